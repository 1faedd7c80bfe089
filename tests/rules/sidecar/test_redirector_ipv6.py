"""IPv6 rules in a real pod netns, decided as Istio's plugin decides: ISTIO_DUAL_STACK on the
proxy and the netns's own addresses (RulesRedirector.apply: look, decide, apply). No traffic is
sent: the test reads which families got rules."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.netns import run_in_netns
from agent.netns.look import look_here
from agent.rules.sidecar.redirector import RulesRedirector
from testbed import netns
from tests.podserver.helpers import make_pod

pytestmark = pytest.mark.netns

V4, V6 = "10.231.77.2", "fd31:77::2"


def _ip(name: str, *args: str) -> None:
    subprocess.run(["ip", "-n", name, *args], check=True, capture_output=True, timeout=30)


def _pod_netns(families: tuple[int, ...]) -> Iterator[Path]:
    """A netns with a veth pair (both ends inside) holding the pod's addresses."""
    name = netns.unique_name("ipv6")
    path = netns.add(name)
    try:
        _ip(name, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
        if 4 in families:
            _ip(name, "addr", "add", f"{V4}/24", "dev", "eth0")
        if 6 in families:
            _ip(name, "addr", "add", f"{V6}/64", "dev", "eth0", "nodad")
        for dev in ("eth0", "eth0p"):
            _ip(name, "link", "set", dev, "up")
        yield path
    finally:
        netns.delete(name)


@pytest.fixture
def dual_netns() -> Iterator[Path]:
    yield from _pod_netns((4, 6))


@pytest.fixture
def v6_netns() -> Iterator[Path]:
    yield from _pod_netns((6,))


def nat_rules(path: Path, tool: str) -> str:
    found = shutil.which(tool)
    assert found, f"{tool} is missing: install it with ci/setup-apt"
    done = subprocess.run(
        ["ip", "netns", "exec", path.name, found, "-t", "nat"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return done.stdout


def sidecar(dual_stack: str | None) -> dict[str, object]:
    pod = make_pod()
    if dual_stack is not None:
        proxy = pod["spec"]["containers"][1]
        proxy["env"] = [{"name": "ISTIO_DUAL_STACK", "value": dual_stack}]
    return pod


def families_with_rules(path: Path) -> set[int]:
    found = set()
    if "ISTIO_REDIRECT" in nat_rules(path, "iptables-nft-save"):
        found.add(4)
    if "ISTIO_REDIRECT" in nat_rules(path, "ip6tables-nft-save"):
        found.add(6)
    return found


def test_the_look_sees_both_families(dual_netns: Path) -> None:
    look = run_in_netns(str(dual_netns), look_here)
    assert look.ipv4_addresses == ("127.0.0.1", V4)
    assert V4 in look.addresses and V6 in look.addresses
    assert look.addresses.index(V4) < look.addresses.index(V6)


@pytest.mark.parametrize(
    ("dual_stack", "families"),
    [("true", {4, 6}), (None, {4}), ("false", {4})],
    ids=["dual-stack-true", "dual-stack-unset", "dual-stack-false"],
)
def test_dual_stack_pod(dual_netns: Path, dual_stack: str | None, families: set[int]) -> None:
    redirector = RulesRedirector(exclude_namespaces=(), backend="iptables-nft")
    pod = sidecar(dual_stack)
    redirector.apply(str(dual_netns), pod)
    assert families_with_rules(dual_netns) == families
    assert redirector.present(str(dual_netns), pod) is True


def test_single_stack_ipv6_pod_gets_ipv6_rules_without_the_env(v6_netns: Path) -> None:
    redirector = RulesRedirector(exclude_namespaces=(), backend="iptables-nft")
    redirector.apply(str(v6_netns), sidecar(None))
    assert families_with_rules(v6_netns) == {4, 6}
