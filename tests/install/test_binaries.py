"""Copying the built plugin into the bin dir: atomic, skip identical, support dirs, uninstall."""

from __future__ import annotations

import os
import pathlib
import subprocess
import time

import pytest

from agent.errors import InstallError
from agent.install.binaries import binary_problems, install_binaries, uninstall_binaries
from agent.install.ledger import WriteLedger
from tests.install.conftest import Node, write_plugin


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
    for old, new in (("istio-cni-aaaa.d", "istio-cni-bbbb.d"),
                     ("istio-cni-bbbb.d", "istio-cni-cccc.d")):
        time.sleep(0.01)
        os.rename(node.src_dir / old, node.src_dir / new)
        install_binaries(str(node.src_dir), str(node.bin_dir), ledger)
    names = sorted(os.listdir(node.bin_dir))
    assert names == ["istio-cni", "istio-cni-bbbb.d", "istio-cni-cccc.d"], "previous one kept"


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
