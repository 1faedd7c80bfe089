"""Who a serving loop lets in: each accepted connection checked (the peer's credentials), charged
to its budget's key (its address, or the node's own processes: agent.serving.origins) and added
under the cap, or closed before a byte of it is read.

Connections are accepted in batches well below the cap, after the ready ones are read, so a
newcomer's request is read before a flood of later connections could push it out.
"""

from __future__ import annotations

import errno
import logging
import socket
import time
from collections.abc import Callable

from agent.serving.budget import Budget
from agent.serving.connections import Connections
from agent.serving.listener import Listener
from agent.serving.origins import Origins

log = logging.getLogger(__name__)

ACCEPT_BATCH = 32
_RESOURCE_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

PeerCheck = Callable[[socket.socket], "str | None"]
"""None when the connected peer may be served, else why not."""


class Admission:
    """Used by its loop's thread."""

    def __init__(
        self,
        listener: Listener,
        conns: Connections,
        *,
        name: str,
        check_peer: PeerCheck | None,
        budget: Budget | None,
        pause: float,
    ) -> None:
        """`pause`: how long accepting waits when the process is out of descriptors."""
        self.name = name
        self._listener = listener
        self._conns = conns
        self._check_peer = check_peer
        self._budget = budget
        self._pause = pause
        node = None if budget is None else budget.node
        self._origins = None if budget is None or node is None else Origins(budget, node)

    def wait(self, most: float) -> float:
        """How long the loop may wait for events: `most`, or less when a connection waiting to
        be told (agent.serving.origins) can be then."""
        due = None if self._origins is None else self._origins.due()
        return most if due is None else max(0.0, min(most, due - time.monotonic()))

    def accept(self, now: float) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = self._listener.sock.accept()
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno in _RESOURCE_ERRORS:  # wait for descriptors to free, do not spin
                    self._conns.count(f"accept failed ({errno.errorcode.get(e.errno or 0, e)})")
                    self._listener.pause(now + self._pause)
                    return
                continue  # the peer gave up before we accepted (ECONNABORTED)
            self._guarded(sock)

    def settle(self) -> None:
        """Admit the waiting connections whose maker is now told (agent.serving.origins)."""
        origins = self._origins
        due = None if origins is None else origins.due()
        if origins is None or due is None or time.monotonic() < due:
            return
        try:
            told = origins.settle()
        except Exception:  # reading /proc failed unexpectedly: each charged to its address
            log.exception("%s: telling the node's processes' connections apart failed", self.name)
            told = origins.give_up()
        for sock, peer in told:
            self._guarded(sock, peer)

    def close(self) -> None:
        """Close the connections waiting to be told."""
        if self._origins is not None:
            self._origins.close()

    def _guarded(self, sock: socket.socket, peer: str | None = None) -> None:
        """Admit one connection (`peer`: already charged to it); whatever fails refuses it."""
        try:
            if peer is None:
                self._admit(sock)
            else:
                self._admit_as(sock, peer)
        except Exception:  # the peer check or the selector: this peer is refused
            log.exception("%s: admitting a connection failed", self.name)
            self._conns.count("refused: admitting it failed")
            sock.close()

    def _admit(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        if self._check_peer is not None:
            reason = self._check_peer(sock)
            if reason is not None:
                self._conns.count(f"refused: {reason}")
                sock.close()
                return
        try:
            peer = str(sock.getpeername()[0]) if self._budget is not None else ""
        except OSError:  # gone already (reset before it was accepted)
            sock.close()
            return
        if self._origins is not None:  # the node's own processes apart (budget.NODE)
            key = self._origins.charge(sock, peer)
            if key is None:  # told later (`settle`); the oldest waiting past the bound now
                for waited, address in self._origins.overflow():
                    self._guarded(waited, address)
                return
            peer = key
        self._admit_as(sock, peer)

    def _admit_as(self, sock: socket.socket, peer: str) -> None:
        """Admit a connection charged to `peer` (its budget's key), or close it."""
        if self._budget is not None and not self._budget.connection(peer):
            self._conns.count("refused: its peer's request budget is spent")
            sock.close()  # before a byte is read: the cheapest answer
            return
        if not self._conns.make_room():
            self._conns.count("refused: every connection is being answered")
            sock.close()
            return
        self._conns.add(sock, time.monotonic()).peer = peer
