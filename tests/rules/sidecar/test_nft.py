"""`rules --format=nft`: Istio's native nftables commands, line for line as Istio's goldens.

The cases (tests/testdata/istio-conformance/nftables) are Istio's own: the iptables case's
inputs run through `istio-iptables --native-nftables`. The unit tests pin the parts of Istio's
transaction the goldens do not all show (insert positions, cleanup, chains without rules).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.rules import nft
from agent.rules.nft import NftRule
from agent.rules.sidecar.capture import CaptureConfig
from agent.rules.sidecar.nft import CHAINS, render_native
from tests.rules.conftest import conformance_dir, golden_lines, read_args, read_env, run_rules

CASES = sorted(
    p for p in (conformance_dir() / "nftables").iterdir() if (p / "golden.txt").is_file()
)


def test_all_nftables_cases_are_here() -> None:
    assert len(CASES) >= 13, f"nftables cases missing under {conformance_dir() / 'nftables'}"


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_nftables_case(case: Path) -> None:
    config = json.loads((case / "config.json").read_text())
    dns = ",".join(config.get("DNSServersV4", []) + config.get("DNSServersV6", []))
    ipv6 = "true" if config["EnableIPv6"] else "false"
    argv = [*read_args(case / "args.txt"), f"--ipv6={ipv6}", f"--dns-servers={dns}", "--format=nft"]
    got = run_rules(argv, read_env(case / "env.txt"))
    assert got.code == 0, got.stderr
    assert got.stdout.strip().splitlines() == golden_lines(case / "golden.txt")


def test_native_nftables_flag_selects_nft_output() -> None:
    got = run_rules(["--native-nftables", "--ipv6=false", "--dns-servers="])
    assert got.code == 0, got.stderr
    assert got.stdout.startswith("add table inet istio-proxy-nat\n")
    assert "-A " not in got.stdout


def test_cleanup_only_deletes_each_table() -> None:
    got = run_rules(["--native-nftables", "--cleanup-only", "--ipv6=false", "--dns-servers="])
    assert got.code == 0, got.stderr
    assert got.stdout.splitlines() == [
        f"{verb} table inet istio-proxy-{t}"
        for t in ("nat", "mangle", "raw")
        for verb in ("add", "delete")
    ]


def test_skip_rule_apply_prints_nothing() -> None:
    got = run_rules(["--native-nftables", "--cleanup-only", "--skip-rule-apply", "--ipv6=false"])
    assert (got.code, got.stdout) == (0, "")


def test_insert_into_short_chain_becomes_append() -> None:
    """nft rejects `insert ... index N` past the chain's end; Istio appends instead."""
    rules = [
        NftRule("mangle", "istio-inbound", "counter return", 0),
        NftRule("mangle", "istio-inbound", "counter accept", 5),
        NftRule("mangle", "istio-inbound", "counter drop", 1),
    ]
    got = nft.commands(rules, prefix=nft.SIDECAR_PREFIX, chains=CHAINS, jumped_to=False)
    assert got.splitlines()[3:] == [
        "add rule inet istio-proxy-mangle istio-inbound counter return",
        "add rule inet istio-proxy-mangle istio-inbound counter accept",
        "insert rule inet istio-proxy-mangle istio-inbound index 1 counter drop",
    ]


def test_only_chains_with_rules_are_declared() -> None:
    text = render_native(CaptureConfig())
    assert "add chain inet istio-proxy-nat prerouting" not in text  # no inbound capture
    assert "istio-proxy-mangle" not in text and "istio-proxy-raw" not in text
    assert "add chain inet istio-proxy-nat output { type nat hook output priority -100 ; }" in text
