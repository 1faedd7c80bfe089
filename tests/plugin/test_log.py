"""The plugin's log lines: stderr in both formats, levels, and the fallback file in the run dir
that keeps its lines when the agent cannot be reached."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest

from plugin import log, wire
from plugin.log import PluginLog, append_line
from tests.plugin.helpers import AgentTestDouble, Answer, cni_env, net_conf, run_plugin

KV_FIELD = re.compile(r'([A-Za-z_][\w.-]*)=("(?:[^"\\]|\\.)*"|[^ "]*)')
"""One logfmt field: a key, then a bare value or a quoted one with backslash escapes."""
KV_KEYS = ("time=", "level=", "logger=istio-cni", "msg=")


def file_lines(run_dir: Path, name: str = wire.LOG_FILE_NAME) -> list[dict[str, Any]]:
    path = run_dir / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_key_value_line() -> None:
    err = io.StringIO()
    PluginLog("debug", stderr=err, fields={"pod": "ns/p", "empty": ""}).info("hello there", n=3)
    line = err.getvalue()
    assert line.endswith("\n") and line.count("\n") == 1
    parts = line.split(" ")
    assert [p.split("=")[0] for p in parts[:4]] == ["time", "level", "logger", "msg"]
    assert "level=info" in line and 'msg="hello there"' in line
    assert "pod=ns/p" in line and "n=3" in line and "empty=" not in line


HOSTILE_VALUES = [
    "web\rlevel=error msg=forged",
    "web\nlevel=error",
    "\x1b[2Jcleared",
    "nul\x00byte",
    "line\u2028separator",
    "next\x85line",
    "rtl\u202eevil",
    'quote" injected=1',
    "back\\slash",
]


@pytest.mark.parametrize("value", HOSTILE_VALUES)
@pytest.mark.parametrize("as_json", [False, True], ids=["kv", "json"])
def test_a_pod_owners_value_stays_one_field_of_one_line(value: str, as_json: bool) -> None:
    err = io.StringIO()
    PluginLog("info", stderr=err, fields={"pod": f"app/{value}"}, as_json=as_json).info(value)
    line = err.getvalue()
    assert len(line.splitlines()) == 1, repr(line)
    if as_json:
        parsed = json.loads(line)
        assert parsed["msg"] == value and parsed["pod"] == f"app/{value}"
        return
    assert line[:-1].isprintable(), repr(line)  # no terminal escape, NUL or bidi mark raw
    fields = KV_FIELD.findall(line[:-1])
    assert " ".join(f"{k}={v}" for k, v in fields) == line[:-1], "the line is only its fields"
    assert [k for k, _ in fields] == ["time", "level", "logger", "msg", "pod"]


def test_json_line_has_the_agents_keys() -> None:
    err = io.StringIO()
    PluginLog("debug", stderr=err, fields={"pod": "ns/p"}, as_json=True).warn(
        'say "hi"\n', time="clash", error="boom"
    )
    obj = json.loads(err.getvalue())
    assert list(obj)[:4] == ["time", "level", "scope", "msg"]
    assert obj["level"] == "warn" and obj["scope"] == "istio-cni" and obj["msg"] == 'say "hi"\n'
    assert obj["pod"] == "ns/p" and obj["error"] == "boom" and obj["field.time"] == "clash"
    assert obj["time"].endswith("Z") and len(obj["time"]) == len("2024-01-01T00:00:00.000Z")


@pytest.mark.parametrize(
    ("level", "written"),
    [
        ("debug", ["debug", "info", "warn", "error"]),
        ("info", ["info", "warn", "error"]),
        ("warn", ["warn", "error"]),
        ("error", ["error"]),
        ("fatal", []),
        ("panic", []),
        ("none", []),
    ],
)
def test_levels(level: str, written: list[str], tmp_path: Path) -> None:
    err = io.StringIO()
    sent: list[str] = []

    def sink(lvl: str, msg: str, fields: object) -> bool:
        sent.append(lvl)
        return True

    plog = PluginLog(level, stderr=err, fields={}, sink=sink, run_dir=str(tmp_path))
    for name in ("debug", "info", "warn", "error"):
        getattr(plog, name)("x")
    assert [line.split()[1] for line in err.getvalue().splitlines()] == [
        f"level={w}" for w in written
    ]
    assert sent == written
    assert not (tmp_path / wire.LOG_FILE_NAME).exists()


def test_none_is_silent_end_to_end(agent: AgentTestDouble) -> None:
    for run_dir in (str(agent.run_dir), str(agent.run_dir / "missing")):
        run = run_plugin(cni_env("ADD"), net_conf(run_dir=run_dir, plugin_log_level="none"))
        assert run.err == ""
    assert agent.logs() == []
    assert not (agent.run_dir / wire.LOG_FILE_NAME).exists()


def test_forwarded_lines_carry_their_fields_apart(agent: AgentTestDouble) -> None:
    agent.answers["/v1/cni/add"] = Answer(503, {"code": 11, "msg": "busy", "details": "d"})
    run = run_plugin(cni_env("ADD"), net_conf(run_dir=str(agent.run_dir)))
    assert run.code == 1
    [line] = [b for b in agent.logs() if b["level"] == "error"]
    assert line["msg"] == "ADD failed"
    assert line["fields"] == {"code": "11", "error": "busy", "details": "d"}
    assert (line["podName"], line["containerId"]) == ("app-1", "c0ffee")


def test_json_stderr_from_the_entry(agent: AgentTestDouble) -> None:
    run = run_plugin(cni_env("ADD"), net_conf(run_dir=str(agent.run_dir), log_as_json=True))
    assert run.code == 0
    objs = [json.loads(line) for line in run.err.splitlines()]
    assert objs and all(o["scope"] == "istio-cni" for o in objs)
    assert objs[0]["pod"] == "default/app-1" and objs[0]["containerId"] == "c0ffee"


def test_log_as_json_must_be_a_bool() -> None:
    run = run_plugin(cni_env("ADD"), net_conf(log_as_json="yes"))
    assert run.out["code"] == wire.INVALID_CONFIG and "log_as_json" in run.out["msg"]


# -- the fallback file --------------------------------------------------------------------------


def test_agent_down_lines_go_to_the_file(tmp_path: Path) -> None:
    run = run_plugin(cni_env("ADD"), net_conf(run_dir=str(tmp_path)))
    assert run.out["code"] == wire.TRY_AGAIN_LATER
    run = run_plugin(cni_env("DEL"), net_conf(run_dir=str(tmp_path)))
    assert run.code == 0
    lines = file_lines(tmp_path)
    assert [(o["level"], o["msg"].split(" ")[0]) for o in lines] == [
        ("error", "ADD"),
        ("warn", "DEL"),
    ]
    for o in lines:
        assert o["scope"] == "istio-cni" and o["pod"] == "default/app-1"
        assert o["containerId"] == "c0ffee" and "pluginevent.sock" in o["details"]
    assert stat.S_IMODE(os.stat(tmp_path / wire.LOG_FILE_NAME).st_mode) == 0o600


def test_after_a_failed_request_no_connect_per_line(tmp_path: Path) -> None:
    """The ADD found no agent: its lines go straight to the file (a timed-out agent would
    otherwise cost up to 0.5 s per line)."""
    calls: list[str] = []

    def sink(*args: object) -> bool:
        calls.append("sink")
        return False

    plog = PluginLog(
        "debug", stderr=io.StringIO(), fields={"pod": "a/b"}, sink=sink, run_dir=str(tmp_path)
    )
    plog.agent_unreachable()
    plog.error("one")
    plog.info("two")
    assert calls == [] and [o["msg"] for o in file_lines(tmp_path)] == ["one", "two"]


def test_a_failed_forward_sends_that_line_and_the_rest_to_the_file(agent: AgentTestDouble) -> None:
    agent.answers["/v1/log"] = Answer(500, {"code": 999, "msg": "no"})
    run = run_plugin(cni_env("ADD"), net_conf(run_dir=str(agent.run_dir)))
    assert run.code == 0
    assert len(agent.logs()) == 1  # one try, then the file
    [line] = file_lines(agent.run_dir)
    assert line["level"] == "debug" and line["msg"] == "ADD: redirected"


@pytest.mark.parametrize("run_dir", ["missing/dir", "a-file"])
def test_no_usable_run_dir_only_loses_the_line(tmp_path: Path, run_dir: str) -> None:
    (tmp_path / "a-file").write_text("")
    path = str(tmp_path / run_dir)
    assert append_line(path, '{"msg":"x"}\n') is False
    run = run_plugin(cni_env("ADD"), net_conf(run_dir=path))
    assert run.out["code"] == wire.TRY_AGAIN_LATER  # the CNI answer, not a crash
    run = run_plugin(cni_env("DEL"), net_conf(run_dir=path))
    assert (run.code, run.out) == (0, None)


def test_a_symlink_at_the_file_name_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / wire.LOG_FILE_NAME).symlink_to(target)
    assert append_line(str(tmp_path), "x\n") is False
    assert target.read_text() == ""


def test_existing_file_keeps_its_lines_and_mode(tmp_path: Path) -> None:
    path = tmp_path / wire.LOG_FILE_NAME
    path.write_text("old\n")
    os.chmod(path, 0o640)
    assert append_line(str(tmp_path), "new\n")
    assert path.read_text() == "old\nnew\n" and stat.S_IMODE(path.stat().st_mode) == 0o640


def test_rotation_bounds_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log, "MAX_FILE_BYTES", 100)
    for n in range(30):
        assert append_line(str(tmp_path), f"line {n:02d} " + "x" * 20 + "\n")  # 30 bytes
    current = (tmp_path / wire.LOG_FILE_NAME).read_text().splitlines()
    rotated = (tmp_path / wire.LOG_FILE_ROTATED).read_text().splitlines()
    assert (len(current), len(rotated)) == (3, 3)  # 3 lines fit in 100 bytes; older .1 replaced
    assert [line[:7] for line in rotated + current] == [f"line {n:02d}" for n in range(24, 30)]
    assert stat.S_IMODE((tmp_path / wire.LOG_FILE_NAME).stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == [wire.LOG_FILE_NAME, wire.LOG_FILE_ROTATED]


def test_long_values_are_cut_in_the_file(tmp_path: Path) -> None:
    plog = PluginLog("info", stderr=io.StringIO(), fields={}, run_dir=str(tmp_path))
    plog.error("m" * 10_000, details="d" * 10_000)
    [line] = file_lines(tmp_path)
    assert len(line["msg"]) < 4200 and len(line["details"]) < 4200


def _writer(run_dir: str, worker: int, count: int) -> None:
    log.MAX_FILE_BYTES = 20_000
    for n in range(count):
        line = json.dumps({"w": worker, "n": n, "pad": "p" * (n % 300)}) + "\n"
        append_line(run_dir, line)


def test_concurrent_writers_never_interleave_lines(tmp_path: Path) -> None:
    """8 processes append 400 lines each through many rotations: every line in either file is
    whole, and nothing but the two files is left."""
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, 400)) for w in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    seen = 0
    for name in (wire.LOG_FILE_ROTATED, wire.LOG_FILE_NAME):
        text = (tmp_path / name).read_text()
        assert text.endswith("\n")
        for line in text.splitlines():
            obj = json.loads(line)  # a partial or interleaved line would not parse
            assert obj["pad"] == "p" * (obj["n"] % 300)
            seen += 1
        # Writers check the size, then append: each of the 8 may add one line (< 400 bytes)
        # past the limit before one of them rotates.
        assert (tmp_path / name).stat().st_size <= 20_000 + 8 * 400
    assert seen > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [wire.LOG_FILE_NAME, wire.LOG_FILE_ROTATED]
