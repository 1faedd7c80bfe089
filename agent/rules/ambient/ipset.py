"""The enrolled-pod address sets (`istio-inpod-probes-v4`/`-v6`), over ipset's netlink API.

Each set is `hash:ip` with comments, like Istio's: an entry is one pod IP whose comment is the
pod's UID, so a pod's removal never drops an address that a newer pod has taken over. Every call
runs in a thread inside the given namespace (the netlink socket belongs to that namespace).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from agent.errors import RedirectError
from agent.netns import run_in_netns

T = TypeVar("T")
ENOENT = 2
NOT_ADDED = 4103  # IPSET_ERR_EXIST: the element is not in the set


def family_of(ip: str) -> int:
    return socket.AF_INET6 if ipaddress.ip_address(ip).version == 6 else socket.AF_INET


class AddressSets:
    """The v4 set, and the v6 set when IPv6 is on, in the namespace at `netns_path`."""

    def __init__(self, netns_path: str, *, v4: str, v6: str | None) -> None:
        self.netns_path = netns_path
        self.names: dict[int, str] = {socket.AF_INET: v4}
        if v6 is not None:
            self.names[socket.AF_INET6] = v6

    def _run(self, what: str, fn: Callable[[Any], T]) -> T:
        from pyroute2 import IPSet

        def work() -> T:
            with IPSet() as ipset:
                return fn(ipset)

        try:
            return run_in_netns(self.netns_path, work)
        except RedirectError:
            raise
        except Exception as e:  # pyroute2's netlink errors
            raise RedirectError(f"ipset {what} in {self.netns_path}: {e}") from e

    def create(self) -> None:
        """Create the sets that are missing; existing ones keep their entries."""

        def work(ipset: Any) -> None:
            for family, name in self.names.items():
                ipset.create(name, stype="hash:ip", family=family, comment=True, exclusive=False)

        self._run("create", work)

    def destroy(self) -> None:
        def work(ipset: Any) -> None:
            for name in self.names.values():
                try:
                    ipset.destroy(name)
                except Exception as e:
                    if getattr(e, "code", None) != ENOENT:
                        raise

        self._run("destroy", work)

    def entries(self) -> dict[str, str]:
        """ip -> comment (pod UID) over both sets."""

        def work(ipset: Any) -> dict[str, str]:
            out: dict[str, str] = {}
            for name in self.names.values():
                for msg in ipset.list(name):
                    adt = msg.get_attr("IPSET_ATTR_ADT")
                    for entry in adt.get_attrs("IPSET_ATTR_DATA") if adt else ():
                        ip = entry.get_attr("IPSET_ATTR_IP_FROM")
                        addr = ip.get_attr("IPSET_ATTR_IPADDR_IPV4") or ip.get_attr(
                            "IPSET_ATTR_IPADDR_IPV6"
                        )
                        out[str(ipaddress.ip_address(addr))] = entry.get_attr("IPSET_ATTR_COMMENT")
            return out

        return self._run("list", work)

    def add(self, ips: Iterable[tuple[str, str]]) -> None:
        """Add (ip, uid) entries, replacing the comment of an address already there."""

        def work(ipset: Any) -> None:
            for ip, uid in ips:
                family = family_of(ip)
                name = self._name(family, ip)
                ipset.add(name, ip, family=family, comment=uid, exclusive=False)

        self._run("add", work)

    def delete(self, ips: Iterable[str]) -> None:
        """Delete addresses; ones that are not there are fine."""

        def work(ipset: Any) -> None:
            for ip in ips:
                family = family_of(ip)
                try:
                    ipset.delete(self._name(family, ip), ip, family=family)
                except Exception as e:
                    if getattr(e, "code", None) not in (NOT_ADDED, ENOENT):
                        raise

        self._run("delete", work)

    def _name(self, family: int, ip: str) -> str:
        name = self.names.get(family)
        if name is None:
            raise RedirectError(f"ipset: {ip} is IPv6 but IPv6 is off for the probe sets")
        return name
