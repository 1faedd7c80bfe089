"""The one way tests, the demo and the benchmarks wait: poll a condition until it holds or a
deadline passes, and fail naming what was awaited (never a bare sleep standing in for a wait)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The condition did not hold in time. An AssertionError so pytest reports it as a failed
    check, with the message naming what was awaited."""


def wait_for(
    condition: Callable[[], T | None],
    what: str = "",
    timeout: float = 60.0,
    *,
    interval: float = 0.1,
    on_timeout: Callable[[], str] | None = None,
) -> T:
    """Call `condition` until it returns something truthy, and return that. After `timeout`
    seconds raise WaitTimeout naming `what` (or the condition), plus `on_timeout()` if given
    (say, a log tail). The condition is always tried once more at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            name = what or getattr(condition, "__qualname__", repr(condition))
            extra = f"\n{on_timeout()}" if on_timeout else ""
            raise WaitTimeout(f"timed out after {timeout}s waiting for {name}{extra}")
        time.sleep(interval)
