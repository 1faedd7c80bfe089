"""Who is on the other end of a Unix socket: the kernel's word (SO_PEERCRED), not the peer's.

The agent's sockets are mode 0600 and owned by root, so only root reaches them; the check is the
second lock on the same door (a hostPath whose mode was changed, a socket bind-mounted elsewhere).
"""

from __future__ import annotations

import os
import socket
import struct

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_uid(sock: socket.socket) -> int:
    _, uid, _ = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return int(uid)


def untrusted_peer(sock: socket.socket) -> str | None:
    """None for root or the agent's own user, else why the peer is refused."""
    try:
        uid = peer_uid(sock)
    except OSError as e:
        return f"peer credentials unreadable: {e.strerror or e}"
    if uid in (0, os.geteuid()):
        return None
    return f"peer uid {uid} is neither root nor the agent's"
