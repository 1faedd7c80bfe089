"""Loopback ports for the servers tests start (API server, agent HTTP, Prometheus, ...)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback TCP port nothing listens on right now. Another process may take it before the
    caller binds it: callers that start a server retry with a new port on 'address in use'."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
