"""The open connections of one server: each one's state and selector interest, the cap, the
timeouts, and what was closed or refused (counted, and logged as counts now and then).

Each connection is in one state: IDLE (waiting for a request's first byte, `idle_timeout`),
READING (a request begun, complete within `request_timeout`), BUSY (the app answers it; nothing is
read meanwhile), WRITING (the reply, taken by the peer within `write_timeout`) or LINGER (sent a
final reply; what the peer still sends is read and dropped for a moment, so a TCP reset cannot
destroy the reply in flight). Over `max_connections` the connection that has waited longest
(since it was accepted or last answered) and is not BUSY is closed; only when all are BUSY is the
newcomer refused.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import selectors
import socket
from collections import OrderedDict
from collections.abc import Iterator

from agent.serving.http import Exchange
from agent.serving.limits import Limits

log = logging.getLogger(__name__)

REPORT_INTERVAL = 10.0
"""Closed and refused connections are logged as counts at most this often."""


class State(enum.Enum):
    IDLE = "idle"
    READING = "reading"
    BUSY = "busy"
    WRITING = "writing"
    LINGER = "linger"


class Conn:
    __slots__ = (
        "close_after",
        "closed",
        "deadline",
        "events",
        "exchange",
        "fd",
        "out",
        "peer",
        "sent",
        "sock",
        "state",
    )

    def __init__(self, sock: socket.socket, exchange: Exchange, deadline: float) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.peer = ""
        """The peer's address, where a budget is kept by it (agent.serving.budget)."""
        self.exchange = exchange
        self.out = b""
        """The reply being sent, `sent` bytes of it so far."""
        self.sent = 0
        self.events = 0
        """The selector events watched (0: not registered)."""
        self.state = State.IDLE
        self.deadline = deadline
        self.close_after = False
        """Close once `out` is sent."""
        self.closed = False


class Connections:
    """`name`'s connections under `sel`, oldest wait first (the order the cap closes them in)."""

    def __init__(self, sel: selectors.BaseSelector, limits: Limits, *, name: str) -> None:
        self._sel = sel
        self._limits = limits
        self._name = name
        self._conns: OrderedDict[int, Conn] = OrderedDict()
        self._counts: dict[str, int] = {}
        self._next_report = 0.0

    def __len__(self) -> int:
        return len(self._conns)

    def __iter__(self) -> Iterator[Conn]:
        return iter(list(self._conns.values()))

    def add(self, sock: socket.socket, now: float) -> Conn:
        limits = self._limits
        exchange = Exchange(max_head=limits.max_head_bytes, max_body=limits.max_body_bytes)
        conn = Conn(sock, exchange, now + limits.idle_timeout)
        self._conns[conn.fd] = conn
        self.watch(conn, selectors.EVENT_READ)
        return conn

    def make_room(self) -> bool:
        """Under the cap, or made so by closing the longest waiting connection not BUSY."""
        if len(self._conns) < self._limits.max_connections:
            return True
        for conn in self._conns.values():
            if conn.state is not State.BUSY:
                self.count(f"closed over the cap of {self._limits.max_connections}")
                self.close(conn)
                return True
        return False

    def waits_from(self, conn: Conn, state: State, deadline: float) -> None:
        """`conn` now waits in `state` until `deadline`; the longest waiting from now on."""
        conn.state, conn.deadline = state, deadline
        self._conns.move_to_end(conn.fd)

    def watch(self, conn: Conn, events: int) -> None:
        if events == conn.events:
            return
        if conn.events == 0:
            self._sel.register(conn.sock, events, conn)
        elif events == 0:
            self._sel.unregister(conn.sock)
        else:
            self._sel.modify(conn.sock, events, conn)
        conn.events = events

    def close(self, conn: Conn) -> None:
        """Closes it whatever state it was left in (also after a failed step)."""
        if conn.closed:
            return
        conn.closed = True
        self._conns.pop(conn.fd, None)
        if conn.events:
            conn.events = 0
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._sel.unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.close()

    def sweep(self, now: float) -> None:
        """Close those past their deadline (BUSY ones wait for their app); report the counts."""
        for conn in list(self._conns.values()):
            if conn.state is not State.BUSY and now >= conn.deadline:
                if conn.state in (State.READING, State.WRITING):
                    self.count(f"timed out {conn.state.value}")
                self.close(conn)
        if now >= self._next_report:
            self._next_report = now + REPORT_INTERVAL
            if self._counts:
                log.warning(
                    "%s: connections closed or refused",
                    self._name,
                    extra={"fields": {**self._counts, "open": len(self._conns)}},
                )
                self._counts = {}

    def count(self, what: str) -> None:
        self._counts[what] = self._counts.get(what, 0) + 1
