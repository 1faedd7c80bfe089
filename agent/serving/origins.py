"""Who a connection is charged to, by the HTTP port's budget: its address, or the node's own
processes (`budget.NODE`) when its address is the node's, contested, and one of them made it
(agent.serving.node_processes). A connection that cannot be told at once waits here, unread: for
the next listing of the known node processes' sockets (50 ms at most) when it connected after the
last one, else for the next scan of the node's processes (a second at most).
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections import deque
from dataclasses import dataclass

from agent.serving.budget import NODE, Budget
from agent.serving.node_processes import NodeProcesses
from agent.serving.socket_diag import peer_socket_inode

log = logging.getLogger(__name__)

REPORT_SECONDS = 60.0
"""A failure to tell connections apart is logged with its traceback at most this often."""
MAX_WAITING = 256
"""Connections held unread; past it the oldest is charged to its address."""


@dataclass(frozen=True)
class _Waiting:
    sock: socket.socket
    address: str
    inode: int
    accepted_at: float


class Origins:
    """Used by one thread (a serving loop)."""

    def __init__(self, budget: Budget, node: NodeProcesses) -> None:
        self._budget = budget
        self._node = node
        self._waiting: deque[_Waiting] = deque()
        self._next_report = 0.0

    def charge(self, sock: socket.socket, address: str) -> str | None:
        """The key a new connection is charged to; None: it waits here (see `due`)."""
        accepted_at = self._node.clock()  # after the accept: it had connected before
        if not self._budget.asks_who(sock, address):
            return address
        try:
            inode = peer_socket_inode(sock)
        except OSError:
            return address  # not found out: charged as any connection from its address
        if inode is None:
            return address  # its maker closed it already
        try:
            return self._tell(_Waiting(sock, address, inode, accepted_at))
        except Exception:  # /proc unreadable in a way not foreseen: as before, by address
            now = time.monotonic()
            if now >= self._next_report:
                self._next_report = now + REPORT_SECONDS
                log.exception("telling the node's processes' connections apart failed")
            return address

    def _tell(self, waiting: _Waiting) -> str | None:
        node, inode, accepted_at = self._node, waiting.inode, waiting.accepted_at
        if node.listed_at < accepted_at and node.relist_due():
            node.relist()
        if node.held(inode):
            return NODE
        if node.listed_at >= accepted_at and node.scan_due():
            return NODE if node.scan({inode}) else waiting.address
        self._waiting.append(waiting)
        return None

    def due(self) -> float | None:
        """When some waiting connection can be told; None: none waits."""
        if not self._waiting:
            return None
        # Waiting in the order accepted: the newest may wait for a listing, the oldest for a scan.
        node = self._node
        times = []
        if self._waiting[-1].accepted_at > node.listed_at:
            times.append(node.listed_at + node.refresh_every)
        if self._waiting[0].accepted_at <= node.listed_at:
            times.append(node.scanned_at + node.scan_every)
        return min(times)

    def overflow(self) -> list[tuple[socket.socket, str]]:
        """The oldest waiting connections past `MAX_WAITING`, charged to their address."""
        out = []
        while len(self._waiting) > MAX_WAITING:
            waiting = self._waiting.popleft()
            out.append((waiting.sock, waiting.address))
        return out

    def settle(self) -> list[tuple[socket.socket, str]]:
        """The waiting connections that can be told now, each with its key."""
        node = self._node
        if self._waiting and self._waiting[-1].accepted_at > node.listed_at and node.relist_due():
            node.relist()
        unknown = {
            w.inode
            for w in self._waiting
            if w.accepted_at <= node.listed_at and not node.held(w.inode)
        }
        found = node.scan(unknown) if unknown and node.scan_due() else None
        out: list[tuple[socket.socket, str]] = []
        kept: deque[_Waiting] = deque()
        for w in self._waiting:
            if node.held(w.inode) or (found is not None and w.inode in found):
                out.append((w.sock, NODE))
            elif found is not None and w.inode in unknown:
                out.append((w.sock, w.address))  # scanned: no node process holds it
            else:
                kept.append(w)
        self._waiting = kept
        return out

    def give_up(self) -> list[tuple[socket.socket, str]]:
        """Every waiting connection, charged to its address."""
        out = [(w.sock, w.address) for w in self._waiting]
        self._waiting.clear()
        return out

    def close(self) -> None:
        while self._waiting:
            with contextlib.suppress(OSError):
                self._waiting.popleft().sock.close()
