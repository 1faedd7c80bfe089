"""The CNI STATUS verb as the container runtime calls it: containerd 2 (testbed/containerd2.py) and
Debian's 1.6 read a conf dir whose conflist chains our plugin (this checkout's, run by the
interpreter) after ptp and portmap (ci/go/cni-plugins: they speak CNI 1.1.0), the agent's socket
served by the real pod server or by nothing. The CRI's Status, what kubelet polls, is asked over
gRPC.

containerd 2 runs STATUS on every plugin of a 1.1.0 list at each Status and answers NetworkReady
false with the plugin's error: not ready while no agent serves or the agent answers not ready,
ready while it answers ready. A 1.0.0 list is never asked; containerd 1.6 never asks.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.podserver.server import PodServer
from plugin import wire
from testbed.containerd import Containerd, ContainerdDirs
from testbed.containerd2 import Containerd2
from testbed.parts import REPO_ROOT, cni_plugin_1_1
from testbed.wait import wait_for
from tests.install.test_kill_containerd import cri_status
from tests.podserver.helpers import InMemoryPods, ScriptedRedirector, build_rig, make_pod

pytestmark = pytest.mark.node

NOT_AVAILABLE = "the plugin is not available"  # the plugin's STATUS error (CNI code 11)


def conflist(version: str, run_dir: Path) -> dict[str, object]:
    return {
        "cniVersion": version,
        "name": "net",
        "plugins": [
            {
                "type": "ptp",
                "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.23.0.0/24"}]]},
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
            {"type": "istio-cni", "cni_agent_run_dir": str(run_dir)},
        ],
    }


Start = Callable[[type[Containerd], str], Containerd]


@pytest.fixture
def node() -> Iterator[tuple[Start, Path]]:
    """start(runtime class, cniVersion) -> that containerd on a conf dir holding the list; and
    the agent's run dir (nothing serves there yet). Every runtime started is stopped. Under a
    short dir: containerd's sockets must fit a socket address."""
    short = Path(tempfile.mkdtemp(prefix="ctrd-", dir="/tmp"))
    try:
        yield from _node(short)
    finally:
        shutil.rmtree(short, ignore_errors=True)


def _node(tmp_path: Path) -> Iterator[tuple[Start, Path]]:
    bin_dir, run_dir = tmp_path / "bin", tmp_path / "run"
    bin_dir.mkdir()
    run_dir.mkdir()
    for name in ("ptp", "host-local", "portmap"):
        (bin_dir / name).symlink_to(cni_plugin_1_1(name).require())
    plugin = bin_dir / "istio-cni"
    plugin.write_text(f'#!/bin/sh\nPYTHONPATH={REPO_ROOT} exec {sys.executable} -m plugin "$@"\n')
    plugin.chmod(0o755)
    started: list[Containerd] = []

    def start(kind: type[Containerd], version: str) -> Containerd:
        base = tmp_path / f"{kind.__name__[-1]}{version}"
        conf_dir = base / "net.d"
        conf_dir.mkdir(parents=True)
        (conf_dir / "10-net.conflist").write_text(json.dumps(conflist(version, run_dir)))
        runtime = kind(
            ContainerdDirs(base / "containerd"),
            base / "containerd.log",
            prefix=[],
            sandbox_image="registry.invalid/pause:never-pulled",
            cni_bin_dir=bin_dir,
            cni_conf_dir=conf_dir,
        )
        started.append(runtime)
        runtime.start()
        return runtime

    try:
        yield start, run_dir
    finally:
        for runtime in started:
            runtime.stop()


def network_ready(runtime: Containerd) -> tuple[bool, str]:
    """NetworkReady once the CNI config is loaded (before that it is false for that reason)."""

    def loaded() -> tuple[bool, str] | None:
        conditions, info = cri_status(runtime.dirs.socket)
        return conditions["NetworkReady"] if info.get("lastCNILoadStatus") == "OK" else None

    return wait_for(loaded, "containerd's CNI config loaded", 20, interval=0.2)


def test_containerd2_asks_status_of_a_1_1_list_and_reports_the_agent(
    node: tuple[Start, Path],
) -> None:
    start, run_dir = node
    runtime = start(Containerd2, "1.1.0")
    ready, message = network_ready(runtime)
    assert not ready and NOT_AVAILABLE in message, message

    rig = build_rig(InMemoryPods(make_pod()), ScriptedRedirector())
    server = PodServer(wire.socket_path(str(run_dir)), rig.handlers)
    server.start()
    try:
        assert network_ready(runtime) == (True, "")
        rig.not_ready.append("no ZDS peer")  # the agent's own readiness, as /v1/status gives it
        ready, message = network_ready(runtime)
        assert not ready and "istio-cni agent not ready: no ZDS peer" in message, message
        rig.not_ready.clear()
        assert network_ready(runtime) == (True, "")
    finally:
        server.stop()
    ready, message = network_ready(runtime)
    assert not ready and NOT_AVAILABLE in message, message


@pytest.mark.parametrize(
    ("kind", "version"), [(Containerd2, "1.0.0"), (Containerd, "1.1.0")], ids=["2-on-1.0.0", "1.6"]
)
def test_no_status_asked_of_an_older_list_or_by_containerd_1_6(
    node: tuple[Start, Path], kind: type[Containerd], version: str
) -> None:
    start, _ = node  # nothing serves the agent's socket
    assert network_ready(start(kind, version)) == (True, "")
