"""The one way tests, the demo and the benchmarks wait: poll a condition until it holds or a
deadline passes, and fail naming what was awaited (never a bare sleep standing in for a wait).

A timeout says what the world looked like: the wait's own `on_timeout`, then every diagnostic a
fixture registered with `diagnostics(...)` for the test bed it runs (say, the cluster's
DaemonSets, pods and nodes and the controller manager's log tail), so a wait written without one
still explains itself in the node tiers."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

Diagnostic = Callable[[], str]
_registered: list[Diagnostic] = []
"""What every timeout reports, innermost last (a stack: fixtures nest)."""
DIAGNOSTIC_CHARS = 12_000
"""Each diagnostic's text is cut to this: a timeout message stays readable."""


class WaitTimeout(AssertionError):
    """The condition did not hold in time. An AssertionError so pytest reports it as a failed
    check, with the message naming what was awaited."""


@contextlib.contextmanager
def diagnostics(report: Diagnostic) -> Iterator[None]:
    """While inside, every wait's timeout message ends with `report()`."""
    _registered.append(report)
    try:
        yield
    finally:
        _registered.remove(report)


def explain(extra: Diagnostic | None = None) -> str:
    """`extra()` and every registered diagnostic, each guarded: a diagnostic that fails (the API
    server being what timed out, say) says so instead of hiding the timeout."""
    parts = []
    for report in ([extra] if extra else []) + list(_registered):
        try:
            text = report()
        except Exception as e:  # the report must never replace the timeout it explains
            text = f"(diagnostic {getattr(report, '__qualname__', report)} failed: {e!r})"
        if len(text) > DIAGNOSTIC_CHARS:
            text = f"{text[:DIAGNOSTIC_CHARS]}\n... ({len(text) - DIAGNOSTIC_CHARS} chars cut)"
        parts.append(text)
    return "\n".join(parts)


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
    (say, a log tail) and the registered diagnostics. The condition is always tried once more at
    the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise timed_out(
                what or getattr(condition, "__qualname__", repr(condition)), timeout, on_timeout
            )
        time.sleep(interval)


def timed_out(what: str, timeout: float, on_timeout: Diagnostic | None = None) -> WaitTimeout:
    """The WaitTimeout for `what` after `timeout` seconds, with its diagnostics."""
    extra = explain(on_timeout)
    return WaitTimeout(
        f"timed out after {timeout}s waiting for {what}" + (f"\n{extra}" if extra else "")
    )
