"""Install, check and uninstall on real directories: bad input, modes, conversions, undo."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shutil

import pytest

from agent.errors import InstallError, TransientInstallError
from agent.install import conflist
from agent.install.installer import Installer
from testbed.agent_host import Node
from tests.install.conftest import conformance_dir

CASES = conformance_dir() / "install"
REPO = pathlib.Path(__file__).resolve().parents[2]
LIST = {"cniVersion": "0.4.0", "name": "net", "plugins": [{"type": "ptp"}, {"type": "portmap"}]}


def _installer(node: Node, **settings: object) -> Installer:
    if settings:
        node.with_settings(**settings)
    return Installer(node.settings, pod_name="agent-1", pod_namespace="istio-system")


def _snapshot(node: Node) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in node.conf_dir.iterdir() if p.is_file()}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{\n  "name": "net",\n  "plugins": [', "not valid JSON"),
        (b"{}", "empty object"),
        (b"[]", "got an array"),
        (b'{"name": "net", "plugins": "ptp"}', "plugins must be a list"),
        (b'{"name": "net", "plugins": [{"type": ["ptp"]}]}', "plugins[0].type"),
        (b" " * (conflist.MAX_CONFIG_BYTES + 10), "larger than"),
    ],
    ids=["invalid-json", "empty-map", "array", "plugins-string", "type-list", "huge"],
)
def test_bad_named_primary_loses_nothing(node: Node, content: bytes, message: str) -> None:
    (node.conf_dir / "10-net.conflist").write_bytes(content)
    before = _snapshot(node)
    installer = _installer(node, cniConfFileName="10-net.conflist")
    with pytest.raises(InstallError) as err:
        installer.install()
    assert str(node.conf_dir / "10-net.conflist") in str(err.value)
    assert message in str(err.value)
    assert _snapshot(node) == before
    assert installer.problems()


def test_bad_files_are_skipped_like_the_runtime_does(node: Node) -> None:
    (node.conf_dir / "01-broken.conflist").write_text("{")
    (node.conf_dir / "02-empty.conf").write_text("{}")
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    report = _installer(node).install()
    assert report.config_path == str(node.conf_dir / "10-net.conflist")
    assert (node.conf_dir / "01-broken.conflist").read_text() == "{"


def test_symlink_primary_refused(node: Node) -> None:
    real = node.root / "elsewhere.conflist"
    real.write_text(json.dumps(LIST))
    (node.conf_dir / "10-net.conflist").symlink_to(real)
    with pytest.raises(InstallError, match=r"10-net\.conflist: is a symlink, expected a regular"):
        _installer(node).install()
    assert json.loads(real.read_text()) == LIST
    assert os.path.islink(node.conf_dir / "10-net.conflist")


def test_conf_dir_not_a_directory(node: Node) -> None:
    shutil.rmtree(node.conf_dir)
    node.conf_dir.write_text("")
    with pytest.raises(InstallError, match=f"CNI conf dir {node.conf_dir}: Not a directory"):
        _installer(node).install()


def test_waits_for_primary_naming_the_dir(node: Node) -> None:
    installer = _installer(node)
    with pytest.raises(TransientInstallError, match=str(node.conf_dir)):
        installer.install()
    assert os.listdir(node.conf_dir) == []
    assert os.listdir(node.bin_dir) == ["istio-cni"], "binary first: it may be there already"


def test_json_single_becomes_conflist_and_mode_kept(node: Node) -> None:
    (node.conf_dir / "10-net.json").write_text('{"cniVersion":"1.0.0","name":"n","type":"ptp"}')
    os.chmod(node.conf_dir / "10-net.json", 0o640)
    _installer(node).install()
    assert os.listdir(node.conf_dir) == ["10-net.conflist"]
    assert os.stat(node.conf_dir / "10-net.conflist").st_mode & 0o777 == 0o640
    assert node.conf("10-net.conflist")["plugins"][0] == {"name": "n", "type": "ptp"}


def test_conversion_refused_when_list_name_taken(node: Node) -> None:
    shutil.copy(CASES / "bridge.conf", node.conf_dir / "10-net.conf")
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    before = _snapshot(node)
    with pytest.raises(InstallError, match=r"10-net\.conflist already exists"):
        _installer(node).install()
    assert _snapshot(node) == before


def test_interrupted_conversion_is_finished(node: Node) -> None:
    installer = _installer(node)
    bridge = json.loads((CASES / "bridge.conf").read_text())
    # What a crash between "write the list into the .conf" and "rename it" leaves behind.
    (node.conf_dir / "10-net.conf").write_bytes(
        conflist.dumps(conflist.insert(bridge, installer.entry))
    )
    installer.install()
    assert os.listdir(node.conf_dir) == ["10-net.conflist"]
    assert conflist.has_entry(node.conf("10-net.conflist"), installer.entry)
    assert installer.problems() == []


def test_stale_conf_temp_removed(node: Node) -> None:
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    stale = node.conf_dir / ".10-net.conflist.999999.deadbeef.istio-tmp"
    stale.write_text("{")
    _installer(node).install()
    assert sorted(os.listdir(node.conf_dir)) == ["10-net.conflist"]


def test_owned_file_follows_primary_and_warns(node: Node, caplog: pytest.LogCaptureFixture) -> None:
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    (node.conf_dir / "01-early.conflist").write_text(json.dumps({**LIST, "name": "early"}))
    installer = _installer(
        node,
        istioOwnedCNIConfig=True,
        cniConfFileName="10-net.conflist",
        istioOwnedCNIConfigFileName="02-istio-cni.conflist",
    )
    with caplog.at_level(logging.WARNING):
        installer.install()
    assert "01-early.conflist sorts before 02-istio-cni.conflist" in caplog.text
    assert node.conf("10-net.conflist") == LIST, "primary untouched"
    owned = node.conf("02-istio-cni.conflist")
    assert owned == conflist.with_owned_copy_of(
        conflist.insert(LIST, installer.entry), "10-net.conflist"
    )
    changed = {**LIST, "plugins": [{"type": "calico"}]}
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(changed))
    assert installer.problems()
    installer.install()
    assert node.conf("02-istio-cni.conflist")["plugins"][0] == {"type": "calico"}
    installer.uninstall()
    assert sorted(os.listdir(node.conf_dir)) == ["01-early.conflist", "10-net.conflist"]


def test_standalone_names(node: Node) -> None:
    installer = _installer(node, chained=False)
    installer.install()
    assert node.conf("YYY-istio-cni.conf") == installer.entry
    assert installer.entry["cniVersion"] == "1.0.0"
    installer = _installer(node, chained=False, cniConfFileName="90-istio.conflist")
    installer.install()
    config = node.conf("90-istio.conflist")
    assert conflist.runtime_loadable("90-istio.conflist", conflist.dumps(config))
    assert config["plugins"][0]["type"] == "istio-cni"


def test_entry_carries_what_the_plugin_needs(node: Node) -> None:
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    installer = _installer(
        node, logLevel="debug", excludeNamespaces=("a", "b"), cniAgentRunDir="/run/x"
    )
    installer.install()
    entry = node.conf("10-net.conflist")["plugins"][-1]
    assert entry == {
        "name": "istio-cni",
        "type": "istio-cni",
        "plugin_log_level": "debug",
        "cni_agent_run_dir": "/run/x",
        "exclude_namespaces": ["a", "b"],
        "pod_namespace": "istio-system",
        "ambient_enabled": False,
        "capabilities": {"io.kubernetes.cri.pod-annotations": True},
        "agent_pod_prefix": "agent-",
    }
    text = (node.conf_dir / "10-net.conflist").read_text().lower()
    assert "token" not in text and "kubeconfig" not in text


ISTIO_LEFT = REPO / "tests" / "testdata" / "istio-install-test" / "expected"


def test_take_over_from_istios_agent_removes_its_leftovers(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """A node Istio's agent stopped on without its clean-up: its entry (with its own fields) in
    the conflist, its plugin's kubeconfig in the run dir (and, from Istio before 1.23, in the
    conf dir). Ours replaces the entry whole, keeps every other plugin, removes both files."""
    left = (ISTIO_LEFT / "10-calico.conflist-istioconfig").read_bytes()
    (node.conf_dir / "10-calico.conflist").write_bytes(left)
    run_dir = node.root / "run"
    run_dir.mkdir()
    kubeconfigs = [run_dir / "istio-cni-kubeconfig", node.conf_dir / "ZZZ-istio-cni-kubeconfig"]
    for path in kubeconfigs:
        path.write_text("apiVersion: v1\nkind: Config\nusers: [{user: {token: secret}}]\n")
    (run_dir / "unrelated").write_text("kept")
    installer = _installer(node)
    with caplog.at_level(logging.INFO):
        report = installer.install()

    assert not any(p.exists() for p in kubeconfigs)
    assert (run_dir / "unrelated").read_text() == "kept"
    assert {str(p) for p in kubeconfigs} <= set(report.changed)
    assert "removed the kubeconfig Istio's node agent left" in caplog.text
    conf = node.conf("10-calico.conflist")
    theirs = json.loads(left)["plugins"]
    assert conf["plugins"][:-1] == theirs[:-1]
    assert conf["plugins"][-1] == installer.entry
    assert not {"dns", "enablement_selectors", "native_nftables"} & conf["plugins"][-1].keys()
    # Nothing left to take over: a second install changes nothing.
    assert installer.install().changed == []


def test_reinstall_without_change_writes_nothing(node: Node) -> None:
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    installer = _installer(node)
    installer.install()
    inode = os.stat(node.conf_dir / "10-net.conflist").st_ino
    assert installer.install().changed == []
    assert os.stat(node.conf_dir / "10-net.conflist").st_ino == inode


def test_uninstall_reports_every_failure_and_runs_every_step(node: Node) -> None:
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    installer = _installer(node)
    installer.install()
    (node.conf_dir / "10-net.conflist").write_text("{broken")
    with pytest.raises(InstallError) as err:
        installer.uninstall()
    assert "10-net.conflist" in str(err.value) and "not valid JSON" in str(err.value)
    assert os.listdir(node.bin_dir) == [], "the binaries step still ran"
    assert (node.conf_dir / "10-net.conflist").read_text() == "{broken"


def test_uninstall_after_primary_moved(node: Node) -> None:
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    _installer(node).install()
    (node.conf_dir / "05-new.conflist").write_text(json.dumps({**LIST, "name": "new"}))
    _installer(node).install()
    _installer(node).uninstall()  # a fresh process: no undo log, finds both entries
    assert node.conf("10-net.conflist") == LIST
    assert node.conf("05-new.conflist") == {**LIST, "name": "new"}
