"""The network of a real node: a network namespace holding the node's IP, reached from the
machine's root namespace over one veth pair, and nothing else.

The node netns has no default route: the pod bridge, pods and hostNetwork pods (the agent) live
in it, and traffic to any address outside it and the veth's /30 is unreachable. The API server
listens on the root end of the veth (`gateway`); the kubelet on the node end (`node_ip`).

The test bed plays kube-proxy for the one Service pods need, `kubernetes`: in the node netns a
route for the Service CIDR over the veth and a DNAT rule ClusterIP:443 -> API server, so in-cluster
clients (the agent's KUBERNETES_SERVICE_HOST) reach it as on a real node.
"""

from __future__ import annotations

import ipaddress
import random
import secrets
import shutil
import subprocess
from dataclasses import dataclass, field

from testbed import netns
from testbed.parts import SETUP_APT, MissingPartError

# Each node takes a random /30 of this range for its veth, so parallel sessions rarely clash;
# a clash is seen (the address is in use) and another /30 is taken.
LINK_RANGE = ipaddress.IPv4Network("10.249.0.0/16")
NODE_IFNAME = "eth0"


def _in_use(network: ipaddress.IPv4Network) -> bool:
    for link in netns.ip_json("addr", "show"):
        for addr in link.get("addr_info", []):
            if addr.get("family") == "inet" and ipaddress.ip_address(addr["local"]) in network:
                return True
    return False


def pick_link_network() -> ipaddress.IPv4Network:
    subnets: list[ipaddress.IPv4Network] = list(LINK_RANGE.subnets(new_prefix=30))
    for candidate in random.sample(subnets, 64):
        if not _in_use(candidate):
            return candidate
    raise RuntimeError(f"no free /30 in {LINK_RANGE} for the node's veth")


def iptables(ns: str, *args: str) -> None:
    """iptables (Debian's default, nft-based) in netns `ns`."""
    binary = shutil.which("iptables", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if binary is None:
        raise MissingPartError(f"test bed part 'iptables' is missing; install it with {SETUP_APT}")
    argv = ["nsenter", f"--net={netns.NETNS_DIR / ns}", "--", binary, "-w", *args]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")


@dataclass
class NodeNetwork:
    """Use create() then delete() (idempotent; the veth goes with the netns)."""

    netns_name: str = field(default_factory=lambda: netns.unique_name("tb-rnode"))
    host_ifname: str = field(default_factory=lambda: f"tbrn{secrets.token_hex(4)}")
    link: ipaddress.IPv4Network | None = None

    @property
    def gateway(self) -> str:
        """The root-namespace end of the veth: where the API server listens for the node."""
        assert self.link is not None
        return str(self.link.network_address + 1)

    @property
    def node_ip(self) -> str:
        assert self.link is not None
        return str(self.link.network_address + 2)

    @property
    def netns_path(self) -> str:
        return str(netns.NETNS_DIR / self.netns_name)

    def create(self) -> None:
        self.link = pick_link_network()
        netns.add(self.netns_name)
        try:
            netns.ip(
                "link",
                "add",
                self.host_ifname,
                "type",
                "veth",
                "peer",
                "name",
                NODE_IFNAME,
                "netns",
                self.netns_name,
            )
            netns.ip("addr", "add", f"{self.gateway}/30", "dev", self.host_ifname)
            netns.ip("link", "set", self.host_ifname, "up")
            netns.ip("addr", "add", f"{self.node_ip}/30", "dev", NODE_IFNAME, netns=self.netns_name)
            netns.ip("link", "set", NODE_IFNAME, "up", netns=self.netns_name)
        except Exception:
            self.delete()
            raise

    def route_host(self, address: str) -> None:
        """Reach `address` (another node's link end in the machine's namespace, where the API
        server listens) over this node's link."""
        netns.ip("route", "add", f"{address}/32", "via", self.gateway, netns=self.netns_name)

    def route_service(
        self, service_cidr: str, cluster_ip: str, port: int, target: str, target_port: int
    ) -> None:
        """kube-proxy's job for one Service, for hostNetwork pods (all that need it here):
        cluster_ip:port -> target:target_port for connections made in the node netns."""
        netns.ip("route", "add", service_cidr, "via", self.gateway, netns=self.netns_name)
        rule = [
            "-d",
            f"{cluster_ip}/32",
            "-p",
            "tcp",
            "--dport",
            str(port),
            "-j",
            "DNAT",
            "--to-destination",
            f"{target}:{target_port}",
        ]
        iptables(self.netns_name, "-t", "nat", "-A", "OUTPUT", *rule)

    def delete(self) -> None:
        """Delete the netns (with the node end of the veth, so the root end goes too)."""
        netns.delete(self.netns_name)
        netns.delete_link(self.host_ifname)

    def nsenter(self) -> list[str]:
        """Command prefix that runs a program in the node netns and nothing else: unlike
        `ip netns exec` it keeps the machine's /sys (with the cgroup mounts kubelet needs)."""
        return ["nsenter", f"--net={self.netns_path}", "--"]
