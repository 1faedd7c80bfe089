"""A serving loop's worker pool: up to `count` daemon threads, started as work needs them, each
ending once it has waited `idle_seconds` for work, and whose shutdown waits a bounded time.

Idle workers end so that the pool holds what the recent load needs, not what its highest peak
did: 110 pods starting at once, or ADDs held up while the API server is away, would otherwise leave
their threads (and the stacks they touched) with the agent for good. For that, work goes to the
worker that went idle last (a stack, as Go's and most servers' pools): handed to the one idle
longest, a trickle of pods (one every few seconds) kept every worker of the last peak busy often
enough never to reach its idle limit, and the soak's agents kept 6 to 8 threads more after an
API server outage for the rest of their lives.

Why not concurrent.futures.ThreadPoolExecutor: its shutdown(wait=True) waits for a stuck worker
for ever, and, whatever shutdown was asked, the interpreter's exit joins every one of its workers
(an atexit hook), so one request stuck in a netns call that never returns would keep the agent
from stopping and from exiting after SIGTERM. Here a worker that is still busy when the bound
runs out is named, left behind, and, a daemon thread, does not hold the process's exit.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

log = logging.getLogger(__name__)

R = TypeVar("R")

_Item = tuple["Future[object]", Callable[[], object]]

IDLE_SECONDS = 60.0
"""How long a worker waits for work before it ends."""


class _Slot:
    """An idle worker's place: what it is handed (None: end), under the pool's lock."""

    def __init__(self, lock: threading.Lock) -> None:
        self._cond = threading.Condition(lock)
        self.given = False
        self.item: _Item | None = None

    def give(self, item: _Item | None) -> None:
        self.item, self.given = item, True
        self._cond.notify()

    def wait(self, seconds: float) -> None:
        self._cond.wait_for(lambda: self.given, timeout=seconds)


class Workers:
    """submit() as ThreadPoolExecutor's; shutdown() never waits longer than its timeout."""

    def __init__(
        self, count: int, name: str, join_timeout: float, *, idle_seconds: float = IDLE_SECONDS
    ) -> None:
        """`join_timeout`: how long shutdown() waits for the workers unless told otherwise."""
        self._count = count
        self._join_timeout = join_timeout
        self._idle_seconds = idle_seconds
        self._name = name
        self._lock = threading.Lock()
        # Under the lock: the queue, the idle workers, the threads. A submit hands its item to
        # the worker that went idle last, or queues it (starting a worker when the count allows);
        # a worker takes from the queue before it goes idle, so no item waits beside an idle one.
        self._items: deque[_Item | None] = deque()
        """None: end (shutdown)."""
        self._idle: list[_Slot] = []
        """A stack: the last to go idle is handed the next item, so the others can end."""
        self._threads: list[threading.Thread] = []
        self._started = 0
        self._closed = False

    def submit(self, work: Callable[..., R], *args: object) -> Future[R]:
        """Run `work(*args)` on a worker; RuntimeError once shut down."""
        future: Future[R] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self._name}: the worker pool is shut down")
            item: _Item = (future, functools.partial(work, *args))  # type: ignore[assignment]
            if self._idle:
                self._idle.pop().give(item)
            else:
                self._items.append(item)
                if len(self._threads) < self._count:
                    thread = threading.Thread(
                        target=self._run, name=f"{self._name}_{self._started}", daemon=True
                    )
                    self._started += 1
                    self._threads.append(thread)
                    thread.start()
        return future

    @property
    def size(self) -> int:
        """Workers alive now, busy or waiting."""
        with self._lock:
            return len(self._threads)

    def shutdown(self, timeout: float | None = None) -> list[str]:
        """Cancel what no worker has taken, tell every worker to end and wait at most `timeout`
        seconds for them all; the names of those still running (stuck in their item), logged."""
        timeout = self._join_timeout if timeout is None else timeout
        with self._lock:
            self._closed = True
            threads = list(self._threads)
            idle, self._idle = self._idle, []
            busy = len(threads) - len(idle)
            pending, self._items = self._items, deque([None] * busy)
            for slot in idle:
                slot.give(None)
        for item in pending:
            if item is not None:
                item[0].cancel()
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        left = [t.name for t in threads if t.is_alive()]
        if left:
            log.warning(
                "%s: workers still busy at stop; left running",
                self._name,
                extra={"fields": {"threads": ",".join(left), "waitedSeconds": timeout}},
            )
        return left

    def _next(self) -> _Item | None:
        """The next item, waiting for one; None: end this worker (shut down, or idle too long,
        in which case it is no longer counted)."""
        with self._lock:
            if self._items:
                return self._items.popleft()
            slot = _Slot(self._lock)
            self._idle.append(slot)
            slot.wait(self._idle_seconds)
            if slot.given:
                return slot.item
            self._idle.remove(slot)
            self._threads.remove(threading.current_thread())
            return None

    def _run(self) -> None:
        while (item := self._next()) is not None:
            future, work = item
            if future.set_running_or_notify_cancel():
                try:
                    result = work()
                except BaseException as e:  # the caller's to see, as ThreadPoolExecutor's
                    future.set_exception(e)
                else:
                    future.set_result(result)
            del item, future, work  # no reference to a finished reply while idle
