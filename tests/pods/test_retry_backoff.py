"""The list + watch loops' back-off (agent/pods/retry_backoff.py): doubling to its cap within a
run of failures, and a run ended by a success or by RESET_SECONDS without a failure, as
client-go's reflector does."""

from __future__ import annotations

from agent.pods.retry_backoff import FIRST_SECONDS, RESET_SECONDS, RetryBackoff


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def no_jitter(low: float, high: float) -> float:
    assert (low, high) == (0.8, 1.2)
    return 1.0


def test_failures_close_together_double_the_wait_up_to_the_cap() -> None:
    clock = Clock()
    backoff = RetryBackoff(30.0, clock=clock, draw=no_jitter)
    waits = []
    for _ in range(8):
        waits.append(backoff.failed())
        clock.now += waits[-1] + 5.0  # the next try fails a few seconds in
    assert waits == [FIRST_SECONDS, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


def test_a_failure_after_a_quiet_spell_waits_the_first_step_again() -> None:
    """Outages minutes apart, each ending a watch that served meanwhile: each is a new run."""
    clock = Clock()
    backoff = RetryBackoff(30.0, clock=clock, draw=no_jitter)
    for _ in range(6):
        backoff.failed()
        clock.now += 5.0
    assert backoff.failed() == 30.0
    clock.now += RESET_SECONDS
    assert backoff.failed() == FIRST_SECONDS and backoff.failures == 1


def test_a_success_ends_the_run() -> None:
    clock = Clock()
    backoff = RetryBackoff(30.0, clock=clock, draw=no_jitter)
    for _ in range(4):
        backoff.failed()
    backoff.succeeded()
    assert backoff.failures == 0 and backoff.failed() == FIRST_SECONDS


def test_the_wait_is_jittered_around_its_step() -> None:
    waits = {RetryBackoff(30.0, clock=Clock()).failed() for _ in range(50)}
    assert all(0.8 * FIRST_SECONDS <= w <= 1.2 * FIRST_SECONDS for w in waits)
    assert len(waits) > 10  # drawn, not fixed: nodes do not retry in step
