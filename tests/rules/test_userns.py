"""A sidecar's rules in a network namespace owned by a user namespace of its own (a
user-namespaced pod's, `hostUsers: false`, as containerd 2 makes it): every backend programs
them, the owner match names the proxy's uid as the pod sees it (1337 inside, an unprivileged uid
outside), and only the pod's own traffic is redirected, the proxy's not."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent.netns import run_command
from agent.rules.sidecar.apply import apply_rules, rules_present
from agent.rules.sidecar.capture import CaptureConfig
from testbed import netns
from testbed.userns import UsernsNetns, userns_netns

pytestmark = pytest.mark.netns

OUTSIDE = ("203.0.113.10", 80)  # TEST-NET-3, routed via a gateway nobody is: nothing answers
CONNECT = [
    "python3",
    "-c",
    "import socket\n"
    "s = socket.socket()\n"
    "s.settimeout(1)\n"
    "try:\n"
    f"    s.connect({OUTSIDE!r})\n"
    "    print('connected')\n"
    "except OSError as e:\n"
    "    print(type(e).__name__)\n",
]


@pytest.fixture
def pod_userns() -> Iterator[UsernsNetns]:
    with userns_netns() as ns:
        name = ns.path.name
        netns.ip("link", "add", "d0", "type", "veth", "peer", "name", "d1", netns=name)
        netns.ip("addr", "add", "192.0.2.2/24", "dev", "d0", netns=name)
        for link in ("d0", "d1"):
            netns.ip("link", "set", link, "up", netns=name)
        netns.ip("route", "add", "default", "via", "192.0.2.1", netns=name)
        yield ns


@pytest.mark.parametrize(
    "backend", ["iptables-nft", "iptables-legacy", "python-iptables", "nftables"]
)
def test_rules_in_a_user_namespaced_pod(pod_userns: UsernsNetns, backend: str) -> None:
    path = str(pod_userns.path)
    config = CaptureConfig(inbound_ports_include="*", outbound_ip_ranges_include="*")
    assert apply_rules(path, config, backend=backend) == backend
    assert rules_present(path, config, backend=backend)
    if backend != "nftables":
        variant = "nft" if backend == "iptables-nft" else "legacy"
        saved = run_command(path, [f"iptables-{variant}-save", "-t", "nat"]).stdout
        assert "--uid-owner 1337" in saved, saved
    # The pod's root is redirected to the (absent) proxy: refused at once; the proxy's uid
    # goes out (no gateway answers).
    app = pod_userns.run_as(0, CONNECT)
    assert app.stdout.strip() == "ConnectionRefusedError", app
    proxy = pod_userns.run_as(1337, CONNECT)
    assert proxy.stdout.strip() == "TimeoutError", proxy
