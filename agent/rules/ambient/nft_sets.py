"""The enrolled-pod address sets as nft sets (`istio-inpod-probes-v4`/`-v6` in the node's
`inet istio-ambient-nat`), Istio's nftables counterpart of the ipsets (agent.rules.ambient.ipset).

Same interface as `AddressSets`: an element is one pod IP whose comment is the pod's UID, so a
pod's removal never drops an address that a newer pod has taken over. Each change is one `nft -f`
transaction inside the given namespace.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable

from agent.errors import RedirectError
from agent.rules.ambient.builder import PROBE_IPSET_V4, PROBE_IPSET_V6
from agent.rules.ambient.nft import HOST_TABLE, set_commands
from agent.rules.backend_nft import nft


class NftAddressSets:
    """The v4 set, and the v6 set when IPv6 is on, in the namespace at `netns_path`."""

    def __init__(self, netns_path: str, *, ipv6: bool) -> None:
        self.netns_path = netns_path
        self.ipv6 = ipv6
        self.names = {4: PROBE_IPSET_V4} | ({6: PROBE_IPSET_V6} if ipv6 else {})

    def create(self) -> None:
        """Create the table and sets that are missing; existing ones keep their elements."""
        nft(self.netns_path, ["-f", "-"], set_commands(ipv6=self.ipv6))

    def destroy(self) -> None:
        """Drop the node table (sets and rules with it): nft sets live in their table."""
        nft(self.netns_path, ["-f", "-"], f"add table {HOST_TABLE}\ndelete table {HOST_TABLE}\n")

    def entries(self) -> dict[str, str]:
        """ip -> comment (pod UID) over both sets."""
        out: dict[str, str] = {}
        for name in self.names.values():
            listed = json.loads(
                nft(self.netns_path, ["-j", "list", "set", *HOST_TABLE.split(), name])
            )
            for item in listed.get("nftables", []):
                for elem in item.get("set", {}).get("elem", []):
                    if isinstance(elem, dict):
                        val, comment = elem["elem"]["val"], elem["elem"].get("comment", "")
                    else:
                        val, comment = elem, ""
                    out[str(ipaddress.ip_address(val))] = comment
        return out

    def add(self, ips: Iterable[tuple[str, str]]) -> None:
        """Add (ip, uid) elements, replacing the comment of an address already there."""
        lines = []
        for ip, uid in ips:
            element = f"{HOST_TABLE} {self._name(ip)} {{ {ip} }}"
            # add-delete-add: the delete is valid whether or not it was there, and the comment
            # of an existing element is replaced (nft's add keeps the old one).
            lines += [f"add element {element}", f"delete element {element}"]
            lines.append(f"add element {HOST_TABLE} {self._name(ip)} {{ {ip} comment {_q(uid)} }}")
        self._run(lines)

    def delete(self, ips: Iterable[str]) -> None:
        """Delete addresses; ones that are not there are fine."""
        lines = []
        for ip in ips:
            element = f"{HOST_TABLE} {self._name(ip)} {{ {ip} }}"
            lines += [f"add element {element}", f"delete element {element}"]
        self._run(lines)

    def _run(self, lines: list[str]) -> None:
        if lines:
            nft(self.netns_path, ["-f", "-"], "".join(line + "\n" for line in lines))

    def _name(self, ip: str) -> str:
        name = self.names.get(ipaddress.ip_address(ip).version)
        if name is None:
            raise RedirectError(f"nft set: {ip} is IPv6 but IPv6 is off for the probe sets")
        return name


def _q(text: str) -> str:
    """A comment as an nft string (Go's %q for the UIDs Kubernetes gives: no quotes inside)."""
    if '"' in text or "\n" in text or len(text) > 128:
        raise RedirectError(f"nft set: comment {text!r} cannot be stored")
    return f'"{text}"'
