"""No function in proxy/ over 60 lines, no module over 450 (docs/development.md § Sizes): a long
function does several things, and a long module several jobs. Nothing is over today; should an
exception ever be listed, an entry that no longer applies fails the test until it is removed."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION = 60
MAX_MODULE = 450

EXCEPTIONS: set[str] = set()  # 'path' or 'path:qualified.name', until it is split


def oversized(path: str, source: str) -> dict[str, int]:
    """`path` (module) or `path:qualified.name` (function) -> its lines, for each one over its limit."""
    lines = source.count("\n")
    found = {path: lines} if lines > MAX_MODULE else {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}.{child.name}" if prefix else child.name
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = child.end_lineno - child.lineno + 1  # type: ignore[operator]
                if length > MAX_FUNCTION:
                    found[f"{path}:{name}"] = length
            visit(child, name)

    visit(ast.parse(source), "")
    return found


def all_oversized() -> dict[str, int]:
    found: dict[str, int] = {}
    for file in sorted((ROOT / "proxy").rglob("*.py")):
        found.update(oversized(file.relative_to(ROOT).as_posix(), file.read_text(encoding="utf-8")))
    return found


def test_no_function_or_module_over_its_limit():
    over = {k: n for k, n in all_oversized().items() if k not in EXCEPTIONS}
    assert not over, f"over {MAX_FUNCTION} lines a function or {MAX_MODULE} a module: {over}"


def test_the_exceptions_are_still_over():
    stale = EXCEPTIONS - set(all_oversized())
    assert not stale, f"no longer over the limit: remove from EXCEPTIONS {sorted(stale)}"


def test_the_measure_counts_functions_nested_in_classes_and_modules_by_lines():
    def lines(n: int) -> str:
        return "".join(f"    x{i} = {i}\n" for i in range(n))

    source = f"class A:\n  def fits(self):\n{lines(MAX_FUNCTION - 1)}  def long(self):\n{lines(MAX_FUNCTION)}"
    assert oversized("m.py", source) == {"m.py:A.long": MAX_FUNCTION + 1}  # with its def line
    nested = f"def outer():\n  async def inner():\n{lines(MAX_FUNCTION)}"
    assert oversized("m.py", nested) == {"m.py:outer": MAX_FUNCTION + 2, "m.py:outer.inner": MAX_FUNCTION + 1}
    assert oversized("m.py", "x = 1\n" * MAX_MODULE) == {}
    assert oversized("m.py", "x = 1\n" * (MAX_MODULE + 1)) == {"m.py": MAX_MODULE + 1}
