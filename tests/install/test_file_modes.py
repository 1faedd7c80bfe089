"""File modes on the node, as Istio sets them: our config files 0600 (0640 with
cniConfGroupRead), the node's primary config keeps its mode, the plugin stays 0755; every file
gets its final mode before the rename that makes it visible. Real files in a temp dir."""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.install import atomic, conflist
from agent.install.installer import Installer
from agent.install.watcher import InstallWatcher, WatchTiming
from testbed.agent_host import Node
from testbed.wait import wait_for

LIST = {"cniVersion": "0.4.0", "name": "net", "plugins": [{"type": "ptp"}, {"type": "portmap"}]}
SINGLE = {"cniVersion": "0.4.0", "name": "net", "type": "bridge"}
GROUP_READ = [
    pytest.param(False, 0o600, id="default-0600"),
    pytest.param(True, 0o640, id="group-read-0640"),
]


def mode(path: Path | str) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def installer(node: Node, **settings: object) -> Installer:
    node.with_settings(**settings)
    return Installer(node.settings, pod_name="agent-1", pod_namespace="istio-system")


def write(path: Path, content: object, file_mode: int) -> None:
    path.write_text(json.dumps(content))
    os.chmod(path, file_mode)


@contextlib.contextmanager
def umask(value: int) -> Iterator[None]:
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


# -- files we create ------------------------------------------------------------------------


@pytest.mark.parametrize(("group_read", "want"), GROUP_READ)
@pytest.mark.parametrize("name", ["YYY-istio-cni.conf", "istio-cni.conflist"])
def test_standalone_config_mode(node: Node, group_read: bool, want: int, name: str) -> None:
    file_name = "" if name.startswith("YYY") else name
    inst = installer(node, chained=False, cniConfFileName=file_name, cniConfGroupRead=group_read)
    with umask(0o000):  # the umask plays no part: a loose one must not loosen the file
        inst.install()
    assert mode(node.conf_dir / name) == want
    assert mode(node.bin_dir / "istio-cni") == 0o755
    assert inst.problems() == []


@pytest.mark.parametrize(("group_read", "want"), GROUP_READ)
def test_istio_owned_conflist_mode_and_primary_untouched(
    node: Node, group_read: bool, want: int
) -> None:
    write(node.conf_dir / "10-net.conflist", LIST, 0o644)
    before = (node.conf_dir / "10-net.conflist").read_bytes()
    inst = installer(node, istioOwnedCNIConfig=True, cniConfGroupRead=group_read)
    with umask(0o077):
        inst.install()
    assert mode(node.conf_dir / "02-istio-cni.conflist") == want
    assert mode(node.conf_dir / "10-net.conflist") == 0o644
    assert (node.conf_dir / "10-net.conflist").read_bytes() == before
    assert mode(node.bin_dir / "istio-cni") == 0o755


@pytest.mark.parametrize("group_read", [False, True])
def test_non_executable_support_file_gets_our_mode(node: Node, group_read: bool) -> None:
    (node.src_dir / "istio-cni.version").write_text("1\n")
    os.chmod(node.src_dir / "istio-cni.version", 0o644)
    os.chmod(node.src_dir / "istio-cni", 0o700)  # the image's mode does not matter either
    inst = installer(node, chained=False, cniConfGroupRead=group_read)
    inst.install()
    assert mode(node.bin_dir / "istio-cni.version") == (0o640 if group_read else 0o600)
    assert mode(node.bin_dir / "istio-cni") == 0o755
    assert inst.problems() == []


# -- the node's primary config keeps its mode -----------------------------------------------


@pytest.mark.parametrize("group_read", [False, True])
@pytest.mark.parametrize("primary_mode", [0o644, 0o600, 0o640, 0o604])
def test_chained_primary_keeps_its_mode(node: Node, primary_mode: int, group_read: bool) -> None:
    write(node.conf_dir / "10-net.conflist", LIST, primary_mode)
    inst = installer(node, cniConfGroupRead=group_read)
    with umask(0o022):
        report = inst.install()
    assert report.changed[-1] == str(node.conf_dir / "10-net.conflist")
    assert mode(node.conf_dir / "10-net.conflist") == primary_mode
    assert inst.problems() == []
    inst.uninstall()  # taking our entry out keeps it too
    assert mode(node.conf_dir / "10-net.conflist") == primary_mode
    assert node.conf("10-net.conflist") == LIST


@pytest.mark.parametrize("primary_mode", [0o644, 0o600])
@pytest.mark.parametrize("ext", [".conf", ".json"])
def test_converted_conf_keeps_the_originals_mode(node: Node, primary_mode: int, ext: str) -> None:
    write(node.conf_dir / f"10-net{ext}", SINGLE, primary_mode)
    installer(node, cniConfGroupRead=True).install()
    assert os.listdir(node.conf_dir) == ["10-net.conflist"]
    assert mode(node.conf_dir / "10-net.conflist") == primary_mode


# -- another writer changes a mode ----------------------------------------------------------


@pytest.mark.parametrize(("group_read", "want"), GROUP_READ)
def test_reinstall_puts_our_mode_back(node: Node, group_read: bool, want: int) -> None:
    inst = installer(node, chained=False, cniConfGroupRead=group_read)
    inst.install()
    path = node.conf_dir / "YYY-istio-cni.conf"
    content = path.read_bytes()
    os.chmod(path, 0o644)  # another writer loosens it; the content is unchanged
    assert inst.problems() == [f"{path}: mode 0644, want {want:04o}"]
    report = inst.install()
    assert report.changed == [str(path)]
    assert mode(path) == want
    assert path.read_bytes() == content
    assert inst.problems() == []
    assert inst.install().changed == []  # in place: nothing written


def test_reinstall_puts_the_plugin_mode_back(node: Node) -> None:
    inst = installer(node, chained=False)
    inst.install()
    os.chmod(node.bin_dir / "istio-cni", 0o700)
    assert any("not mode 0755" in p for p in inst.problems())
    inst.install()
    assert mode(node.bin_dir / "istio-cni") == 0o755
    assert inst.problems() == []


def test_primary_mode_changed_by_its_owner_is_theirs(node: Node) -> None:
    path = node.conf_dir / "10-net.conflist"
    write(path, LIST, 0o644)
    inst = installer(node)
    inst.install()
    os.chmod(path, 0o600)  # the network's owner tightens its file: not ours to undo
    assert inst.problems() == []
    assert inst.install().changed == []
    assert mode(path) == 0o600
    # The owner rewrites the file without our entry and with another mode: the merge keeps it.
    write(path, LIST, 0o640)
    assert inst.install().changed == [str(path)]
    assert mode(path) == 0o640
    assert conflist.count_ours(node.conf("10-net.conflist")) == 1


def test_group_read_switched_on_changes_our_files(node: Node) -> None:
    inst = installer(node, istioOwnedCNIConfig=True)
    write(node.conf_dir / "10-net.conflist", LIST, 0o644)
    inst.install()
    owned = node.conf_dir / "02-istio-cni.conflist"
    assert mode(owned) == 0o600
    inst.reconfigure(node.with_settings(cniConfGroupRead=True))
    assert inst.problems() == [f"{owned}: mode 0600, want 0640"]
    inst.install()
    assert mode(owned) == 0o640
    assert mode(node.conf_dir / "10-net.conflist") == 0o644


def test_only_a_chmod_of_our_own_file_is_another_writers_change(node: Node) -> None:
    write(node.conf_dir / "10-net.conflist", LIST, 0o644)
    inst = installer(node, istioOwnedCNIConfig=True)
    inst.install()
    owned = node.conf_dir / "02-istio-cni.conflist"
    plugin = node.bin_dir / "istio-cni"
    assert inst.ledger.is_own_state(str(owned)) and inst.ledger.is_own_state(str(plugin))
    os.chmod(owned, 0o644)
    os.chmod(plugin, 0o777)
    assert not inst.ledger.is_own_state(str(owned))
    assert not inst.ledger.is_own_state(str(plugin))
    inst.install()
    assert inst.ledger.is_own_state(str(owned)) and inst.ledger.is_own_state(str(plugin))
    # Chained into the primary: its mode is its owner's business, a chmod is no change of ours.
    inst.uninstall()
    chained = installer(node, istioOwnedCNIConfig=False)
    chained.install()
    primary = node.conf_dir / "10-net.conflist"
    assert chained.ledger.is_own_state(str(primary))
    os.chmod(primary, 0o600)
    assert chained.ledger.is_own_state(str(primary))


def test_watcher_heals_a_chmod_at_once(node: Node) -> None:
    """The event path, not the periodic recheck (set far away): the chmod wakes the watcher."""
    inst = installer(node, chained=False)
    watcher = InstallWatcher(inst, timing=WatchTiming(recheck_seconds=600))
    watcher.start()
    try:
        path = node.conf_dir / "YYY-istio-cni.conf"
        wait_for(watcher.ready, "the watcher to be ready", 5, interval=0.01)
        os.chmod(path, 0o666)
        wait_for(lambda: mode(path) == 0o600, f"{path} back to mode 0600", 5, interval=0.01)
        wait_for(watcher.ready, "the watcher to be ready again", 5, interval=0.01)
        assert watcher.heals == 1
    finally:
        watcher.stop()


# -- atomic: the final mode is set before the rename ---------------------------------------


def test_every_file_has_its_final_mode_before_the_rename(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, int]] = []
    real_replace = os.replace

    def spying_replace(src: str, dst: str) -> None:
        if os.path.isfile(src):
            seen.append((os.path.basename(dst), mode(src)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spying_replace)  # the os module atomic.py uses
    write(node.conf_dir / "10-net.conf", SINGLE, 0o644)
    installer(node, cniConfGroupRead=True).install()
    assert ("istio-cni", 0o755) in seen
    assert ("10-net.conflist", 0o644) in seen  # the list gets the .conf's mode
    seen.clear()
    installer(node, chained=False, cniConfGroupRead=True).install()
    assert ("YYY-istio-cni.conf", 0o640) in seen
    leftovers = [n for n in os.listdir(node.conf_dir) if atomic.is_temp_name(n)]
    assert leftovers == []


def test_atomic_write_default_is_0600_whatever_the_umask(tmp_path: Path) -> None:
    with umask(0):
        atomic.atomic_write(str(tmp_path / "f"), b"x")
    assert mode(tmp_path / "f") == 0o600
    atomic.atomic_write(str(tmp_path / "f"), b"y", mode=0o640, keep_mode=False)
    assert mode(tmp_path / "f") == 0o640
    atomic.atomic_write(str(tmp_path / "f"), b"z", mode=0o600)  # keep_mode: existing wins
    assert mode(tmp_path / "f") == 0o640
