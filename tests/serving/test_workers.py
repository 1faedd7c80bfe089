"""The serving loops' worker pool: workers start as work needs them, end once idle, and no item
is ever left without a worker, whatever the timing of submits against idle workers ending."""

from __future__ import annotations

import random
import threading
import time

import pytest

from agent.serving.workers import Workers


def wait_until(check: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("not within the time allowed")
        time.sleep(0.01)


def test_a_burst_starts_a_worker_per_item_up_to_the_count_and_they_end_once_idle() -> None:
    pool = Workers(8, "burst", join_timeout=2.0, idle_seconds=0.2)
    release = threading.Event()
    try:
        futures = [pool.submit(release.wait) for _ in range(12)]
        wait_until(lambda: pool.size == 8)
        release.set()
        assert [f.result(timeout=5) for f in futures] == [True] * 12
        wait_until(lambda: pool.size == 0)
        # The pool serves again after every worker ended.
        assert pool.submit(lambda: 42).result(timeout=5) == 42
    finally:
        release.set()
        assert pool.shutdown() == []


def test_an_idle_worker_takes_the_next_item_instead_of_a_new_one_starting() -> None:
    pool = Workers(8, "reuse", join_timeout=2.0, idle_seconds=30.0)
    try:
        names = {pool.submit(lambda: threading.current_thread().name).result(5) for _ in range(20)}
        assert len(names) == 1 and pool.size == 1
    finally:
        assert pool.shutdown() == []


@pytest.mark.parametrize("seed", range(5))
def test_no_item_is_stranded_while_workers_end_as_submits_arrive(seed: int) -> None:
    """Idle workers end after a millisecond while submits arrive at random intervals around
    it: every item runs, and the pool never holds more workers than its count."""
    rng = random.Random(seed)
    pool = Workers(4, "race", join_timeout=2.0, idle_seconds=0.001)
    peak = 0
    try:
        futures = []
        for _ in range(400):
            futures.append(pool.submit(time.sleep, rng.choice((0.0, 0.0005, 0.002))))
            peak = max(peak, pool.size)
            time.sleep(rng.choice((0.0, 0.0005, 0.001, 0.003)))
        for future in futures:
            future.result(timeout=10)
        assert peak <= 4
        wait_until(lambda: pool.size == 0)
    finally:
        assert pool.shutdown() == []


def test_shutdown_cancels_what_no_worker_took_and_names_a_stuck_worker() -> None:
    pool = Workers(1, "stuck", join_timeout=0.2, idle_seconds=30.0)
    release = threading.Event()
    try:
        running = pool.submit(release.wait)
        queued = pool.submit(lambda: None)
        wait_until(running.running)
        assert pool.shutdown() == ["stuck_0"]
        assert queued.cancelled()
        with pytest.raises(RuntimeError, match="shut down"):
            pool.submit(lambda: None)
    finally:
        release.set()


def test_a_trickle_after_a_burst_keeps_only_the_workers_it_needs() -> None:
    """After a burst, one short item every 50 ms: the worker that went idle last takes each,
    so the burst's others reach their idle limit and end. Handed to the one idle longest, each
    item would keep every worker of the burst busy every 300 ms, under the 500 ms limit, and
    the pool would keep its peak for as long as the trickle lasts."""
    pool = Workers(6, "trickle", join_timeout=2.0, idle_seconds=0.5)
    release = threading.Event()
    try:
        burst = [pool.submit(release.wait) for _ in range(6)]
        wait_until(lambda: pool.size == 6)
        release.set()
        for f in burst:
            f.result(timeout=5)
        sizes = []
        for _ in range(40):
            pool.submit(lambda: None).result(timeout=5)
            sizes.append(pool.size)
            time.sleep(0.05)
        assert sizes[-1] == 1, sizes
    finally:
        release.set()
        assert pool.shutdown() == []


def test_shutdown_ends_idle_and_busy_workers_alike() -> None:
    pool = Workers(3, "mixed", join_timeout=2.0, idle_seconds=30.0)
    release = threading.Event()
    busy = pool.submit(release.wait)
    for _ in range(2):
        pool.submit(lambda: None).result(timeout=5)
    wait_until(lambda: pool.size >= 2)
    threading.Timer(0.2, release.set).start()
    assert pool.shutdown() == []  # the idle one ended at once, the busy one after its item
    assert busy.result(timeout=1) is True
