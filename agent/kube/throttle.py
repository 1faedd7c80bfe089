"""How fast the agent may ask the API server, as client-go's rest client decides it:

    token bucket   QPS and burst (the settings' kubeApi.qps, kubeApi.burst; client-go's
                   defaults 5 and 10): every call takes a token, waiting for one when the
                   burst is spent (a node's burst of pod starts must not become a burst of
                   GETs under API Priority and Fairness)
    hold-off       an answer 429 or 5xx with Retry-After: N holds every call of this client
                   back for N seconds (capped at RETRY_AFTER_MAX_SECONDS): the API server said
                   when it can take more, from anyone on this node

A call waits only as long as its own timeout allows; one that would wait longer fails at once
with `Throttled` (retry later), never sent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from agent.errors import AgentError

DEFAULT_QPS = 5
DEFAULT_BURST = 10
RETRY_AFTER_MAX_SECONDS = 60.0
"""The longest one Retry-After holds calls back: a larger value (or a broken proxy's) is cut."""
RETRY_STATUSES = frozenset({429}) | frozenset(range(500, 600))
"""Answers whose Retry-After is honoured (client-go's checkWait)."""


def retry_after(status: int, headers: Mapping[str, str]) -> float | None:
    """Seconds the answer asks to wait (an integer Retry-After on 429 or 5xx), capped; None when
    it asks nothing."""
    if status not in RETRY_STATUSES:
        return None
    value = (headers.get("Retry-After") or "").strip()
    if not value.isdigit():
        return None  # client-go reads only whole seconds
    return min(float(value), RETRY_AFTER_MAX_SECONDS)


class Throttle:
    """The token bucket and the hold-off, shared by every call of one client (thread-safe)."""

    def __init__(
        self,
        qps: float = DEFAULT_QPS,
        burst: int = DEFAULT_BURST,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"kube API rate: qps {qps} and burst {burst} must be positive")
        self.qps, self.burst = float(qps), burst
        self._clock, self._sleep = clock, sleep
        self._tokens = float(burst)
        self._filled_at = clock()
        self._not_before = 0.0
        self._lock = threading.Lock()

    def hold_off(self, seconds: float) -> None:
        """No call before `seconds` from now (the API server's Retry-After)."""
        with self._lock:
            self._not_before = max(self._not_before, self._clock() + seconds)

    def wait_turn(self, budget: float) -> float:
        """Wait for this call's turn; returns the seconds waited. Raises Throttled, taking
        nothing, when the turn is more than `budget` seconds away."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._filled_at) * self.qps)
            self._filled_at = now
            held = max(0.0, self._not_before - now)
            wait = max(held, (1.0 - self._tokens) / self.qps)
            if wait > budget:
                raise Throttled(wait, held > 0)
            self._tokens -= 1.0  # below zero: reserved by the callers waiting for it
        if wait > 0:
            self._sleep(wait)
        return wait


class Throttled(AgentError):
    """The call would have had to wait longer than its timeout for its turn; it was not sent."""

    retry_later = True

    def __init__(self, wait: float, held: bool) -> None:
        why = "the API server asked to wait (Retry-After)" if held else "client rate limit"
        super().__init__(f"not sent: its turn was {wait:.1f}s away ({why})")
        self.wait, self.held = wait, held
