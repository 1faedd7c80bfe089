"""Structured key=value logging with the chart's level names."""

from __future__ import annotations

import logging
import sys
import time

# The chart's levels are Istio's; panic and fatal both mean "only the worst".
LEVELS: dict[str, int] = {
    "panic": logging.CRITICAL,
    "fatal": logging.CRITICAL,
    "error": logging.ERROR,
    "warn": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
}


class KeyValueFormatter(logging.Formatter):
    """`time=... level=... logger=... msg="..." k=v`: one line per record, grep- and parse-able."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [
            f"time={stamp}.{int(record.msecs):03d}Z",
            f"level={record.levelname.lower()}",
            f"logger={record.name}",
            f"msg={_quote(record.getMessage())}",
        ]
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            parts.extend(f"{k}={_quote(str(v))}" for k, v in fields.items())
        if record.exc_info:
            parts.append(f"error={_quote(self.formatException(record.exc_info))}")
        return " ".join(parts)


def _quote(value: str) -> str:
    if value and not any(c in value for c in ' "=\n\t'):
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def setup_logging(level: str) -> None:
    """Send every agent log line to stderr at the chart's `logLevel`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(LEVELS.get(level, logging.INFO))
    # The kubernetes client logs request bodies at debug: keep tokens and payloads out.
    logging.getLogger("kubernetes").setLevel(max(logging.INFO, root.level))
    logging.getLogger("urllib3").setLevel(logging.WARNING)
