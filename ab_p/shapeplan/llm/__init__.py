"""LLM generation on shapeplan plans: Llama-family builders, static KV cache, in-graph sampling."""
from shapeplan.llm.config import PRESETS, SUPPORTED_MODEL_TYPES, LlamaConfig, preset_config
from shapeplan.llm.metrics import Metrics
from shapeplan.llm.pipeline import GenerationPipeline, GenerationResult, Session, TextStream, bucket_ladder
from shapeplan.llm.sampling import Sampling
from shapeplan.llm.tokenizer import Tokenizer

__all__ = ["GenerationPipeline", "GenerationResult", "LlamaConfig", "Metrics", "PRESETS", "SUPPORTED_MODEL_TYPES",
           "Sampling", "Session", "TextStream", "Tokenizer", "bucket_ladder", "preset_config"]
