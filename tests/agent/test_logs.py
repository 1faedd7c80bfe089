"""The agent's log set-up: levels per Istio scope, `none`, unknown scopes, key=value and JSON."""

from __future__ import annotations

import ast
import json
import logging
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from agent.log_levels import AGENT_SCOPES, parse_log_levels
from agent.logs import NONE, PLUGIN_LOGGER, JsonFormatter, KeyValueFormatter, setup_logging
from plugin import wire
from tests.podserver.helpers import InMemoryPods, ScriptedRedirector, build_rig, make_pod

TOUCHED = ["", *AGENT_SCOPES.values(), PLUGIN_LOGGER, "kubernetes", "urllib3"]


class Captured:
    """What the agent wrote to stderr so far (pytest's capsys: sys.stderr while a test runs)."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self.capsys = capsys
        self.text = ""

    def getvalue(self) -> str:
        self.text += self.capsys.readouterr().err
        return self.text


@pytest.fixture
def stderr(capsys: pytest.CaptureFixture[str]) -> Iterator[Captured]:
    """setup_logging's stream, with every logger it sets put back afterwards."""
    saved = {name: logging.getLogger(name).level for name in TOUCHED}
    handlers = logging.getLogger().handlers[:]
    yield Captured(capsys)
    logging.getLogger().handlers[:] = handlers
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


def levels_of(*names: str) -> list[int]:
    return [logging.getLogger(n).level for n in names]


def test_a_bare_level_sets_every_scope(stderr: Captured) -> None:
    setup_logging(parse_log_levels("warn"))
    assert levels_of("", *AGENT_SCOPES.values(), PLUGIN_LOGGER) == [logging.WARNING] * 6


def test_scopes_get_their_own_level(stderr: Captured) -> None:
    setup_logging(parse_log_levels("default:warn,install:debug,cni-plugin:error,repair:none"))
    assert levels_of(
        "", "agent", "agent.install", "agent.repair", "agent.ambient", PLUGIN_LOGGER
    ) == [logging.WARNING, logging.WARNING, logging.DEBUG, NONE, logging.WARNING, logging.ERROR]
    logging.getLogger("agent.install.watcher").debug("shown")
    logging.getLogger("agent.podserver.handlers").info("hidden: cni-agent is at the default")
    logging.getLogger("agent.repair.service").critical("hidden: repair is none")
    logging.getLogger(PLUGIN_LOGGER).warning("hidden: cni-plugin is error")
    lines = stderr.getvalue().splitlines()
    assert len(lines) == 1 and "msg=shown" in lines[0], lines


def test_cni_agent_scope_is_the_agents_own_modules(stderr: Captured) -> None:
    setup_logging(parse_log_levels("default:error,cni-agent:debug"))
    logging.getLogger("agent.podserver.handlers").debug("agent line")
    logging.getLogger("agent.install.installer").info("install stays at the default")
    assert stderr.getvalue().count("\n") == 1 and "agent line" in stderr.getvalue()


def test_none_silences_everything(stderr: Captured) -> None:
    setup_logging(parse_log_levels("none"))
    for name in ("agent", "agent.install", PLUGIN_LOGGER, "kubernetes", "other"):
        logging.getLogger(name).critical("no")
    assert stderr.getvalue() == ""


def test_unknown_scopes_are_named_once(stderr: Captured) -> None:
    setup_logging(parse_log_levels("info,galley:debug,ambient:warn,zz:error"))
    lines = stderr.getvalue().splitlines()
    assert len(lines) == 1
    assert "level=warn" in lines[0] and "scopes=galley,zz" in lines[0]


def test_a_string_is_parsed(stderr: Captured) -> None:
    setup_logging("default:debug")
    assert logging.getLogger().level == logging.DEBUG


def test_kubernetes_client_never_below_info(stderr: Captured) -> None:
    setup_logging(parse_log_levels("debug"))
    assert levels_of("kubernetes", "urllib3") == [logging.INFO, logging.WARNING]


def _record(level: int = logging.WARNING, **fields: object) -> logging.LogRecord:
    record = logging.LogRecord(
        "agent.install", level, __file__, 1, "%s went %s", ("it", "wrong"), None
    )
    record.fields = fields
    return record


def test_key_value_format() -> None:
    stamp, rest = KeyValueFormatter().format(_record(path="/x y", n=2)).split(" ", 1)
    assert stamp.startswith("time=") and stamp.endswith("Z")
    assert rest == 'level=warn logger=agent.install msg="it went wrong" path="/x y" n=2'


def test_json_format_has_the_keys_and_fields() -> None:
    obj = json.loads(
        JsonFormatter().format(_record(path="/x", n=2, ok=True, msg="clash", obj=["a"]))
    )
    assert list(obj)[:4] == ["time", "level", "scope", "msg"]
    assert obj["level"] == "warn" and obj["scope"] == "agent.install"
    assert obj["msg"] == "it went wrong" and obj["field.msg"] == "clash"
    assert (obj["path"], obj["n"], obj["ok"], obj["obj"]) == ("/x", 2, True, "['a']")
    assert obj["time"].endswith("Z") and len(obj["time"]) == len("2024-01-01T00:00:00.000Z")


def test_json_format_carries_the_exception() -> None:
    try:
        raise ValueError("bad")
    except ValueError:
        record = logging.LogRecord(
            "agent", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    obj = json.loads(JsonFormatter().format(record))
    assert obj["level"] == "error" and "ValueError: bad" in obj["stack"]


def test_level_names_are_istios() -> None:
    names = [
        json.loads(JsonFormatter().format(_record(level)))["level"]
        for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)
    ]
    assert names == ["debug", "info", "warn", "error", "fatal"]


def test_agent_process_logs_json() -> None:
    """What the agent's commands call, in a fresh process: one JSON object per line."""
    code = (
        "from agent.config import Settings; from agent.logs import setup_logging; "
        "import logging; s = Settings(logLevel='default:info,foo:debug', logAsJson=True); "
        "setup_logging(s.log_levels, as_json=s.logAsJson); "
        "logging.getLogger('agent.install').info('hi', extra={'fields': {'a': 1}})"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    objs = [json.loads(line) for line in done.stderr.splitlines()]
    assert [o["msg"] for o in objs][1:] == ["hi"] and objs[1]["a"] == 1
    assert objs[0]["level"] == "warn" and objs[0]["scopes"] == "foo"


# -- the plugin's lines, as the /log handler writes them --------------------------------------


def test_plugin_line_fields_are_kept_apart(stderr: Captured) -> None:
    setup_logging(parse_log_levels("debug"), as_json=True)
    rig = build_rig(InMemoryPods(make_pod()), ScriptedRedirector())
    body = wire.encode(
        wire.log_request(
            level="error",
            msg="ADD failed",
            pod_name="web-0",
            pod_namespace="shop",
            container_id="c1",
            fields={"code": "11", "error": "x", "source": "spoofed"},
        )
    )
    assert rig.handlers.log(body).status == 200
    [obj] = [json.loads(line) for line in stderr.getvalue().splitlines()]
    assert (obj["level"], obj["scope"], obj["msg"]) == ("error", PLUGIN_LOGGER, "ADD failed")
    assert (obj["source"], obj["pod"], obj["containerId"]) == ("plugin", "shop/web-0", "c1")
    assert (obj["code"], obj["error"]) == ("11", "x")


def test_plugin_line_without_fields_is_still_accepted() -> None:
    rig = build_rig(InMemoryPods(make_pod()), ScriptedRedirector())
    body = json.dumps(
        {"level": "info", "msg": "m", "podName": "p", "podNamespace": "n", "containerId": "c"}
    ).encode()
    assert rig.handlers.log(body).status == 200
    bad = json.dumps(
        {
            "level": "info",
            "msg": "m",
            "podName": "p",
            "podNamespace": "n",
            "containerId": "c",
            "fields": {"a": 1},
        }
    ).encode()
    assert rig.handlers.log(bad).status == 400


LOGFMT_PAIR = re.compile(r'([^\s="]+)=("(?:[^"\\]|\\.)*"|[^\s"]*)(?: |$)')

HOSTILE = {
    "newline": "web\nlevel=error msg=forged",
    "carriage return": "web\rlevel=error msg=forged",
    "tab": "a\tb",
    "terminal escape": "\x1b[2K\x1b[1Gforged",
    "nul": "a\x00b",
    "line separator": "a\u2028level=error",
    "paragraph separator": "a\u2029b",
    "next line": "a\x85b",
    "bidi override": "a\u202eb",
    "quotes and backslashes": 'a\\" b=\\"c',
    "an equals sign": "k=v",
    "empty": "",
}


def logfmt(line: str) -> dict[str, str]:
    """A key=value line as a reader parses it: every field, its value unescaped (the escapes
    are a Python string literal's)."""
    assert len(line.splitlines()) == 1 and line.isprintable(), repr(line)
    pairs = LOGFMT_PAIR.findall(line)
    assert " ".join(f"{k}={v}" for k, v in pairs) == line, "the line is fields and nothing else"
    return {k: ast.literal_eval(v) if v.startswith('"') else v for k, v in pairs}


@pytest.mark.parametrize("value", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_value_cannot_forge_a_line_or_a_field(value: str) -> None:
    record = _record(pod=value, n=1)
    record.msg = "refused %s"
    record.args = (value,)
    fields = logfmt(KeyValueFormatter().format(record))
    assert list(fields) == ["time", "level", "logger", "msg", "pod", "n"]
    assert fields["pod"] == value and fields["msg"] == f"refused {value}"
    line = JsonFormatter().format(record)
    assert len(line.splitlines()) == 1 and "\u2028" not in line
    assert json.loads(line)["pod"] == value


def test_a_field_name_is_one_safe_key() -> None:
    record = _record()
    record.fields = {'a b=c"\nlevel': "x", "": "y", "ok.key-1_2": "z"}
    fields = logfmt(KeyValueFormatter().format(record))
    assert list(fields)[4:] == ["a_b_c__level", "_", "ok.key-1_2"]
    assert fields["level"] == "warn"
