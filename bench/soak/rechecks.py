"""The churn's checks of undecided pods (bench/soak/ambient.py, bench/soak/sidecar.py): when each
pod was first seen Running, each read at most once every `every` seconds, and forgotten once
judged."""

from __future__ import annotations

import time
from collections.abc import Callable


class Rechecks:
    def __init__(self, every: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.every, self.clock = every, clock
        self._seen: dict[str, float] = {}
        self._read: dict[str, float] = {}

    def due(self, uid: str) -> float | None:
        """Seconds since the pod was first seen when it is time to read it (counted as read);
        None while its last read is under `every` seconds old."""
        now = self.clock()
        seen = self._seen.setdefault(uid, now)
        if now - self._read.get(uid, -self.every) < self.every:
            return None
        self._read[uid] = now
        return now - seen

    def judged(self, uid: str) -> None:
        self._seen.pop(uid, None)
        self._read.pop(uid, None)
