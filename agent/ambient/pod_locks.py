"""One lock per pod uid, kept only while an operation holds or waits for it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _Entry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        """Operations holding or waiting for `lock`."""


class PodLocks:
    """`with locks.hold(uid):` runs one operation per pod at a time. A pod's entry goes with its
    last user, so a pod that is never released (not enrolled, its delete event matching
    nothing) leaves nothing behind."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    @contextmanager
    def hold(self, uid: str) -> Iterator[None]:
        with self._lock:
            entry = self._entries.get(uid)
            if entry is None:
                entry = self._entries[uid] = _Entry()
            entry.users += 1
        try:
            with entry.lock:
                yield
        finally:
            with self._lock:
                entry.users -= 1
                if entry.users == 0:
                    del self._entries[uid]

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
