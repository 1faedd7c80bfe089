"""Keeps a Unix socket's path naming a listener of this agent while no other agent serves it.

In a rolling update's surge the newer agent binds the node's socket path over the older one's;
if the newer goes away (a rolled-back surge), it removes the path, and the older one, still
running, would listen on a socket nobody can reach: every CNI ADD (pod socket) or ztunnel's
connection (ZDS socket) fails until it restarts. The server asks `take_back` every KEEP_SECONDS:
when the path no longer names its socket and nobody answers there, it gets a new listening
socket bound at the path to accept on. A socket someone else serves is left to them (the newer
agent), probed once per socket so that its server is not disturbed every round.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable

log = logging.getLogger(__name__)

KEEP_SECONDS = 2.0
"""How often a server looks at its path: the readiness check's period."""
ANSWER_TIMEOUT_SECONDS = 1.0


class SocketKeeper:
    def __init__(
        self,
        path: str,
        *,
        kind: int,
        what: str,
        bind: Callable[[socket.socket], int],
    ) -> None:
        """`kind`: SOCK_STREAM or SOCK_SEQPACKET; `bind`: binds a socket at `path`, listening
        before the path names it (as the server's own start does), returns its inode."""
        self.path = path
        self._kind = kind
        self._what = what
        self._bind = bind
        self._served_by: int | None = None
        """The inode at the path last found served by someone else: not probed again."""
        self._reported: str | None = None

    def take_back(self, ours: int | None) -> tuple[socket.socket, int] | None:
        """(a listening socket bound at the path, its inode) when the path must be taken back
        from `ours` (the inode this server bound); None when it is ours or served."""
        at = inode_at(self.path)
        if at is not None and at in (ours, self._served_by):
            return None
        if at is not None and answers(self.path, self._kind):
            self._served_by = at
            return None
        sock = socket.socket(socket.AF_UNIX, self._kind | socket.SOCK_CLOEXEC)
        try:
            inode = self._bind(sock)  # listening before the path names it
        except Exception as e:  # the path taken by a file, the dir gone: said once, retried
            sock.close()
            if str(e) != self._reported:
                self._reported = str(e)
                log.error(
                    "%s is gone and cannot be bound again; its clients fail until it can",
                    self._what,
                    extra={"fields": {"socket": self.path, "error": str(e)}},
                )
            return None
        self._reported = None
        log.warning(
            "%s was gone (another agent took it over and left, or it was removed); bound again",
            self._what,
            extra={"fields": {"socket": self.path}},
        )
        return sock, inode


def inode_at(path: str) -> int | None:
    try:
        return os.lstat(path).st_ino
    except OSError:
        return None


def answers(path: str, kind: int) -> bool:
    """Someone accepts connections of `kind` at `path`."""
    with socket.socket(socket.AF_UNIX, kind) as probe:
        probe.settimeout(ANSWER_TIMEOUT_SECONDS)
        try:
            probe.connect(path)
        except OSError:
            return False
    return True
