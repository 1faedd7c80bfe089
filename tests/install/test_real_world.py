"""CNI configs as real providers write them: install chains us last and keeps everything else,
uninstall gives back a config equal as JSON to the original."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
from typing import Any

import pytest

from agent.install import conflist
from agent.install.installer import Installer
from testbed.agent_host import Node
from tests.install.conftest import conformance_dir

REAL_WORLD = conformance_dir() / "real-world"
FILES = sorted(p.name for p in REAL_WORLD.iterdir() if p.suffix in (".conf", ".conflist"))


def test_every_file_is_covered() -> None:
    assert len(FILES) == 29


def _installed(node: Node, name: str) -> tuple[Installer, str, Any]:
    original = json.loads((REAL_WORLD / name).read_text())
    shutil.copy(REAL_WORLD / name, node.conf_dir / f"10-{name}")
    os.chmod(node.conf_dir / f"10-{name}", 0o600)
    installer = Installer(node.settings, pod_name="agent-x", pod_namespace="istio-system")
    report = installer.install()
    return installer, report.config_path, original


@pytest.mark.parametrize("name", FILES)
def test_install_chains_ours_last(node: Node, name: str) -> None:
    installer, path, original = _installed(node, name)
    assert os.path.basename(path) == conflist.list_file_name(f"10-{name}")
    assert sorted(os.listdir(node.conf_dir)) == [os.path.basename(path)]
    assert os.stat(path).st_mode & 0o777 == 0o600, "the file's mode is kept"
    result = json.loads(pathlib.Path(path).read_text())
    ours = {k: v for k, v in installer.entry.items()}
    assert result["plugins"][-1] == ours
    assert conflist.count_ours(result) == 1
    if conflist.is_single(original):
        plugin = {k: v for k, v in original.items() if k != "cniVersion"}
        assert result["plugins"][:-1] == [plugin]
        assert result["name"] == original["name"]
        assert result.get("cniVersion") == original.get("cniVersion")
    else:
        rest = {k: v for k, v in result.items() if k != "plugins"}
        assert rest == {k: v for k, v in original.items() if k != "plugins"}
        assert result["plugins"][:-1] == original["plugins"]
        for before, after in zip(original["plugins"], result["plugins"], strict=False):
            assert list(before) == list(after), "other plugins keep their key order"
    assert installer.problems() == []


@pytest.mark.parametrize("name", FILES)
def test_uninstall_restores(node: Node, name: str) -> None:
    installer, path, original = _installed(node, name)
    installer.install()
    Installer(node.settings, pod_name="other", pod_namespace="x").uninstall()
    restored = json.loads(pathlib.Path(path).read_text())
    if conflist.is_single(original):
        # A list holding exactly the original plugin (libcni gives it the list's cniVersion).
        assert len(restored["plugins"]) == 1
        assert {**restored["plugins"][0], "cniVersion": restored["cniVersion"]} == original
    else:
        assert restored == original
    assert os.listdir(node.bin_dir) == []
