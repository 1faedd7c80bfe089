"""Ambient mode's rules: every Istio ambient golden through `rules --ambient`, and bad flags."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agent.rules.ambient.builder import pod_rules, redirect_dns
from agent.rules.ambient.options import PodRuleOptions
from agent.rules.render_save import save_tables
from tests.conformance_data import AMBIENT_DIR
from tests.rules.conftest import golden_lines, run_rules

CASES = sorted(p for p in AMBIENT_DIR.iterdir() if (p / "golden.txt").is_file())


def ambient_argv(case: dict[str, object]) -> list[str]:
    """The command line check.py builds for a case (see ambient/README.md)."""

    def tf(value: object) -> str:
        return "true" if value else "false"

    argv = [
        "--ambient",
        str(case["target"]),
        f"--ipv6={tf(case['ipv6'])}",
        f"--redirect-dns={tf(case['redirectDNS'])}",
        f"--probe-snat={case['probeSNAT']}",
        f"--probe-snat-v6={case['probeSNATv6']}",
    ]
    if case.get("ingress"):
        argv.append("--ingress")
    interfaces = case.get("virtualInterfaces")
    if isinstance(interfaces, list) and interfaces:
        argv.append("--virtual-interfaces=" + ",".join(interfaces))
    if case.get("dnsProxy"):
        argv.append(f"--dns-proxy={case['dnsProxy']}")
    return argv


def test_every_istio_ambient_golden_is_here() -> None:
    # Istio's cni/pkg/iptables/testdata: 6 in-pod cases and 1 host case, each IPv4 and IPv6.
    assert len(CASES) == 14, [p.name for p in CASES]
    listed = re.findall(r"^- `([^`]+)`$", (AMBIENT_DIR / "ORIGIN.md").read_text(), re.M)
    assert len(listed) == 8
    assert all((AMBIENT_DIR / name / "golden.txt").is_file() for name in listed)


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_ambient_case(case: Path) -> None:
    got = run_rules(ambient_argv(json.loads((case / "case.json").read_text())))
    assert got.code == 0, got.stderr
    assert got.stdout.strip().splitlines() == golden_lines(case / "golden.txt")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ambient", "node"], "--ambient: invalid value 'node'"),
        (["--ambient=pod", "--ipv6=maybe"], "--ipv6: invalid value"),
        (["--ambient=pod", "--dns-proxy=on"], "--dns-proxy: invalid value 'on'"),
        (["--ambient=pod", "--probe-snat=fd00::1"], "--probe-snat: invalid value 'fd00::1'"),
        (["--ambient=host", "--probe-snat-v6=1.2.3.4"], "--probe-snat-v6: invalid value"),
        (["--ambient=pod", "--redirect-mode=TPROXY"], "--redirect-mode: unknown"),
        (["--ambient=pod", "--config", "/nonexistent/config.yaml"], "config file not found"),
    ],
    ids=["target", "ipv6", "dns-proxy", "probe-snat", "probe-snat-v6", "unknown", "config"],
)
def test_bad_flags_name_the_flag(argv: list[str], message: str) -> None:
    got = run_rules(argv)
    assert got.code == 2 and got.stdout == ""
    assert message in got.stderr


def test_defaults_come_from_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("ambient:\n  ipv6: false\n  dnsCapture: false\n")
    got = run_rules(["--ambient=pod", "--config", str(config)])
    assert got.code == 0, got.stderr
    text = got.stdout
    assert "* raw" not in text and "15053" not in text and "::1/128" not in text
    on = run_rules(["--ambient=pod"])  # the default config: IPv6 and DNS capture on
    assert "* raw" in on.stdout and "::1/128" in on.stdout


@pytest.mark.parametrize(
    ("node", "pod", "want"),
    [(True, None, True), (False, None, False), (True, "disabled", False), (False, "enabled", True)],
)
def test_pod_dns_setting_wins(node: bool, pod: str | None, want: bool) -> None:
    options = PodRuleOptions(redirect_dns=node, dns_proxy=pod)  # type: ignore[arg-type]
    assert redirect_dns(options) is want


def test_save_form_is_what_the_kernel_prints() -> None:
    # The read-back comparison (present, tests) needs the kernel's spelling of ambient's rules.
    nat = save_tables(pod_rules(PodRuleOptions(ipv6=False)).v4, family=4)["nat"]
    assert nat["ISTIO_PRERT"][1] == (
        "-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp -m tcp ! --dport 15008 -m mark ! --mark "
        "0x539/0xfff -j REDIRECT --to-ports 15006"
    )
    assert nat["ISTIO_OUTPUT"][1] == (
        "-A ISTIO_OUTPUT ! -o lo -p udp -m mark ! --mark 0x539/0xfff -m udp --dport 53 "
        "-j REDIRECT --to-ports 15053"
    )
