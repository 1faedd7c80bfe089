"""The readiness service: each check at its own period, results kept for /readyz, a transition
logged once (not per probe), the istio_cni_ready_check gauge, a raising check failing."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import REGISTRY

from agent.readiness.service import NOT_CHECKED, Check, Readiness


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Scripted:
    """A check whose answer the test sets; counts its runs."""

    def __init__(self, answer: str | None = None) -> None:
        self.answer = answer
        self.runs = 0

    def __call__(self) -> str | None:
        self.runs += 1
        return self.answer


def gauge(check: str) -> float | None:
    return REGISTRY.get_sample_value("istio_cni_ready_check", {"check": check})


def test_not_ready_until_checked_then_each_runs_at_its_period() -> None:
    fast, slow, clock = Scripted(), Scripted("netns dir wrong"), Clock()
    readiness = Readiness([Check("fast", fast, 1.0), Check("slow", slow, 30.0)], clock=clock)
    assert readiness.failing() == [("fast", NOT_CHECKED), ("slow", NOT_CHECKED)]
    assert not readiness.ready()
    readiness.run_due()
    assert readiness.failing() == [("slow", "netns dir wrong")]
    assert readiness.lines() == ["slow: netns dir wrong"]
    for _ in range(5):
        clock.now += 1.0
        readiness.run_due()
    assert (fast.runs, slow.runs) == (6, 1)  # the slow one is not due yet
    slow.answer = None
    clock.now += 25.0
    readiness.run_due()
    assert slow.runs == 2 and readiness.ready() and readiness.failing() == []


def test_gauge_follows_each_check() -> None:
    a, b = Scripted(), Scripted("no")
    readiness = Readiness([Check("gauge-a", a, 0.0), Check("gauge-b", b, 0.0)], tick=60.0)
    assert gauge("gauge-a") is None  # not started
    readiness.start()
    try:
        assert (gauge("gauge-a"), gauge("gauge-b")) == (1.0, 0.0)
        a.answer, b.answer = "broken", None
        readiness.run_due()
        assert (gauge("gauge-a"), gauge("gauge-b")) == (0.0, 1.0)
    finally:
        readiness.stop()
    assert (gauge("gauge-a"), gauge("gauge-b")) == (None, None)  # gone with the service


def test_a_transition_is_logged_once_not_per_run(caplog: pytest.LogCaptureFixture) -> None:
    check = Scripted("cniNetnsDir /wrong is not a directory")
    readiness = Readiness([Check("netns-dir", check, 0.0)])
    with caplog.at_level(logging.INFO, logger="agent.readiness.service"):
        for _ in range(5):
            readiness.run_due()
        check.answer = None
        for _ in range(5):
            readiness.run_due()
    messages = [(r.getMessage(), getattr(r, "fields", {})) for r in caplog.records]
    fails = [m for m in messages if m[0] == "readiness check fails"]
    assert fails == [
        ("readiness check fails", {"check": "netns-dir", "reason": check_reason()}),
    ]
    assert [m[0] for m in messages].count("readiness check passes") == 1
    assert [m[0] for m in messages].count("agent not ready") == 1
    assert [m[0] for m in messages].count("agent ready: every readiness check passes") == 1


def check_reason() -> str:
    return "cniNetnsDir /wrong is not a directory"


def test_a_raising_check_fails_with_the_exception() -> None:
    def boom() -> str | None:
        raise RuntimeError("no such table")

    readiness = Readiness([Check("rules", boom, 0.0)])
    readiness.run_due()
    assert readiness.failing() == [("rules", "check raised RuntimeError: no such table")]


def test_start_answers_at_once_and_stop_releases_what_checks_hold() -> None:
    events: list[str] = []

    class Held:
        def start(self) -> None:
            events.append("start")

        def stop(self) -> None:
            events.append("stop")

    readiness = Readiness([Check("x", Scripted(), 60.0)], held=[Held()], tick=0.01)
    readiness.start()
    try:
        assert readiness.ready()  # the first round ran inside start()
    finally:
        readiness.stop()
    assert events == ["start", "stop"]
