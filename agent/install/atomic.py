"""Writing files on the node so that a reader sees the old content or the new one, never a mix.

Every write goes to a temp file in the target's directory (same filesystem, so the rename is
atomic), created 0600, gets its final mode (the caller's, or the mode of the file it replaces)
and is fsynced before it is renamed over the target: no reader ever sees the file with another
mode or partly written. The directory is fsynced so the rename survives a power cut. Temp names
start with "." and end in ".istio-tmp" so no CNI runtime takes them for a config (it only reads
.conf/.conflist/.json) and a crashed writer's leftovers can be found and removed.

Which temps are still being written is told by a lock, not a name: the agent is PID 1 in its
pod, as is every other agent's container (a surge, a one-shot install), so a PID in the name
tells nothing. A writer holds an exclusive flock on its temp (through a read-only descriptor: a
plugin being replaced must never be open for writing, or an exec of it fails with ETXTBSY) from
creating it until it is renamed; a cleaner removes only a temp whose lock it can take, and
removes it while holding that lock. Between the create and the lock the writer holds a shared
flock on the directory, and a cleaner scans it holding an exclusive one, so no cleaner ever
sees a temp its writer has not locked yet; a writer killed at any instant leaves only locks the
kernel releases.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from agent.errors import ChangedUnderUs

TEMP_SUFFIX = ".istio-tmp"
_TEMP_RE = re.compile(r"^\..*\.[0-9a-f]{8,16}" + re.escape(TEMP_SUFFIX) + "$")
"""Also the former names, which carried the writer's PID: .<name>.<pid>.<8 hex>.istio-tmp."""


def temp_path(target: str) -> str:
    """A fresh, random temp name beside `target`."""
    directory, base = os.path.split(target)
    return os.path.join(directory, f".{base}.{secrets.token_hex(8)}{TEMP_SUFFIX}")


@contextlib.contextmanager
def _dir_lock(directory: str, operation: int) -> Iterator[None]:
    fd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, operation)
        yield
    finally:
        os.close(fd)


def _locked(tmp: str) -> int:
    fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def create_temp_file(target: str) -> tuple[str, int, int]:
    """A new temp file beside `target`, 0600: (name, write descriptor, lock descriptor)."""
    tmp = temp_path(target)
    with _dir_lock(os.path.dirname(target), fcntl.LOCK_SH):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            return tmp, fd, _locked(tmp)
        except BaseException:
            os.close(fd)
            raise


def create_temp_dir(target: str) -> tuple[str, int]:
    """A new, empty temp dir beside `target`: (name, lock descriptor)."""
    tmp = temp_path(target)
    with _dir_lock(os.path.dirname(target), fcntl.LOCK_SH):
        os.mkdir(tmp, 0o700)
        return tmp, _locked(tmp)


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


SELINUX_XATTR = "security.selinux"


@dataclass(frozen=True)
class Attributes:
    """What a rewrite keeps of the file it replaces."""

    mode: int
    uid: int
    gid: int
    label: bytes | None

    def apply(self, fd: int) -> None:
        """Give the open file (ours, root's) this mode, label and owner, the owner last: once
        the file is another user's, its mode and label are that user's to change (CAP_FOWNER,
        which the agent does not have). A chown clears only setuid and setgid bits, which a CNI
        config has no use for."""
        os.fchmod(fd, self.mode)
        if self.label is not None:
            with contextlib.suppress(OSError):  # no SELinux there: nothing to keep
                os.setxattr(fd, SELINUX_XATTR, self.label)
        with contextlib.suppress(PermissionError):  # no CAP_CHOWN: root's, as before
            os.fchown(fd, self.uid, self.gid)


def attributes_of(path: str) -> Attributes | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    try:
        label: bytes | None = os.getxattr(path, SELINUX_XATTR)
    except OSError:
        label = None
    return Attributes(stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, label)


def atomic_write(
    path: str,
    data: bytes,
    *,
    mode: int = 0o600,
    keep_mode: bool = True,
    expect: FileId | None = None,
    like: str | None = None,
) -> None:
    """Replace `path` with `data` atomically; with keep_mode an existing file's mode, owner,
    group and SELinux label win (the node's file stays its owner's to rewrite), else (and for a
    new file) the result has exactly `mode` (the umask plays no part) and is root's. `like`
    names another file whose attributes the result takes (a .conf turned into a .conflist).

    With `expect`, the target must still be the file we read (same inode, size, mtime) right
    before the rename, else ChangedUnderUs: a read-modify-write must not undo another writer.

    Never opens `path` itself for writing, so a binary being executed is never touched (no
    ETXTBSY for the runtime, no half-written plugin).
    """
    kept = attributes_of(like or path) if keep_mode or like else None
    tmp, fd, lock = create_temp_file(path)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if kept is not None:
                kept.apply(fd)
            else:
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
    finally:
        os.close(lock)
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


def remove_if_unchanged(path: str, expect: FileId | None) -> bool:
    """Remove `path` only while it is still the file `expect` names (the one its caller read
    and judged); False when it is gone or another file took its place, which then stays. The
    file is first renamed to a temp name (atomic: a writer replacing it meanwhile keeps its new
    file), then judged; one that is not `expect` is linked back (never over a newer file). The
    directory's shared lock keeps a temp cleaner away from it in between."""
    directory = os.path.dirname(path) or "."
    doomed = temp_path(path)
    with _dir_lock(directory, fcntl.LOCK_SH):
        try:
            os.rename(path, doomed)
        except FileNotFoundError:
            return False
        if expect is not None and current_id(doomed) == expect:
            os.unlink(doomed)
            fsync_dir(directory)
            return True
        with contextlib.suppress(FileExistsError):
            os.link(doomed, path)  # put it back, unless a newer file is there already
        os.unlink(doomed)
    fsync_dir(directory)
    return False


def remove_tree(path: str) -> None:
    """Remove a directory tree so no reader ever sees part of it: rename it to a temp name (one
    atomic step), then delete that; a kill mid-delete leaves a temp that the next install or
    uninstall removes (remove_stale_temps)."""
    doomed = temp_path(path)
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def remove_stale_temps(directory: str) -> list[str]:
    """Remove the temp files/dirs no writer holds (a crash, kill -9); return their names. A
    removed tree (remove_tree) is never locked: removing it twice is harmless."""
    with _dir_lock(directory, fcntl.LOCK_EX):
        return _remove_unlocked_temps(directory)


def _remove_unlocked_temps(directory: str) -> list[str]:
    removed: list[str] = []
    for entry in os.scandir(directory):
        if not is_temp_name(entry.name):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        except OSError:  # a symlink (ELOOP) or unreadable: no writer of ours holds it
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
            removed.append(entry.name)
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a writer (this process or another) is using it
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
            removed.append(entry.name)
        finally:
            os.close(fd)
    return removed
