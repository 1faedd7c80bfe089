"""netns-dir: `cniNetnsDir` is where the container runtime keeps the pods' network namespaces.

The runtime names a pod's namespace to the plugin by a path under its own dir
(/var/run/netns/cni-<id> for containerd and CRI-O); the agent opens that path in its pod, where
the chart mounts `cniNetnsDir` at the same path. A wrong `cniNetnsDir` makes every ADD fail, so
the agent is not Ready while either of these shows it wrong:

- the dir is missing, or is not a directory;
- this node's pods that do not use the host's network (by the pod cache) run in network
  namespaces of their own (found by their processes' cgroups, as repair finds them) and none of
  those namespaces is mounted in the dir;
- the last ADD named a namespace path the agent cannot see (an ADD that names a visible one
  clears this).

An empty dir on a node with no pod namespace yet (a fresh node) passes: nothing tells a right
dir from a wrong one there, and the first pod's ADD decides (the third point), within one check.
Cost: a listing of the dir, then a pass over the node's /proc (one stat per process, a read of
the cgroup file of those in another namespace), every `period` seconds.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Collection

from agent.netns.look import NetnsId
from agent.netns.look import ident as netns_ident
from agent.podnetns.scan import scan_node

PodUids = Callable[[], Collection[str]]
"""The UIDs of this node's pods that have a network namespace of their own (not hostNetwork)."""


class NetnsDirCheck:
    """`check()` for the readiness service; `saw_add(path)` for the pod server's ADDs."""

    def __init__(self, *, netns_dir: str, proc_dir: str, pod_uids: PodUids) -> None:
        self.netns_dir = netns_dir
        self._proc_dir = proc_dir
        self._pod_uids = pod_uids
        self._lock = threading.Lock()
        self._unseen: str | None = None

    def saw_add(self, netns: str) -> None:
        """Called with the netns path of every ADD, before it is handled."""
        visible = os.path.exists(netns)
        with self._lock:
            if not visible:
                self._unseen = netns
            elif os.path.dirname(os.path.normpath(netns)) == os.path.normpath(self.netns_dir):
                self._unseen = None

    def __call__(self) -> str | None:
        where = f"cniNetnsDir {self.netns_dir}"
        if not os.path.isdir(self.netns_dir):
            return f"{where} is not a directory: set cniNetnsDir to the runtime's netns dir"
        with self._lock:
            unseen = self._unseen
        if unseen is not None:
            return (
                f"{where}: the runtime named the network namespace {unseen} for a pod, which is "
                f"not under it; set cniNetnsDir to {os.path.dirname(unseen) or unseen}"
            )
        uids = {u.lower() for u in self._pod_uids()}
        if not uids:
            return None  # no pod of this node has a namespace of its own (or none is known yet)
        mounted = self._mounted()
        in_pods = [
            ns
            for ns in scan_node(proc_dir=self._proc_dir, netns_dir=self.netns_dir)
            if ns.oldest is not None and uids.intersection(ns.pods)
        ]
        if not in_pods or any(ns.ident in mounted for ns in in_pods):
            return None
        return (
            f"{where} holds none of the network namespaces of the {len(in_pods)} pod sandbox(es) "
            "running on this node: the container runtime keeps them in another dir; set "
            "cniNetnsDir to it"
        )

    def _mounted(self) -> set[NetnsId]:
        try:
            names = os.listdir(self.netns_dir)
        except OSError:
            return set()
        found = (netns_ident(os.path.join(self.netns_dir, n)) for n in names)
        return {ident for ident in found if ident is not None}
