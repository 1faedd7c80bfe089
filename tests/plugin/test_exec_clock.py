"""The plugin's own start, as it reports it to the agent (plugin.commands.process_start): the
kernel's record of the fork, on CLOCK_BOOTTIME, half a clock tick at most from the truth."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from plugin import commands

TICK = 1 / os.sysconf("SC_CLK_TCK")


def test_a_new_process_reports_its_own_start_within_half_a_tick() -> None:
    """A child started between two readings of the clock says it started between them (give
    or take half a tick), however long its interpreter took before our code ran."""
    before = time.clock_gettime(time.CLOCK_BOOTTIME)
    out = subprocess.run(
        [sys.executable, "-c", "from plugin.commands import process_start; print(process_start())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    after = time.clock_gettime(time.CLOCK_BOOTTIME)
    started = float(out)
    assert before - TICK / 2 <= started <= after
    # The interpreter's start-up and imports came before the print: a time taken in the
    # child's own code would be later than the fork by that much.
    assert started < after


def test_the_start_is_never_later_than_now() -> None:
    now = time.clock_gettime(time.CLOCK_BOOTTIME)
    started = commands.process_start()
    assert started is not None
    assert started < now  # this test process started before the test


def test_no_proc_means_no_report(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "open", _refuse)
    assert commands.process_start() is None


def test_a_command_name_with_spaces_and_parentheses_is_skipped_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """/proc/PID/stat's second field is the command name in parentheses, and may hold both:
    the fields are counted from the last `)`; starttime is the 22nd (here: 22 ticks)."""
    stat = b"42 (we ird) ) name) S " + b" ".join(str(n).encode() for n in range(4, 60))
    monkeypatch.setattr(os, "read", lambda fd, n: stat)
    assert commands.process_start() == (22 + 0.5) * TICK


def test_a_garbled_stat_means_no_report(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "read", lambda fd, n: b"42 (x) S 1 2")
    assert commands.process_start() is None


def _refuse(*_: object) -> int:
    raise PermissionError("no /proc here")
