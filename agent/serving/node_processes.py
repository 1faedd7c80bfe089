"""Whether a connection from the node's own address was made by one of the node's processes
(kubelet probing the agent) or by a hostNetwork pod's, which shares that address.

The HTTP port's budget is kept by peer address (agent.serving.budget), and kubelet probes from the
node's address. A hostNetwork pod has that address too, so its flood would spend the allowance
kubelet's probes draw on. The address cannot tell them apart; the process holding the peer's
socket can: the kernel names that socket's inode (agent.serving.socket_diag), the node's /proc
names who holds it, and the holder's cgroup names a pod or none (`pod_of_cgroups`: the
agent's reading of kubelet's cgroup names, agent.podnetns.cgroup).

Finding the holder among all the node's processes reads every descriptor on the node, some
milliseconds: a scan is done at most once per `scan_every`, for every connection then waiting,
and the node processes it finds holding one (kubelet, which probes from the agent's first
seconds) are remembered. Their sockets are then listed at most once per `refresh_every`, so that
their next connections are told within that period, and a flood of connections costs one
listing per period and one scan a second, not one of either per connection
(agent.serving.origins holds the connections meanwhile).
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable

log = logging.getLogger(__name__)

SCAN_EVERY_SECONDS = 1.0
REFRESH_EVERY_SECONDS = 0.05
MAX_KNOWN = 4
"""Node processes remembered: kubelet, and room for a node-level scraper beside it."""
MAX_DESCRIPTORS = 1024
"""A node process with more descriptors is not remembered: listing them 20 times a second would
cost more than its probes are worth (kubelet holds a few hundred); its connections are charged
to their address, as every connection was before the node's processes were told apart."""


class NodeProcesses:
    """Tells the node's processes' connections from pods' ones. Used by one thread (a loop)."""

    def __init__(
        self,
        proc_dir: str,
        pod_of_cgroups: Callable[[str], str | None],
        *,
        clock: Callable[[], float] = time.monotonic,
        scan_every: float = SCAN_EVERY_SECONDS,
        refresh_every: float = REFRESH_EVERY_SECONDS,
    ) -> None:
        self.proc_dir = proc_dir
        self._pod_of = pod_of_cgroups
        self.clock = clock
        self.scan_every = scan_every
        self.refresh_every = refresh_every
        self._known: OrderedDict[int, None] = OrderedDict()
        self.scanned_at = -scan_every
        """When every process's descriptors were last read."""
        self._held: set[str] = set()
        self.listed_at = -refresh_every
        """When the known processes' sockets were last listed (the listing began)."""

    def scan_due(self) -> bool:
        """A scan of the node's processes is allowed now."""
        return self.clock() - self.scanned_at >= self.scan_every

    def relist_due(self) -> bool:
        """A listing of the known processes' sockets is allowed now."""
        return self.clock() - self.listed_at >= self.refresh_every

    def held(self, inode: int) -> bool:
        """A known node process held the socket `inode` at the last listing."""
        return f"socket:[{inode}]" in self._held

    def relist(self) -> None:
        """The sockets the known node processes hold, listed again."""
        self.listed_at = self.clock()
        held: set[str] = set()
        for pid in list(self._known):
            targets = _sockets(self.proc_dir, pid, MAX_DESCRIPTORS)
            if targets is None:
                del self._known[pid]  # exited (kubelet restarted), or grew past the bound
            else:
                held |= targets
        self._held = held

    def scan(self, inodes: set[int]) -> set[int]:
        """Of the sockets `inodes`, those a process of the node (in no pod's cgroup) holds, found
        by reading every process's descriptors; their holders are remembered."""
        self.scanned_at = self.clock()
        wanted = {f"socket:[{inode}]": inode for inode in inodes}
        holders = _holders(self.proc_dir, set(wanted))
        found: set[int] = set()
        for target, pid in holders.items():
            if not self._of_the_node(pid) or _too_many_descriptors(self.proc_dir, pid):
                continue
            found.add(wanted[target])
            if pid not in self._known:
                log.info("a node process connects to the agent", extra={"fields": {"pid": pid}})
            self._known[pid] = None
            self._known.move_to_end(pid)
        while len(self._known) > MAX_KNOWN:
            self._known.popitem(last=False)
        if found:
            self.relist()
        return found

    def _of_the_node(self, pid: int) -> bool:
        """The process is in no pod's cgroup (kubelet, the runtime); unreadable counts as a
        pod's, and so does a path under kubelet's pods that names no single pod."""
        try:
            with open(os.path.join(self.proc_dir, str(pid), "cgroup"), encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            return False
        return bool(text.strip()) and self._pod_of(text) is None and "kubepods" not in text


def _too_many_descriptors(proc_dir: str, pid: int) -> bool:
    try:
        return len(os.listdir(os.path.join(proc_dir, str(pid), "fd"))) > MAX_DESCRIPTORS
    except OSError:
        return True


def _sockets(proc_dir: str, pid: int, most: int | None = None) -> set[str] | None:
    """The sockets `pid` holds ("socket:[inode]"); None when the process is gone, or holds more
    than `most` descriptors."""
    fd_dir = os.path.join(proc_dir, str(pid), "fd")
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return None
    if most is not None and len(fds) > most:
        log.info(
            "a node process holds too many descriptors to be told apart cheaply; its connections"
            " are charged to their address",
            extra={"fields": {"pid": pid, "descriptors": len(fds), "bound": most}},
        )
        return None
    held: set[str] = set()
    for fd in fds:
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:"):
            held.add(target)
    return held


def _holders(proc_dir: str, targets: set[str]) -> dict[str, int]:
    """The process holding each of the sockets `targets` (those held by one)."""
    found: dict[str, int] = {}
    try:
        entries = os.listdir(proc_dir)
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        held = _sockets(proc_dir, int(entry))
        for target in (held or set()) & targets:
            found.setdefault(target, int(entry))
        if len(found) == len(targets):
            break
    return found
