"""Serving: thin HTTP layers over ``llm/batch`` (and ``runtime/``).

* ``shapeplan.serve.openai``: the OpenAI-compatible LLM server, ``shapeplan serve --model DIR |
  FILE.gguf | --preset NAME`` (docs/serve.md).

Needs the ``serve`` extra: ``pip install -e ".[serve]"``.
"""
