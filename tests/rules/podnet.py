"""Real network namespaces for redirect tests: a pod namespace wired by veth to a peer.

Every test gets its own uniquely named pair (deleted even when the test fails) and a small
server process in each namespace that answers TCP and UDP on the ports the test needs with a
label and the local address it saw, so a client can tell where its connection landed.
The `podnet` fixture is re-exported by this directory's conftest.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent.netns import setns

SERVER = Path(__file__).with_name("echo_server.py")
CLIENT = Path(__file__).with_name("echo_client.py")
PROXY_UID = 1337
UNPRIVILEGED_PYTHON = "/usr/bin/python3"


def _require_parts() -> None:
    if os.geteuid() != 0:
        pytest.fail("netns tests need root (network namespaces, iptables, nft)")
    if not os.access(UNPRIVILEGED_PYTHON, os.X_OK):
        pytest.fail(f"netns tests need {UNPRIVILEGED_PYTHON} (Debian python3) for UID 1337")
    for tool in ("ip", "iptables-legacy-restore", "iptables-nft-restore", "nft"):
        if shutil.which(tool) is None:
            pytest.fail(f"netns tests need {tool!r} on PATH (Debian iptables/nftables/iproute2)")


def sh(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


@dataclass
class PodNet:
    """pod and peer namespaces; the pod is 10.x.y.2 / fdxx::2, the peer .1 / ::1."""

    pod: str
    peer: str
    pod_ip: str
    peer_ip: str
    pod_ip6: str
    peer_ip6: str
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def pod_path(self) -> str:
        return f"/var/run/netns/{self.pod}"

    @property
    def peer_path(self) -> str:
        return f"/var/run/netns/{self.peer}"

    def serve(self, ns_path: str, specs: list[str]) -> subprocess.Popen[str]:
        """Start an echo server in the namespace; specs like 'tcp:15001:proxy[:transparent]'."""
        proc = subprocess.Popen(
            [sys.executable, str(SERVER), *specs],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_enter(ns_path, None),
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if line != "ready":
            proc.kill()
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"echo server failed: {line} {err}")
        return proc

    def call(
        self, ns_path: str, proto: str, host: str, port: int, *, uid: int | None = None
    ) -> str:
        """Connect (or send a datagram) from inside `ns_path`; returns the server's answer."""
        # The proxy UID cannot read root's home: run the system interpreter, code inline.
        python = sys.executable if uid is None else UNPRIVILEGED_PYTHON
        done = subprocess.run(
            [python, "-I", "-c", CLIENT.read_text(), proto, host, str(port)],
            capture_output=True,
            text=True,
            timeout=20,
            preexec_fn=_enter(ns_path, uid),
        )
        return done.stdout.strip() or f"error: {done.stderr.strip()[-200:]}"


_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def _enter(ns_path: str, uid: int | None):  # type: ignore[no-untyped-def]
    def enter() -> None:
        # Die with the test process, even when it is killed before its clean-up runs.
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        fd = os.open(ns_path, os.O_RDONLY)
        try:
            setns(fd)
        finally:
            os.close(fd)
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)

    return enter


@pytest.fixture
def podnet() -> Iterator[PodNet]:
    _require_parts()
    tag = uuid.uuid4().hex[:8]
    subnet = int(tag[:2], 16)
    net = PodNet(
        pod=f"icni-pod-{tag}",
        peer=f"icni-peer-{tag}",
        pod_ip=f"10.231.{subnet}.2",
        peer_ip=f"10.231.{subnet}.1",
        # Canonical spelling, as the kernel reports it back (no leading zeros).
        pod_ip6=str(ipaddress.ip_address(f"fd31:{tag[:4]}::2")),
        peer_ip6=str(ipaddress.ip_address(f"fd31:{tag[:4]}::1")),
    )
    created: list[str] = []
    try:
        for name in (net.pod, net.peer):
            sh("ip", "netns", "add", name)
            created.append(name)
            sh("ip", "-n", name, "link", "set", "lo", "up")
        veth_pod, veth_peer = f"vp{tag}", f"vq{tag}"
        sh("ip", "link", "add", veth_pod, "type", "veth", "peer", "name", veth_peer)
        sh("ip", "link", "set", veth_pod, "netns", net.pod)
        sh("ip", "link", "set", veth_peer, "netns", net.peer)
        for ns, dev, ip4, ip6 in (
            (net.pod, veth_pod, net.pod_ip, net.pod_ip6),
            (net.peer, veth_peer, net.peer_ip, net.peer_ip6),
        ):
            sh("ip", "-n", ns, "link", "set", dev, "name", "eth0")
            sh("ip", "-n", ns, "addr", "add", f"{ip4}/24", "dev", "eth0")
            sh("ip", "-n", ns, "addr", "add", f"{ip6}/64", "dev", "eth0", "nodad")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
        yield net
    finally:
        for proc in net.procs:
            proc.kill()
            proc.wait(timeout=10)
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        for name in created:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
