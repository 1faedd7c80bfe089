"""A node's file we rewrite keeps its owner, group, mode and SELinux label: its owner (a CNI
running as another user, say) must still be able to rewrite it."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from agent.install.installer import Installer
from testbed.agent_host import Node

LIST = {"cniVersion": "0.4.0", "name": "net", "plugins": [{"type": "ptp"}]}
SINGLE = {"cniVersion": "0.4.0", "name": "net", "type": "bridge"}
LABEL = b"system_u:object_r:container_file_t:s0\0"


def _own(path: pathlib.Path) -> tuple[int, int, int, bytes]:
    st = os.stat(path)
    return st.st_uid, st.st_gid, st.st_mode & 0o7777, os.getxattr(path, "security.selinux")


@pytest.mark.parametrize(
    ("name", "content", "result"),
    [
        ("10-net.conflist", LIST, "10-net.conflist"),
        ("10-net.conf", SINGLE, "10-net.conflist"),
    ],
    ids=["conflist", "conf-to-conflist"],
)
def test_install_and_uninstall_keep_owner_mode_and_label(
    node: Node, name: str, content: dict[str, object], result: str
) -> None:
    # Another owner as root (as the agent runs); without root only the mode and label tell.
    uid, gid = (1234, 5678) if os.geteuid() == 0 else (os.geteuid(), os.getegid())
    path = node.conf_dir / name
    path.write_text(json.dumps(content))
    os.chown(path, uid, gid)
    os.chmod(path, 0o640)
    os.setxattr(path, "security.selinux", LABEL)
    want = (uid, gid, 0o640, LABEL)
    installer = Installer(node.settings, pod_name="agent-1", pod_namespace="istio-system")
    installer.install()
    assert _own(node.conf_dir / result) == want
    installer.uninstall()
    assert _own(path) == want
