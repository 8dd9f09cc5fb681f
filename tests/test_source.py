"""The repository's Python source: no module or class defines the same function or class name twice. The
second definition silently replaces the first: a test function defined twice never runs its first body, and
(thirtieth session) bench/quant_gemv.py's two ``_precompile`` made its mmq and GEMM sweeps' worker pool call
the one-row sweep's, which only failed on a GPU."""
from __future__ import annotations

import ast
import collections
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted(p for d in ("shapeplan", "bench", "tests") for p in (ROOT / d).rglob("*.py"))
DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


#: decorators that build on a name already defined (a property's setter, an overload, a dispatch case)
REDEFINE = ("setter", "deleter", "getter", "register", "overload")


def _redefines(node: ast.stmt) -> bool:
    return any(ast.unparse(d).split("(")[0].rsplit(".", 1)[-1] in REDEFINE for d in node.decorator_list)


def _twice(body: list[ast.stmt]) -> list[str]:
    """Names defined more than once directly in ``body`` (decorated or not: a test defined twice with the
    same parametrize loses its first body too), but for ``REDEFINE``'s decorators."""
    names = collections.Counter(n.name for n in body if isinstance(n, DEFS) and not _redefines(n))
    return sorted(name for name, count in names.items() if count > 1)


def test_the_source_was_found():
    assert len(FILES) > 300, f"found only {len(FILES)} Python files under {ROOT}"


def test_no_name_is_defined_twice():
    found = []
    for path in FILES:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        scopes = [("module", tree.body)] + [(f"class {c.name}", c.body) for c in ast.walk(tree)
                                            if isinstance(c, ast.ClassDef)]
        found += [f"{path.relative_to(ROOT)} ({where}): {twice}" for where, body in scopes if (twice := _twice(body))]
    assert not found, f"names defined twice (the second replaces the first): {found}"
