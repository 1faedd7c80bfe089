"""The agent's log: one line per record on stderr, key=value or (logAsJson) one JSON object,
at the chart's levels, per Istio scope.

key=value: `time=... level=... logger=<logger> msg="..." k=v ...`
JSON:      `{"time": ..., "level": ..., "scope": <logger>, "msg": ..., "k": v, ...}`

The plugin writes its own lines in the same two shapes (plugin/log.py), so the lines it forwards
and its stderr read alike. Level names are Istio's: debug, info, warn, error, fatal.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time

from agent.log_levels import AGENT_SCOPES, LogLevels, parse_log_levels
from plugin.logfmt import json_line_breaks_escaped, quote

NONE = logging.CRITICAL + 10
"""The level of `none`: above every record's level, so nothing is written."""

# The chart's levels are Istio's; panic and fatal both mean "only the worst".
LEVELS: dict[str, int] = {
    "none": NONE,
    "panic": logging.CRITICAL,
    "fatal": logging.CRITICAL,
    "error": logging.ERROR,
    "warn": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
}
LEVEL_NAMES: dict[int, str] = {
    logging.DEBUG: "debug",
    logging.INFO: "info",
    logging.WARNING: "warn",
    logging.ERROR: "error",
    logging.CRITICAL: "fatal",
}
PLUGIN_LOGGER = "agent.plugin"
"""The logger of the plugin's lines in the agent's log (Istio's `cni-plugin` scope)."""

log = logging.getLogger(__name__)


def _stamp(record: logging.LogRecord) -> str:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{stamp}.{int(record.msecs):03d}Z"


def _level_name(record: logging.LogRecord) -> str:
    return LEVEL_NAMES.get(record.levelno, record.levelname.lower())


def _fields(record: logging.LogRecord) -> dict[str, object]:
    fields = getattr(record, "fields", None)
    return fields if isinstance(fields, dict) else {}


class KeyValueFormatter(logging.Formatter):
    """`time=... level=... logger=... msg="..." k=v`: one line per record, grep- and parse-able."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [
            f"time={_stamp(record)}",
            f"level={_level_name(record)}",
            f"logger={record.name}",
            f"msg={quote(record.getMessage())}",
        ]
        parts.extend(f"{_key(k)}={quote(str(v))}" for k, v in _fields(record).items())
        if record.exc_info:
            parts.append(f"error={quote(self.formatException(record.exc_info))}")
        return " ".join(parts)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, scope (the logger), msg, then the record's
    fields (a field named like one of those four is written as `field.<name>`), and `stack`
    when the record carries an exception."""

    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, object] = {
            "time": _stamp(record),
            "level": _level_name(record),
            "scope": record.name,
            "msg": record.getMessage(),
        }
        for k, v in _fields(record).items():
            key = str(k)
            obj["field." + key if key in obj else key] = _json_value(v)
        if record.exc_info:
            obj["stack"] = self.formatException(record.exc_info)
        line = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
        return json_line_breaks_escaped(line)


def _json_value(value: object) -> object:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _key(key: object) -> str:
    """A field's name as one logfmt key: letters, digits, `_`, `.`, `-` (others become `_`)."""
    return _KEY_UNSAFE.sub("_", str(key)) or "_"


def setup_logging(levels: LogLevels | str = "info", *, as_json: bool = False) -> None:
    """Send every agent log line to stderr: the root logger at the default level, each Istio
    scope the agent has (AGENT_SCOPES, and `cni-plugin` for the plugin's lines) at its own.
    Scopes the setting names that nothing here logs under are reported once, as Istio accepts
    them too."""
    if isinstance(levels, str):
        levels = parse_log_levels(levels)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if as_json else KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(LEVELS[levels.default])
    for scope, logger in AGENT_SCOPES.items():
        logging.getLogger(logger).setLevel(LEVELS[levels.level_of(scope)])
    logging.getLogger(PLUGIN_LOGGER).setLevel(LEVELS[levels.plugin])
    # The kubernetes client logs request bodies at debug: keep tokens and payloads out.
    logging.getLogger("kubernetes").setLevel(max(logging.INFO, root.level))
    logging.getLogger("urllib3").setLevel(max(logging.WARNING, root.level))
    unknown = levels.unknown_scopes
    if unknown:
        log.warning(
            "log level names scopes the agent does not have; they are ignored",
            extra={"fields": {"scopes": ",".join(unknown)}},
        )
