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
    assert found.samples == len([t for t, _ in warm if t >= trend.WARMUP_S]), found
    with_warmup = trend.slope([warm], warmup_s=0.0)
    assert with_warmup is not None and with_warmup.per_h > 100 * abs(found.per_h), with_warmup


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


def ar1_series(
    seconds: float, *, per_h: float, sd: float, phi: float, seed: int
) -> list[tuple[float, float]]:
    """Samples 2 s apart around a line: noise that keeps `phi` of itself from one sample to
    the next (stationary, standard deviation `sd`), as a process's RSS wanders."""
    rng = random.Random(seed)
    step_sd = sd * (1 - phi * phi) ** 0.5
    e, out = rng.gauss(0.0, sd), []
    for i in range(int(seconds / 2)):
        t = i * 2.0
        out.append((t, 50.0 + per_h * t / 3600 + e))
        e = phi * e + rng.gauss(0.0, step_sd)
    return out


def test_autocorrelated_noise_is_not_called_a_trend() -> None:
    # An hour of a flat process whose RSS wanders (0.5 MiB, 98% kept per 2 s sample: a
    # wander of about a minute and a half): least squares counting every sample as new calls
    # most seeds a leak past the floor; the widened interval about one in twenty at most.
    seeds = range(40)
    runs = [ar1_series(3600, per_h=0.0, sd=0.5, phi=0.98, seed=s) for s in seeds]
    called = [s for s, run in zip(seeds, runs, strict=True) if trend.slope([run]).leaking(0.0)]  # type: ignore[union-attr]
    assert len(called) <= 4, called
    naive = [s for s, run in zip(seeds, runs, strict=True) if naive_low_per_h(run) > 0.0]
    assert len(naive) >= 10, naive  # what the narrow interval did: the test would see it


def naive_low_per_h(run: list[tuple[float, float]]) -> float:
    """The lower end of least squares' 95% interval that takes every sample as independent."""
    n = len(run)
    mt = sum(t for t, _ in run) / n
    mv = sum(v for _, v in run) / n
    sxx = sum((t - mt) ** 2 for t, _ in run)
    b = sum((t - mt) * (v - mv) for t, v in run) / sxx
    sse = sum(((v - mv) - b * (t - mt)) ** 2 for t, v in run)
    return (b - 1.96 * (sse / (n - 2) / sxx) ** 0.5) * 3600


def test_a_leak_is_caught_through_autocorrelated_noise() -> None:
    # 6 MiB an hour, over 30 minutes of wandering noise (0.3 MiB, 90% kept per sample).
    caught = [
        trend.slope([ar1_series(1800, per_h=6.0, sd=0.3, phi=0.9, seed=s)]) for s in range(10)
    ]
    assert all(f is not None and f.leaking(FLOOR) for f in caught), caught
