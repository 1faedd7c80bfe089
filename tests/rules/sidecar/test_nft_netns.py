"""The nftables backend programs exactly Istio's native nftables rules.

For each of Istio's nftables cases: Istio's golden commands fed to `nft -f` in a blank network
namespace, and our backend applying the same configuration in another; `nft list ruleset` must
be equal in both (counters aside). Then CHECK sees them, a second apply replaces them (one
copy), and removal leaves the namespace empty.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.errors import RedirectError
from agent.rules import backend_nft
from agent.rules.cli import main as rules_main
from agent.rules.sidecar.apply import apply_rules, remove_rules, rules_present
from agent.rules.sidecar.flags import FLAGS, HOST_FLAGS, parse_flags, request_from_flags
from tests.rules.conftest import conformance_dir, golden_lines, read_args, read_env

pytestmark = pytest.mark.netns

CASES = sorted(
    p for p in (conformance_dir() / "nftables").iterdir() if (p / "golden.txt").is_file()
)


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"nftn-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield f"/var/run/netns/{name}"
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def _ruleset(path: str) -> str:
    done = subprocess.run(
        ["nsenter", f"--net={path}", "nft", "list", "ruleset"],
        capture_output=True,
        text=True,
        check=True,
    )
    return backend_nft.COUNTERS.sub("counter", done.stdout)


def _istio_ruleset(case: Path) -> str:
    """Istio's golden commands applied in a blank namespace, listed."""
    commands = "\n".join(golden_lines(case / "golden.txt")) + "\n"
    return backend_nft.expected_listing(commands)


def _config(case: Path):  # type: ignore[no-untyped-def]
    cfg = json.loads((case / "config.json").read_text())
    env = read_env(case / "env.txt")
    parsed = parse_flags(read_args(case / "args.txt"), FLAGS + HOST_FLAGS, env)
    servers = cfg.get("DNSServersV4", []) + cfg.get("DNSServersV6", [])
    return request_from_flags(parsed, env, ipv6=cfg["EnableIPv6"], dns_servers=servers).config


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_backend_programs_istio_rules(netns: str, case: Path) -> None:
    config = _config(case)
    assert config is not None
    try:
        want = _istio_ruleset(case)
    except RedirectError as e:
        # Istio's own rules name a group this host lacks (`java`): nft refuses them. Ours are
        # the same rules: refused too, and atomically (nothing half-applied, pod not started).
        assert "Group does not exist" in str(e)
        with pytest.raises(RedirectError, match="Group does not exist"):
            apply_rules(netns, config, backend="nftables")
        assert _ruleset(netns) == ""
        return
    assert "table inet istio-proxy-nat" in want
    assert apply_rules(netns, config, backend="nftables") == "nftables"
    assert _ruleset(netns) == want
    assert rules_present(netns, config, backend="nftables")
    apply_rules(netns, config, backend="nftables")  # again: replaced, not doubled
    assert _ruleset(netns) == want
    remove_rules(netns, backend="nftables")
    assert _ruleset(netns) == ""
    assert not rules_present(netns, config, backend="nftables")


def test_check_notices_a_changed_rule(netns: str) -> None:
    config = _config(conformance_dir() / "nftables" / "tproxy")
    apply_rules(netns, config, backend="nftables")
    subprocess.run(
        [
            "nsenter",
            f"--net={netns}",
            "nft",
            "flush",
            "chain",
            "inet",
            "istio-proxy-mangle",
            "istio-divert",
        ],
        check=True,
    )
    assert not rules_present(netns, config, backend="nftables")


def test_cli_output_applies_as_is(netns: str) -> None:
    """`rules --format=nft` is `nft -f` input: it applies, and lists as Istio's golden does."""
    import io
    from contextlib import redirect_stdout

    case = conformance_dir() / "nftables" / "ipv6-dns-outbound-owner-groups"
    cfg = json.loads((case / "config.json").read_text())
    out = io.StringIO()
    argv = [
        *read_args(case / "args.txt"),
        "--ipv6=true",
        "--format=nft",
        "--dns-servers=" + ",".join(cfg["DNSServersV4"] + cfg["DNSServersV6"]),
    ]
    with redirect_stdout(out):
        assert rules_main("rules", argv, read_env(case / "env.txt")) == 0
    # `java` is no group on this host: nft refuses Istio's rule exactly as it refuses ours.
    done = subprocess.run(
        ["nsenter", f"--net={netns}", "nft", "-f", "-"],
        input=out.getvalue(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0 and "java" in done.stderr
