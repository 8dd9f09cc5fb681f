"""Serving: thin layers over ``runtime/`` (and, for LLMs, ``llm/batch``).

* ``shapeplan.serve.kserve``: the KServe v2 tensor server (HTTP/REST + gRPC, dynamic batching) for
  ONNX and ``torch.export`` models: ``shapeplan serve --model-repository DIR`` (docs/serve.md).
* ``shapeplan.serve.openai``: the OpenAI-compatible LLM server over the batched engine (completions,
  chat, streaming, logprobs, metrics): ``shapeplan serve --model DIR|FILE.gguf | --preset NAME``.
* ``shapeplan.serve.app``: the one FastAPI app every part mounts its router on, ``/metrics``, uvicorn.
* ``shapeplan.serve.errors``: typed errors and the protocol status of each.

Needs the ``serve`` extra: ``pip install -e ".[serve]"``.
"""
