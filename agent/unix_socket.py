"""The agent's Unix sockets on the node (the plugin's pod server, ztunnel's ZDS server).

`bind_private` binds under a temporary name, sets mode 0600, then renames over the path, so the
socket is never reachable with a wider mode; the caller listens only after it returns. A stale
socket is replaced; anything else in the way is refused, never deleted. `remove_if_ours` removes
the socket on stop only while it is still ours: a newer agent may already have replaced it.
"""

from __future__ import annotations

import logging
import os
import socket
import stat

from agent.errors import SocketPathError

log = logging.getLogger(__name__)

SOCKET_MODE = 0o600
RUN_DIR_MODE = 0o700
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes including the NUL


def bind_private(sock: socket.socket, path: str, *, what: str) -> int:
    """Bind `sock` at `path` with mode 0600 (parent dir created 0700); returns the inode.
    `what` names the socket in errors and logs ("pod server socket")."""
    temp = f"{path}.{os.getpid()}.tmp"
    if len(os.fsencode(temp)) > MAX_SOCKET_PATH:
        raise SocketPathError(f"{what} path {path} is too long for a Unix socket")
    try:
        os.makedirs(os.path.dirname(path) or ".", mode=RUN_DIR_MODE, exist_ok=True)
        _refuse_non_socket(path, what)
        if os.path.lexists(temp):
            os.unlink(temp)
        sock.bind(temp)
        os.chmod(temp, SOCKET_MODE)
        os.replace(temp, path)
        return os.lstat(path).st_ino
    except SocketPathError:
        raise
    except OSError as e:
        raise SocketPathError(f"{what} {path}: {e.strerror or e}") from e


def remove_if_ours(path: str, inode: int | None) -> None:
    try:
        if os.lstat(path).st_ino == inode:
            os.unlink(path)
    except FileNotFoundError:
        pass


def _refuse_non_socket(path: str, what: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketPathError(
            f"{what} {path}: a {_kind(mode)} is in the way; refusing to replace it"
        )
    log.info("replacing stale socket", extra={"fields": {"socket": path}})


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "regular file" if stat.S_ISREG(mode) else "non-socket file"
