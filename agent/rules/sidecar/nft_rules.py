"""Istio's sidecar rules in its native nftables form, one rule a line: `table chain expression`.

Istio's words as its nftables configurator writes them (tools/istio-nftables); `{slots}` are
filled in from the capture config, values as the user spelled them, or from the constants in
agent.rules.sidecar.nft, which adds these rules in Istio's order.
"""

from __future__ import annotations

from typing import Final

RULES: Final = {
    # Interfaces never captured; virtual interfaces whose inbound is outbound.
    "exclude-in": "{table} prerouting iifname {name} counter return",
    "exclude-out": "{table} output oifname {name} counter return",
    "virtual-return": "nat prerouting iifname {name} counter return",
    "drop-invalid": "mangle prerouting meta l4proto tcp ct state invalid counter jump istio-drop",
    "drop": "mangle istio-drop counter drop",
    "tunnel-return": "nat istio-inbound meta l4proto tcp tcp dport {port} counter return",
    "redirect": "nat istio-redirect meta l4proto tcp counter redirect to :{port}",
    "in-redirect": "nat istio-in-redirect meta l4proto tcp counter redirect to :{port}",
    # Inbound, REDIRECT mode.
    "inbound-jump": "nat prerouting meta l4proto tcp counter jump istio-inbound",
    "inbound-except": "nat istio-inbound meta l4proto tcp tcp dport {port} counter return",
    "inbound-all": "nat istio-inbound meta l4proto tcp counter jump istio-in-redirect",
    "inbound-port": "nat istio-inbound meta l4proto tcp tcp dport {port} counter jump istio-in-redirect",
    # Inbound, TPROXY mode.
    "divert-mark": "mangle istio-divert counter meta mark set {mark}",
    "divert-accept": "mangle istio-divert counter accept",
    "tproxy": "mangle istio-tproxy meta l4proto tcp ip daddr != {loop4} tproxy ip to :{port} meta mark set {mark} counter accept",
    "tproxy-v6": "mangle istio-tproxy meta l4proto tcp ip6 daddr != {loop6} tproxy ip6 to :{port} meta mark set {mark} counter accept",
    "tproxy-jump": "mangle prerouting meta l4proto tcp counter jump istio-inbound",
    "tproxy-except": "mangle istio-inbound meta l4proto tcp tcp dport {port} counter return",
    "tproxy-divert-all": "mangle istio-inbound meta l4proto tcp ct state related,established counter jump istio-divert",
    "tproxy-all": "mangle istio-inbound meta l4proto tcp counter jump istio-tproxy",
    "tproxy-divert-port": "mangle istio-inbound meta l4proto tcp ct state related,established tcp dport {port} counter jump istio-divert",
    "tproxy-port": "mangle istio-inbound meta l4proto tcp tcp dport {port} counter jump istio-tproxy",
    # Outbound.
    "output-jump": "nat output counter jump istio-output",
    "port-except-tcp": "nat istio-output tcp dport {port} counter return",
    "port-except-udp": "nat istio-output udp dport {port} counter return",
    "passthrough": "nat istio-output oifname lo ip saddr {passthrough_v4} counter return",
    "passthrough-v6": "nat istio-output oifname lo ip6 saddr {passthrough_v6} counter return",
    "owner-self-call": "nat istio-output oifname lo meta l4proto tcp {ip} daddr != {loop} tcp dport != {ports} {key} {value} counter jump istio-in-redirect",
    "owner-lo-dns": "nat istio-output oifname lo meta l4proto tcp tcp dport != 53 {key} != {value} counter return",
    "owner-lo": "nat istio-output oifname lo {key} != {value} counter return",
    "owner": "nat istio-output {key} {value} counter return",
    "group-except": "nat istio-output skgid {group} counter return",
    "groups-only": "nat istio-output {not_groups}counter return",
    "loopback": "nat istio-output ip daddr {loop4} counter return",
    "loopback-v6": "nat istio-output ip6 daddr {loop6} counter return",
    "cidr-except": "nat istio-output {ip} daddr {cidr} counter return",
    "port-include": "nat istio-output tcp dport {port} counter jump istio-redirect",
    "all-outbound": "nat istio-output counter jump istio-redirect",
    "virtual-all": "nat prerouting iifname {name} counter jump istio-redirect",
    "virtual-cidr": "nat prerouting iifname {name} {ip} daddr {cidr} counter jump istio-redirect",
    "cidr-include": "nat istio-output {ip} daddr {cidr} counter jump istio-redirect",
    # DNS to the agent's resolver (nat) and the conntrack zones that keep its flows apart (raw).
    "dns-jump-raw": "raw output counter jump istio-output-dns",
    "dns-jump": "nat istio-output counter jump istio-output-dns",
    "dns-all-tcp": "nat istio-output-dns meta l4proto tcp tcp dport 53 counter redirect to :{agent_dns_port}",
    "dns-all-udp": "nat istio-output-dns udp dport 53 counter redirect to :{agent_dns_port}",
    "dns-server": "nat istio-output-dns ip daddr {server}/32 {proto} dport 53 counter redirect to :{agent_dns_port}",
    "dns-server-v6": "nat istio-output-dns ip6 daddr {server}/128 {proto} dport 53 counter redirect to :{agent_dns_port}",
    "zone-upstream": "raw istio-output-dns udp dport 53 meta {key} {value} counter ct zone set 1",
    "zone-listener": "raw istio-output-dns udp sport {agent_dns_port} meta {key} {value} counter ct zone set 2",
    "zone-jump": "raw prerouting counter jump istio-inbound",
    "zone-all-out": "raw istio-output-dns udp dport 53 counter ct zone set 2",
    "zone-all-in": "raw istio-inbound udp sport 53 counter ct zone set 1",
    "zone-server-out": "raw istio-output-dns udp dport 53 {ip} daddr {server}{bits} counter ct zone set 2",
    "zone-server-in": "raw istio-inbound udp sport 53 {ip} saddr {server}{bits} counter ct zone set 1",
    # TPROXY bookkeeping: keep the mark on the connection, skip proxy-to-app loops.
    "mark-keep": "mangle prerouting meta l4proto tcp mark {mark} counter ct mark set mark",
    "mark-lo-return": "mangle output oifname lo meta l4proto tcp mark {mark} counter return",
    "mark-owner": "mangle output oifname lo meta l4proto tcp {ip} daddr != {loop} {key} {value} counter meta mark set {outbound_mark}",
    "mark-restore": "mangle output meta l4proto tcp ct mark {mark} counter meta mark set ct mark",
    "marked-return": "mangle istio-inbound meta l4proto tcp mark {mark} counter return",
    "lo-passthrough": "mangle istio-inbound iifname lo meta l4proto tcp ip saddr {passthrough_v4} counter return",
    "lo-passthrough-v6": "mangle istio-inbound iifname lo meta l4proto tcp ip6 saddr {passthrough_v6} counter return",
    "lo-unmarked": "mangle istio-inbound iifname lo meta l4proto tcp mark != {outbound_mark} counter return",
}
