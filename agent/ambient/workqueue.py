"""A keyed work queue, as client-go's workqueue: one pending item per key, however many events
arrive for it, so the work of one object is bounded by the worker, not by its event rate.

    put(key, value)      queued once: a key already pending merges the value into its item
                         (`merge(older, newer)`) and keeps its place and due time, so a key
                         waiting out a back-off keeps waiting (`at_once` ends the wait)
    get()                the next due item, taken off the queue while it is processed
    retry(key, value)    processing failed: due again after the key's back-off (5 ms doubling
                         to 5 s, as Istio's queue), merged with whatever arrived meanwhile

Items are processed one at a time by one worker, which reads the object's latest state when
it handles the item: what is queued is that the key needs a look, not each change.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

RETRY_FIRST_SECONDS = 0.005
RETRY_MAX_SECONDS = 5.0


@dataclass
class _Item(Generic[V]):
    value: V
    due: float
    backoff: float
    """The delay of the key's last failed try; 0 while it has not failed."""


@dataclass(frozen=True)
class Taken(Generic[K, V]):
    """An item taken for processing; hand it back to `retry` when processing fails."""

    key: K
    value: V
    backoff: float


class KeyedQueue(Generic[K, V]):
    """Thread-safe; `merge(older, newer)` folds two values of one key into the one to process."""

    def __init__(
        self, merge: Callable[[V, V], V], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._merge = merge
        self._clock = clock
        self._items: dict[K, _Item[V]] = {}
        self._heap: list[tuple[float, int, K]] = []
        """(due, seq, key); an entry whose due is no longer its key's is skipped when met."""
        self._seq = itertools.count()
        self._cond = threading.Condition()

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    def put(self, key: K, value: V, *, at_once: bool = False) -> None:
        """Queue `value` for `key`: merged into the key's pending item when there is one."""
        with self._cond:
            now = self._clock()
            item = self._items.get(key)
            if item is None:
                self._items[key] = _Item(value, now, 0.0)
                self._schedule(key, now)
            else:
                item.value = self._merge(item.value, value)
                if at_once and item.due > now:
                    item.due = now
                    self._schedule(key, now)
            self._cond.notify()

    def retry(self, taken: Taken[K, V]) -> float:
        """Processing `taken` failed: due again after the key's next back-off, which is
        returned. An item queued for the key meanwhile is merged in and waits as long."""
        delay = min(RETRY_MAX_SECONDS, max(RETRY_FIRST_SECONDS, taken.backoff * 2))
        with self._cond:
            due = self._clock() + delay
            item = self._items.get(taken.key)
            if item is None:
                self._items[taken.key] = _Item(taken.value, due, delay)
            else:
                item.value = self._merge(taken.value, item.value)
                item.backoff = delay
                if item.due >= due:
                    return delay
                item.due = due
            self._schedule(taken.key, due)
            self._cond.notify()
        return delay

    def get(self, timeout: float) -> Taken[K, V] | None:
        """The next due item (taken off the queue), or None after waiting up to `timeout`."""
        with self._cond:
            while self._heap:
                due, _, key = self._heap[0]
                item = self._items.get(key)
                if item is None or item.due != due:
                    heapq.heappop(self._heap)  # superseded by a later schedule of the key
                    continue
                wait = due - self._clock()
                if wait > 0:
                    self._cond.wait(min(wait, timeout))
                    return None
                heapq.heappop(self._heap)
                del self._items[key]
                return Taken(key, item.value, item.backoff)
            self._cond.wait(timeout)
            return None

    def wake(self) -> None:
        """End a worker's wait in `get` (stopping)."""
        with self._cond:
            self._cond.notify_all()

    def _schedule(self, key: K, due: float) -> None:
        heapq.heappush(self._heap, (due, next(self._seq), key))
