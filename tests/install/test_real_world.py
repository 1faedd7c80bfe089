"""CNI configs as real providers write them: install chains us last and keeps everything else,
uninstall gives back the provider's file byte for byte (a .conf we made a list of included)."""

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
        assert result["cniVersion"] == conflist.list_version(original)
        assert conflist.converted_from(result, os.path.basename(path)) == (
            f"10-{name}",
            (REAL_WORLD / name).read_text(),
        )
    else:
        rest = {k: v for k, v in result.items() if k != "plugins"}
        assert (
            pathlib.Path(path)
            .read_text()
            .startswith((REAL_WORLD / name).read_text().rsplit("]", 1)[0].rstrip())
        ), "the provider's text is kept up to its last plugin"
        assert rest == {k: v for k, v in original.items() if k != "plugins"}
        assert result["plugins"][:-1] == original["plugins"]
        for before, after in zip(original["plugins"], result["plugins"], strict=False):
            assert list(before) == list(after), "other plugins keep their key order"
    assert installer.problems() == []


@pytest.mark.parametrize("name", FILES)
def test_uninstall_restores(node: Node, name: str) -> None:
    installer, _path, _original = _installed(node, name)
    installer.install()
    Installer(node.settings, pod_name="other", pod_namespace="x").uninstall()
    assert sorted(os.listdir(node.conf_dir)) == [f"10-{name}"]
    restored = node.conf_dir / f"10-{name}"
    assert restored.read_bytes() == (REAL_WORLD / name).read_bytes()
    assert os.stat(restored).st_mode & 0o777 == 0o600, "the file's mode is kept"
    assert os.listdir(node.bin_dir) == []
