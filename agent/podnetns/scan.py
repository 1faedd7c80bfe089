"""One pass over the node's processes: each network namespace other than the node's own, with the
pods whose processes live in it (by the pod UID of their cgroup) and a path to open it by.

A namespace is named by (st_dev, st_ino) of its `ns/net` file. Its path is a mount of it under the
node's netns dir when there is one (runtimes bind-mount the sandbox's namespace there; the mount
outlives any process), else `/proc/<pid>/ns/net` of its oldest process: the sandbox's own, which
outlives init and app containers. Mounted namespaces no process is in are listed too (no pods):
they count when looking for who else holds an address.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from agent.netns.look import NetnsId
from agent.netns.look import ident as netns_ident
from agent.podnetns.cgroup import pod_uid_of_cgroups


@dataclass
class NetnsSeen:
    ident: NetnsId
    path: str
    pods: dict[str, int] = field(default_factory=dict)
    """pod UID -> start time (clock ticks since boot) of its oldest process in this namespace."""
    oldest: int | None = None
    """Start time of the namespace's oldest process (None: only mounted)."""


def scan_node(*, proc_dir: str, netns_dir: str) -> list[NetnsSeen]:
    """Every network namespace of the node except the node's own (that of `proc_dir`/1)."""
    host = netns_ident(os.path.join(proc_dir, "1", "ns", "net"))
    seen: dict[NetnsId, NetnsSeen] = {}
    for pid, ns_path in _processes(proc_dir):
        ident = netns_ident(ns_path)
        if ident is None or ident == host:
            continue
        started = _start_time(os.path.join(proc_dir, pid, "stat"))
        if started is None:
            continue  # exited meanwhile
        entry = seen.setdefault(ident, NetnsSeen(ident, ns_path))
        if entry.oldest is None or started < entry.oldest:
            entry.oldest, entry.path = started, ns_path
        uid = _pod_uid(os.path.join(proc_dir, pid, "cgroup"))
        if uid is not None and (uid not in entry.pods or started < entry.pods[uid]):
            entry.pods[uid] = started
    for mount in _mounts(netns_dir):
        ident = netns_ident(mount)
        if ident is None or ident == host:
            continue
        entry = seen.setdefault(ident, NetnsSeen(ident, mount))
        entry.path = mount  # a mount names it for as long as it exists
    return list(seen.values())


def _processes(proc_dir: str) -> Iterator[tuple[str, str]]:
    try:
        entries = os.listdir(proc_dir)
    except OSError:
        return
    for entry in entries:
        if entry.isdigit():
            yield entry, os.path.join(proc_dir, entry, "ns", "net")


def _mounts(netns_dir: str) -> list[str]:
    try:
        return [os.path.join(netns_dir, name) for name in sorted(os.listdir(netns_dir))]
    except OSError:
        return []


def _pod_uid(cgroup_path: str) -> str | None:
    try:
        with open(cgroup_path, encoding="utf-8", errors="replace") as f:
            return pod_uid_of_cgroups(f.read(65536))
    except OSError:
        return None


def _start_time(stat_path: str) -> int | None:
    try:
        with open(stat_path, encoding="utf-8", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    # Field 22 (starttime) counts after the parenthesised command, which may contain spaces.
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None
