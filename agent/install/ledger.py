"""What we wrote, by content hash (and mode where we set it), so our own writes never wake the
watcher while another writer's change, a chmod included, does."""

from __future__ import annotations

import hashlib
import os
import stat
import threading

_CHUNK = 1 << 20
ABSENT = "absent"
"""Recorded state of a path we removed."""


class HashCache:
    """sha256 of files keyed by (dev, inode, size, mtime): a 30 MB plugin is hashed once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[tuple[int, int, int, int], str]] = {}

    def digest(self, path: str, *, follow_symlinks: bool = False) -> str:
        """Hash of the regular file at `path`, ABSENT, or a marker for anything else."""
        try:
            st = os.stat(path) if follow_symlinks else os.lstat(path)
        except FileNotFoundError:
            return ABSENT
        if not stat.S_ISREG(st.st_mode):
            return "not-a-regular-file"
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            hit = self._cache.get(path)
        if hit is not None and hit[0] == key:
            return hit[1]
        h = hashlib.sha256()
        try:
            with open(path, "rb") as f:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
        except FileNotFoundError:
            return ABSENT
        value = h.hexdigest()
        with self._lock:
            self._cache[path] = (key, value)
        return value


class WriteLedger:
    """Last state we left each path in: a content hash, or ABSENT for a path we removed, plus
    the permission bits for a file whose mode is ours to set (None: any mode is as we left it,
    e.g. the node's primary config, which keeps the mode its owner gave it)."""

    def __init__(self, hashes: HashCache | None = None) -> None:
        self.hashes = hashes or HashCache()
        self._lock = threading.Lock()
        self._states: dict[str, tuple[str, int | None]] = {}

    def record(self, path: str, digest: str, *, mode: int | None = None) -> None:
        with self._lock:
            self._states[os.path.abspath(path)] = (digest, mode)

    def record_written(self, path: str, data: bytes, *, mode: int | None = None) -> None:
        self.record(path, hashlib.sha256(data).hexdigest(), mode=mode)

    def record_removed(self, path: str) -> None:
        self.record(path, ABSENT)

    def is_own_state(self, path: str) -> bool:
        """True when `path` is exactly as we last left it (so an event on it is our own)."""
        with self._lock:
            recorded = self._states.get(os.path.abspath(path))
        if recorded is None or recorded[0] != self.hashes.digest(path):
            return False
        digest, mode = recorded
        if mode is None or digest == ABSENT:
            return True
        try:
            return stat.S_IMODE(os.lstat(path).st_mode) == mode
        except FileNotFoundError:
            return False
