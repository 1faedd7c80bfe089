"""What ztunnel requires of the node agent on the ZDS socket, checked message by message for the
ztunnel test double (testbed.ztunnel_double), which records each violation; the double's owner
fails the test on any (its `close`, so every fixture's teardown, asserts there is none).

Checked, as ztunnel would see it:

- order: ztunnel says hello first (the double does, on connect); then the agent sends the
  snapshot, AddWorkload or KeepWorkload for each pod, closed by one SnapshotSent; only then
  DelWorkload, and never KeepWorkload or another SnapshotSent on that connection;
- AddWorkload: a uid; a WorkloadInfo whose name, namespace and service account are those of
  the pod with that uid (the pods the test told the double about, and in tiers with an API
  server the API server's pod, through an `IdentityLookup`); exactly one descriptor, and it is
  a network namespace (ioctl NS_GET_NSTYPE); not the same sandbox again after a DelWorkload
  of that uid that left the pod captured (its netns still redirecting to ztunnel when the
  DelWorkload came: the agent let go of a pod it still captures, as a stale sandbox's DEL
  would, and is adding it back). A sandbox is told apart by its netns cookie, which the kernel
  never reuses, unlike an inode number; a pod released properly (its in-pod rules removed
  first, as Istio does) may come back in the same sandbox;
- KeepWorkload: only inside a snapshot, only for a pod this ztunnel holds (added on an earlier
  connection, or held from before: `hold`), without a descriptor;
- DelWorkload and SnapshotSent: without a descriptor; an unknown request kind is a violation.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

from agent.ambient import zds_pb2

NS_GET_NSTYPE = 0xB703  # _IO(0xb7, 0x3), <linux/nsfs.h>
CLONE_NEWNET = 0x40000000


@dataclass(frozen=True)
class PodIdentity:
    """What ztunnel gets told about a pod, and what it looks the pod up by."""

    uid: str
    name: str
    namespace: str
    service_account: str


IdentityLookup = Callable[[str, str, str], PodIdentity | None]
"""(uid, namespace, name) -> the pod with that uid as the API server has it; None when it
cannot tell (the pod is gone, or the name now belongs to another pod): nothing is checked."""

NetnsCookie = Callable[[int], int]
"""The netns cookie (SO_NETNS_COOKIE) of the namespace at a descriptor."""
Redirects = Callable[[int], bool]
"""Does the namespace at a descriptor hold in-pod redirection rules (to ztunnel)?"""


class ZdsChecks:
    """Thread-safe; fed by the double's connection and reader thread."""

    def __init__(
        self, *, lookup: IdentityLookup | None, cookie: NetnsCookie, redirects: Redirects
    ) -> None:
        self._lookup = lookup
        self._cookie = cookie
        self._redirects = redirects
        self._netns: dict[str, int] = {}
        """uid -> a descriptor of the netns of its last AddWorkload, held as ztunnel holds it."""
        self._lock = threading.Lock()
        self.violations: list[str] = []
        self._told: dict[str, PodIdentity] = {}
        self._held: set[str] = set()
        """uids this ztunnel holds (added, or kept by a snapshot)."""
        self._last_netns: dict[str, int] = {}
        """uid -> netns cookie of its last AddWorkload."""
        self._deleted: dict[str, int] = {}
        """uid -> netns cookie of a pod its DelWorkload left captured."""
        self._in_snapshot: set[str] | None = None
        self._connected = False

    # -- what the test tells it

    def tell(self, *pods: PodIdentity) -> None:
        with self._lock:
            self._told.update((p.uid, p) for p in pods)

    def hold(self, *uids: str) -> None:
        """This ztunnel holds these pods from before (an agent restarted, ztunnel did not)."""
        with self._lock:
            self._held.update(uids)

    # -- the connection

    def said_hello(self) -> None:
        with self._lock:
            self._connected = True
            self._in_snapshot = set()

    def disconnected(self) -> None:
        with self._lock:
            self._connected = False
            self._in_snapshot = None

    def restarted(self) -> None:
        """A new ztunnel process: it holds nothing (what the agent deleted stays deleted)."""
        with self._lock:
            self._held.clear()
            self._last_netns.clear()
        self.close()

    def close(self) -> None:
        """Let go of the namespaces held."""
        with self._lock:
            fds, self._netns = list(self._netns.values()), {}
        for fd in fds:
            os.close(fd)

    # -- each request

    def request(self, request: zds_pb2.WorkloadRequest, fds: list[int]) -> None:
        kind = request.WhichOneof("payload") or "none"
        found: list[str] = []
        if not self._connected:
            found.append(f"{kind} before ztunnel's hello")
        if kind == "add":
            found += self._add(request.add, fds)
        elif kind == "keep":
            found += self._keep(request.keep.uid, fds)
        elif kind == "del":
            found += self._del(getattr(request, "del").uid, fds)
        elif kind == "snapshot_sent":
            found += self._snapshot_sent(fds)
        else:
            found.append(f"unknown request {kind}")
        if found:
            with self._lock:
                self.violations.extend(found)

    def answered(self, request: zds_pb2.WorkloadRequest, error: str) -> None:
        """The double's ack: a pod it took is held from now on."""
        if request.WhichOneof("payload") == "add" and not error:
            with self._lock:
                self._held.add(request.add.uid)

    def _add(self, add: zds_pb2.AddWorkload, fds: list[int]) -> list[str]:
        uid, what = add.uid, f"AddWorkload {add.uid or '(no uid)'}"
        found = [] if uid else [f"{what}: no uid"]
        found += self._identity(what, uid, add.workload_info)
        if len(fds) != 1:
            return [*found, f"{what}: {len(fds)} descriptors, not one network namespace"]
        kind = _ns_kind(fds[0])
        if kind != "net":
            return [*found, f"{what}: its descriptor is {kind!r}, not a network namespace"]
        cookie, held = self._cookie(fds[0]), os.dup(fds[0])
        with self._lock:
            if self._deleted.pop(uid, None) == cookie:
                found.append(
                    f"{what}: the same sandbox again after a DelWorkload that left it captured"
                )
            self._last_netns[uid] = cookie
            old, self._netns[uid] = self._netns.get(uid), held
            # A pod the snapshot adds is one it names (SnapshotSent must not drop it), whether
            # or not this ztunnel held it before.
            if self._in_snapshot is not None:
                self._in_snapshot.add(uid)
        if old is not None:
            os.close(old)
        return found

    def _identity(self, what: str, uid: str, info: zds_pb2.WorkloadInfo) -> list[str]:
        got = (info.name, info.namespace, info.service_account)
        if not info.name or not info.namespace:
            return [f"{what}: WorkloadInfo without name or namespace: {got}"]
        with self._lock:
            told = self._told.get(uid)
        expected = told or (self._lookup(uid, info.namespace, info.name) if self._lookup else None)
        if expected is None:
            return []
        want = (expected.name, expected.namespace, expected.service_account)
        if got != want:
            return [f"{what}: WorkloadInfo (name, namespace, service account) {got}, pod {want}"]
        return []

    def _keep(self, uid: str, fds: list[int]) -> list[str]:
        what = f"KeepWorkload {uid}"
        found = [f"{what}: came with a descriptor"] if fds else []
        with self._lock:
            if self._in_snapshot is None:
                found.append(f"{what}: outside a snapshot")
            else:
                self._in_snapshot.add(uid)
            if uid not in self._held:
                found.append(f"{what}: a pod this ztunnel does not hold")
        return found

    def _del(self, uid: str, fds: list[int]) -> list[str]:
        what = f"DelWorkload {uid}"
        found = [f"{what}: came with a descriptor"] if fds else []
        with self._lock:
            if self._in_snapshot is not None:
                found.append(f"{what}: before SnapshotSent")
            self._held.discard(uid)
            cookie, netns = self._last_netns.pop(uid, None), self._netns.pop(uid, None)
        if netns is not None:
            try:
                if cookie is not None and self._redirects(netns):
                    with self._lock:
                        self._deleted[uid] = cookie
            finally:
                os.close(netns)
        return found

    def _snapshot_sent(self, fds: list[int]) -> list[str]:
        found = ["SnapshotSent came with a descriptor"] if fds else []
        with self._lock:
            if self._in_snapshot is None:
                return [*found, "SnapshotSent outside a snapshot (a second one)"]
            self._held &= self._in_snapshot  # ztunnel drops every pod the snapshot did not name
            self._in_snapshot = None
        return found


def _ns_kind(fd: int) -> str:
    """`net` for a network namespace: ioctl NS_GET_NSTYPE (a descriptor opened through a netns
    bind mount reads as the mount's path in /proc/self/fd, so the link alone cannot tell)."""
    try:
        nstype = fcntl.ioctl(fd, NS_GET_NSTYPE)
    except OSError as e:
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            link = "?"
        return f"not a namespace ({e.strerror}): {link}"
    return "net" if nstype == CLONE_NEWNET else f"namespace type {nstype:#x}"
