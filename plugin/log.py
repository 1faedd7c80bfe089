"""The plugin's log lines: key=value on stderr, and forwarded to the agent's log (best effort).

Not the `logging` package on purpose: importing it costs the plugin ~15 ms on every exec, and a
plugin run writes a handful of lines. The line format is the agent's (agent/logs.py).
"""

from __future__ import annotations

import time

TYPE_CHECKING = False  # not typing's: importing typing costs ~10 ms of start-up
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TextIO

LEVELS = {"debug": 10, "info": 20, "warn": 30, "error": 40, "fatal": 50, "panic": 50}



class PluginLog:
    """Writes lines at or above `level`; `sink(level, msg)` forwards one, False stops forwarding."""

    def __init__(
        self,
        level: str,
        *,
        stderr: TextIO,
        fields: dict[str, str],
        sink: Callable[[str, str], bool] | None = None,
    ) -> None:
        self.threshold = LEVELS.get(level, LEVELS["info"])
        self.stderr = stderr
        self.fields = fields
        self.sink = sink

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
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))
        extra = {**self.fields, **{k: str(v) for k, v in fields.items()}}
        parts = [f"time={stamp}.{int(now % 1 * 1000):03d}Z", f"level={level}",
                 "logger=istio-cni", f"msg={_quote(msg)}"]
        parts += [f"{k}={_quote(v)}" for k, v in extra.items() if v]
        try:
            self.stderr.write(" ".join(parts) + "\n")
            self.stderr.flush()
        except OSError:
            pass  # a closed stderr must not fail the command
        line = msg + "".join(f" {k}={_quote(str(v))}" for k, v in fields.items())
        if self.sink is not None and not self.sink(level, line):
            self.sink = None  # the agent is not there: do not pay a connect per line


def _quote(value: str) -> str:
    if value and not any(c in value for c in ' "=\n\t'):
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'
