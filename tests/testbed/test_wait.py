"""The one wait: its timeout names what was awaited and reports what the registered
diagnostics show, each guarded so that a failing report never hides the timeout."""

from __future__ import annotations

import pytest

from testbed import wait
from testbed.wait import WaitTimeout, diagnostics, wait_for


def test_a_timeout_reports_its_own_and_every_registered_diagnostic() -> None:
    with (
        diagnostics(lambda: "DaemonSet desired 3 ready 2"),
        diagnostics(lambda: "node gone"),
        pytest.raises(WaitTimeout) as failed,
    ):
        wait_for(lambda: False, "the DaemonSet", 0.05, on_timeout=lambda: "its pods")
    text = str(failed.value)
    assert text.startswith("timed out after 0.05s waiting for the DaemonSet")
    assert text.index("its pods") < text.index("DaemonSet desired 3") < text.index("node gone")


def test_diagnostics_end_with_their_block() -> None:
    with diagnostics(lambda: "inside"):
        pass
    with pytest.raises(WaitTimeout) as failed:
        wait_for(lambda: None, "something", 0.01)
    assert "inside" not in str(failed.value)


def test_a_failing_diagnostic_is_named_and_the_others_still_report() -> None:
    def broken() -> str:
        raise ConnectionError("API server away")

    with (
        diagnostics(broken),
        diagnostics(lambda: "the log tail"),
        pytest.raises(WaitTimeout) as failed,
    ):
        wait_for(lambda: 0, "the pod", 0.01)
    text = str(failed.value)
    assert "diagnostic" in text and "API server away" in text and "the log tail" in text


def test_a_long_diagnostic_is_cut() -> None:
    with diagnostics(lambda: "x" * (wait.DIAGNOSTIC_CHARS * 3)):
        message = str(wait.timed_out("a thing", 1.0))
    assert len(message) < wait.DIAGNOSTIC_CHARS + 200
    assert f"{wait.DIAGNOSTIC_CHARS * 2} chars cut" in message


def test_a_condition_that_holds_returns_its_value_without_diagnostics() -> None:
    def explode() -> str:
        raise AssertionError("a diagnostic ran though nothing timed out")

    with diagnostics(explode):
        assert wait_for(lambda: "done", "x", 1.0) == "done"
