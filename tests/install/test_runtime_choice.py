"""The file the agent chains into is the one libcni would load (ConfFiles sorted by name, the
first that loads). Where the agent cannot read or edit that file, it refuses, naming it: never
chaining into a later file, which the runtime does not use."""

from __future__ import annotations

import json

import pytest

from agent.errors import InstallError
from agent.install import conflist
from agent.install.installer import Installer
from testbed.agent_host import Node

LIST = {"cniVersion": "0.4.0", "name": "net", "plugins": [{"type": "ptp"}, {"type": "portmap"}]}
LATER = "10-later.conflist"


def _non_utf8() -> bytes:
    return json.dumps({**LIST, "name": "net-X"}).encode().replace(b"net-X", b"net-\xff")


def _huge() -> bytes:
    return json.dumps({**LIST, "pad": "x" * (conflist.MAX_CONFIG_BYTES + 10)}).encode()


def _stray_type() -> bytes:
    return json.dumps({**LIST, "type": "bridge"}).encode()


def _surrogate() -> bytes:
    return b'{"cniVersion": "0.4.0", "name": "n\\ud800", "type": "bridge"}'


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("05-net.conflist", _non_utf8(), "not UTF-8"),
        ("05-net.conflist", _huge(), "larger than"),
        ("05-net.conflist", _stray_type(), "top-level type"),
        ("05-net.conf", _surrogate(), "surrogate"),
    ],
    ids=["non-utf8", "over-1mib", "conflist-with-type", "surrogate-escape"],
)
def test_a_file_libcni_loads_but_the_agent_cannot_edit_is_refused(
    node: Node, name: str, content: bytes, message: str
) -> None:
    (node.conf_dir / name).write_bytes(content)
    (node.conf_dir / LATER).write_text(json.dumps(LIST))
    installer = Installer(node.settings, pod_name="agent-1", pod_namespace="istio-system")
    with pytest.raises(InstallError) as err:
        installer.install()
    assert f"{node.conf_dir / name}: the runtime may load this file, but" in str(err.value)
    assert message in str(err.value)
    assert node.conf(LATER) == LIST  # never chained into the file the runtime does not use
    assert (node.conf_dir / name).read_bytes() == content
    assert any(str(node.conf_dir / name) in p for p in installer.problems())


def test_a_symlink_to_a_node_path_is_the_runtimes_choice(node: Node) -> None:
    """A symlink to an absolute node path cannot be followed in the container, but the runtime
    follows it on the node."""
    target = "/etc/cni/net.d.node-only/05-net.conflist"
    (node.conf_dir / "05-net.conflist").symlink_to(target)
    (node.conf_dir / LATER).write_text(json.dumps(LIST))
    installer = Installer(node.settings, pod_name="agent-1", pod_namespace="istio-system")
    with pytest.raises(InstallError) as err:
        installer.install()
    assert f"{node.conf_dir / '05-net.conflist'}: is a symlink to {target}" in str(err.value)
    assert node.conf(LATER) == LIST
    assert any(target in p for p in installer.problems())


def test_a_dangling_named_primary_is_refused(node: Node) -> None:
    target = "/etc/cni/net.d.node-only/10-net.conflist"
    (node.conf_dir / "10-net.conflist").symlink_to(target)
    installer = Installer(
        node.with_settings(cniConfFileName="10-net.conflist"),
        pod_name="agent-1",
        pod_namespace="istio-system",
    )
    with pytest.raises(InstallError, match="is a symlink to " + target):
        installer.install()


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"{", "not valid JSON"),
        (b'{"cniVersion": "0.4.0", "plugins": [{"type": "ptp"}]}', "without a string name"),
        (b'{"name": "n", "plugins": []}', "empty list"),
        (b"\xef\xbb\xbf" + json.dumps(LIST).encode(), "not valid JSON"),
    ],
    ids=["truncated", "no-name", "no-plugins", "bom"],
)
def test_files_libcni_rejects_are_skipped_as_the_runtime_skips_them(
    node: Node, content: bytes, why: str
) -> None:
    assert why in str(conflist.libcni_rejects("05-net.conflist", content))
    (node.conf_dir / "05-net.conflist").write_bytes(content)
    (node.conf_dir / LATER).write_text(json.dumps(LIST))
    installer = Installer(node.settings, pod_name="agent-1", pod_namespace="istio-system")
    assert installer.install().config_path == str(node.conf_dir / LATER)
    assert (node.conf_dir / "05-net.conflist").read_bytes() == content
