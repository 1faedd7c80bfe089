"""Resource slopes over a run (bench/soak/trend.py)."""

from __future__ import annotations

import random

from bench.soak import trend

FLOOR = trend.FLOORS_PER_H["rss_mib"]


def series(
    seconds: float, *, per_h: float, noise: float, seed: int, start: float = 0.0, base: float = 60.0
) -> list[tuple[float, float]]:
    rng = random.Random(seed)
    return [
        (start + t, base + per_h * t / 3600 + rng.gauss(0.0, noise))
        for t in (i * 2.0 for i in range(int(seconds / 2)))
    ]


def test_a_flat_noisy_series_is_indistinguishable_from_zero() -> None:
    for seed in range(20):
        found = trend.slope([series(600, per_h=0.0, noise=2.0, seed=seed)])
        assert found is not None
        assert not found.leaking(FLOOR), found


def test_a_leak_is_caught() -> None:
    # 30 MiB an hour under 2 MiB of noise, over 10 minutes (5 MiB in all).
    found = trend.slope([series(600, per_h=30.0, noise=2.0, seed=1)])
    assert found is not None
    assert found.leaking(FLOOR), found
    assert 15.0 < found.per_h < 45.0


def test_a_slope_under_the_floor_is_no_leak_even_when_significant() -> None:
    found = trend.slope([series(3600, per_h=0.5, noise=0.01, seed=2)])
    assert found is not None
    assert found.low_per_h > 0 and not found.leaking(FLOOR), found


def test_restarts_neither_hide_nor_fake_a_trend() -> None:
    # Each process starts from 40 MiB: a leak inside each is caught though every restart
    # drops the value; a flat process after a bigger one is not a downward trend hiding
    # anything, nor are rising restarts an upward one.
    leaking = [
        series(300, per_h=40.0, noise=1.0, seed=s, start=s * 300.0, base=40.0) for s in range(3)
    ]
    found = trend.slope(leaking)
    assert found is not None and found.segments == 3 and found.leaking(FLOOR), found
    steps = [
        series(300, per_h=0.0, noise=1.0, seed=s, start=s * 300.0, base=40.0 + 30 * s)
        for s in range(3)
    ]
    found = trend.slope(steps)
    assert found is not None and not found.leaking(FLOOR), found


def test_each_process_warm_up_is_left_out() -> None:
    warm = [(t, 10.0 if t < 20 else 50.0 + (t % 4) * 0.1) for t in range(0, 300, 2)]
    found = trend.slope([warm])
    assert found is not None and not found.leaking(FLOOR), found
    assert trend.slope([warm], warmup_s=0.0).leaking(FLOOR)  # type: ignore[union-attr]


def test_too_few_samples_give_no_slope() -> None:
    assert trend.slope([[(0.0, 1.0), (40.0, 2.0)]]) is None
    assert trend.slope([]) is None


def test_a_short_run_reports_its_slope_without_a_verdict() -> None:
    # 24 MiB/h over 4 minutes: steep and significant, but no process lived long enough to
    # tell a leak from a process still settling.
    short = trend.slope([series(240, per_h=24.0, noise=0.05, seed=3)])
    assert short is not None and short.leaking(FLOOR) and not short.judged, short
    long = trend.slope([series(trend.JUDGED_SPAN_S + 60, per_h=24.0, noise=0.05, seed=3)])
    assert long is not None and long.leaking(FLOOR) and long.judged, long
