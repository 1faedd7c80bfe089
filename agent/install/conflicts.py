"""Counting fights with another writer of a CNI config file, and naming the likely culprit."""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterable

from agent.errors import InstallError
from agent.install import conflist

# plugin type or file-name fragment -> who rewrites that file and how to stop it.
_CULPRITS: tuple[tuple[str, str], ...] = (
    ("cilium", "Cilium (its agent rewrites its CNI config unless cni.exclusive=false)"),
    ("calico", "Calico (install-cni rewrites the conflist; check CNI_CONF_NAME/config sync)"),
    ("aws-cni", "AWS VPC CNI (aws-node rewrites 10-aws.conflist at start)"),
    ("flannel", "flannel (its init container copies cni-conf.json over the file)"),
    ("weave", "Weave Net (weave-kube rewrites its conflist)"),
    ("antrea", "Antrea (install_cni rewrites its conflist)"),
    ("multus", "Multus (it regenerates its config from the master network)"),
    ("ovn", "OVN-Kubernetes (ovnkube-node rewrites its config)"),
    ("azure", "Azure CNI / CNS (it regenerates the conflist)"),
    ("kindnet", "kindnet (kindnetd rewrites its conflist)"),
    ("gke", "GKE netd (it regenerates the conflist from its template)"),
    ("k3s", "k3s (its agent rewrites the flannel conflist)"),
)


def likely_culprit(file_name: str, plugin_types: Iterable[str]) -> str:
    """A best guess from the file's name and the plugin types in it."""
    haystack = " ".join([os.path.basename(file_name).lower(), *(t.lower() for t in plugin_types)])
    for needle, who in _CULPRITS:
        if needle in haystack:
            return who
    return "another CNI or node agent writing this file"


PLUGIN_CULPRIT = (
    "another istio-cni agent on this node installing a different plugin build (a rolling "
    "update's surge, or a second installation of the chart)"
)
"""Who else rewrites our plugin in the bin dir."""

FIGHT_HEAL_INTERVAL = 0.25
"""Shortest time between two heals of a file another writer keeps rewriting."""


class ConflictTracker:
    """Heals per file over the last minute; says when one passes the warning threshold, and how
    long to hold the next heal off then: past the threshold, heals of that file are at least
    FIGHT_HEAL_INTERVAL apart (a writer that answers each of our writes with its own gets no
    tight write loop, about 20 writes a second unbounded, while the entry is still never gone
    for long: a pod started without it would start uncaptured); none once the minute holds no
    more than the threshold."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self.clock = clock
        self._heals: dict[str, deque[float]] = {}
        self._warned: dict[str, float] = {}

    def hold_off(self) -> float:
        """Seconds to wait before the next heal (0: at once)."""
        now = self.clock()
        wait = 0.0
        for heals in self._heals.values():
            while heals and heals[0] < now - 60.0:
                heals.popleft()
            if len(heals) > self.per_minute:
                wait = max(wait, FIGHT_HEAL_INTERVAL - (now - heals[-1]))
        return wait

    def record(self, path: str) -> int | None:
        """Count one heal of `path`; the minute's count when a warning is due (once a minute)."""
        now = self.clock()
        heals = self._heals.setdefault(path, deque())
        heals.append(now)
        while heals and heals[0] < now - 60.0:
            heals.popleft()
        if len(heals) <= self.per_minute:
            return None
        if now - self._warned.get(path, -1e9) < 60.0:
            return None
        self._warned[path] = now
        return len(heals)


def plugin_types(data: bytes | None) -> list[str]:
    """The plugin types a config file's bytes name (for likely_culprit); [] when unreadable."""
    if data is None:
        return []
    try:
        config = conflist.parse(data, source="")
    except InstallError:
        return []
    plugins = config.get("plugins")
    items = plugins if isinstance(plugins, list) else [config]
    return [str(p.get("type")) for p in items if isinstance(p, dict) and p.get("type")]
