"""Read the addresses configured in a network namespace (for matching pods to namespaces)."""

from __future__ import annotations

from pyroute2 import IPRoute

from agent.netns import run_in_netns


def netns_addresses(path: str) -> set[str]:
    """Every IPv4/IPv6 address in the netns at `path`; the netlink socket is opened inside it."""

    def read() -> set[str]:
        with IPRoute() as ipr:
            return {str(a.get("address")) for a in ipr.get_addr() if a.get("address")}

    return run_in_netns(path, read)
