"""The serving loop's listening socket in its selector: accepted from while registered, paused
for a while when descriptors run out, and replaced by another on request from any thread (the
pod server binds its path again when another agent took it over and left)."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading


class Listener:
    """Owns the listening socket it is given (bound and listening) and any that replaces it."""

    def __init__(self, sock: socket.socket, selector: selectors.BaseSelector) -> None:
        self.sock = sock
        self._sel = selector
        self.paused_until = 0.0
        self._lock = threading.Lock()
        self._offered: socket.socket | None = None

    def register(self) -> None:
        self.sock.setblocking(False)
        self._sel.register(self.sock, selectors.EVENT_READ, self)

    def pause(self, until: float) -> None:
        """Not accepted from until `until` (resume_if_due): descriptors ran out."""
        self._unregister()
        self.paused_until = until

    def resume_if_due(self, now: float) -> None:
        if self.paused_until and now >= self.paused_until:
            self.paused_until = 0.0
            self.register()

    def offer(self, sock: socket.socket) -> None:
        """Any thread: accept on `sock` instead, from the loop's next swap_if_offered()."""
        with self._lock:
            earlier, self._offered = self._offered, sock
        if earlier is not None:
            earlier.close()

    @property
    def offered(self) -> bool:
        return self._offered is not None

    def swap_if_offered(self) -> None:
        """The loop's thread: the offered socket replaces the current one, which is closed."""
        with self._lock:
            sock, self._offered = self._offered, None
        if sock is None:
            return
        self._unregister()
        self.sock.close()
        self.sock, self.paused_until = sock, 0.0
        self.register()

    def close(self) -> None:
        self._unregister()
        with contextlib.suppress(OSError):
            self.sock.close()
        with self._lock:
            offered, self._offered = self._offered, None
        if offered is not None:
            offered.close()

    def _unregister(self) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(self.sock)
