"""The agent's Unix sockets on the node (the plugin's pod server, ztunnel's ZDS server).

`bind_private` binds in a private directory, sets mode 0600 and listens, then renames over the
path, so the socket is never reachable with a wider mode, the path never names a socket that
refuses connections (a client's connect between a bind and its listen would be refused), and no
one who may write the socket's directory can turn the chmod onto another file. A stale
socket is replaced; anything else in the way is refused, never deleted. `remove_if_ours` removes
the socket on stop only while it is still ours: a newer agent may already have replaced it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import tempfile

from agent.errors import SocketPathError

log = logging.getLogger(__name__)

SOCKET_MODE = 0o600
RUN_DIR_MODE = 0o700
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes including the NUL
TEMP_NAME = "s"
"""The socket's name in its private directory until it is renamed into place."""


def bind_private(sock: socket.socket, path: str, *, what: str, backlog: int) -> int:
    """Bind `sock` at `path` with mode 0600 (parent dir created 0700), listening with `backlog`
    before the path names it; returns the inode. `what` names the socket in errors and logs
    ("pod server socket").

    The socket is bound, made 0600 and renamed over `path` from a private directory made
    beside it (0700, the agent's), each step through that directory's descriptor: whoever
    may write the parent directory can swap the names in it, never make a step act on another
    file (a symlink put at a temporary name in the parent would have had the chmod change its
    target's mode: Linux has no lchmod, and a socket's fchmod does not reach the bound inode).
    """
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise SocketPathError(f"{what} path {path} is too long for a Unix socket")
    parent = os.path.dirname(path) or "."
    try:
        os.makedirs(parent, mode=RUN_DIR_MODE, exist_ok=True)
        _refuse_non_socket(path, what)
        private = tempfile.mkdtemp(prefix=".bind-", dir=parent)
        try:
            return _bind_in(sock, private, path, backlog)
        finally:
            with contextlib.suppress(OSError):  # swapped meanwhile: not ours to remove
                os.rmdir(private)
    except SocketPathError:
        raise
    except OSError as e:
        raise SocketPathError(f"{what} {path}: {e.strerror or e}") from e


def _bind_in(sock: socket.socket, private: str, path: str, backlog: int) -> int:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(private, flags)
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
            raise OSError(f"{private} is not the private directory made for the socket")
        sock.bind(f"/proc/self/fd/{fd}/{TEMP_NAME}")  # the directory itself, not its name
        try:
            os.chmod(TEMP_NAME, SOCKET_MODE, dir_fd=fd)
            inode = os.stat(TEMP_NAME, dir_fd=fd, follow_symlinks=False).st_ino
            sock.listen(backlog)
            os.replace(TEMP_NAME, path, src_dir_fd=fd)
            return inode
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(TEMP_NAME, dir_fd=fd)
            raise
    finally:
        os.close(fd)


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
