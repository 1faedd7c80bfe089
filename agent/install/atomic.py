"""Writing files on the node so that a reader sees the old content or the new one, never a mix.

Every write goes to a temp file in the target's directory (same filesystem, so the rename is
atomic), created 0600, gets its final mode (the caller's, or the mode of the file it replaces)
and is fsynced before it is renamed over the target: no reader ever sees the file with another
mode or partly written. The directory is fsynced so the rename survives a power cut. Temp names
start with "." and end in ".istio-tmp" so no CNI runtime takes them for a config (it only reads
.conf/.conflist/.json) and a crashed writer's leftovers can be found and removed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import shutil
import stat

from agent.errors import ChangedUnderUs

TEMP_SUFFIX = ".istio-tmp"
_TEMP_RE = re.compile(r"^\..*\.(\d+)\.[0-9a-f]{8}" + re.escape(TEMP_SUFFIX) + "$")


def temp_path(target: str) -> str:
    """A fresh temp name beside `target`, with our pid so others' leftovers can be told apart."""
    directory, base = os.path.split(target)
    return os.path.join(directory, f".{base}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}")


def is_temp_name(name: str) -> bool:
    return _TEMP_RE.match(name) is not None


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


FileId = tuple[int, int, int, int]


def file_id(st: os.stat_result) -> FileId:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def current_id(path: str) -> FileId | None:
    try:
        return file_id(os.lstat(path))
    except FileNotFoundError:
        return None


def dangling_target(path: str) -> str | None:
    """The target of `path` when it is a symlink that cannot be followed here (else None)."""
    try:
        target = os.readlink(path)
    except OSError:
        return None  # no symlink (or gone)
    return None if os.path.exists(path) else target


def atomic_write(
    path: str,
    data: bytes,
    *,
    mode: int = 0o600,
    keep_mode: bool = True,
    expect: FileId | None = None,
) -> None:
    """Replace `path` with `data` atomically; with keep_mode an existing file's mode wins, else
    (and for a new file) the result has exactly `mode` (the umask plays no part).

    With `expect`, the target must still be the file we read (same inode, size, mtime) right
    before the rename, else ChangedUnderUs: a read-modify-write must not undo another writer.

    Never opens `path` itself for writing, so a binary being executed is never touched (no
    ETXTBSY for the runtime, no half-written plugin).
    """
    if keep_mode:
        with contextlib.suppress(FileNotFoundError):
            mode = stat.S_IMODE(os.stat(path).st_mode)
    tmp = temp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        if expect is not None and current_id(path) != expect:
            raise ChangedUnderUs(path)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(os.path.dirname(path) or ".")


def atomic_rename(src: str, dst: str) -> None:
    """Rename and make the rename durable."""
    os.replace(src, dst)
    fsync_dir(os.path.dirname(dst) or ".")


def remove_file(path: str) -> bool:
    """Unlink `path` durably; False when it was already gone."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    fsync_dir(os.path.dirname(path) or ".")
    return True


def remove_tree(path: str) -> None:
    """Remove a directory tree so no reader ever sees part of it: rename it to a temp name (one
    atomic step), then delete that; a kill mid-delete leaves a temp that the next install or
    uninstall removes (remove_stale_temps)."""
    doomed = temp_path(path)
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def remove_stale_temps(directory: str) -> list[str]:
    """Remove temp files/dirs other processes left behind (a crash, kill -9); return their names."""
    removed: list[str] = []
    own = str(os.getpid())
    for entry in os.scandir(directory):
        match = _TEMP_RE.match(entry.name)
        if match is None or match.group(1) == own:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
        removed.append(entry.name)
    return removed
