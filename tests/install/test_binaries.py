"""Copying the built plugin into the bin dir: atomic, skip identical, uninstall; the support dirs
of the former two-part layout (executable + "istio-cni-<hash>.d"), still installable, pruned."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import time

import pytest

from agent.errors import InstallError
from agent.install.atomic import atomic_write
from agent.install.binaries import binary_problems, install_binaries, uninstall_binaries
from agent.install.ledger import WriteLedger
from testbed.agent_host import Node, write_plugin


def _support(src: pathlib.Path, name: str, content: str) -> None:
    (src / name / "lib").mkdir(parents=True)
    (src / name / "lib" / "mod.py").write_text(content)


def test_installs_executable_and_skips_identical(node: Node) -> None:
    ledger = WriteLedger()
    first = install_binaries(str(node.src_dir), str(node.bin_dir), ledger)
    plugin = node.bin_dir / "istio-cni"
    assert first.written == [str(plugin)]
    assert os.stat(plugin).st_mode & 0o777 == 0o755
    assert subprocess.run([str(plugin)], capture_output=True, check=True).stdout
    inode = os.stat(plugin).st_ino
    second = install_binaries(str(node.src_dir), str(node.bin_dir), ledger)
    assert second.written == [] and os.stat(plugin).st_ino == inode
    assert binary_problems(str(node.src_dir), str(node.bin_dir), ledger) == []


def test_new_version_never_writes_into_the_old_file(node: Node) -> None:
    ledger = WriteLedger()
    install_binaries(str(node.src_dir), str(node.bin_dir), ledger)
    plugin = node.bin_dir / "istio-cni"
    with open(plugin, "rb") as running:  # what a running plugin has open
        write_plugin(node.src_dir, version="2")
        install_binaries(str(node.src_dir), str(node.bin_dir), ledger)
        assert b"test plugin 1" in running.read()
    assert b"test plugin 2" in plugin.read_bytes()


def test_support_dirs_versioned_and_pruned(node: Node) -> None:
    ledger = WriteLedger()
    _support(node.src_dir, "istio-cni-aaaa.d", "v1")
    install_binaries(str(node.src_dir), str(node.bin_dir), ledger)
    assert (node.bin_dir / "istio-cni-aaaa.d" / "lib" / "mod.py").read_text() == "v1"
    inode = os.stat(node.bin_dir / "istio-cni-aaaa.d").st_ino
    install_binaries(str(node.src_dir), str(node.bin_dir), ledger)
    assert os.stat(node.bin_dir / "istio-cni-aaaa.d").st_ino == inode, "identical dir kept"
    for old, new in (
        ("istio-cni-aaaa.d", "istio-cni-bbbb.d"),
        ("istio-cni-bbbb.d", "istio-cni-cccc.d"),
    ):
        # Age is the behaviour under test (newest kept): the file clock ticks coarsely.
        time.sleep(0.01)
        os.rename(node.src_dir / old, node.src_dir / new)
        install_binaries(str(node.src_dir), str(node.bin_dir), ledger)
    names = sorted(os.listdir(node.bin_dir))
    assert names == ["istio-cni", "istio-cni-bbbb.d", "istio-cni-cccc.d"], "previous one kept"


def test_upgrade_from_the_two_part_layout(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """A single-file source replaces a former launcher + support dirs: the new executable is in
    place before any support dir goes, and then every one goes."""
    ledger = WriteLedger()
    write_plugin(node.src_dir, version="old")
    _support(node.src_dir, "istio-cni-aaaa.d", "v1")
    install_binaries(str(node.src_dir), str(node.bin_dir), ledger)
    os.rename(node.src_dir / "istio-cni-aaaa.d", node.src_dir / "istio-cni-bbbb.d")
    install_binaries(str(node.src_dir), str(node.bin_dir), ledger)
    assert sorted(os.listdir(node.bin_dir)) == ["istio-cni", "istio-cni-aaaa.d", "istio-cni-bbbb.d"]

    shutil.rmtree(node.src_dir / "istio-cni-bbbb.d")
    write_plugin(node.src_dir, version="single")
    plugin = node.bin_dir / "istio-cni"
    seen_at_prune: list[bytes] = []
    real_rmtree = shutil.rmtree

    def spy(path: str, *args: object, **kwargs: object) -> None:
        seen_at_prune.append(plugin.read_bytes())
        real_rmtree(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(shutil, "rmtree", spy)
    result = install_binaries(str(node.src_dir), str(node.bin_dir), ledger)
    assert sorted(result.removed) == ["istio-cni-aaaa.d", "istio-cni-bbbb.d"]
    assert os.listdir(node.bin_dir) == ["istio-cni"]
    assert len(seen_at_prune) == 2 and all(b"test plugin single" in b for b in seen_at_prune)
    assert binary_problems(str(node.src_dir), str(node.bin_dir), ledger) == []
    again = install_binaries(str(node.src_dir), str(node.bin_dir), ledger)
    assert again.written == again.removed == []


def test_support_dir_lands_before_its_executable(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A two-part source: the runtime never finds the new executable without its support dir."""
    _support(node.src_dir, "istio-cni-aaaa.d", "v1")
    plugin = node.bin_dir / "istio-cni"
    dirs_at_write: list[list[str]] = []

    def spy(path: str, *args: object, **kwargs: object) -> None:
        if path == str(plugin):
            dirs_at_write.append(sorted(os.listdir(node.bin_dir)))
        atomic_write(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("agent.install.binaries.atomic_write", spy)
    install_binaries(str(node.src_dir), str(node.bin_dir), WriteLedger())
    assert dirs_at_write == [["istio-cni-aaaa.d"]]


def test_damaged_support_dir_replaced(node: Node) -> None:
    ledger = WriteLedger()
    _support(node.src_dir, "istio-cni-aaaa.d", "v1")
    install_binaries(str(node.src_dir), str(node.bin_dir), ledger)
    (node.bin_dir / "istio-cni-aaaa.d" / "lib" / "mod.py").write_text("damaged")
    install_binaries(str(node.src_dir), str(node.bin_dir), ledger)
    assert (node.bin_dir / "istio-cni-aaaa.d" / "lib" / "mod.py").read_text() == "v1"


def test_stale_temps_removed_others_kept(node: Node) -> None:
    stale = node.bin_dir / ".istio-cni.999999.deadbeef.istio-tmp"
    stale.write_text("half")
    stale_dir = node.bin_dir / ".istio-cni-aaaa.d.999999.0badf00d.istio-tmp"
    stale_dir.mkdir()
    (node.bin_dir / "calico").write_text("other cni")
    install_binaries(str(node.src_dir), str(node.bin_dir), WriteLedger())
    assert sorted(os.listdir(node.bin_dir)) == ["calico", "istio-cni"]


def test_symlink_in_place_of_binary_is_refused(node: Node) -> None:
    (node.bin_dir / "istio-cni").symlink_to("/bin/true")
    with pytest.raises(InstallError, match=r"istio-cni: expected a regular file, found a symlink"):
        install_binaries(str(node.src_dir), str(node.bin_dir), WriteLedger())
    assert os.readlink(node.bin_dir / "istio-cni") == "/bin/true"


def test_missing_source_or_bin_dir(node: Node, tmp_path: pathlib.Path) -> None:
    with pytest.raises(InstallError, match="has no istio-cni executable"):
        install_binaries(str(tmp_path / "conf"), str(node.bin_dir), WriteLedger())
    with pytest.raises(InstallError, match="does not exist"):
        install_binaries(str(node.src_dir), str(tmp_path / "nope"), WriteLedger())


def test_uninstall_removes_ours_only(node: Node) -> None:
    ledger = WriteLedger()
    _support(node.src_dir, "istio-cni-aaaa.d", "v1")
    install_binaries(str(node.src_dir), str(node.bin_dir), ledger)
    (node.bin_dir / "istio-cni-old.d").mkdir()
    (node.bin_dir / "bridge").write_text("other")
    removed, errors = uninstall_binaries(str(node.src_dir), str(node.bin_dir), ledger)
    assert errors == [] and len(removed) == 3
    assert os.listdir(node.bin_dir) == ["bridge"]
