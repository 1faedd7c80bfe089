"""The plugin runs on every pod start from a standalone executable: it may import only the
standard library and itself. import-linter (ci/test) checks the other layers; it cannot name
"the standard library", so this walks the plugin's imports itself."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parents[2] / "plugin"


def imported_roots(source: Path) -> set[str]:
    """The top-level names of every absolute import in a module (relative ones stay inside)."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_walker_sees_every_import_form(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import os.path, json\nfrom yaml import safe_load\nfrom . import x\n"
        "def f():\n    import kubernetes\n"
    )
    assert imported_roots(module) == {"os", "json", "yaml", "kubernetes"}


@pytest.mark.parametrize(
    "source", sorted(PLUGIN.rglob("*.py")), ids=lambda p: str(p.relative_to(PLUGIN.parent))
)
def test_plugin_imports_only_the_standard_library(source: Path) -> None:
    foreign = imported_roots(source) - set(sys.stdlib_module_names) - {"plugin", "__future__"}
    assert not foreign, f"{source} imports {sorted(foreign)}: the plugin is standard library only"
