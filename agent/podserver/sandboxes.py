"""What the agent remembers about each pod sandbox it answered an ADD for, until DEL or GC."""

from __future__ import annotations

import threading
from collections.abc import Collection
from dataclasses import dataclass

from agent.netns.look import NetnsId
from agent.netns.look import ident as netns_ident


@dataclass(frozen=True)
class Sandbox:
    """One sandbox (CNI attachment) seen by ADD."""

    container_id: str
    ifname: str
    namespace: str
    name: str
    uid: str
    netns: str
    redirected: bool
    ambient: bool = False
    """Enrolled in ambient by this ADD (DEL releases it)."""
    ips: tuple[str, ...] = ()
    """The pod's IPs from the ADD's prevResult (ambient only)."""
    netns_id: NetnsId | None = None
    """(st_dev, st_ino) of `netns` at ADD: a later look at the path must find the same one."""


class SandboxStore:
    """containerId -> Sandbox, safe to use from the server's request threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, Sandbox] = {}

    def put(self, sandbox: Sandbox) -> None:
        with self._lock:
            self._items.pop(sandbox.container_id, None)  # re-inserted last: the latest ADD
            self._items[sandbox.container_id] = sandbox

    def get(self, container_id: str) -> Sandbox | None:
        with self._lock:
            return self._items.get(container_id)

    def netns_of(self, uid: str) -> str | None:
        """The netns path of the pod's latest ADD, while that path is still the namespace the
        runtime named then (a path reused by another sandbox is not the pod's)."""
        with self._lock:
            latest = [s for s in self._items.values() if s.uid == uid and s.netns_id is not None]
        for sandbox in reversed(latest):
            if netns_ident(sandbox.netns) == sandbox.netns_id:
                return sandbox.netns
        return None

    def remove(self, container_id: str) -> Sandbox | None:
        with self._lock:
            return self._items.pop(container_id, None)

    def keep_only(self, valid: Collection[tuple[str, str]]) -> list[Sandbox]:
        """Drop every sandbox whose (containerId, ifname) is not in `valid`; returns the dropped."""
        keep = set(valid)
        with self._lock:
            dropped = [s for s in self._items.values() if (s.container_id, s.ifname) not in keep]
            for sandbox in dropped:
                del self._items[sandbox.container_id]
        return dropped

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
