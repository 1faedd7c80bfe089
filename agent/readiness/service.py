"""Readiness: runs the named checks on one thread, each at its own period, and keeps their last
results, so /readyz (probed every few seconds by kubelet, on every node) never waits on a check
and a check that costs something (a scratch network namespace, the node's processes) runs only
as often as it is due.

Each check's result is exported as istio_cni_ready_check{check} (1 passes, 0 fails) and its
changes are logged once, when it starts or stops failing (with the reason), not per probe.
A check that raises fails, with the exception as its reason.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import Gauge

from agent.background import BackgroundLoop

log = logging.getLogger(__name__)

CHECK_GAUGE = Gauge(
    "istio_cni_ready_check",
    "1 while the named readiness check passes, else 0: the agent is Ready (its /readyz) only "
    "when all are 1.",
    ["check"],
)
NOT_CHECKED = "not checked yet"


@dataclass(frozen=True)
class Check:
    """One prerequisite of a pod's ADD: `run()` returns None when it holds, else why not."""

    name: str
    run: Callable[[], str | None]
    period: float = 2.0
    """Seconds between two runs."""


class Held(Protocol):
    """What a check holds while the service runs (the scratch network namespace)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Readiness:
    """Service: start() runs every check once, then a thread runs each as it is due."""

    def __init__(
        self,
        checks: Sequence[Check],
        *,
        held: Sequence[Held] = (),
        tick: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.checks = list(checks)
        self._held = list(held)
        self._clock = clock
        self._lock = threading.Lock()
        self._results: dict[str, str | None] = {c.name: NOT_CHECKED for c in self.checks}
        self._due: dict[str, float] = {c.name: 0.0 for c in self.checks}
        # A round runs the due checks, each within its own timeout (the API's 3 s, a scratch
        # netns's few seconds): a minute is well past the longest.
        self._loop = BackgroundLoop.every(
            "readiness", tick, self.run_due, failed="readiness round failed", step_bound=60.0
        )
        self._was_ready: bool | None = None

    def start(self) -> None:
        for check in self.checks:
            CHECK_GAUGE.labels(check=check.name).set(0)
        for part in self._held:
            part.start()
        self.run_due()  # /readyz answers from the first request on
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()
        for part in reversed(self._held):
            part.stop()
        for check in self.checks:  # a reload may drop a check (ambient off): no stale series
            CHECK_GAUGE.remove(check.name)

    def ready(self) -> bool:
        with self._lock:
            return all(r is None for r in self._results.values())

    def failing(self) -> list[tuple[str, str]]:
        """(check, why) of each failing check, in the order the checks were given."""
        with self._lock:
            return [(name, r) for name, r in self._results.items() if r is not None]

    def lines(self) -> list[str]:
        """`check: why` of each failing check (what /readyz's body lists)."""
        return [f"{name}: {why}" for name, why in self.failing()]

    def run_due(self) -> None:
        """Run every check that is due (all of them the first time)."""
        now = self._clock()
        for check in self.checks:
            if self._due[check.name] <= now:
                self._due[check.name] = now + check.period
                self._record(check, _run(check))
        self._log_overall()

    def _record(self, check: Check, result: str | None) -> None:
        with self._lock:
            before = self._results[check.name]
            self._results[check.name] = result
        CHECK_GAUGE.labels(check=check.name).set(1 if result is None else 0)
        if result is None and before is not None:
            if before != NOT_CHECKED:
                log.info("readiness check passes", extra={"fields": {"check": check.name}})
        elif result is not None and (before is None or before == NOT_CHECKED):
            log.warning(
                "readiness check fails", extra={"fields": {"check": check.name, "reason": result}}
            )

    def _log_overall(self) -> None:
        ready = self.ready()
        if ready == self._was_ready:
            return
        self._was_ready = ready
        if ready:
            log.info("agent ready: every readiness check passes")
        else:
            names = ",".join(name for name, _ in self.failing())
            log.warning("agent not ready", extra={"fields": {"failing": names}})


def _run(check: Check) -> str | None:
    try:
        return check.run()
    except Exception as e:  # a broken check fails, it does not end the loop
        log.debug("readiness check %s raised", check.name, exc_info=True)
        return f"check raised {type(e).__name__}: {e}"
