"""The plugin's log lines: on stderr (key=value, or JSON with `log_as_json`), forwarded to the
agent's log, and, when the agent cannot be reached, appended to a bounded file in its run dir.

Not the `logging` package on purpose: importing it costs the plugin ~15 ms on every exec, and a
plugin run writes a handful of lines. The line formats are the agent's (agent/logs.py).

The fallback file `<cni_agent_run_dir>/istio-cni.log` (Istio's name for its plugin's local log)
holds one JSON object per line: time, level, scope, msg and the line's fields. Each line is one
`write` on an O_APPEND descriptor, so plugin runs at the same time never interleave parts of
lines. Past MAX_FILE_BYTES the file is renamed to `istio-cni.log.1` (replacing an older one), so
the two never hold much more than 2 MiB (each plugin run at the same time may add one line past
the limit between its size check and its append). The agent forwards both into its own log once
it is back and removes them (agent/plugin_log_file.py). Nothing here ever fails the CNI command: a
missing or read-only run dir only loses the line.
"""

from __future__ import annotations

import os
import time

from plugin import fastjson, wire
from plugin.logfmt import json_line_breaks_escaped, quote

TYPE_CHECKING = False  # not typing's: importing typing costs ~10 ms of start-up
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TextIO

    Sink = Callable[[str, str, dict[str, str]], bool]

LEVELS = {"debug": 10, "info": 20, "warn": 30, "error": 40, "fatal": 50, "panic": 50, "none": 1000}
SCOPE = "istio-cni"
"""The `logger=` / `scope` of the plugin's stderr lines and fallback file lines."""
MAX_FILE_BYTES = 1 << 20
MAX_FILE_VALUE = 4096
"""A longer message or field is cut to this many characters in the file (the agent's limit)."""
FILE_MODE = 0o600


class PluginLog:
    """Writes lines at or above `level` to `stderr`; `sink(level, msg, fields)` forwards one to
    the agent, and once it returns False (or `agent_unreachable()` was called) every further
    line goes to the fallback file in `run_dir` instead."""

    def __init__(
        self,
        level: str,
        *,
        stderr: TextIO,
        fields: dict[str, str],
        sink: Sink | None = None,
        as_json: bool = False,
        run_dir: str = "",
    ) -> None:
        self.threshold = LEVELS.get(level, LEVELS["info"])
        self.stderr = stderr
        self.fields = fields
        self.sink = sink
        self.as_json = as_json
        self.run_dir = run_dir

    def agent_unreachable(self) -> None:
        """The agent did not answer: do not pay a connect per line, write the file."""
        self.sink = None

    def debug(self, msg: str, **fields: object) -> None:
        self._write("debug", msg, fields)

    def info(self, msg: str, **fields: object) -> None:
        self._write("info", msg, fields)

    def warn(self, msg: str, **fields: object) -> None:
        self._write("warn", msg, fields)

    def error(self, msg: str, **fields: object) -> None:
        self._write("error", msg, fields)

    def _write(self, level: str, msg: str, fields: dict[str, object]) -> None:
        if LEVELS[level] < self.threshold:
            return
        now = time.time()
        stamp = (
            time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
        )
        own = {k: str(v) for k, v in fields.items()}
        extra = {k: v for k, v in {**self.fields, **own}.items() if v}
        line = (
            json_line(stamp, level, msg, extra)
            if self.as_json
            else kv_line(stamp, level, msg, extra)
        )
        try:
            self.stderr.write(line)
            self.stderr.flush()
        except (OSError, ValueError):
            pass  # a closed stderr must not fail the command
        if self.sink is not None and self.sink(level, msg, own):
            return
        self.sink = None
        if self.run_dir:
            append_line(
                self.run_dir,
                json_line(stamp, level, _cut(msg), {k: _cut(v) for k, v in extra.items()}),
            )


def kv_line(stamp: str, level: str, msg: str, fields: dict[str, str]) -> str:
    """`time=... level=... logger=istio-cni msg="..." k=v`, newline-terminated."""
    parts = [f"time={stamp}", f"level={level}", f"logger={SCOPE}", f"msg={quote(msg)}"]
    parts += [f"{k}={quote(v)}" for k, v in fields.items()]
    return " ".join(parts) + "\n"


def json_line(stamp: str, level: str, msg: str, fields: dict[str, str]) -> str:
    """`{"time":...,"level":...,"scope":"istio-cni","msg":...,k:v}`, newline-terminated.
    A field named like one of the four keys is written as `field.<name>`."""
    obj = {"time": stamp, "level": level, "scope": SCOPE, "msg": msg}
    for k, v in fields.items():
        obj["field." + k if k in obj else k] = v
    return json_line_breaks_escaped(fastjson.dumps_compact(obj)) + "\n"


def log_file_path(run_dir: str) -> str:
    return run_dir.rstrip("/") + "/" + wire.LOG_FILE_NAME


def append_line(run_dir: str, line: str) -> bool:
    """Append `line` (whole, newline-terminated) to the fallback file; False when it is lost."""
    path = log_file_path(run_dir)
    data = line.encode("utf-8", "backslashreplace")
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, FILE_MODE)
    except OSError:
        return False  # no run dir, read-only, full: the line is lost, the command is not
    try:
        mine = os.fstat(fd)
        if mine.st_size and mine.st_size + len(data) > MAX_FILE_BYTES:
            os.close(fd)
            fd = -1
            _rotate(path, mine)
            fd = os.open(path, flags, FILE_MODE)
        return os.write(fd, data) == len(data)
    except OSError:
        return False
    finally:
        if fd >= 0:
            os.close(fd)


def _rotate(path: str, mine: os.stat_result) -> None:
    """Rename the full file (`mine`) to `.1`, unless another run already rotated it."""
    try:
        there = os.stat(path)
        if (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino):
            os.rename(path, path[: -len(wire.LOG_FILE_NAME)] + wire.LOG_FILE_ROTATED)
    except OSError:
        pass  # gone meanwhile, or cannot rename: write to whatever is at the path now


def _cut(value: str) -> str:
    return value if len(value) <= MAX_FILE_VALUE else value[:MAX_FILE_VALUE] + "...(cut)"
