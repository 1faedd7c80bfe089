"""A serving loop's worker pool: up to `count` daemon threads, started as work needs them, whose
shutdown waits a bounded time.

Why not concurrent.futures.ThreadPoolExecutor: its shutdown(wait=True) waits for a stuck worker
for ever, and, whatever shutdown was asked, the interpreter's exit joins every one of its workers
(an atexit hook), so one request stuck in a netns call that never returns would keep the agent
from stopping and from exiting after SIGTERM. Here a worker that is still busy when the bound
runs out is named, left behind, and, a daemon thread, does not hold the process's exit.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

log = logging.getLogger(__name__)

R = TypeVar("R")

_Item = tuple["Future[object]", Callable[[], object]]


class Workers:
    """submit() as ThreadPoolExecutor's; shutdown() never waits longer than its timeout."""

    def __init__(self, count: int, name: str, join_timeout: float) -> None:
        """`join_timeout`: how long shutdown() waits for the workers unless told otherwise."""
        self._count = count
        self._join_timeout = join_timeout
        self._name = name
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        """Released by a worker each time it waits for an item: a submit takes one, or starts
        a worker when none is idle (as ThreadPoolExecutor does)."""
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def submit(self, work: Callable[..., R], *args: object) -> Future[R]:
        """Run `work(*args)` on a worker; RuntimeError once shut down."""
        future: Future[R] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self._name}: the worker pool is shut down")
            self._queue.put((future, functools.partial(work, *args)))  # type: ignore[arg-type]
            if not self._idle.acquire(blocking=False) and len(self._threads) < self._count:
                thread = threading.Thread(
                    target=self._run, name=f"{self._name}_{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        return future

    def shutdown(self, timeout: float | None = None) -> list[str]:
        """Cancel what no worker has taken, tell every worker to end and wait at most `timeout`
        seconds for them all; the names of those still running (stuck in their item), logged."""
        timeout = self._join_timeout if timeout is None else timeout
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in threads:
            self._queue.put(None)
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

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, work = item
            if future.set_running_or_notify_cancel():
                try:
                    result = work()
                except BaseException as e:  # the caller's to see, as ThreadPoolExecutor's
                    future.set_exception(e)
                else:
                    future.set_result(result)
            del item, future, work  # no reference to a finished reply while idle
            self._idle.release()
