"""The plugin's own start, as it reports it to the agent (plugin.commands.process_start): the
kernel's record of the fork, on CLOCK_BOOTTIME, half a clock tick at most from the truth."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from agent.podserver.metrics import exec_seconds
from plugin import commands
from tests.plugin.helpers import AgentTestDouble, Answer, cni_env, net_conf

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


def test_the_exec_the_agent_measures_is_the_one_the_runtime_waited_for(
    agent: AgentTestDouble,
) -> None:
    """A real plugin process against an agent that takes 0.2 s to answer: the exec the agent
    computes from the reported start to its answer holds the interpreter's start-up and the
    answer, and is no longer than what the runtime measured from spawn to exit (give or take
    half a tick)."""
    agent.answers["/v1/cni/add"] = Answer(
        200, {"result": "redirected", "reason": "sidecar"}, delay=0.2
    )
    env = {**cni_env("ADD"), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    conf = json.dumps(net_conf(run_dir=str(agent.run_dir))).encode()
    spawned = time.clock_gettime(time.CLOCK_BOOTTIME)
    done = subprocess.run(
        [sys.executable, "-m", "plugin"], env=env, input=conf, capture_output=True, check=False
    )
    exited = time.clock_gettime(time.CLOCK_BOOTTIME)
    assert done.returncode == 0, done.stderr
    [(_, path, body)] = [r for r in agent.requests if r[1] == "/v1/cni/add"]
    [arrived] = [t for t, r in zip(agent.arrivals, agent.requests, strict=True) if r[1] == path]
    started = body["startedAt"]
    assert spawned - TICK / 2 <= started < arrived
    assert arrived - started > 0.005  # the interpreter's start-up and imports are in it
    measured = exec_seconds(started, arrived + 0.2)  # the agent's answer, 0.2 s after
    assert measured is not None
    assert 0.2 < measured <= exited - spawned + TICK / 2


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
