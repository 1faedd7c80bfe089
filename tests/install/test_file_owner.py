"""A node's file we rewrite keeps its owner, group, mode and SELinux label: its owner (a CNI
running as another user, say) must still be able to rewrite it."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

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


REWRITE = """
import sys
from agent.install.atomic import atomic_write
atomic_write(sys.argv[1], b'{"rewritten": true}', keep_mode=True)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the file is another user's")
def test_a_rewrite_keeps_the_owner_without_cap_fowner(tmp_path: pathlib.Path) -> None:
    """The chart gives the agent CAP_CHOWN but not CAP_FOWNER: once the temp file is another
    user's, root may no longer change its mode, so the owner must come last."""
    path = tmp_path / "10-net.conflist"
    path.write_text("{}")
    os.chown(path, 1234, 5678)
    os.chmod(path, 0o640)
    # capsh runs bash with CAP_FOWNER gone from its bounding set: the python it execs has not
    # got it either, as the agent in its container has not.
    command = [sys.executable, "-c", REWRITE, str(path)]
    done = subprocess.run(
        ["capsh", "--drop=cap_fowner", "--", "-c", 'exec "$@"', "capsh", *command],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).parents[2])},
    )
    assert done.returncode == 0, done.stderr
    st = os.stat(path)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (1234, 5678, 0o640)
    assert path.read_text() == '{"rewritten": true}'
