"""Program ambient mode's native nftables rules with one `nft -f` transaction per change.

In a pod: Istio's `inet istio-ambient-*` tables. Each apply declares, deletes and writes anew all
three (plus the `ip`/`ip6` tables an older agent wrote for ambient) in one transaction, so tables
Istio leaves out this time do not linger and applying twice leaves one copy. On the node: the
`inet istio-ambient-nat` table with the enrolled-IP sets and the probe SNAT chain. Re-applying
flushes the chains only, as Istio does, so the sets keep their pod IPs; removal drops the table.
Tables of other software are never named.
"""

from __future__ import annotations

from agent.podinput.tokens import Address, Id
from agent.rules import nft as engine
from agent.rules.ambient.nft import HOST_TABLE, render_host, render_pod, set_commands
from agent.rules.ambient.options import PodRuleOptions
from agent.rules.backend_nft import (
    drop_tables,
    expected_listing,
    former_tables_script,
    list_tables,
    nft,
    normalize,
)

POD_TABLES = engine.table_names(engine.AMBIENT_PREFIX)


def pod_script(options: PodRuleOptions | None) -> str:
    body = render_pod(options) if options is not None else ""
    return drop_tables(POD_TABLES) + former_tables_script() + body


def apply_pod(netns_path: str, options: PodRuleOptions | None) -> None:
    """Istio's in-pod rules for `options` (None: remove them)."""
    nft(netns_path, ["-f", "-"], pod_script(options))


def list_pod(netns_path: str) -> str:
    """Our in-pod tables as `nft list` prints them, counters stripped, in Istio's order."""
    return list_tables(netns_path, POD_TABLES)


def pod_present(netns_path: str, options: PodRuleOptions) -> bool:
    want = expected_listing(render_pod(options))
    return normalize(list_pod(netns_path)) == normalize(want)


class HostTable:
    """The node's `inet istio-ambient-nat`: probe SNAT for kubelet's UID, and the IP sets."""

    def __init__(
        self, netns_path: str, *, ipv6: bool, probe_snat: str, probe_snat_v6: str, kubelet_uid: str
    ) -> None:
        self.netns_path = netns_path
        self.ipv6 = ipv6
        self.sets = set_commands(ipv6=ipv6)
        self.rules = render_host(
            ipv6=ipv6,
            probe_snat=Address(probe_snat),
            probe_snat_v6=Address(probe_snat_v6),
            kubelet_uid=Id(kubelet_uid),
        )

    def ensure(self) -> None:
        """Sets first (existing ones keep their elements), then the rules that name them."""
        nft(self.netns_path, ["-f", "-"], self.sets + self.rules)

    def present(self) -> bool:
        got = list_tables(self.netns_path, (HOST_TABLE,), terse=True)
        return normalize(got) == normalize(expected_listing(self.sets + self.rules))

    def remove_all(self) -> None:
        nft(self.netns_path, ["-f", "-"], drop_tables((HOST_TABLE,)))
