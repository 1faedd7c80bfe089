"""The seeded timeline of a run's fault windows: every available kind at least once, then more
drawn at random for longer runs; some windows alone, some overlapping others; two windows of one
group (faults driving the same part) never overlap on the same target; a node fault targets
only the nodes its kind may have (`targets`: a reboot never the node holding the control plane).

    plan(kinds, nodes, minutes=5, seed=7, targets={"node_reboot": nodes[1:]})
      -> [Window(kind, node, start, end), ...] by start

Times are seconds from the run's start. The first WARMUP seconds are quiet (the bed's pods
start without faults, the baseline for start-up times), and so is the tail, kept for recovery:
the run's last fault ends TAIL_FRACTION of the run (at least MIN_TAIL seconds) before its end.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench.soak.faults import FaultKind

WARMUP = 20.0
MIN_TAIL = 45.0
TAIL_FRACTION = 0.15
EXTRA_PER_MINUTE = 1.5
"""Faults beyond the one of each kind, per minute of the faulted span."""
PLACE_ATTEMPTS = 50


@dataclass(frozen=True)
class Window:
    kind: str
    node: str | None
    """None: a cluster fault (every node affected)."""
    start: float
    end: float

    def overlaps(self, other: Window) -> bool:
        return self.start < other.end and other.start < self.end

    def same_target(self, other: Window) -> bool:
        return self.node is None or other.node is None or self.node == other.node


class PlanError(ValueError):
    """The run is too short for the catalogue it was given."""


def span(minutes: float) -> tuple[float, float]:
    """[first start, last end] of the faulted part of a run of `minutes`."""
    total = minutes * 60.0
    return WARMUP, total - max(MIN_TAIL, TAIL_FRACTION * total)


def plan(
    kinds: Sequence[FaultKind],
    nodes: Sequence[str],
    *,
    minutes: float,
    seed: int,
    targets: Mapping[str, Sequence[str]] | None = None,
) -> list[Window]:
    """The timeline for `kinds` (the available ones) on `nodes`; same seed, same timeline.
    `targets`: kind name -> the only nodes of `nodes` a node fault of that kind may target (a
    kind not named: any)."""
    rng = random.Random(seed)
    first, last = span(minutes)
    if not nodes:
        raise PlanError("no nodes")
    allowed = {k.name: _targets(k, nodes, targets or {}) for k in kinds}
    longest = max((k.seconds for k in kinds), default=0.0)
    if last - first < longest:
        raise PlanError(f"{minutes} min leaves {last - first:.0f} s for faults, under {longest} s")
    by_name = {k.name: k for k in kinds}
    if not by_name:
        return []
    order = sorted(by_name)
    rng.shuffle(order)
    # The first kind alone at the start of the span, so every run has a fault without company.
    solo = by_name[order[0]]
    node = None if solo.scope == "cluster" else rng.choice(allowed[solo.name])
    windows = [Window(solo.name, node, first, round(first + solo.seconds, 3))]
    # Then one of each other kind at evenly spread starts with jitter: windows longer than the
    # spacing overlap their neighbours.
    begin = windows[0].end
    step = (last - begin) / max(len(order) - 1, 1)
    for i, name in enumerate(order[1:]):
        at = begin + i * step + rng.uniform(0.0, step * 0.5)
        placed = _place(rng, by_name[name], allowed[name], windows, by_name, at, (begin, last))
        if placed is None:
            raise PlanError(f"no room for {name} in {minutes} min")
        windows.append(placed)
    extra = int(EXTRA_PER_MINUTE * (last - begin) / 60.0)
    for _ in range(extra):
        kind = by_name[rng.choice(order)]
        at = rng.uniform(begin, last)
        placed = _place(rng, kind, allowed[kind.name], windows, by_name, at, (begin, last))
        if placed is not None:
            windows.append(placed)
    return sorted(windows, key=lambda w: (w.start, w.kind, w.node or ""))


def _targets(
    kind: FaultKind, nodes: Sequence[str], targets: Mapping[str, Sequence[str]]
) -> list[str]:
    """The nodes a fault of `kind` may target, in `nodes`' order; PlanError when none."""
    if kind.name not in targets:
        return list(nodes)
    found = [n for n in nodes if n in targets[kind.name]]
    if kind.scope == "node" and not found:
        raise PlanError(f"{kind.name}: no node it may target among {list(nodes)}")
    return found


def exclusive(a: FaultKind, b: FaultKind) -> bool:
    """Windows of `a` and `b` never overlap on one target: one group, or one excludes the
    other's."""
    return a.exclusive == b.exclusive or b.exclusive in a.excludes or a.exclusive in b.excludes


def alone(windows: Sequence[Window]) -> list[Window]:
    """The windows that overlap no other."""
    return [w for w in windows if not any(o is not w and o.overlaps(w) for o in windows)]


def _place(
    rng: random.Random,
    kind: FaultKind,
    nodes: Sequence[str],
    windows: Sequence[Window],
    by_name: dict[str, FaultKind],
    at: float,
    bounds: tuple[float, float],
) -> Window | None:
    """A window of `kind` starting at `at` (else at random starts in `bounds`) that ends within
    `bounds` and meets no window of its group, or of a group either one excludes, on its
    target; None when none was found."""
    low, high = bounds[0], bounds[1] - kind.seconds
    if high < low:
        return None
    # `at` first, then random starts, then every second of the bounds in order: a gap that
    # exists is found, however crowded the plan.
    grid = [low + i for i in range(int(high - low) + 1)]
    starts = [at] + [rng.uniform(low, high) for _ in range(PLACE_ATTEMPTS)] + grid
    for start in starts:
        start = min(max(start, low), high)
        node = None if kind.scope == "cluster" else rng.choice(list(nodes))
        candidate = Window(kind.name, node, round(start, 3), round(start + kind.seconds, 3))
        clash = any(
            exclusive(kind, by_name[w.kind]) and candidate.same_target(w) and candidate.overlaps(w)
            for w in windows
        )
        if not clash:
            return candidate
    return None
