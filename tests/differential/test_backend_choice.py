"""Differential: the `auto` backend's choice against Istio's own, per family, on namespace states.

For each state (legacy tables present or not, empty or holding rules, in either family; nft rules
beside them), two namespaces are built alike: in one, Istio's `pilot-agent istio-iptables` (its
DetectIptablesVersion, then its rules, both families: the namespace has an IPv4 and an IPv6
address and ISTIO_DUAL_STACK is on) programs the capture, and the variant whose tables then hold
ISTIO_OUTPUT is Istio's choice for that family; in the other, the agent's `auto` decides. Istio
decides this way in the pod's namespace (sidecar plugin) and, once at start, in the node's
(ambient), which agent.rules.backend_pin pins for the boot.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable, Iterator

import pytest

from agent.rules.backends import FamilyChoice, choose
from testbed.istio_binaries import pilot_agent

pytestmark = pytest.mark.differential

STATES: dict[str, list[str]] = {
    "fresh": [],
    "empty-legacy-ipv4-nat": ["iptables-legacy -t nat -L -n"],
    "empty-legacy-ipv4-filter": ["iptables-legacy -t filter -L -n"],
    "legacy-ipv4-rule": ["iptables-legacy -A INPUT -p 253 -j ACCEPT"],
    "empty-legacy-ipv6-nat": ["ip6tables-legacy -t nat -L -n"],
    "legacy-ipv6-rule": ["ip6tables-legacy -A INPUT -p 253 -j ACCEPT"],
    "legacy-both": ["iptables-legacy -t mangle -L -n", "ip6tables-legacy -A OUTPUT -j ACCEPT"],
    "nft-rules-only": ["iptables-nft -A INPUT -p 253 -j ACCEPT", "ip6tables-nft -t nat -L -n"],
    "nft-and-empty-legacy": ["iptables-nft -A INPUT -p 253 -j ACCEPT", "iptables-legacy -L -n"],
}

ISTIO_ARGS = ["istio-iptables", "-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT"]
ISTIO_ARGS += ["-i", "*", "-b", "*"]


def _sh(*argv: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {done.stdout}{done.stderr}")
    return done.stdout


MakeNetns = Callable[[list[str]], str]


@pytest.fixture
def make_netns() -> Iterator[MakeNetns]:
    made: list[str] = []

    def make(state: list[str]) -> str:
        name = f"bk-{uuid.uuid4().hex[:10]}"
        _sh("ip", "netns", "add", name)
        made.append(name)
        for cmd in (
            "ip link add d0 type veth peer name d1",
            "ip link set d1 up",
            "ip addr add 10.44.0.2/24 dev d0",
            "ip -6 addr add fd00:44::2/64 dev d0 nodad",
            "ip link set d0 up",
            "ip link set lo up",
            *state,
        ):
            _sh("ip", "netns", "exec", name, *cmd.split())
        return name

    yield make
    for name in made:
        subprocess.run(["ip", "netns", "delete", name], check=False, timeout=30)


def _istio_choice(name: str) -> FamilyChoice:
    env = dict(os.environ, ISTIO_DUAL_STACK="true")
    _sh("ip", "netns", "exec", name, str(pilot_agent().require()), *ISTIO_ARGS, env=env)
    chosen: dict[int, str] = {}
    for family, prefix in ((4, "iptables"), (6, "ip6tables")):
        found = [
            variant
            for variant in ("legacy", "nft")
            if ":ISTIO_OUTPUT" in _sh("ip", "netns", "exec", name, f"{prefix}-{variant}-save")
        ]
        assert len(found) == 1, f"Istio's IPv{family} rules found in {found or 'no variant'}"
        chosen[family] = f"iptables-{found[0]}"
    return FamilyChoice(chosen[4], chosen[6])


@pytest.mark.parametrize("state", sorted(STATES), ids=str)
def test_auto_chooses_as_istio_per_family(make_netns: MakeNetns, state: str) -> None:
    istio_ns, our_ns = make_netns(STATES[state]), make_netns(STATES[state])
    ours = choose(f"/var/run/netns/{our_ns}", "auto")
    assert ours == _istio_choice(istio_ns)
