"""The agent forwards what the plugin wrote to `<run dir>/istio-cni.log` while it was away: each
line into its log at its level and time, tagged as the plugin's; then the file is gone, and a line
appended meanwhile is kept for the next round."""

from __future__ import annotations

import datetime
import io
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.logs import PLUGIN_LOGGER, KeyValueFormatter
from agent.plugin_log_file import CLAIMED_SUFFIX, Forwarding, forward_once
from agent.podserver.server import PodServer
from plugin import wire
from plugin.log import PluginLog, append_line, json_line
from testbed.wait import wait_for
from tests.plugin.helpers import cni_env, net_conf, run_plugin
from tests.podserver.helpers import InMemoryPods, ScriptedRedirector, build_rig, make_pod


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    # sun_path is 108 bytes: pytest's tmp_path can be longer than that, so use a short dir.
    short = Path("/tmp") / f"plf-{os.getpid()}-{tmp_path.name[-12:]}"
    (short / "run").mkdir(parents=True)
    yield short / "run"
    shutil.rmtree(short, ignore_errors=True)


@pytest.fixture
def agent_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


def plugin_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == PLUGIN_LOGGER]


def fields(record: logging.LogRecord) -> dict[str, object]:
    return dict(getattr(record, "fields", {}))


def write(
    run_dir: Path,
    level: str,
    msg: str,
    name: str = wire.LOG_FILE_NAME,
    stamp: str = "2024-05-06T07:08:09.123Z",
    **extra: str,
) -> None:
    with open(run_dir / name, "a") as f:
        f.write(json_line(stamp, level, msg, extra))


def test_lines_are_logged_at_their_level_and_time(
    run_dir: Path, agent_log: pytest.LogCaptureFixture
) -> None:
    write(run_dir, "error", "ADD failed", pod="ns/p", containerId="c1", error="no agent")
    write(run_dir, "warn", "DEL without agent", pod="ns/p")
    write(run_dir, "debug", "detail")
    assert forward_once(str(run_dir), settle=0) == 3
    records = plugin_records(agent_log)
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.ERROR, "ADD failed"),
        (logging.WARNING, "DEL without agent"),
        (logging.DEBUG, "detail"),
    ]
    assert fields(records[0]) == {
        "source": "plugin",
        "via": "file",
        "pod": "ns/p",
        "containerId": "c1",
        "error": "no agent",
    }
    when = datetime.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=datetime.UTC).timestamp()
    assert records[0].created == pytest.approx(when)
    line = KeyValueFormatter().format(records[0])
    assert line.startswith("time=2024-05-06T07:08:09.123Z level=error logger=agent.plugin ")
    assert os.listdir(run_dir) == []


def test_rotated_file_comes_first(run_dir: Path, agent_log: pytest.LogCaptureFixture) -> None:
    write(run_dir, "info", "newer")
    write(run_dir, "info", "older", name=wire.LOG_FILE_ROTATED)
    assert forward_once(str(run_dir), settle=0) == 2
    assert [r.getMessage() for r in plugin_records(agent_log)] == ["older", "newer"]
    assert os.listdir(run_dir) == []


def test_nothing_there_costs_nothing(run_dir: Path, agent_log: pytest.LogCaptureFixture) -> None:
    start = time.monotonic()
    assert forward_once(str(run_dir)) == 0
    assert time.monotonic() - start < 0.1  # no settle wait when nothing was taken
    assert agent_log.records == []
    assert forward_once(str(run_dir / "missing")) == 0


def test_levels_below_the_plugin_scope_are_dropped(
    run_dir: Path, agent_log: pytest.LogCaptureFixture
) -> None:
    logging.getLogger(PLUGIN_LOGGER).setLevel(logging.WARNING)
    try:
        write(run_dir, "info", "quiet")
        write(run_dir, "error", "loud")
        forward_once(str(run_dir), settle=0)
    finally:
        logging.getLogger(PLUGIN_LOGGER).setLevel(logging.NOTSET)
    assert [r.getMessage() for r in plugin_records(agent_log)] == ["loud"]
    assert os.listdir(run_dir) == []


def test_a_line_appended_while_forwarding_is_kept(
    run_dir: Path, agent_log: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plugin appending after the file was taken writes a new file, forwarded next round;
    one that opened the old name just before writes into the taken file within the settle."""
    write(run_dir, "info", "first")
    held = os.open(run_dir / wire.LOG_FILE_NAME, os.O_WRONLY | os.O_APPEND)  # opened before
    real_sleep = time.sleep

    def during_settle(seconds: float) -> None:
        os.write(held, json_line("2024-01-01T00:00:00.000Z", "info", "opened before", {}).encode())
        assert append_line(
            str(run_dir), json_line("2024-01-01T00:00:01.000Z", "info", "after the rename", {})
        )
        real_sleep(0)

    monkeypatch.setattr("agent.plugin_log_file.time.sleep", during_settle)
    try:
        assert forward_once(str(run_dir), settle=0.2) == 2
    finally:
        os.close(held)
    assert [r.getMessage() for r in plugin_records(agent_log)] == ["first", "opened before"]
    assert os.listdir(run_dir) == [wire.LOG_FILE_NAME]
    assert forward_once(str(run_dir), settle=0) == 1
    assert plugin_records(agent_log)[-1].getMessage() == "after the rename"


def test_a_file_left_halfway_is_forwarded_first(
    run_dir: Path, agent_log: pytest.LogCaptureFixture
) -> None:
    write(
        run_dir, "info", "left by an agent that stopped", name=wire.LOG_FILE_NAME + CLAIMED_SUFFIX
    )
    write(run_dir, "info", "new")
    assert forward_once(str(run_dir), settle=0) == 1
    assert os.listdir(run_dir) == [wire.LOG_FILE_NAME]
    assert forward_once(str(run_dir), settle=0) == 1
    assert [r.getMessage() for r in plugin_records(agent_log)] == [
        "left by an agent that stopped",
        "new",
    ]


def test_a_line_that_is_not_the_plugins_json_is_kept_as_text(
    run_dir: Path, agent_log: pytest.LogCaptureFixture
) -> None:
    (run_dir / wire.LOG_FILE_NAME).write_text(
        'garbage line\n\n{"level":"loud","msg":"x"}\n{"level":"info","msg":"ok","n":3}\n'
    )
    assert forward_once(str(run_dir), settle=0) == 3
    records = plugin_records(agent_log)
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.WARNING, "garbage line"),
        (logging.WARNING, '{"level":"loud","msg":"x"}'),
        (logging.INFO, "ok"),
    ]
    assert fields(records[0])["unparsed"] == "true" and fields(records[2])["n"] == "3"


def test_the_timer_forwards_at_start_and_then_periodically(
    run_dir: Path, agent_log: pytest.LogCaptureFixture
) -> None:
    write(run_dir, "warn", "before the agent")
    forwarding = Forwarding(str(run_dir), interval=0.05, settle=0)
    forwarding.start()
    try:
        wait_for(lambda: plugin_records(agent_log), "the forward at start", 5, interval=0.01)
        write(run_dir, "warn", "while the agent runs")
        wait_for(
            lambda: len(plugin_records(agent_log)) >= 2, "a periodic forward", 5, interval=0.01
        )
    finally:
        forwarding.stop()
    assert not forwarding._loop.running()
    assert [r.getMessage() for r in plugin_records(agent_log)] == [
        "before the agent",
        "while the agent runs",
    ]


def test_plugin_without_agent_then_the_real_pod_server(
    run_dir: Path, agent_log: pytest.LogCaptureFixture
) -> None:
    """The plugin runs while no agent listens (its lines go to the file); the agent's pod
    server starts, the forwarder logs those lines; from then on lines go over the socket."""
    conf = net_conf(run_dir=str(run_dir))
    assert run_plugin(cni_env("ADD", CNI_CONTAINERID="a1"), conf).code == 1
    assert run_plugin(cni_env("DEL", CNI_CONTAINERID="a1"), conf).code == 0
    assert {p.name for p in run_dir.iterdir()} == {wire.LOG_FILE_NAME}

    rig = build_rig(InMemoryPods(make_pod()), ScriptedRedirector())
    server = PodServer(str(run_dir / wire.SOCKET_NAME), rig.handlers)
    server.start()
    try:
        assert forward_once(str(run_dir), settle=0) == 2
        late = [r for r in plugin_records(agent_log) if fields(r).get("via") == "file"]
        assert [(r.levelno, r.getMessage().split(" ")[0]) for r in late] == [
            (logging.ERROR, "ADD"),
            (logging.WARNING, "DEL"),
        ]
        assert all(fields(r)["containerId"] == "a1" for r in late)
        assert all(fields(r)["pod"] == "default/app-1" for r in late)

        run = run_plugin(cni_env("DEL", CNI_CONTAINERID="b2"), conf)
        assert run.code == 0
        live = [r for r in plugin_records(agent_log) if "via" not in fields(r)]
        assert live and fields(live[0])["containerId"] == "b2"
        assert fields(live[0])["source"] == "plugin"
    finally:
        server.stop()
    assert wire.LOG_FILE_NAME not in os.listdir(run_dir)


def test_plugin_json_lines_and_forwarded_lines_read_alike(run_dir: Path) -> None:
    """With logAsJson the plugin's stderr line and the agent's line for it have the same keys."""
    err = io.StringIO()
    plog = PluginLog("info", stderr=err, fields={"pod": "ns/p"}, as_json=True, run_dir=str(run_dir))
    plog.agent_unreachable()
    plog.warn("no agent", error="refused")
    plugin_line = json.loads(err.getvalue())
    handler_out = io.StringIO()
    handler = logging.StreamHandler(handler_out)
    from agent.logs import JsonFormatter

    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(PLUGIN_LOGGER)
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        forward_once(str(run_dir), settle=0)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    agent_line = json.loads(handler_out.getvalue())
    assert list(plugin_line)[:4] == list(agent_line)[:4] == ["time", "level", "scope", "msg"]
    assert {k: agent_line[k] for k in ("time", "level", "msg", "pod", "error")} == {
        k: plugin_line[k] for k in ("time", "level", "msg", "pod", "error")
    }
    assert (agent_line["scope"], agent_line["source"]) == (PLUGIN_LOGGER, "plugin")
