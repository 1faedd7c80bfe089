"""How long a list + watch loop waits after a failure: doubling from FIRST_SECONDS up to a cap,
with jitter, and starting over once failures stop for RESET_SECONDS.

The reset is client-go's reflector's (its backoff manager: 800 ms doubling to 30 s, reset after
2 min without a failure). Without it a run of failures never ends while each watch, however long
it served, ends by an error (the API server restarted, a connection cut): an agent that lived
through a few outages minutes apart waited the whole cap after the next one, its cache stale for
30 s after the API server was back (seen in the soak: `retryIn=30.0s` after a 20 s outage).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable

FIRST_SECONDS = 1.0
RESET_SECONDS = 120.0
JITTER = 0.2
"""Each delay drawn from [1 - JITTER, 1 + JITTER] times its step: nodes must not relist in step."""


class RetryBackoff:
    def __init__(
        self,
        cap_seconds: float,
        *,
        reset_seconds: float = RESET_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        draw: Callable[[float, float], float] = random.uniform,
    ) -> None:
        self._cap = cap_seconds
        self._reset = reset_seconds
        self._clock, self._draw = clock, draw
        self._failures = 0
        self._last_failure = -math.inf

    @property
    def failures(self) -> int:
        """Failures in the current run (0 after a success or a quiet RESET_SECONDS)."""
        return self._failures

    def failed(self) -> float:
        """Count a failure; the seconds to wait before the next try."""
        now = self._clock()
        if now - self._last_failure >= self._reset:
            self._failures = 0
        self._last_failure = now
        self._failures += 1
        step = min(self._cap, FIRST_SECONDS * 2 ** min(self._failures - 1, 30))
        return float(step * self._draw(1 - JITTER, 1 + JITTER))

    def succeeded(self) -> None:
        """The loop did what it is for (a watch that ran): the next failure starts over."""
        self._failures = 0
