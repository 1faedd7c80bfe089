"""What must hold through a soak, checked on every sample the run feeds in; each violation
carries its time, its node and the faults active then (by `Activity`, the record of what was
fired when), so a report reads "uncaptured pod p at 132.4 s on node-2 during agent_kill9@node-2,
api_429".

A fault is active on a node from its start until it has recovered (not merely until its
window's end): an agent still coming back after a kill is the kill's doing. Cluster faults are
active on every node.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class Firing:
    kind: str
    node: str | None
    started: float
    stopped: float | None = None
    recovered: float | None = None

    @property
    def label(self) -> str:
        return self.kind if self.node is None else f"{self.kind}@{self.node}"

    def affects(self, node: str | None) -> bool:
        return self.node is None or node is None or self.node == node

    def active_at(self, t: float) -> bool:
        return self.started <= t and (self.recovered is None or t < self.recovered)

    @property
    def recovery_s(self) -> float | None:
        if self.stopped is None or self.recovered is None:
            return None
        return max(0.0, self.recovered - self.stopped)


@dataclass(frozen=True)
class Violation:
    invariant: str
    at: float
    node: str | None
    detail: str
    faults: tuple[str, ...]

    def as_dict(self) -> dict[str, object]:
        return {
            "invariant": self.invariant,
            "at_s": round(self.at, 3),
            "node": self.node,
            "detail": self.detail,
            "faults": list(self.faults),
        }


class Activity:
    """The faults fired in a run, as the run fired them."""

    def __init__(self) -> None:
        self.firings: list[Firing] = []

    def started(self, kind: str, node: str | None, at: float) -> Firing:
        firing = Firing(kind, node, at)
        self.firings.append(firing)
        return firing

    def active(self, t: float, node: str | None = None) -> tuple[str, ...]:
        return tuple(f.label for f in self.firings if f.affects(node) and f.active_at(t))

    def last_end(self, node: str | None, since: float, until: float) -> float | None:
        """When the last fault affecting `node` that was active somewhere in [since, until]
        recovered (`until` for one still unrecovered); None if none was."""
        ends = [
            until if f.recovered is None else f.recovered
            for f in self.firings
            if f.affects(node)
            and f.started <= until
            and (f.recovered is None or f.recovered > since)
        ]
        return max(ends, default=None)

    def last_recovery_before(self, node: str | None, t: float) -> float | None:
        """When the last fault affecting `node` that was over by `t` recovered; None if none."""
        ends = [
            f.recovered
            for f in self.firings
            if f.affects(node) and f.recovered is not None and f.recovered <= t
        ]
        return max(ends, default=None)


@dataclass
class Invariants:
    """The recorders; `violations` in the order seen."""

    activity: Activity
    sandbox_bound_s: float
    """Longest a pod may wait for its sandbox once the last fault affecting its node is over."""
    recovery_bound_s: float
    """Longest a fault may take to recover once stopped."""
    touching_files: frozenset[str] = frozenset()
    """Kinds that break the node's files themselves (faults.FaultKind.touches_files)."""
    violations: list[Violation] = field(default_factory=list)
    _waited: set[str] = field(default_factory=set)

    def _record(self, invariant: str, at: float, node: str | None, detail: str) -> None:
        faults = self.activity.active(at, node)
        self.violations.append(Violation(invariant, at, node, detail, faults))

    def pod_captured(self, at: float, node: str, pod: str, captured: bool) -> None:
        """A pod's traffic was looked at (sidecar: Istio's rules in its netns; ambient: enrolled
        with ztunnel) at `at`: never uncaptured, whatever faults are active."""
        if not captured:
            self._record("uncaptured", at, node, f"pod {pod} runs with its traffic not captured")

    def pod_waiting(
        self, now: float, node: str, pod: str, created: float, running: float | None
    ) -> None:
        """A pod created at `created`, Running at `running` (None: still waiting at `now`). Its
        wait is excused while faults affect its node; beyond `sandbox_bound_s` after the last of
        them ends (or after its creation), it is stuck. Recorded once per pod."""
        if pod in self._waited:
            return
        until = now if running is None else running
        last = self.activity.last_end(node, created, until)
        base = created if last is None else max(created, last)
        if until - base > self.sandbox_bound_s:
            self._waited.add(pod)
            state = "still waiting" if running is None else f"Running after {until - created:.1f} s"
            bound = f"over {self.sandbox_bound_s:.0f} s past its node's last fault"
            self._record("stuck", base + self.sandbox_bound_s, node, f"pod {pod} {state}, {bound}")

    def uninstalled(self, at: float, node: str, detail: str) -> None:
        """An agent removed its plugin or entry during the run: never allowed."""
        self._record("uninstall", at, node, detail)

    def files(self, at: float, node: str, working: bool, detail: str) -> None:
        """The node's conf dir and bin dir as the runtime would load them: a working config
        (our entry, its binary there) except while a fault breaking them is still active."""
        if working:
            return
        excused = [
            f for f in self.activity.firings
            if f.kind in self.touching_files and f.affects(node) and f.active_at(at)
        ]  # fmt: skip
        if not excused:
            self._record("files", at, node, detail)

    def fault_recovered(self, firing: Firing, now: float) -> None:
        """A fault stopped and not recovered within the bound by `now`: stuck (once)."""
        if firing.stopped is None or firing.recovered is not None:
            return
        key = f"fault:{id(firing)}"
        if key not in self._waited and now - firing.stopped > self.recovery_bound_s:
            self._waited.add(key)
            detail = f"{firing.label} not recovered {self.recovery_bound_s:.0f} s after it stopped"
            self._record("unrecovered", now, firing.node, detail)

    def leftovers(self, at: float, found: Iterable[str]) -> None:
        """What the nodes still hold after the run that no pod owns."""
        for item in found:
            self._record("leftover", at, None, item)

    def trend(self, at: float, resource: str, detail: str) -> None:
        self._record("trend", at, None, f"{resource}: {detail}")
