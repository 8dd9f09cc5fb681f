"""LLM generation on shapeplan plans: Llama-family builders, static KV cache, in-graph sampling."""
from shapeplan import _gc

with _gc.startup():               # a command's process: no full collection over these (shapeplan/_gc.py)
    from shapeplan.llm.config import PRESETS, SUPPORTED_MODEL_TYPES, LlamaConfig, preset_config
    from shapeplan.llm.constraint import Constraint, ToolCall, parse_tool_calls
    from shapeplan.llm.metrics import Metrics
    from shapeplan.llm.pipeline import GenerationPipeline, GenerationResult, Session, TextStream, bucket_ladder
    from shapeplan.llm.sampling import Sampling
    from shapeplan.llm.tokenizer import Tokenizer

__all__ = ["Constraint", "GenerationPipeline", "GenerationResult", "LlamaConfig", "Metrics", "PRESETS",
           "SUPPORTED_MODEL_TYPES", "Sampling", "Session", "TextStream", "ToolCall", "Tokenizer", "bucket_ladder",
           "parse_tool_calls", "preset_config"]
