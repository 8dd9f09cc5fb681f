"""Reuse tests/llm's tiny save_pretrained checkpoints (written once per session) and its one-thread rule."""
from tests.llm.conftest import _one_thread, checkpoints  # noqa: F401  (fixtures)
