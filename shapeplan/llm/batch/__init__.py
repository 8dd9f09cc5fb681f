"""The serving core, free of HTTP: a paged KV cache with a prefix cache over its blocks
(``blocks``), continuous batching with chunked prefill and preemption (``scheduler``), one captured
plan per batch bucket (``runner``), and the thread that owns them (``engine``). ``GenerationPipeline``
(shapeplan/llm/pipeline.py) builds one and is a client of it; so are the servers (shapeplan/serve)."""
from shapeplan.llm.batch.blocks import BlockManager
from shapeplan.llm.batch.engine import BatchEngine
from shapeplan.llm.batch.runner import ModelRunner, decode_buckets
from shapeplan.llm.batch.scheduler import Scheduler
from shapeplan.llm.batch.sequence import RequestHandle, Sequence, TokenEvent, TokenLogprob

__all__ = ["BatchEngine", "BlockManager", "ModelRunner", "RequestHandle", "Scheduler", "Sequence", "TokenEvent",
           "TokenLogprob", "decode_buckets"]
