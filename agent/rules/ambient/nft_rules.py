"""Istio's ambient rules in its native nftables form, one rule a line: `table chain expression`.

Istio's words exactly as its nftables mode prints them (cni/pkg/nftables), spacing quirks
included (`mark and 0xfff  != 0x539`); `{slots}` are filled in from the pod's options or from
the constants in agent.rules.ambient.nft, which adds these rules in Istio's order.
"""

from __future__ import annotations

from typing import Final

RULES: Final = {
    # Jumps into Istio's chains.
    "jump-mangle-prerouting": "mangle prerouting jump istio-prerouting",
    "jump-mangle-output": "mangle output jump istio-output",
    "jump-nat-output": "nat output jump istio-output",
    "jump-raw-prerouting": "raw prerouting jump istio-prerouting",
    "jump-raw-output": "raw output jump istio-output",
    "jump-nat-prerouting": "nat prerouting jump istio-prerouting",
    # Virtual interfaces first: their inbound is outbound, straight to ztunnel (TCP only).
    "virtual-redirect": "nat istio-prerouting iifname {iface} meta l4proto tcp counter redirect to :{ztunnel_outbound}",
    "virtual-return": "nat istio-prerouting iifname {iface} meta l4proto tcp counter return",
    "connmark": "mangle istio-prerouting meta mark & 0xfff == {inpod_mark} counter ct mark set ct mark & 0xfffff000 |  {tproxy_mark}",
    # Kubelet's SNATed probes (and their replies) skip ztunnel.
    "probe-in": "nat istio-prerouting meta l4proto tcp ip saddr {snat} counter accept",
    "probe-in-v6": "nat istio-prerouting meta l4proto tcp ip6 saddr {snat} counter accept",
    "probe-out": "nat istio-output meta l4proto tcp ip daddr {snat} counter accept",
    "probe-out-v6": "nat istio-output meta l4proto tcp ip6 daddr {snat} counter accept",
    # Unmarked inbound TCP to ztunnel's plaintext port; 15008 (HBONE) goes straight in. Istio's
    # IPv4 rule has "mark and 0xfff " (a trailing space): kept as it prints it.
    "inbound": "nat istio-prerouting ip daddr != 127.0.0.1/32 tcp dport != {ztunnel_inbound} mark and 0xfff  != {inpod_mark} counter redirect to :{ztunnel_plaintext}",
    "inbound-v6": "nat istio-prerouting ip6 daddr != ::1/128 tcp dport != {ztunnel_inbound} mark and 0xfff != {inpod_mark} counter redirect to :{ztunnel_plaintext}",
    "restore-mark": "mangle istio-output ct mark and {tproxy_mask} == {tproxy_mark} counter meta mark set ct mark",
    # DNS to ztunnel's DNS proxy; the proxy's own upstream queries in conntrack zone 1.
    "dns-udp": "nat istio-output oifname != lo mark and {inpod_mask} != {inpod_mark} udp dport 53 counter redirect to :{ztunnel_dns}",
    "dns-tcp": "nat istio-output ip daddr != 127.0.0.1/32 tcp dport 53 mark and {inpod_mask} != {inpod_mark} counter redirect to :{ztunnel_dns}",
    "dns-tcp-v6": "nat istio-output ip6 daddr != ::1/128 tcp dport 53 mark and {inpod_mask} != {inpod_mark} counter redirect to :{ztunnel_dns}",
    "dns-zone-out": "raw istio-output udp dport 53 meta mark and {inpod_mask} == {inpod_mark} counter ct zone set 1",
    "dns-zone-in": "raw istio-prerouting udp sport 53 meta mark and {inpod_mask} != {inpod_mark} counter ct zone set 1",
    # Marked traffic (ztunnel's own) and the pod calling itself pass; the rest to 15001.
    "marked-accept": "nat istio-output meta l4proto tcp mark and {tproxy_mask} == {tproxy_mark} counter accept",
    "self-accept": "nat istio-output oifname lo ip daddr != 127.0.0.1/32 counter accept",
    "self-accept-v6": "nat istio-output oifname lo ip6 daddr != ::1/128 counter accept",
    "outbound": "nat istio-output meta l4proto tcp ip daddr != 127.0.0.1/32 mark and {inpod_mask} != {inpod_mark} counter redirect to :{ztunnel_outbound}",
    "outbound-v6": "nat istio-output meta l4proto tcp ip6 daddr != ::1/128 mark and {inpod_mask} != {inpod_mark} counter redirect to :{ztunnel_outbound}",
    # On the node: kubelet's probes to enrolled pod IPs SNATed to the probe address.
    "host-snat": "nat postrouting meta l4proto tcp skuid {kubelet_uid} ip daddr @{set_v4} counter snat to {snat}",
    "host-snat-v6": "nat postrouting meta l4proto tcp skuid {kubelet_uid} ip6 daddr @{set_v6} counter snat to {snat}",
}
