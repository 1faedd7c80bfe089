"""The network between the test bed's nodes: one bridge in a network namespace of its own, each
node's netns joined to it by a veth (`eth1` on the node's side, an address of the fabric's /24),
and in every node a route to every other node's pod subnet through that node's fabric address,
as kindnet (or any routed CNI without an overlay) programs a real cluster's nodes.

Nothing of it is in the machine's own namespace: deleting the fabric's netns takes every veth
with it, and a node's netns going takes its end.
"""

from __future__ import annotations

import ipaddress
import secrets
from dataclasses import dataclass, field

from testbed import netns

FABRIC_RANGE = ipaddress.IPv4Network("10.248.0.0/16")
NODE_IFNAME = "eth1"
BRIDGE = "fabric0"


@dataclass(frozen=True)
class FabricPort:
    node_netns: str
    address: str
    pod_subnet: str


@dataclass
class Fabric:
    """create(), join() each node, then delete() (idempotent)."""

    netns_name: str = field(default_factory=lambda: netns.unique_name("tb-fabric"))
    network: ipaddress.IPv4Network = field(
        default_factory=lambda: list(FABRIC_RANGE.subnets(new_prefix=24))[secrets.randbelow(256)]
    )
    ports: list[FabricPort] = field(default_factory=list)
    _next_host: int = 1

    def create(self) -> None:
        netns.add(self.netns_name)
        try:
            netns.ip("link", "add", BRIDGE, "type", "bridge", netns=self.netns_name)
            netns.ip("link", "set", BRIDGE, "up", netns=self.netns_name)
        except Exception:
            self.delete()
            raise

    def join(self, node_netns: str, pod_subnet: str) -> FabricPort:
        """Connect a node and route pod subnets both ways between it and every node joined."""
        address = str(self.network.network_address + self._next_host)
        self._next_host += 1
        outer = f"fab{secrets.token_hex(4)}"
        netns.ip(
            "link", "add", outer, "netns", self.netns_name,
            "type", "veth", "peer", "name", NODE_IFNAME, "netns", node_netns,
        )  # fmt: skip
        netns.ip("link", "set", outer, "master", BRIDGE, "up", netns=self.netns_name)
        prefix = self.network.prefixlen
        netns.ip("addr", "add", f"{address}/{prefix}", "dev", NODE_IFNAME, netns=node_netns)
        netns.ip("link", "set", NODE_IFNAME, "up", netns=node_netns)
        # Pods' packets to other nodes are forwarded by the node (ptp enables it too, at the
        # first pod; a node without pods still forwards replies).
        netns.sysctl(node_netns, "net.ipv4.ip_forward", "1")
        port = FabricPort(node_netns, address, pod_subnet)
        for other in self.ports:
            netns.ip("route", "add", other.pod_subnet, "via", other.address, netns=node_netns)
            netns.ip("route", "add", pod_subnet, "via", address, netns=other.node_netns)
        self.ports.append(port)
        return port

    def leave(self, node_netns: str) -> None:
        """Forget a node (its netns is being deleted): the others' routes to it go."""
        gone = [p for p in self.ports if p.node_netns == node_netns]
        self.ports = [p for p in self.ports if p.node_netns != node_netns]
        for port in gone:
            for other in self.ports:
                netns.ip("route", "del", port.pod_subnet, netns=other.node_netns)

    def delete(self) -> None:
        netns.delete(self.netns_name)
        self.ports = []
