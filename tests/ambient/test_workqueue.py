"""The keyed work queue on a test clock: one item per key, values merged, per-key back-off that
new values do not cut short, a value queued while its key is processed kept for after it."""

from __future__ import annotations

from agent.ambient.workqueue import RETRY_FIRST_SECONDS, RETRY_MAX_SECONDS, KeyedQueue


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def joined(older: str, newer: str) -> str:
    return older + newer


def queue() -> tuple[KeyedQueue[str, str], Clock]:
    clock = Clock()
    return KeyedQueue(joined, clock=clock), clock


def test_values_of_one_key_merge_into_one_item_in_first_come_order() -> None:
    q, _ = queue()
    q.put("a", "1")
    q.put("b", "x")
    q.put("a", "2")
    assert len(q) == 2
    first, second = q.get(0), q.get(0)
    assert first is not None and (first.key, first.value) == ("a", "12")
    assert second is not None and (second.key, second.value) == ("b", "x")
    assert q.get(0) is None and len(q) == 0


def test_a_failing_key_backs_off_doubling_and_new_values_wait_with_it() -> None:
    q, clock = queue()
    q.put("a", "1")
    delays = []
    for _ in range(12):
        taken = q.get(0)
        assert taken is not None
        delay = q.retry(taken)
        delays.append(delay)
        q.put("a", "+")  # an update meanwhile: merged, not due before the back-off
        assert q.get(0) is None
        clock.now += delay
    assert delays[:4] == [RETRY_FIRST_SECONDS, 0.01, 0.02, 0.04]
    assert delays[-1] == RETRY_MAX_SECONDS
    assert len(q) == 1


def test_a_value_queued_while_its_key_is_processed_is_kept_and_merged_on_failure() -> None:
    q, clock = queue()
    q.put("a", "1")
    taken = q.get(0)
    assert taken is not None
    q.put("a", "2")  # arrives while "1" is processed
    delay = q.retry(taken)
    assert q.get(0) is None
    clock.now += delay
    again = q.get(0)
    assert again is not None and again.value == "12" and again.backoff == delay


def test_success_forgets_the_back_off() -> None:
    q, clock = queue()
    q.put("a", "1")
    taken = q.get(0)
    assert taken is not None
    clock.now += q.retry(taken)
    assert q.get(0) is not None  # handled this time
    q.put("a", "2")
    taken = q.get(0)
    assert taken is not None and taken.backoff == 0.0


def test_at_once_ends_a_back_off() -> None:
    q, _ = queue()
    q.put("a", "1")
    taken = q.get(0)
    assert taken is not None
    q.retry(taken)
    q.put("a", "!", at_once=True)
    now = q.get(0)
    assert now is not None and now.value == "1!"
