"""The OpenAI-compatible LLM server (``shapeplan serve --model DIR|FILE.gguf | --preset NAME``), a thin
layer over the serving core (shapeplan/llm/batch): docs/serve.md.

    protocol.py    request models (strict: a wrong type or unknown field is a 400) and answer pieces
    generation.py  requests -> engine requests -> JSON or SSE chunks, raced against client disconnects
    routes.py      the FastAPI routes (/v1/completions, /v1/chat/completions, /v1/models, /health)
    metrics.py     /metrics (prometheus-client, ``shapeplan:`` names)
    errors.py      errors in OpenAI's JSON shape and their HTTP statuses
    server.py      the app, the uvicorn thread, ``serve_openai(args)``
    loadgen.py     ``shapeplan bench --serve URL``: streaming clients against a running server
"""
DEFAULT_MAX_REQUEST_BYTES = 8 << 20    # a larger body is answered 413
