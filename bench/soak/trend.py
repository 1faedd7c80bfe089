"""Whether a resource of the agents grows over a run: a least-squares slope over (t, value)
samples, per hour, with its 95% confidence interval.

An agent killed or replaced starts again from its first bytes, so the samples come in segments
(one per agent process: node and pid), and the slope is the one common to all segments, each
with its own intercept (least squares on values centred per segment). A restart is then neither
a drop that hides a leak nor a rise that fakes one. Each segment's first WARMUP_S seconds are
left out: a process fills its caches once as it starts.

The rule for "no upward trend": the slope is indistinguishable from 0 when its 95% interval
includes 0, or when it is under the resource's stated floor (FLOORS_PER_H: what a day-long run
could gain and still be noise, e.g. 1 MiB of RSS an hour). It is a leak only when the whole
interval is above 0 and the slope is above the floor.

Samples a couple of seconds apart are not independent draws: a process's RSS stays near where it
was a moment ago, so least squares' interval, which counts every sample as new evidence, is too
narrow and calls noise a trend. The interval is widened for the residuals' lag-1 autocorrelation
r (an AR(1) view of the noise: the variance of the slope grows by (1 + r) / (1 - r), and the
samples count as n (1 - r) / (1 + r) for Student's t), as trend tests of autocorrelated series do.

A trend is judged only when one agent process was sampled past its warm-up for JUDGED_SPAN_S
at least: over a few minutes a process still settling (its heap sized by the pods and events it
has seen so far, a thread more while a watch reconnects) rises as steeply as a leak does (a
4-minute run on the three-node bed: +1 MiB of RSS per process, 24 MiB/h), so a short run reports
its slopes without a verdict.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

WARMUP_S = 30.0
JUDGED_SPAN_S = 15 * 60.0
FLOORS_PER_H: Mapping[str, float] = {"rss_mib": 1.0, "fds": 1.0, "threads": 1.0}
# Student's t at 97.5% for 1..30 degrees of freedom; 1.96 beyond.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip


@dataclass(frozen=True)
class Slope:
    per_h: float
    low_per_h: float
    high_per_h: float
    samples: int
    segments: int
    longest_s: float = 0.0
    """The longest span of one process's samples after its warm-up."""

    @property
    def judged(self) -> bool:
        return self.longest_s >= JUDGED_SPAN_S

    def leaking(self, floor_per_h: float) -> bool:
        return self.low_per_h > 0.0 and self.per_h > floor_per_h


def t975(dof: int) -> float:
    if dof < 1:
        return math.inf
    return _T975[dof - 1] if dof <= len(_T975) else 1.96


def slope(
    segments: Iterable[Sequence[tuple[float, float]]], *, warmup_s: float = WARMUP_S
) -> Slope | None:
    """The common slope of `segments` (each a process's (t seconds, value) samples in time
    order); None when fewer than three samples are left after each segment's warm-up."""
    kept: list[list[tuple[float, float]]] = []
    for seg in segments:
        if not seg:
            continue
        t0 = seg[0][0]
        rest = [(t, v) for t, v in seg if t - t0 >= warmup_s]
        if len(rest) >= 2:
            kept.append(rest)
    n = sum(len(s) for s in kept)
    if n < 3:
        return None
    means = list(_means(kept))
    sxx = sxy = 0.0
    for seg, mt, mv in means:
        for t, v in seg:
            sxx += (t - mt) ** 2
            sxy += (t - mt) * (v - mv)
    if sxx == 0.0:
        return None
    b = sxy / sxx
    residuals = [[(v - mv) - b * (t - mt) for t, v in seg] for seg, mt, mv in means]
    sse = sum(e * e for seg in residuals for e in seg)
    r = lag1_autocorrelation(residuals)
    inflation = (1 + r) / (1 - r)
    dof = math.floor(n / inflation) - len(kept) - 1
    half = t975(dof) * math.sqrt(inflation * sse / dof / sxx) if dof > 0 else math.inf
    longest = max(seg[-1][0] - seg[0][0] for seg in kept)
    return Slope(b * 3600, (b - half) * 3600, (b + half) * 3600, n, len(kept), longest)


def _means(
    segments: Sequence[Sequence[tuple[float, float]]],
) -> Iterable[tuple[Sequence[tuple[float, float]], float, float]]:
    """Each segment with its mean time and mean value."""
    for seg in segments:
        yield seg, sum(t for t, _ in seg) / len(seg), sum(v for _, v in seg) / len(seg)


MAX_AUTOCORRELATION = 0.98
"""r is capped: at 1 the series is a random walk, for which no interval from one run holds."""


def lag1_autocorrelation(residuals: Sequence[Sequence[float]]) -> float:
    """The residuals' lag-1 autocorrelation, pooled over segments (pairs within a segment
    only), in [0, MAX_AUTOCORRELATION]: negative r would narrow the interval, never done."""
    pairs = sum(e0 * e1 for seg in residuals for e0, e1 in itertools.pairwise(seg))
    total = sum(e * e for seg in residuals for e in seg)
    if total == 0.0:
        return 0.0
    return min(max(pairs / total, 0.0), MAX_AUTOCORRELATION)
