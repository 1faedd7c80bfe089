"""Inputs Istio's istio-iptables accepts and writes in its own way; ours must write the same.

Each case was found by the differential tier (tests/differential) against Istio's own binary.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.rules.sidecar import hostfacts
from tests.rules.conftest import run_rules

BASE = ["-n", "--ipv6=false", "--dns-servers="]


def _lines(argv: list[str], env: dict[str, str] | None = None) -> list[str]:
    out = run_rules(BASE + argv, env)
    assert out.code == 0, out.stderr
    return out.stdout.splitlines()


def test_spaces_in_uid_list_are_kept_in_the_rule() -> None:
    lines = _lines(["--proxy-uid= 1000"])
    assert "-A ISTIO_OUTPUT -m owner --uid-owner  1000 -j RETURN" in lines


def test_spaces_in_owner_groups_are_kept() -> None:
    lines = _lines([], {"ISTIO_OUTBOUND_OWNER_GROUPS": " 101"})
    assert "-A ISTIO_OUTPUT -m owner ! --gid-owner  101 -j RETURN" in lines


def test_ipv4_mapped_loopback_in_service_cidr_counts_as_loopback() -> None:
    lines = _lines(["-i", "::ffff:127.0.0.1/128", "--proxy-uid=1337"])
    assert not any("! --uid-owner" in line for line in lines)


def test_ipv4_mapped_cidr_is_printed_as_go_does() -> None:
    out = run_rules(["-n", "--ipv6=true", "--dns-servers=", "-i", "::ffff:7f00:1/128"])
    assert "-A ISTIO_OUTPUT -d ::ffff:127.0.0.1/128 -j ISTIO_REDIRECT" in out.stdout.splitlines()


def test_duplicate_ports_make_duplicate_rules() -> None:
    lines = _lines(["-q", "3306,3306"])
    assert lines.count("-A ISTIO_OUTPUT -p tcp --dport 3306 -j ISTIO_REDIRECT") == 2


def test_spaces_after_commas_are_kept() -> None:
    lines = _lines(["-b", "80, 90", "-c", "eth0, eth1"])
    assert "-A ISTIO_INBOUND -p tcp --dport  90 -j ISTIO_IN_REDIRECT" in lines
    assert "-A PREROUTING -i  eth1 -j RETURN" in lines


def test_inbound_ports_listing_no_port_still_jumps_to_inbound() -> None:
    assert "-A PREROUTING -p tcp -j ISTIO_INBOUND" in _lines(["-b", ","])


@pytest.mark.parametrize(
    ("addresses", "dual_stack", "want"),
    [
        # The kernel dumps IPv4 addresses before IPv6 ones: lo's fd00::1 comes after eth0's IPv4.
        (["127.0.0.1", "10.0.0.5", "::1", "fd00::1"], False, False),
        (["127.0.0.1", "10.0.0.5", "::1", "fd00::1"], True, True),
        (["127.0.0.1", "::1", "fe80::1", "fd00::1"], False, True),
    ],
    ids=["first-usable-is-ipv4", "dual-stack-any-ipv6", "link-local-skipped"],
)
def test_ipv6_detection_follows_kernel_order(
    addresses: list[str], dual_stack: bool, want: bool
) -> None:
    assert hostfacts.detect_ipv6(addresses, dual_stack=dual_stack) is want


def test_no_usable_address_is_an_error_as_in_istio() -> None:
    with pytest.raises(ValueError, match="no valid local IP address"):
        hostfacts.detect_ipv6(["127.0.0.1", "::1", "fe80::1"], dual_stack=False)


def test_resolv_conf_is_read_as_go_reads_it(tmp_path: Path) -> None:
    conf = tmp_path / "resolv.conf"
    conf.write_text(
        "nameserver 192.168.0.1#comment\n"
        "nameserver FD00:10:96::A\n"
        "nameserver\t10.96.0.10  # cluster DNS\n"
        "# nameserver 8.8.8.8\n"
        "nameserver ::ffff:10.0.0.1\n"
    )
    assert hostfacts.resolv_conf_servers(str(conf)) == [
        "fd00:10:96::a",
        "10.96.0.10",
        "::ffff:10.0.0.1",
    ]
