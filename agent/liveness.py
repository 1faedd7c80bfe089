"""Liveness: whether every long-running loop of the agent still runs (what /healthz answers).

Every loop here is essential: the serving loops (the HTTP port, the pod socket, the status
socket), the install watcher, readiness, the caches, repair, ambient's and the others built on
agent.background. A loop that ends without being asked to stop (its body raised, or returned on
its own) is recorded once with why, logged as an error naming it and counted in
`istio_cni_loop_failures_total{loop}`; from then on /healthz answers 503 naming it, so kubelet's
liveness probe restarts the agent. Nothing restarts a loop inside the process: a loop that
ended on a bug would likely end again, and a restarted process starts from a clean state (its
start-up reconciles every pod). A record stays until the process restarts.

A loop can also hang without ending: blocked on a lock, a syscall or a call with no timeout.
Each long-running loop has a heartbeat (`heart`), stamped on every turn, idle turns included
(a loop that waits on a queue, a condition or a selector wakes at a bounded interval to stamp),
with a bound of its own: well above its longest normal turn, which its own timeouts set (a watch
read may stay silent 130 s, so the caches' bound is above that). A heart not stamped within its
bound fails /healthz as an ended loop does, naming the loop and how long it has been silent;
it is logged and counted in `istio_cni_loop_hangs_total{loop}` once per silence, and clears
if the loop turns again. A loop being stopped, or ended, has no heartbeat to judge.

A pool of workers has no turns to stamp: an idle worker waits on the pool's queue, which is no
hang, and a busy pool takes items all the time even while one of its workers is stuck. Its
`Pool` is judged by the items in flight instead: each worker notes when its item began and that
it ended (one clock read and a dict store, no lock: the pool's hot path stays as cheap); one item
running past the pool's bound (the timeouts of what an item does) fails /healthz as a silent
heart does, naming the pool, and is logged and counted the same way; an idle pool never is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from prometheus_client import Counter

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

LOOP_FAILURES = Counter(
    "istio_cni_loop_failures",
    "Long-running loops of the agent that ended without being stopped (raised, or returned on "
    "their own), by loop: the agent's /healthz fails from the first one on.",
    ["loop"],
)

LOOP_HANGS = Counter(
    "istio_cni_loop_hangs",
    "Long-running loops of the agent found silent past their heartbeat's bound, or worker pools "
    "with a request running past theirs (blocked, not ended), by loop, once per silence: the "
    "agent's /healthz fails while one is.",
    ["loop"],
)


class _Judged:
    """What Liveness judges: a loop (or pool) named `loop` and how long it has been stuck."""

    def __init__(self, owner: Liveness, loop: str, bound: float) -> None:
        self.loop = loop
        self.bound = bound
        """Seconds stuck after which the loop counts as hung."""
        self._owner = owner
        self.hung = False
        """Already reported for the current silence."""

    def stuck_for(self, now: float) -> float:
        """Seconds the loop has made no progress (0 or less: it has just now)."""
        raise NotImplementedError

    def why(self, silent: float) -> str:
        raise NotImplementedError

    def quiet(self) -> None:
        """No longer judged (stopped or ended: an unexpected end is `ended`'s)."""
        self._owner.forget(self)


class Heart(_Judged):
    """One loop's heartbeat: `beat()` each turn; `quiet()` once the loop stops or ends."""

    def __init__(self, owner: Liveness, loop: str, bound: float) -> None:
        super().__init__(owner, loop, bound)
        self.last = owner.clock()

    def beat(self) -> None:
        self.last = self._owner.clock()

    def stuck_for(self, now: float) -> float:
        return now - self.last

    def why(self, silent: float) -> str:
        return f"no turn for {silent:.0f} s (bound {self.bound:g} s)"


class Pool(_Judged):
    """A worker pool's items in flight: each worker calls `begin()` as it takes an item and
    `end()` once done with it (in a `finally`); judged by its oldest item, never by idleness."""

    def __init__(self, owner: Liveness, loop: str, bound: float) -> None:
        super().__init__(owner, loop, bound)
        self._clock = owner.clock
        # Worker thread -> when its item began. Each worker writes only its own key, and a
        # dict's store, pop and copy are atomic (the GIL): no lock on the workers' path.
        self._began: dict[int, float] = {}

    def begin(self) -> None:
        self._began[threading.get_ident()] = self._clock()

    def end(self) -> None:
        self._began.pop(threading.get_ident(), None)

    def timed(self, work: Callable[[T], R], item: T) -> R:
        """`work(item)` as one item of the pool: begun, and ended however it ends."""
        self.begin()
        try:
            return work(item)
        finally:
            self.end()

    def stuck_for(self, now: float) -> float:
        return now - min(self._began.copy().values(), default=now)

    def why(self, silent: float) -> str:
        return f"one item running for {silent:.0f} s (bound {self.bound:g} s)"


class Liveness:
    """The loops that ended unexpectedly, in the order they ended, and the heartbeats of those
    that run."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._ended: dict[str, str] = {}
        self._hearts: list[_Judged] = []

    def heart(self, loop: str, bound: float) -> Heart:
        """A heartbeat for `loop`, judged from now on (stamped now)."""
        heart = Heart(self, loop, bound)
        with self._lock:
            self._hearts.append(heart)
        return heart

    def pool(self, loop: str, bound: float) -> Pool:
        """The items in flight of the worker pool `loop`, judged from now on; `bound`: the
        longest one item may run."""
        pool = Pool(self, loop, bound)
        with self._lock:
            self._hearts.append(pool)
        return pool

    def forget(self, heart: _Judged) -> None:
        with self._lock:
            if heart in self._hearts:
                self._hearts.remove(heart)

    def ended(self, loop: str, why: str) -> None:
        """Record that `loop` ended without being stopped, and why; logs and counts it."""
        LOOP_FAILURES.labels(loop=loop).inc()
        with self._lock:
            self._ended.setdefault(loop, why)
        log.error(
            "essential loop ended; the agent is no longer live and will be restarted",
            extra={"fields": {"loop": loop, "reason": why}},
        )

    def failing(self) -> list[tuple[str, str]]:
        """(loop, why) of each loop that ended unexpectedly, then of each whose heartbeat is
        older than its bound, or whose pool has an item running past it; empty while all run
        and turn."""
        now = self.clock()
        with self._lock:
            failing = list(self._ended.items())
            hearts = list(self._hearts)
        for heart in hearts:
            silent = heart.stuck_for(now)
            if silent <= heart.bound:
                heart.hung = False
                continue
            failing.append((heart.loop, heart.why(silent)))
            if not heart.hung:
                heart.hung = True
                self._hung(heart, silent)
        return failing

    @staticmethod
    def _hung(heart: _Judged, silent: float) -> None:
        LOOP_HANGS.labels(loop=heart.loop).inc()
        log.error(
            "essential loop hung: stuck past its bound; the agent is no longer live",
            extra={
                "fields": {
                    "loop": heart.loop,
                    "why": heart.why(silent),
                    "silentSeconds": round(silent, 1),
                    "boundSeconds": heart.bound,
                }
            },
        )


LIVENESS = Liveness()
"""The agent process's: every BackgroundLoop reports here unless given another."""
