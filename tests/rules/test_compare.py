"""agent.rules.compare: the rules in a namespace against what the agent would program, each
missing or extra rule named: the pure diff, and real namespaces for each backend."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agent.rules import compare
from agent.rules.sidecar.redirector import RulesRedirector
from tests.podserver.helpers import make_pod

BACKENDS = ["iptables-nft", "iptables-legacy", "nftables"]
REDIRECT = "ipv4 nat -A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001"
NFT_REDIRECT = "inet istio-proxy-nat istio-redirect: meta l4proto tcp counter redirect to :15001"


def test_diff_names_missing_extra_and_reordered_rules() -> None:
    want = ["ipv4 nat :A", "ipv4 nat -A A -j X", "ipv4 nat -A A -j Y"]
    assert compare._diff("b", want, list(want)).same
    diff = compare._diff("b", want, ["ipv4 nat :A", "ipv4 nat -A A -j Y", "ipv4 nat -A A -j Z"])
    assert (diff.missing, diff.extra) == (("ipv4 nat -A A -j X",), ("ipv4 nat -A A -j Z",))
    swapped = compare._diff("b", want, ["ipv4 nat :A", "ipv4 nat -A A -j Y", "ipv4 nat -A A -j X"])
    assert (swapped.missing, swapped.extra, swapped.reordered) == ((), (), ("ipv4 nat A",))
    # Chains declared in another order (iptables-save sorts them) are the same rules.
    declared = ["ipv4 nat :B", *want]
    assert compare._diff("b", ["ipv4 nat :A", "ipv4 nat :B", *want[1:]], declared).same
    twice = compare._diff("b", want, [*want, "ipv4 nat -A A -j Y"])  # a duplicate is extra
    assert twice.extra == ("ipv4 nat -A A -j Y",)


def test_nft_lines_carry_their_table_and_chain() -> None:
    listing = (
        "table inet t {\n\tchain c {\n\t\ttype nat hook output priority 0;\n\t\treturn\n\t}\n}\n"
    )
    assert compare._nft_lines(listing) == [
        "inet t",
        "inet t c:",
        "inet t c: type nat hook output priority 0;",
        "inet t c: return",
    ]


def run(path: Path, *argv: str) -> None:
    subprocess.run(["ip", "netns", "exec", path.name, *argv], check=True, capture_output=True)


def tamper(path: Path, backend: str) -> tuple[str, str]:
    """Take out the redirect to 15001, add a rule of our chain's: (missing line, extra line)."""
    if backend == "nftables":
        run(path, "nft", "flush", "chain", "inet", "istio-proxy-nat", "istio-redirect")
        run(path, "nft", "add", "rule", "inet", "istio-proxy-nat", "istio-redirect", "return")
        return NFT_REDIRECT, "inet istio-proxy-nat istio-redirect: return"
    tool = "iptables-legacy" if backend == "iptables-legacy" else "iptables-nft"
    run(path, tool, "-t", "nat", "-D", "ISTIO_REDIRECT", "-p", "tcp", "-j", "REDIRECT",
        "--to-ports", "15001")  # fmt: skip
    run(path, tool, "-t", "nat", "-A", "ISTIO_REDIRECT", "-p", "udp", "-j", "RETURN")
    return REDIRECT, "ipv4 nat -A ISTIO_REDIRECT -p udp -j RETURN"


@pytest.mark.netns
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_real_namespace_compared_rule_by_rule(pod_netns: Path, backend: str) -> None:
    redirector = RulesRedirector(exclude_namespaces=(), backend=backend)
    pod = make_pod()
    none_yet = redirector.compare(str(pod_netns), pod)
    assert REDIRECT in none_yet.missing or NFT_REDIRECT in none_yet.missing, none_yet
    assert none_yet.backend == backend and not none_yet.extra

    redirector.apply(str(pod_netns), pod)
    assert redirector.compare(str(pod_netns), pod).same

    missing, extra = tamper(pod_netns, backend)
    diff = redirector.compare(str(pod_netns), pod)
    assert (diff.missing, diff.extra) == ((missing,), (extra,)), diff

    # A pod the agent would skip gets none of ours: every rule there is extra.
    skipped = redirector.compare(str(pod_netns), make_pod(sidecar=False))
    assert not skipped.missing and extra in skipped.extra, skipped
