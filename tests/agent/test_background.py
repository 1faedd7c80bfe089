"""agent.background: the one start/stop of the agent's long-lived threads, on real threads."""

from __future__ import annotations

import logging
import threading

import pytest

from agent.background import BackgroundLoop
from agent.liveness import Liveness
from testbed.wait import wait_for


def loop_fields(record: logging.LogRecord) -> dict[str, object]:
    return dict(getattr(record, "fields", {}))


def test_runs_on_a_named_daemon_thread_until_stopped() -> None:
    seen: list[threading.Thread] = []

    def body() -> None:
        seen.append(threading.current_thread())
        loop.stopping.wait()

    loop = BackgroundLoop("a-loop", body, join_timeout=5)
    loop.start()
    wait_for(lambda: seen, "the body to run", 5, interval=0.01)
    assert seen[0].name == "a-loop" and seen[0].daemon and loop.running()
    assert loop.stop() is True
    assert not seen[0].is_alive() and not loop.running()
    loop.start()  # a stopped loop starts again, with `stopping` cleared
    wait_for(lambda: len(seen) == 2, "the second run", 5, interval=0.01)
    assert loop.stop() is True


def test_a_running_loop_is_not_started_twice() -> None:
    loop = BackgroundLoop("twice", lambda: loop.stopping.wait(), join_timeout=5)
    loop.start()
    try:
        with pytest.raises(RuntimeError, match="twice is already running"):
            loop.start()
    finally:
        assert loop.stop() is True


def test_stop_before_start_and_twice_is_harmless() -> None:
    loop = BackgroundLoop("idle", lambda: None)
    assert loop.stop() is True
    assert loop.stop() is True


def test_wake_is_called_after_stopping_is_set() -> None:
    cond = threading.Condition()
    woken: list[bool] = []

    def wake() -> None:
        woken.append(loop.stopping.is_set())
        with cond:
            cond.notify_all()

    def body() -> None:
        with cond:  # a wait the event cannot reach: only the wake ends it
            while not loop.stopping.is_set():
                cond.wait()

    loop = BackgroundLoop("woken", body, wake=wake, join_timeout=5)
    loop.start()
    assert loop.stop() is True
    assert woken == [True]


def test_an_exception_leaving_the_body_is_logged_with_the_loops_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def body() -> None:
        raise ValueError("broken body")

    loop = BackgroundLoop("failing", body, join_timeout=5, liveness=Liveness())
    with caplog.at_level(logging.ERROR, logger="agent.background"):
        loop.start()
        wait_for(lambda: not loop.running(), "the failed loop to end", 5, interval=0.01)
    (record,) = [r for r in caplog.records if r.name == "agent.background"]
    assert record.message == "background loop failed and has ended"
    assert loop_fields(record) == {"loop": "failing"}
    assert record.exc_info is not None and "broken body" in str(record.exc_info[1])
    assert loop.stop() is True


def test_a_thread_that_does_not_stop_in_time_is_reported_and_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()
    loop = BackgroundLoop("stuck", lambda: release.wait(), join_timeout=0.05)
    loop.start()
    try:
        with caplog.at_level(logging.WARNING, logger="agent.background"):
            assert loop.stop() is False
        (record,) = [r for r in caplog.records if r.name == "agent.background"]
        assert "did not stop in time" in record.message
        assert loop_fields(record) == {"loop": "stuck", "waitedSeconds": 0.05}
        assert loop.running()
        with pytest.raises(RuntimeError, match="already running"):
            loop.start()  # it still shares `stopping` with the stuck thread
    finally:
        release.set()
    loop._join_timeout = 5
    assert loop.stop() is True


def test_every_runs_each_interval_and_survives_a_failed_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []

    def step() -> None:
        calls.append(len(calls))
        if len(calls) == 2:
            raise RuntimeError("second round broke")

    loop = BackgroundLoop.every("rounds", 0.01, step, failed="a round failed", join_timeout=5)
    with caplog.at_level(logging.ERROR, logger="agent.background"):
        loop.start()
        try:
            wait_for(lambda: len(calls) >= 4, "rounds after the failed one", 5, interval=0.01)
        finally:
            assert loop.stop() is True
    failed = [r for r in caplog.records if r.message == "a round failed"]
    assert len(failed) == 1 and "second round broke" in str(failed[0].exc_info[1])  # type: ignore[index]


def test_every_waits_an_interval_first_unless_at_start() -> None:
    later: list[int] = []
    now: list[int] = []
    waiting = BackgroundLoop.every("later", 60, lambda: later.append(1), failed="x")
    eager = BackgroundLoop.every("now", 60, lambda: now.append(1), failed="x", at_start=True)
    waiting.start()
    eager.start()
    wait_for(lambda: now, "the round at start", 5, interval=0.01)
    assert waiting.stop() is True and eager.stop() is True
    assert later == [] and now == [1]


def ended(liveness: Liveness, name: str, body, **kw) -> list[tuple[str, str]]:
    """What `liveness` holds once a loop named `name` running `body` has ended by itself."""
    loop = BackgroundLoop(name, body, join_timeout=5, liveness=liveness, **kw)
    loop.start()
    wait_for(lambda: not loop.running(), "the loop to end", 5, interval=0.01)
    loop.stop()
    return liveness.failing()


def test_a_loop_that_raises_is_reported_to_liveness(caplog: pytest.LogCaptureFixture) -> None:
    def body() -> None:
        raise OSError("inotify gone")

    liveness = Liveness()
    with caplog.at_level(logging.ERROR, logger="agent.liveness"):
        assert ended(liveness, "install-watcher", body) == [
            ("install-watcher", "raised OSError: inotify gone")
        ]
    (record,) = [r for r in caplog.records if r.name == "agent.liveness"]
    assert "no longer live" in record.message
    assert loop_fields(record) == {
        "loop": "install-watcher",
        "reason": "raised OSError: inotify gone",
    }


def test_a_loop_that_returns_without_being_stopped_is_reported() -> None:
    assert ended(Liveness(), "events", lambda: None) == [
        ("events", "returned without being stopped")
    ]


def test_a_one_shot_task_may_return_but_not_raise() -> None:
    assert ended(Liveness(), "start-up", lambda: None, one_shot=True) == []

    def body() -> None:
        raise RuntimeError("start-up broke")

    assert ended(Liveness(), "start-up", body, one_shot=True) == [
        ("start-up", "raised RuntimeError: start-up broke")
    ]


def test_a_loop_that_ends_because_it_was_stopped_is_not_reported() -> None:
    liveness = Liveness()

    def body() -> None:
        loop.stopping.wait()
        raise RuntimeError("raised on the way out")

    loop = BackgroundLoop("stopped", body, join_timeout=5, liveness=liveness)
    loop.start()
    assert loop.stop() is True
    quiet = BackgroundLoop(
        "quiet", lambda: quiet.stopping.wait(), join_timeout=5, liveness=liveness
    )
    quiet.start()
    assert quiet.stop() is True
    assert liveness.failing() == []
