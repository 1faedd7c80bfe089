"""Forwards the plugin's fallback log (`<cniAgentRunDir>/istio-cni.log` and its rotated `.1`,
written by plugin/log.py while the agent could not be reached) into the agent's log.

When: once as the agent starts (its socket already listening, so new plugin runs reach it), then
every INTERVAL_SECONDS from a daemon thread. A timer rather than a check on each plugin request:
the plugin writes the file only while it cannot reach the agent, so what is there is drained once
per outage; the timer also drains outages this agent never saw (a full listen backlog, a reply
slower than the plugin's deadline) even when no pod starts afterwards, and it keeps the request
path, where every pod start waits, free of file system calls. An idle tick costs two failed
renames.

How, without losing a line a plugin appends meanwhile: each file is first renamed to a name no
plugin opens (`<name>.forwarding`); after SETTLE_SECONDS (a plugin that opened the old name just
before the rename writes its one line right after that open) it is read, every line is logged and
the file is removed. A plugin writing after the rename creates a new file, forwarded on the next
tick. A `.forwarding` file left by an agent that stopped halfway is forwarded first (its lines may
then appear twice; none is lost).

Each line is logged by the `agent.plugin` logger (the `cni-plugin` scope) at its recorded level,
with its recorded time and fields, plus `source=plugin via=file`, in the agent's current format.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import time

from agent.background import BackgroundLoop
from agent.logs import LEVELS, PLUGIN_LOGGER
from plugin import wire

log = logging.getLogger(__name__)
plugin_log = logging.getLogger(PLUGIN_LOGGER)

INTERVAL_SECONDS = 10.0
SETTLE_SECONDS = 0.2
CLAIMED_SUFFIX = ".forwarding"
MAX_READ_BYTES = 4 << 20
"""Read at most this much of one file (the plugin keeps each under 1 MiB plus a line)."""
MAX_VALUE = 4096
_TOP_KEYS = ("time", "level", "scope", "msg")


def forward_once(run_dir: str, *, settle: float = SETTLE_SECONDS) -> int:
    """Forward what the plugin left in `run_dir`, oldest file first; the number of lines."""
    claimed: list[str] = []
    renamed = False
    for name in (wire.LOG_FILE_ROTATED, wire.LOG_FILE_NAME):
        path = os.path.join(run_dir, name)
        target = path + CLAIMED_SUFFIX
        if not os.path.lexists(target):
            try:
                os.rename(path, target)
            except FileNotFoundError:
                continue
            except OSError as e:
                log.warning(
                    "cannot take the plugin's log file",
                    extra={"fields": {"path": path, "error": str(e)}},
                )
                continue
            renamed = True
        claimed.append(target)
    if renamed and settle > 0:
        time.sleep(settle)
    count = 0
    for path in claimed:
        count += _forward_file(path)
    return count


def _forward_file(path: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        log.warning(
            "cannot read the plugin's log file", extra={"fields": {"path": path, "error": str(e)}}
        )
        return 0
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_READ_BYTES + 1)
    if len(data) > MAX_READ_BYTES:
        log.warning(
            "the plugin's log file is larger than expected: only its start is forwarded",
            extra={"fields": {"path": path, "bytes": MAX_READ_BYTES}},
        )
        data = data[:MAX_READ_BYTES]
    lines = data.decode("utf-8", "replace").splitlines()
    count = 0
    for line in lines:
        if line.strip():
            forward_line(line)
            count += 1
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    if count:
        log.info(
            "forwarded the plugin's lines written while the agent was not reachable",
            extra={"fields": {"lines": count, "file": os.path.basename(path)}},
        )
    return count


def forward_line(line: str) -> None:
    """Log one line of the file: a JSON object as the plugin wrote it, else the text at warn."""
    try:
        obj = json.loads(line)
    except ValueError:
        obj = None
    if (
        not isinstance(obj, dict)
        or not isinstance(obj.get("msg"), str)
        or obj.get("level") not in wire.LOG_LEVELS
    ):
        _emit(
            logging.WARNING,
            line[:MAX_VALUE],
            None,
            {"source": "plugin", "via": "file", "unparsed": "true"},
        )
        return
    fields: dict[str, object] = {"source": "plugin", "via": "file"}
    for k, v in obj.items():
        if k not in _TOP_KEYS:
            fields.setdefault(k, (v if isinstance(v, str) else json.dumps(v))[:MAX_VALUE])
    _emit(LEVELS[obj["level"]], obj["msg"][:MAX_VALUE], _timestamp(obj.get("time")), fields)


def _timestamp(value: object) -> datetime.datetime | None:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            when = datetime.datetime.fromisoformat(value)
            return when if when.tzinfo else when.replace(tzinfo=datetime.UTC)
    return None


def _emit(level: int, msg: str, when: datetime.datetime | None, fields: dict[str, object]) -> None:
    if not plugin_log.isEnabledFor(level):
        return
    record = plugin_log.makeRecord(
        plugin_log.name, level, __file__, 0, "%s", (msg,), None, extra={"fields": fields}
    )
    if when is not None:  # when the plugin wrote it, as Istio logs forwarded lines
        record.created = when.timestamp()
        record.msecs = when.microsecond / 1000  # not from the float: .734 must not read .733
    plugin_log.handle(record)


class Forwarding:
    """Lifecycle service: forward now, then every `interval` seconds, the lines the plugin wrote
    while no agent could be reached."""

    def __init__(
        self, run_dir: str, *, interval: float = INTERVAL_SECONDS, settle: float = SETTLE_SECONDS
    ) -> None:
        self.run_dir = run_dir
        self._loop = BackgroundLoop.every(
            "plugin-log-file",
            interval,
            lambda: forward_once(run_dir, settle=settle),
            # one bad file must not end forwarding for good
            failed="forwarding the plugin's log file failed",
            at_start=True,
            step_bound=60.0,  # a settle of SETTLE_SECONDS and one bounded file read
        )

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()
