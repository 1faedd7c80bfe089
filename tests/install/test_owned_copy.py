"""istioOwnedCNIConfig toggled between agent versions (an upgrade with other values): the owned
copy of the primary is marked as ours, so a copy the settings no longer name is removed and never
taken for the primary, uninstall leaves no copy behind, and turning the option on again makes a
fresh copy of the current primary. Each step is a new Installer, as a new agent pod is."""

from __future__ import annotations

import json
import os

import pytest

from agent.errors import TransientInstallError
from agent.install import atomic, conflist
from agent.install.installer import Installer
from testbed.agent_host import Node

CALICO = {
    "cniVersion": "0.3.1",
    "name": "k8s-pod-network",
    "plugins": [{"type": "calico", "mtu": 1440}, {"type": "portmap"}],
}
PRIMARY = "10-calico.conflist"
OWNED = "02-istio-cni.conflist"


def _agent(node: Node, **settings: object) -> Installer:
    return Installer(node.with_settings(**settings), pod_name="agent-1", pod_namespace="ns")


def _owned_on(node: Node, name: str = OWNED) -> Installer:
    return _agent(node, istioOwnedCNIConfig=True, istioOwnedCNIConfigFileName=name)


def _names(node: Node) -> list[str]:
    return sorted(os.listdir(node.conf_dir))


def _calico_changes(node: Node) -> dict[str, object]:
    """Calico rewrites its own file (a new MTU), keeping whatever else it finds there."""
    config = node.conf(PRIMARY)
    config["plugins"][0]["mtu"] = 8980
    (node.conf_dir / PRIMARY).write_text(json.dumps(config))
    return config


def test_the_owned_copy_names_its_primary(node: Node) -> None:
    node.write_primary(CALICO, PRIMARY)
    agent = _owned_on(node)
    agent.install()
    owned = node.conf(OWNED)
    assert owned[conflist.OWNED_COPY_KEY] == PRIMARY
    assert conflist.libcni_rejects(OWNED, (node.conf_dir / OWNED).read_bytes()) is None
    assert node.conf(PRIMARY) == CALICO


def test_turned_off_the_copy_goes_and_the_primary_gets_the_entry(node: Node) -> None:
    node.write_primary(CALICO, PRIMARY)
    _owned_on(node).install()
    new = _agent(node, istioOwnedCNIConfig=False)
    assert any(OWNED in p and "no longer" in p for p in new.problems())
    report = new.install()
    assert report.config_path == str(node.conf_dir / PRIMARY)
    assert str(node.conf_dir / OWNED) in report.changed
    assert _names(node) == [PRIMARY]
    assert node.conf(PRIMARY) == conflist.insert(CALICO, new.entry)
    assert new.problems() == []
    # The runtime now loads Calico's own file: a change there is kept, with our entry.
    changed = _calico_changes(node)
    new.install()
    assert node.conf(PRIMARY) == conflist.insert(changed, new.entry)
    new.uninstall()
    assert _names(node) == [PRIMARY] and node.conf(PRIMARY) == conflist.remove(changed)


def test_a_copy_left_behind_is_never_the_primary(node: Node) -> None:
    """Before the next install removes it, the plan already looks past it."""
    node.write_primary(CALICO, PRIMARY)
    _owned_on(node).install()
    new = _agent(node, istioOwnedCNIConfig=False)
    assert new.plan().target == PRIMARY
    named = _agent(node, istioOwnedCNIConfig=False, cniConfFileName="02-istio-cni.conf")
    with pytest.raises(TransientInstallError, match="waiting for primary CNI config"):
        named.plan()


def test_uninstall_with_the_option_off_removes_the_copy(node: Node) -> None:
    """The upgraded agent never ran install (or was killed before): its uninstall still finds
    the copy by its mark, whatever the settings name."""
    node.write_primary(CALICO, PRIMARY)
    _owned_on(node).install()
    _agent(node, istioOwnedCNIConfig=False).uninstall()
    assert _names(node) == [PRIMARY] and node.conf(PRIMARY) == CALICO


def test_renamed_the_old_copy_goes_and_the_new_one_is_made(node: Node) -> None:
    node.write_primary(CALICO, PRIMARY)
    _owned_on(node).install()
    renamed = _owned_on(node, "01-istio-owned.conflist")
    report = renamed.install()
    assert report.config_path == str(node.conf_dir / "01-istio-owned.conflist")
    assert _names(node) == ["01-istio-owned.conflist", PRIMARY]
    assert node.conf("01-istio-owned.conflist") == conflist.with_owned_copy_of(
        conflist.insert(CALICO, renamed.entry), PRIMARY
    )
    assert renamed.problems() == []
    # An agent still configured with the old name, uninstalling: no copy of either name stays.
    _owned_on(node).uninstall()
    assert _names(node) == [PRIMARY] and node.conf(PRIMARY) == CALICO


def test_turned_on_again_the_copy_is_made_from_the_current_primary(node: Node) -> None:
    node.write_primary(CALICO, PRIMARY)
    _owned_on(node).install()
    _agent(node, istioOwnedCNIConfig=False).install()
    changed = _calico_changes(node)
    again = _owned_on(node)
    report = again.install()
    assert report.config_path == str(node.conf_dir / OWNED)
    owned = node.conf(OWNED)
    assert owned == conflist.with_owned_copy_of(conflist.insert(changed, again.entry), PRIMARY)
    assert again.problems() == []
    again.uninstall()
    assert _names(node) == [PRIMARY] and node.conf(PRIMARY) == conflist.remove(changed)


def test_a_file_of_that_name_without_our_mark_is_not_ours(node: Node) -> None:
    """Another CNI's list that happens to carry the owned file's name is its primary, kept."""
    other = {**CALICO, "name": "other"}
    node.write_primary(CALICO, PRIMARY)
    node.write_primary(other, OWNED)
    agent = _agent(node, istioOwnedCNIConfig=False)
    assert agent.install().config_path == str(node.conf_dir / OWNED)
    agent.uninstall()
    assert _names(node) == [OWNED, PRIMARY] and node.conf(OWNED) == other


def test_a_symlink_to_a_marked_copy_is_not_removed(node: Node) -> None:
    node.write_primary(CALICO, PRIMARY)
    _owned_on(node).install()
    os.rename(node.conf_dir / OWNED, node.root / "kept.conflist")
    (node.conf_dir / OWNED).symlink_to(node.root / "kept.conflist")
    _agent(node, istioOwnedCNIConfig=False).install()
    assert (node.conf_dir / OWNED).is_symlink()


def test_a_copy_replaced_after_it_was_judged_stays(node: Node) -> None:
    """remove_if_unchanged: the file judged ours is removed, a file that took its place is not."""
    path = node.conf_dir / OWNED
    path.write_text("ours")
    judged = atomic.current_id(str(path))
    replacement = node.conf_dir / "new"
    replacement.write_text("theirs, written later")
    os.replace(replacement, path)
    assert not atomic.remove_if_unchanged(str(path), judged)
    assert path.read_text() == "theirs, written later"
    assert _names(node) == [OWNED]
    assert atomic.remove_if_unchanged(str(path), atomic.current_id(str(path)))
    assert _names(node) == []


def _unmarked_copy(node: Node, agent: Installer) -> None:
    """The owned copy as versions before the mark wrote it (and Istio's agent writes it)."""
    (node.conf_dir / OWNED).write_bytes(conflist.dumps(conflist.insert(CALICO, agent.entry)))


def test_an_unmarked_copy_at_the_default_name_is_known_as_ours(node: Node) -> None:
    """An upgrade from a version that did not mark its copy, the option turned off; the primary
    changed since the copy was made."""
    node.write_primary(CALICO, PRIMARY)
    new = _agent(node, istioOwnedCNIConfig=False)
    _unmarked_copy(node, new)
    changed = _calico_changes(node)
    assert new.plan().target == PRIMARY
    new.install()
    assert _names(node) == [PRIMARY]
    assert node.conf(PRIMARY) == conflist.insert(changed, new.entry)


def test_uninstall_removes_an_unmarked_copy(node: Node) -> None:
    node.write_primary(CALICO, PRIMARY)
    agent = _agent(node, istioOwnedCNIConfig=False)
    _unmarked_copy(node, agent)
    agent.uninstall()
    assert _names(node) == [PRIMARY] and node.conf(PRIMARY) == CALICO


def test_a_list_at_the_default_name_of_another_network_is_kept(node: Node) -> None:
    node.write_primary(CALICO, PRIMARY)
    agent = _agent(node, istioOwnedCNIConfig=False)
    other = conflist.insert({**CALICO, "name": "other-network"}, agent.entry)
    (node.conf_dir / OWNED).write_bytes(conflist.dumps(other))
    assert agent.install().config_path == str(node.conf_dir / OWNED)
    assert _names(node) == [OWNED, PRIMARY]
