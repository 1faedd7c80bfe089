"""A serving loop's worker pool: up to `count` daemon threads, started as work needs them, each
ending once it has waited `idle_seconds` for work, and whose shutdown waits a bounded time.

Idle workers end so that the pool holds what the recent load needs, not what its highest peak
did: 110 pods starting at once, or ADDs held up while the API server is away, would otherwise leave
their threads (and the stacks they touched) with the agent for good.

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
        self._cond = threading.Condition()
        # Under the condition's lock: the queue, the waiting workers, the threads. A submit
        # starts a worker when the queued items outnumber the waiting ones; a worker whose
        # wait ran out ends only with nothing queued, so no item is left without a taker.
        self._items: deque[_Item | None] = deque()
        """None: end (shutdown)."""
        self._waiting = 0
        self._threads: list[threading.Thread] = []
        self._started = 0
        self._closed = False

    def submit(self, work: Callable[..., R], *args: object) -> Future[R]:
        """Run `work(*args)` on a worker; RuntimeError once shut down."""
        future: Future[R] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{self._name}: the worker pool is shut down")
            self._items.append((future, functools.partial(work, *args)))  # type: ignore[arg-type]
            if len(self._items) <= self._waiting:
                self._cond.notify()
            elif len(self._threads) < self._count:
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
        with self._cond:
            return len(self._threads)

    def shutdown(self, timeout: float | None = None) -> list[str]:
        """Cancel what no worker has taken, tell every worker to end and wait at most `timeout`
        seconds for them all; the names of those still running (stuck in their item), logged."""
        timeout = self._join_timeout if timeout is None else timeout
        with self._cond:
            self._closed = True
            threads = list(self._threads)
            pending, self._items = self._items, deque([None] * len(threads))
            self._cond.notify_all()
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
        with self._cond:
            self._waiting += 1
            try:
                self._cond.wait_for(lambda: self._items, timeout=self._idle_seconds)
            finally:
                self._waiting -= 1
            if self._items:
                return self._items.popleft()
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
