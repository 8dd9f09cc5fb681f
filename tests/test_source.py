"""The repository's Python source: no module or class defines the same function or class name twice. The
second definition silently replaces the first: a test function defined twice never runs its first body, and
(thirtieth session) bench/quant_gemv.py's two ``_precompile`` made its mmq and GEMM sweeps' worker pool call
the one-row sweep's, which only failed on a GPU."""
from __future__ import annotations

import ast
import collections
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted(p for d in ("shapeplan", "bench", "tests") for p in (ROOT / d).rglob("*.py"))
DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _twice(body: list[ast.stmt]) -> list[str]:
    """Names defined more than once directly in ``body``; a decorated redefinition (``@x.setter``,
    ``@overload``, ``@register``) is how such names are meant to be built, so it does not count."""
    names = collections.Counter(n.name for n in body if isinstance(n, DEFS) and not n.decorator_list)
    return sorted(name for name, count in names.items() if count > 1)


def test_the_source_was_found():
    assert len(FILES) > 300, f"found only {len(FILES)} Python files under {ROOT}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_name_is_defined_twice(path):
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = [f"module: {_twice(tree.body)}"] if _twice(tree.body) else []
    found += [f"class {c.name}: {_twice(c.body)}" for c in ast.walk(tree) if isinstance(c, ast.ClassDef) and _twice(c.body)]
    assert not found, f"{path.relative_to(ROOT)} defines a name twice (the second replaces the first): {found}"
