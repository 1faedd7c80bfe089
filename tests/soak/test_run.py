"""The soak's loop (bench/soak/run.py) on a STAND-IN bed: a few seconds of pods and faults in
this process, so that the wiring (faults fired and stopped at their times, recovery polled,
events fed to the invariants, the bed drained, scanned and stopped) is checked without a node.
The stand-in is as strict as the loop needs: its pods are uncaptured exactly while a `break`
fault is held on their node."""

from __future__ import annotations

import time
from collections.abc import Sequence

from bench.soak import faults, report
from bench.soak.bed import FilesState, PodEvent
from bench.soak.faults import Fault, FaultKind, Held, Instant
from bench.soak.procstats import AgentSample
from bench.soak.run import Runner, Settings
from bench.soak.schedule import Window

KINDS = {
    "break": FaultKind("break", "pods on the node start uncaptured while held", "node", 0.4),
    "blip": FaultKind("blip", "an instant fault, healthy 0.3 s later", "cluster", 0.1),
    "never": FaultKind("never", "never recovers", "node", 0.1),
    "refused": FaultKind("refused", "the bed cannot build it", "node", 0.1),
    "fails": FaultKind("fails", "its act raises", "cluster", 0.1),
}


class StandInBed:
    def __init__(self, leftovers: Sequence[str] = ()) -> None:
        self.names = ["n1", "n2"]
        self.broken: set[str] = set()
        self.calls: list[str] = []
        self.epoch = 0.0
        self._events: list[PodEvent] = []
        self._next = 0
        self._leftovers = list(leftovers)
        self._blip_at: float | None = None

    @property
    def nodes(self) -> Sequence[str]:
        return self.names

    def lacks(self) -> dict[str, str]:
        return {}

    def targets(self) -> dict[str, list[str]]:
        return {}

    def now(self) -> float:
        return time.monotonic() - self.epoch

    def start(self) -> None:
        self.calls.append("start")

    def begin(self, epoch: float) -> None:
        self.calls.append("begin")
        self.epoch = epoch

    def fault(self, kind: FaultKind, node: str | None) -> Fault:
        if kind.name == "break":
            assert node is not None
            return Held("break", (node,), lambda: self.broken.add(node),
                        lambda: self.broken.discard(node), lambda: True)  # fmt: skip
        if kind.name == "blip":

            def act() -> None:
                self._blip_at = self.now()

            def healthy() -> bool:
                return self._blip_at is not None and self.now() > self._blip_at + 0.3

            return Instant("blip", (), act, healthy)
        if kind.name == "fails":

            def act() -> None:
                raise OSError("the part is gone")

            return Instant("fails", (), act, lambda: True)
        if kind.name == "never":
            return Instant("never", (node or "",), lambda: None, lambda: False)
        raise RuntimeError("this bed cannot do that")

    def pod_events(self) -> list[PodEvent]:
        # A pod a tick on alternating nodes, Running at once, captured unless its node is broken.
        now = self.now()
        node = self.names[self._next % 2]
        name = f"p{self._next}"
        self._next += 1
        return [PodEvent(now, name, node, "sidecar", now, now, node not in self.broken)]

    def agent_samples(self) -> list[AgentSample]:
        return [AgentSample(self.now(), n, 1, 50.0, 8, 20) for n in self.names]

    def files(self) -> list[FilesState]:
        return [FilesState(n, True, "") for n in self.names]

    def uninstalls(self) -> list[tuple[float, str, str]]:
        return []

    def drain(self) -> None:
        self.calls.append("drain")

    def leftovers(self) -> list[str]:
        self.calls.append("leftovers")
        return self._leftovers

    def stop(self) -> None:
        self.calls.append("stop")


def settings(total: float) -> Settings:
    return Settings(
        total_s=total, seed=1, tick_s=0.05, sample_s=0.2, recovery_poll_s=0.05, recovery_bound_s=0.5
    )


def test_a_violation_during_a_fault_names_it_and_the_run_reports_every_firing() -> None:
    bed = StandInBed(leftovers=["netns cni-stale"])
    windows = [
        Window("blip", None, 0.2, 0.3),
        Window("break", "n1", 0.6, 1.0),
        Window("never", "n2", 1.2, 1.3),
        Window("refused", "n1", 1.3, 1.4),
    ]
    result = Runner(bed, windows, KINDS, settings(1.8)).run()
    assert bed.calls == ["start", "begin", "drain", "leftovers", "stop"]
    kinds = [f.kind for f in result.firings]
    assert kinds == ["blip", "break", "never"]
    blip, brk, never = result.firings
    assert blip.recovered is not None and 0.25 <= blip.recovery_s <= 0.6  # type: ignore[operator]
    assert brk.recovered is not None and never.recovered is None
    assert result.fault_errors and result.fault_errors[0].startswith("refused@n1 at ")
    uncaptured = [v for v in result.violations if v.invariant == "uncaptured"]
    assert uncaptured, result.violations
    for v in uncaptured:
        assert v.node == "n1" and "break@n1" in v.faults and 0.6 <= v.at <= 1.1, v
    assert [v.detail for v in result.violations if v.invariant == "leftover"] == ["netns cni-stale"]
    (stuck,) = [v for v in result.violations if v.invariant == "unrecovered"]
    assert stuck.node == "n2" and "never@n2" in stuck.faults
    data = report.summary(result)
    assert data["faults"] == {"blip": 1, "break": 1, "never": 1}
    assert data["pods_started"] == len(result.pods) > 10


def test_a_fault_whose_act_fails_is_named_and_not_counted() -> None:
    windows = [Window("fails", None, 0.1, 0.2)]
    result = Runner(StandInBed(), windows, KINDS, settings(0.5)).run()
    assert result.firings == []
    (error,) = result.fault_errors
    assert error.startswith("fails start: OSError: the part is gone (at "), error


def test_a_quiet_run_has_no_violation() -> None:
    result = Runner(StandInBed(), [], KINDS, settings(0.6)).run()
    assert result.violations == [] and result.firings == []
    assert report.summary(result)["rss_slope_mib_per_h"] is None  # under the warm-up: no slope


def test_the_bed_is_stopped_when_the_run_fails() -> None:
    bed = StandInBed()

    def broken() -> list[PodEvent]:
        raise RuntimeError("the bed broke")

    bed.pod_events = broken  # type: ignore[method-assign]
    try:
        Runner(bed, [], KINDS, settings(0.3)).run()
    except RuntimeError as e:
        assert "the bed broke" in str(e)
    assert bed.calls[-1] == "stop"


def test_the_catalogue_kinds_are_what_the_cli_plans_with() -> None:
    assert set(faults.catalogue_by_name()) >= {k.name for k in faults.available()}


def test_an_interrupted_run_keeps_what_it_saw_and_stops_the_bed() -> None:
    bed = StandInBed()
    calls = 0
    events = bed.pod_events

    def interrupted() -> list[PodEvent]:
        nonlocal calls
        calls += 1
        if calls == 10:
            raise KeyboardInterrupt
        return events()

    bed.pod_events = interrupted  # type: ignore[method-assign]
    windows = [Window("break", "n1", 0.1, 5.0)]
    result = Runner(bed, windows, KINDS, settings(10.0)).run()
    assert result.interrupted_at is not None and result.interrupted_at < 2.0
    assert [f.kind for f in result.firings] == ["break"]
    assert "leftovers" not in bed.calls and bed.calls[-1] == "stop"
    assert bed.broken == set()  # the held fault was ended before the teardown
    assert "Interrupted at" in report.markdown(report.summary(result))
