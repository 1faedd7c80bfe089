"""Is anything of ours in a namespace at all? (repair's test for a pod that runs uncaptured)

Ours: an `ISTIO_*` chain in any table of either iptables flavour and family (sidecar and ambient
rules alike), or an `istio-proxy-*` / `istio-ambient-*` nftables table. The kernel's table lists
(agent.netns.look) say where there is nothing to read; only those places run a `-save` program.
"""

from __future__ import annotations

import shutil

from agent.netns.look import look
from agent.rules import backend_nft, backend_restore
from agent.rules.model import Family, is_our_chain
from agent.rules.nft import AMBIENT_PREFIX, SIDECAR_PREFIX

_FAMILIES: tuple[Family, ...] = (4, 6)


def ours_present(netns_path: str) -> bool:
    """True when the namespace holds any chain or table of ours; raises RedirectError when it
    cannot be read (then nobody can tell, and the caller must not act as if it were empty)."""
    seen = look(netns_path)
    for variant in ("legacy", "nft"):
        for family in _FAMILIES:
            if seen.tables_absent(variant, family, ("mangle", "nat", "raw", "filter")):
                continue
            state = backend_restore.read_state(netns_path, variant, family)
            if any(is_our_chain(chain) for chains in state.values() for chain in chains):
                return True
    return _nft_tables_present(netns_path)


def _nft_tables_present(netns_path: str) -> bool:
    if shutil.which("nft") is None:
        return False
    listed = backend_nft.nft(netns_path, ["list", "tables"])
    names = [line.split()[-1] for line in listed.splitlines() if line.startswith("table ")]
    return any(n.startswith((SIDECAR_PREFIX, AMBIENT_PREFIX)) for n in names)
