"""Real traffic through applied redirect rules, for every backend.

A pod namespace wired to a peer: outbound connections from the pod must land on the proxy
port, inbound ones on the inbound capture port, the proxy's own traffic (UID 1337), excluded
ports and ranges must pass untouched, DNS must reach the agent's port, TPROXY must keep the
original destination, for IPv4 and IPv6. What a -save / `nft list` reads back must equal what
we rendered; applying twice leaves one copy; other software's rules survive; removal takes
out only ours.
"""

from __future__ import annotations

from typing import Any, Literal

import pytest

from agent.netns import run_command
from agent.rules import backend_nft, backend_restore
from agent.rules.sidecar import nft_apply
from agent.rules.sidecar.apply import apply_rules, remove_rules, rules_present
from agent.rules.sidecar.builder import build
from agent.rules.sidecar.capture import CaptureConfig
from agent.rules.sidecar.nft import render_native
from agent.rules.sidecar.pod import capture_config_for_pod
from tests.rules.podnet import PROXY_UID, PodNet

pytestmark = pytest.mark.netns

BACKENDS = ["python-iptables", "iptables-legacy", "iptables-nft", "nftables"]

POD_PORTS = [
    "tcp:15001:outbound-proxy",
    "tcp:15006:inbound-proxy",
    "tcp:8080:app",
    "tcp:15020:status",
    "udp:15053:dns-agent",
    "tcp:15053:dns-agent",
]
PEER_PORTS = ["tcp:8080:peer", "tcp:15020:peer", "udp:53:peer-dns", "tcp:53:peer-dns"]


def sidecar_pod(**annotations: str) -> dict[str, Any]:
    env = annotations.pop("env", "")
    container: dict[str, Any] = {"name": "istio-proxy"}
    if env:
        name, value = env.split("=", 1)
        container["env"] = [{"name": name, "value": value}]
    return {
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "app",
            "annotations": {"sidecar.istio.io/status": "{}", **annotations},
        },
        "spec": {"containers": [{"name": "app"}, container]},
    }


def config_for(**annotations: str) -> CaptureConfig:
    return capture_config_for_pod(sidecar_pod(**annotations), ipv6=True, dns_servers=[])


def label(answer: str) -> str:
    return answer.split("|", 1)[0]


def read_back_matches(net: PodNet, path: str, config: CaptureConfig, backend: str) -> None:
    """The kernel's copy of our rules equals what we rendered, rule for rule."""
    ruleset = build(config)
    if backend == "nftables":  # Istio's native nftables rules, as nft lists them
        want = backend_nft.expected_listing(render_native(config))
        assert backend_nft.normalize(nft_apply.list_native(path)) == backend_nft.normalize(want)
        return
    variant = "nft" if backend == "iptables-nft" else "legacy"
    families: tuple[Literal[4, 6], ...] = (4, 6)
    for fam in families:
        got = backend_restore.ours(backend_restore.read_state(path, variant, fam))
        assert got == backend_restore.expected(ruleset.family(fam), fam)


def add_foreign_rules(path: str, backend: str) -> None:
    if backend == "nftables":
        script = (
            "table inet foreign {\n chain input {\n  type filter hook input priority 0;\n"
            "  tcp dport 9999 accept\n }\n}\n"
        )
        assert run_command(path, ["nft", "-f", "-"], script).returncode == 0
        return
    tool = "iptables-nft" if backend == "iptables-nft" else "iptables-legacy"
    for args in (
        ["-t", "nat", "-A", "OUTPUT", "-p", "tcp", "--dport", "9999", "-j", "RETURN"],
        ["-t", "filter", "-A", "INPUT", "-p", "tcp", "--dport", "9999", "-j", "ACCEPT"],
    ):
        done = run_command(path, [tool, *args])
        assert done.returncode == 0, done.stderr


def foreign_rules(path: str, backend: str) -> list[str]:
    if backend == "nftables":
        out = run_command(path, ["nft", "list", "table", "inet", "foreign"]).stdout
        return [line.strip() for line in out.splitlines() if "9999" in line]
    tool = "iptables-nft-save" if backend == "iptables-nft" else "iptables-legacy-save"
    out = run_command(path, [tool]).stdout
    return [line for line in out.splitlines() if "9999" in line]


@pytest.mark.parametrize("backend", BACKENDS)
def test_sidecar_capture_and_bypass(podnet: PodNet, backend: str) -> None:
    pod_server = podnet.serve(podnet.pod_path, POD_PORTS)
    podnet.serve(podnet.peer_path, PEER_PORTS)
    # Any path to the namespace works, not only /var/run/netns: use the server's.
    path = f"/proc/{pod_server.pid}/ns/net"
    add_foreign_rules(path, backend)
    foreign = foreign_rules(path, backend)
    config = config_for()

    assert apply_rules(path, config, backend=backend) == backend
    assert apply_rules(path, config, backend=backend) == backend  # twice: still one copy
    read_back_matches(podnet, path, config, backend)
    assert rules_present(path, config, backend=backend)
    assert foreign_rules(path, backend) == foreign

    pod, peer = podnet.pod_path, podnet.peer_path
    for peer_ip, pod_ip in ((podnet.peer_ip, podnet.pod_ip), (podnet.peer_ip6, podnet.pod_ip6)):
        assert label(podnet.call(pod, "tcp", peer_ip, 8080)) == "outbound-proxy"
        assert label(podnet.call(pod, "tcp", peer_ip, 8080, uid=PROXY_UID)) == "peer"
        assert label(podnet.call(pod, "tcp", peer_ip, 15020)) == "peer"  # excluded outbound
        assert label(podnet.call(peer, "tcp", pod_ip, 8080)) == "inbound-proxy"
        assert label(podnet.call(peer, "tcp", pod_ip, 15020)) == "status"  # excluded inbound

    remove_rules(path, backend=backend)
    assert not rules_present(path, config, backend=backend)
    assert foreign_rules(path, backend) == foreign
    if backend == "nftables":
        assert nft_apply.list_native(path) == ""
    else:
        variant = "nft" if backend == "iptables-nft" else "legacy"
        assert backend_restore.ours(backend_restore.read_state(path, variant, 4)) == {}
        assert backend_restore.ours(backend_restore.read_state(path, variant, 6)) == {}
    assert label(podnet.call(pod, "tcp", podnet.peer_ip, 8080)) == "peer"
    assert label(podnet.call(peer, "tcp", podnet.pod_ip, 8080)) == "app"


@pytest.mark.parametrize("backend", BACKENDS)
def test_excluded_ranges_and_included_ports(podnet: PodNet, backend: str) -> None:
    podnet.serve(podnet.pod_path, POD_PORTS)
    podnet.serve(podnet.peer_path, PEER_PORTS)
    config = config_for(
        **{
            "traffic.sidecar.istio.io/excludeOutboundIPRanges": f"{podnet.peer_ip}/32",
            "traffic.sidecar.istio.io/includeInboundPorts": "15020",
        }
    )
    apply_rules(podnet.pod_path, config, backend=backend)
    read_back_matches(podnet, podnet.pod_path, config, backend)
    pod, peer = podnet.pod_path, podnet.peer_path
    assert label(podnet.call(pod, "tcp", podnet.peer_ip, 8080)) == "peer"  # excluded range
    assert label(podnet.call(pod, "tcp", podnet.peer_ip6, 8080)) == "outbound-proxy"
    assert label(podnet.call(peer, "tcp", podnet.pod_ip, 8080)) == "app"  # not included
    assert label(podnet.call(peer, "tcp", podnet.pod_ip6, 8080)) == "app"


@pytest.mark.parametrize("backend", BACKENDS)
def test_dns_lands_on_agent_port(podnet: PodNet, backend: str) -> None:
    podnet.serve(podnet.pod_path, POD_PORTS)
    podnet.serve(podnet.peer_path, PEER_PORTS)
    config = config_for(env="ISTIO_META_DNS_CAPTURE=true")
    apply_rules(podnet.pod_path, config, backend=backend)
    read_back_matches(podnet, podnet.pod_path, config, backend)
    pod = podnet.pod_path
    for peer_ip in (podnet.peer_ip, podnet.peer_ip6):
        assert label(podnet.call(pod, "udp", peer_ip, 53)) == "dns-agent"
        assert label(podnet.call(pod, "tcp", peer_ip, 53)) == "dns-agent"
        # The agent's own upstream queries go out untouched.
        assert label(podnet.call(pod, "udp", peer_ip, 53, uid=PROXY_UID)) == "peer-dns"


@pytest.mark.parametrize("backend", BACKENDS)
def test_tproxy_keeps_original_destination(podnet: PodNet, backend: str) -> None:
    podnet.serve(podnet.pod_path, [*POD_PORTS[:1], "tcp:15006:tproxy:transparent", "tcp:8080:app"])
    podnet.serve(podnet.peer_path, PEER_PORTS)
    config = config_for(**{"sidecar.istio.io/interceptionMode": "TPROXY"})
    apply_rules(podnet.pod_path, config, backend=backend)
    apply_rules(podnet.pod_path, config, backend=backend)
    read_back_matches(podnet, podnet.pod_path, config, backend)
    rules = run_command(podnet.pod_path, ["ip", "rule"]).stdout
    assert rules.count("fwmark 0x539 lookup 133") == 1
    peer = podnet.peer_path
    assert podnet.call(peer, "tcp", podnet.pod_ip, 8080) == f"tproxy|{podnet.pod_ip}:8080"
    assert podnet.call(peer, "tcp", podnet.pod_ip6, 8080) == f"tproxy|{podnet.pod_ip6}:8080"
    assert label(podnet.call(podnet.pod_path, "tcp", podnet.peer_ip, 8080)) == "outbound-proxy"
    remove_rules(podnet.pod_path, backend=backend)
    assert "lookup 133" not in run_command(podnet.pod_path, ["ip", "rule"]).stdout
