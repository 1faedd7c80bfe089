"""Ambient mode's rules in Istio's native nftables form (cni/pkg/nftables).

Istio's nftables mode for ambient is not a translation of its iptables rules: in a pod it writes
three `inet` tables (`istio-ambient-nat`, `-mangle`, `-raw`) with lower-case chains, and on the
node one `inet istio-ambient-nat` table whose `postrouting` chain SNATs kubelet's probes, matched
by kubelet's UID (`meta skuid`; nftables has no `--socket-exists`), to enrolled pod IPs kept in
nft sets of that same table (`istio-inpod-probes-v4`/`-v6`, each element's comment the pod UID).
`RULES` holds Istio's rules, one a line (`table chain expression`), exactly as Istio prints them,
spacing quirks included (`mark and 0xfff  != 0x539`); each step below adds them in Istio's order.
"""

from __future__ import annotations

from typing import Final

from agent import constants
from agent.podinput.tokens import Address, Id
from agent.rules import nft
from agent.rules.ambient.builder import PROBE_IPSET_V4, PROBE_IPSET_V6, redirect_dns
from agent.rules.ambient.nft_rules import RULES
from agent.rules.ambient.options import PodRuleOptions
from agent.rules.nft import OUTPUT, POSTROUTING, PREROUTING, NftRule, NftRules, NftTable

HOST_TABLE = f"inet {nft.AMBIENT_PREFIX}nat"
SET_COMMENT = "UUID of the pods that are part of ambient mesh"

ISTIO_PREROUTING, ISTIO_OUTPUT = "istio-prerouting", "istio-output"
_CHAINS = (PREROUTING, OUTPUT, POSTROUTING, ISTIO_PREROUTING, ISTIO_OUTPUT)
CHAINS: dict[NftTable, tuple[str, ...]] = {table: _CHAINS for table in nft.TABLE_ORDER}
"""Chains in the order Istio declares them (only those with rules or jumps are created)."""

CONSTANTS: Final = {
    "inpod_mark": "0x539",
    "inpod_mask": "0xfff",
    "tproxy_mark": "0x111",
    "tproxy_mask": "0xfff",
    "ztunnel_outbound": constants.ZTUNNEL_OUTBOUND_PORT,
    "ztunnel_inbound": constants.ZTUNNEL_INBOUND_PORT,
    "ztunnel_plaintext": constants.ZTUNNEL_INBOUND_PLAINTEXT_PORT,
    "ztunnel_dns": constants.ZTUNNEL_DNS_PORT,
    "set_v4": PROBE_IPSET_V4,
    "set_v6": PROBE_IPSET_V6,
}


def pod_rules(options: PodRuleOptions) -> list[NftRule]:
    """Istio's in-pod rules (AppendInpodRules) for these options, in its order."""
    r = NftRules(RULES, ipv6=options.ipv6, values=CONSTANTS)
    dns = redirect_dns(options)
    r.add("jump-mangle-prerouting")
    r.add("jump-mangle-output")
    r.add("jump-nat-output")
    if dns:
        r.add("jump-raw-prerouting")
        r.add("jump-raw-output")
    r.add("jump-nat-prerouting")
    for iface in options.virtual_interfaces:
        r.add("virtual-redirect", iface=iface)
        r.add("virtual-return", iface=iface)
    r.add("connmark")
    if not options.ingress:
        r.add("probe-in", snat=options.probe_snat)
        r.add("probe-in-v6", v6=True, snat=options.probe_snat_v6)
    r.add("probe-out", snat=options.probe_snat)
    r.add("probe-out-v6", v6=True, snat=options.probe_snat_v6)
    if not options.ingress:
        r.add("inbound")
        r.add("inbound-v6", v6=True)
    r.add("restore-mark")
    if dns:
        r.add("dns-udp")
        r.add("dns-tcp")
        r.add("dns-tcp-v6", v6=True)
        r.add("dns-zone-out")
        r.add("dns-zone-in")
    r.add("marked-accept")
    r.add("self-accept")
    r.add("self-accept-v6", v6=True)
    r.add("outbound")
    r.add("outbound-v6", v6=True)
    return r.rules


def host_rules(
    *, ipv6: bool, probe_snat: Address, probe_snat_v6: Address, kubelet_uid: Id
) -> list[NftRule]:
    """Istio's node-side probe SNAT (CreateHostRulesForHealthChecks, nftables form)."""
    r = NftRules(RULES, ipv6=ipv6, values=CONSTANTS)
    r.add("host-snat", kubelet_uid=kubelet_uid, snat=probe_snat)
    r.add("host-snat-v6", v6=True, kubelet_uid=kubelet_uid, snat=probe_snat_v6)
    return r.rules


def commands(rules: list[NftRule]) -> str:
    """The `nft -f` commands Istio's transaction prints for ambient's tables."""
    return nft.commands(rules, prefix=nft.AMBIENT_PREFIX, chains=CHAINS, jumped_to=True)


def set_commands(*, ipv6: bool) -> str:
    """Istio's host set manager start-up: the node table and its (kept) enrolled-IP sets."""
    lines = [f"add table {HOST_TABLE}"]
    sets = [(PROBE_IPSET_V4, "ipv4_addr")] + ([(PROBE_IPSET_V6, "ipv6_addr")] if ipv6 else [])
    for name, kind in sets:
        lines.append(f'add set {HOST_TABLE} {name} {{ type {kind} ; comment "{SET_COMMENT}" ; }}')
    return "".join(line + "\n" for line in lines)


def render_pod(options: PodRuleOptions) -> str:
    return commands(pod_rules(options))


def render_host(*, ipv6: bool, probe_snat: Address, probe_snat_v6: Address, kubelet_uid: Id) -> str:
    return commands(
        host_rules(
            ipv6=ipv6, probe_snat=probe_snat, probe_snat_v6=probe_snat_v6, kubelet_uid=kubelet_uid
        )
    )
