"""Real TCP inside a pod's network namespace, from this process.

A socket belongs to the network namespace of the thread that created it, for its whole life:
sockets are made in a thread that entered the pod's netns (agent.netns.run_in_netns) and then
used from the test's thread. Everything stays inside the pod's netns: the redirect sends the
connection to the local listener before it could leave.
"""

from __future__ import annotations

import socket
import struct

from agent.netns import run_in_netns

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h: the destination before NAT REDIRECT


def listen_in(netns_path: str, port: int) -> socket.socket:
    """A TCP listener on 0.0.0.0:`port` inside the netns (what the sidecar's port would be)."""

    def make() -> socket.socket:
        sock = socket.create_server(("0.0.0.0", port), backlog=8)
        sock.settimeout(5)
        return sock

    return run_in_netns(netns_path, make)


def connect_from(netns_path: str, host: str, port: int) -> socket.socket:
    """A TCP connection made inside the netns, as an app container (uid 0 here) makes it."""
    sock: socket.socket = run_in_netns(netns_path, socket.socket)
    sock.settimeout(5)
    try:
        sock.connect((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def original_destination(conn: socket.socket) -> tuple[str, int]:
    """Where the peer meant to go, for a connection REDIRECT brought to us."""
    raw = conn.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    port, packed = struct.unpack_from("!2xH4s", raw)
    return socket.inet_ntoa(packed), port
