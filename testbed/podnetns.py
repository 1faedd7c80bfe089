"""Simulated pods' network namespaces: named namespaces under /run/netns (as `ip netns` and
containerd mount them), each with the given addresses on lo, and the pods' sandbox processes in
pod cgroups (testbed/podcgroup.py); `close()` removes them all."""

from __future__ import annotations

import uuid

from testbed import netns
from testbed.podcgroup import PodSandboxes


class PodNamespaces:
    """netns(*addresses) -> a namespace's path; pod(*addresses) -> a running pod's (UID, path)."""

    def __init__(self, prefix: str = "podns") -> None:
        self.prefix = prefix
        self.names: list[str] = []
        self.sandboxes = PodSandboxes()

    def netns(self, *addresses: str) -> str:
        """A named namespace with `addresses` (/32 each) on lo and no process in it."""
        name = netns.unique_name(self.prefix)
        netns.add(name)
        self.names.append(name)
        for address in addresses:
            netns.ip("addr", "add", f"{address}/32", "dev", "lo", netns=name)
        return str(netns.NETNS_DIR / name)

    def pod(self, *addresses: str) -> tuple[str, str]:
        """A running pod sandbox: (its UID, the mount of its namespace)."""
        path = self.netns(*addresses)
        uid = str(uuid.uuid4())
        self.sandboxes.start(path, uid)
        return uid, path

    def close(self) -> None:
        self.sandboxes.close()
        for name in self.names:
            netns.delete(name)
        self.names.clear()
