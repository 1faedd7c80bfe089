"""The soak's loop: fire each window's fault on the bed at its time, stop it at its end, poll
until it has recovered, and feed every pod event, agent sample and file look to the invariants.
Once the last window is over, faults still recovering are waited for (up to their bound), the
churn is drained, the nodes scanned for leftovers and the resource slopes judged."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from bench.soak import report, trend
from bench.soak.bed import Bed, PodEvent
from bench.soak.faults import Fault, FaultKind
from bench.soak.invariants import Activity, Firing, Invariants
from bench.soak.schedule import Window

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settings:
    total_s: float
    seed: int
    mode: str = "sidecar+ambient"
    tick_s: float = 0.25
    sample_s: float = 2.0
    recovery_poll_s: float = 1.0
    """How often a stopped fault's recovered() is asked (it may call the API server)."""
    sandbox_bound_s: float = 120.0
    """A pod's longest wait for its sandbox once the last fault on its node has recovered:
    kubelet's sandbox retry back-off (up to ~40 s after refusals) with room for a loaded
    2-core machine."""
    recovery_bound_s: float = 180.0
    """A fault's longest recovery once stopped: a liveness restart (3 x 10 s), kubelet's
    back-off, the agent's start and first list, on a loaded machine."""


@dataclass
class _Live:
    """A fired fault. Its start and stop run in a worker thread (a runtime restart or a Helm
    operation takes seconds), so the loop goes on sampling meanwhile."""

    window: Window
    fault: Fault
    firing: Firing
    worker: threading.Thread | None = None
    error: str = ""
    stopping: bool = False
    next_poll: float = 0.0

    def busy(self) -> bool:
        return self.worker is not None and self.worker.is_alive()

    def act(self, what: str, fn: Callable[[], None]) -> None:
        def body() -> None:
            try:
                fn()
            except Exception as e:  # the fault's own failure: reported, the run goes on
                self.error = f"{self.firing.label} {what}: {type(e).__name__}: {e}"

        self.worker = threading.Thread(target=body, name=f"fault-{self.firing.label}", daemon=True)
        self.worker.start()


class Runner:
    def __init__(
        self,
        bed: Bed,
        windows: Sequence[Window],
        kinds: Mapping[str, FaultKind],
        settings: Settings,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bed, self.kinds, self.settings, self.clock = bed, kinds, settings, clock
        self.pending = sorted(windows, key=lambda w: w.start)
        self.live: list[_Live] = []
        self.activity = Activity()
        touching = frozenset(k.name for k in kinds.values() if k.touches_files)
        self.invariants = Invariants(
            self.activity, settings.sandbox_bound_s, settings.recovery_bound_s, touching
        )
        self.result = report.RunResult(settings.total_s / 60.0, settings.seed, settings.mode)
        self.pods: dict[str, PodEvent] = {}
        self.epoch = 0.0
        self._next_sample = 0.0

    def now(self) -> float:
        return self.clock() - self.epoch

    def run(self) -> report.RunResult:
        """The whole run; the bed is stopped at the end whatever happened."""
        try:
            self.bed.start()
            self.epoch = self.clock()
            self.bed.begin(self.epoch)
            while self.now() < self.settings.total_s:
                self.tick()
                time.sleep(self.settings.tick_s)
            settle_until = self.now() + self.settings.recovery_bound_s
            while self._recovering() and self.now() < settle_until:
                self.tick()
                time.sleep(self.settings.tick_s)
            self.tick()
            self.bed.drain()
            self._finish()
        except KeyboardInterrupt:  # SIGINT (a deadline): what was seen so far, marked as such
            self.result.interrupted_at = self.now()
            self.result.firings = self.activity.firings
            self.result.violations = self.invariants.violations
        finally:
            self._end_held()
            self.bed.stop()
        return self.result

    def _end_held(self) -> None:
        """Held faults still on (an interrupted run) ended before the bed is torn down, so the
        teardown meets a whole bed; best effort, each failure named."""
        for live in self.live:
            if live.fault.instant or live.stopping or live.firing.stopped is not None:
                continue
            if live.worker is not None:
                live.worker.join(30)
            try:
                live.fault.stop()
            except Exception as e:
                self.result.fault_errors.append(f"{live.firing.label} stop at the end: {e}")

    def tick(self) -> None:
        now = self.now()
        while self.pending and self.pending[0].start <= now:
            self._fire(self.pending.pop(0), now)
        for live in list(self.live):
            self._advance(live, now)
        for event in self.bed.pod_events():
            self._pod(event)
        for pod in self.pods.values():
            if pod.running is None:
                self.invariants.pod_waiting(now, pod.node, pod.name, pod.created, None)
        if now >= self._next_sample:
            self._next_sample = now + self.settings.sample_s
            self._sample(now)

    def _fire(self, window: Window, now: float) -> None:
        label = window.kind if window.node is None else f"{window.kind}@{window.node}"
        try:
            fault = self.bed.fault(self.kinds[window.kind], window.node)
        except Exception as e:  # a fault the bed cannot build is reported, not counted
            log.warning("fault %s not fired: %s", label, e)
            self.result.fault_errors.append(f"{label} at {now:.1f} s: {type(e).__name__}: {e}")
            return
        log.info("fault %s starting at %.1f s", label, now)
        live = _Live(window, fault, self.activity.started(window.kind, window.node, now))
        live.act("start", fault.start)
        self.live.append(live)

    def _advance(self, live: _Live, now: float) -> None:
        firing = live.firing
        if live.busy() or firing.recovered is not None:
            return
        if live.error:  # its start or stop failed: not counted as fired, named in the report
            self.result.fault_errors.append(f"{live.error} (at {now:.1f} s)")
            live.error = ""
            if firing.stopped is None:
                self.activity.firings.remove(firing)
                self.live.remove(live)
                return
        if firing.stopped is None:
            # An instant fault's damage is done once started, a held one's once stopped:
            # recovery counts from there.
            if live.fault.instant or live.stopping:
                firing.stopped = now
            elif now >= live.window.end:
                live.stopping = True
                live.act("stop", live.fault.stop)
                return
            else:
                return
        if now < live.next_poll:
            return
        live.next_poll = now + self.settings.recovery_poll_s
        try:
            done = live.fault.recovered()
        except Exception:  # a check that cannot answer yet (the API down): not recovered
            done = False
        if done:
            firing.recovered = now
            log.info("fault %s recovered at %.1f s", firing.label, now)
        else:
            self.invariants.fault_recovered(firing, now)

    def _pod(self, event: PodEvent) -> None:
        self.pods[event.name] = event
        if event.captured is not None:
            self.invariants.pod_captured(event.at, event.node, event.name, event.captured)
        if event.running is not None:
            self.invariants.pod_waiting(
                event.at, event.node, event.name, event.created, event.running
            )

    def _sample(self, now: float) -> None:
        self.result.samples.extend(self.bed.agent_samples())
        for state in self.bed.files():
            self.invariants.files(now, state.node, state.working, state.detail)
        for at, node, what in self.bed.uninstalls():
            self.invariants.uninstalled(at, node, what)

    def _recovering(self) -> bool:
        return any(live.firing.recovered is None for live in self.live)

    def _finish(self) -> None:
        now = self.now()
        for event in self.bed.pod_events():
            self._pod(event)
        for live in self.live:
            self.invariants.fault_recovered(live.firing, now + self.settings.recovery_bound_s)
        for pod in self.pods.values():
            if pod.running is None:  # churn drained: it never got its sandbox
                self.invariants.pod_waiting(now, pod.node, pod.name, pod.created, None)
            until = now if pod.running is None else pod.running
            faulted = self.activity.last_end(pod.node, pod.created, until) is not None
            before = self.activity.last_recovery_before(pod.node, pod.created)
            self.result.pods.append(
                report.PodStart(
                    pod.name, pod.node, pod.created, pod.running, faulted, pod.mode,
                    None if before is None else pod.created - before,
                    pod.phases.get("scheduled"),
                    pod.phases.get("sandbox"),
                )
            )  # fmt: skip
        leftovers = self.bed.leftovers()
        self.result.leftovers = leftovers
        self.invariants.leftovers(now, leftovers)
        for name, found in report.slopes(self.result.samples).items():
            floor = trend.FLOORS_PER_H[name]
            if found is not None and not found.judged:
                self.result.trends_unjudged.append(name)
            elif found is not None and found.leaking(floor):
                interval = f"[{found.low_per_h:.2f}, {found.high_per_h:.2f}]"
                detail = f"{found.per_h:.2f}/h, 95% interval {interval} above 0, floor {floor}/h"
                self.invariants.trend(now, name, detail)
        self.result.firings = self.activity.firings
        self.result.violations = self.invariants.violations
