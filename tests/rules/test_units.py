"""Pure pieces: model ordering, ownership of saved rules, restore scripts, host-fact parsing."""

from __future__ import annotations

from pathlib import Path

from agent.podinput.tokens import InterfaceName
from agent.rules.backend_restore import restore_script
from agent.rules.ownership import is_our_save_line
from agent.rules.render_save import save_tables
from agent.rules.sidecar.builder import build
from agent.rules.sidecar.capture import CaptureConfig
from agent.rules.sidecar.hostfacts import ipv6_enabled, resolv_conf_servers


def test_inserts_land_where_the_kernel_puts_them() -> None:
    config = CaptureConfig(
        reroute_virtual_interfaces=(InterfaceName("eth1"), InterfaceName("eth2")),
        outbound_ip_ranges_include="*",
    )
    nat = next(t for t in build(config).v4 if t.name == "nat")
    prerouting = save_tables((nat,), family=4)["nat"]["PREROUTING"]
    assert prerouting == [
        "-A PREROUTING -i eth2 -j ISTIO_REDIRECT",
        "-A PREROUTING -i eth1 -j ISTIO_REDIRECT",
        "-A PREROUTING -i eth2 -j RETURN",
        "-A PREROUTING -i eth1 -j RETURN",
    ]


def test_ownership_of_builtin_chain_rules() -> None:
    ours = [
        ("nat", "-A OUTPUT -j ISTIO_OUTPUT"),
        ("nat", "-A PREROUTING -i eth9 -j RETURN"),
        (
            "mangle",
            "-A PREROUTING -p tcp -m mark --mark 0x539 -j CONNMARK --save-mark "
            "--nfmask 0xffffffff --ctmask 0xffffffff",
        ),
        (
            "mangle",
            "-A OUTPUT ! -d 127.0.0.1/32 -o lo -p tcp -m owner --uid-owner 1337 "
            "-j MARK --set-xmark 0x53a/0xffffffff",
        ),
        ("mangle", "-A OUTPUT -o lo -p tcp -m mark --mark 0x539 -j RETURN"),
    ]
    theirs = [
        ("nat", "-A OUTPUT -p tcp -m tcp --dport 9999 -j RETURN"),
        ("nat", "-A POSTROUTING -s 10.0.0.0/8 -j MASQUERADE"),
        ("filter", "-A INPUT -i eth0 -j RETURN"),
        ("mangle", "-A PREROUTING -j MARK --set-xmark 0x1/0xffffffff"),
    ]
    assert all(is_our_save_line(t, line) for t, line in ours)
    assert not any(is_our_save_line(t, line) for t, line in theirs)


def test_restore_script_replaces_ours_and_keeps_theirs() -> None:
    state = {
        "nat": {
            "PREROUTING": ["-A PREROUTING -i old0 -j RETURN"],
            "OUTPUT": [
                "-A OUTPUT -p tcp -m tcp --dport 9999 -j RETURN",
                "-A OUTPUT -j ISTIO_OUTPUT",
            ],
            "ISTIO_OUTPUT": ["-A ISTIO_OUTPUT -j RETURN"],
            "ISTIO_STALE": [],
        },
    }
    script = restore_script(state, build(CaptureConfig()).v4)
    lines = script.splitlines()
    assert lines[0] == "*mangle" or lines[0] == "*nat"
    assert "-D PREROUTING -i old0 -j RETURN" in lines
    assert "-D OUTPUT -j ISTIO_OUTPUT" in lines
    assert not any("9999" in line for line in lines)
    assert ":ISTIO_OUTPUT - [0:0]" in lines and ":ISTIO_STALE - [0:0]" in lines
    assert lines.index("-X ISTIO_STALE") > lines.index("-A OUTPUT -j ISTIO_OUTPUT")
    assert not any(line.startswith("-N ") for line in lines)


def test_restore_script_is_empty_when_nothing_is_ours() -> None:
    assert restore_script({"filter": {"INPUT": ["-A INPUT -j ACCEPT"]}}, ()) == ""


def test_ipv6_detection_follows_istio() -> None:
    assert ipv6_enabled(["127.0.0.1", "::1", "10.0.0.2", "fd00::2"], dual_stack=False) is False
    assert ipv6_enabled(["127.0.0.1", "10.0.0.2", "fd00::2"], dual_stack=True) is True
    assert ipv6_enabled(["fe80::1", "fd00::2"], dual_stack=False) is True
    assert ipv6_enabled(["::1", "fe80::1"], dual_stack=True) is False


def test_resolv_conf_parsing(tmp_path: Path) -> None:
    path = tmp_path / "resolv.conf"
    path.write_text(
        "# c\nnameserver 10.0.0.10\nnameserver   ::1  \nnameserver bogus\noptions ndots:5\n"
    )
    assert resolv_conf_servers(str(path)) == ["10.0.0.10", "::1"]
    assert resolv_conf_servers(str(tmp_path / "missing")) == []
