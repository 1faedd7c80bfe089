"""Small modules with one job each: the agent's and the plugin's modules hold at most 450 lines
and their functions at most 60 (protoc's generated zds_pb2 aside)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(
    p for d in ("agent", "plugin") for p in (ROOT / d).rglob("*.py") if p.name != "zds_pb2.py"
)
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_module_and_its_functions_are_small(source: Path) -> None:
    text = source.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{source}: split it"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == [], f"{source}: functions over {MAX_FUNCTION_LINES} lines"
