"""Debug: which plans a warm triton pipeline creates (fifth session)."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ["SHAPEPLAN_CACHE_DIR"] = tempfile.mkdtemp()
from shapeplan import diagnostics  # noqa: E402
from shapeplan.llm import GenerationPipeline  # noqa: E402
from shapeplan.llm.demo import make_tiny_checkpoint  # noqa: E402

path = make_tiny_checkpoint(tempfile.mkdtemp(), "llama", rope_parameters={
    "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64})
KW = dict(device="cuda", max_prefill_length=64, max_kv_cache_length=160, progress=False)
mode = sys.argv[1] if len(sys.argv) > 1 else "triton"
first = GenerationPipeline.from_pretrained(path, mode=mode, **KW).generate("Explain KV caching: keys and values", 24)
diagnostics.enable(["LIFECYCLE", "SEGMENT", "CACHE", "FALLBACK", "SHAPE", "GRAPH_REPLAY"], level="detailed")
pipe = GenerationPipeline.from_pretrained(path, mode=mode, **KW)
again = pipe.generate("Explain KV caching: keys and values", 24)
for e in diagnostics.events():
    f = {k: v for k, v in e.fields.items() if k in ("plan", "signature", "outputs", "reason", "changed", "segment")}
    print(e.category, e.message, f)
print("same tokens", again.token_ids == first.token_ids)
