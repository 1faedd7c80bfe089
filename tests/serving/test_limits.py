"""The bounds in agent.serving.limits: what they are set to, and the descriptor limit raised."""

from __future__ import annotations

import resource
import subprocess
import sys

from agent.serving import limits
from plugin import wire
from testbed.parts import REPO_ROOT


def test_pod_socket_takes_the_bodies_the_plugin_sends() -> None:
    assert limits.POD_SOCKET.max_body_bytes == wire.MAX_BODY
    # Every pod of a full node (110) can be answered side by side, with room to spare.
    assert 110 <= limits.POD_WORKERS < limits.POD_SOCKET.max_connections


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    script = (
        "import resource\n"
        "from agent.serving.limits import raise_descriptor_limit\n"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, (256, {hard}))\n"
        "print(*raise_descriptor_limit(), *resource.getrlimit(resource.RLIMIT_NOFILE))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
        cwd=REPO_ROOT,
    )
    assert done.stdout.split() == [str(hard)] * 4
