"""Copy the built plugin from pluginSourceDir into the node's CNI bin dir, and remove it.

The plugin is one static executable. Top-level files are replaced atomically (a running plugin
keeps its old inode, the runtime never sees a half-written one or gets ETXTBSY). Top-level
directories are support trees whose names carry a content hash ("istio-cni-<hash>.d"): former
versions shipped the executable with one, and a source that still does gets it installed beside
the old one, keeping the previous one for a plugin that may still run. Once the source ships no
support dir (the single file), every support dir left in the bin dir is from a former version:
they are removed once the new executable is in place, so a plugin exec'd from then on never needs
them. A former plugin already running has its interpreter loaded; should it still import from its
support dir after that, that one call fails and the runtime retries it with the new executable
(a failed call, never an uncaptured pod). Uninstall removes every support dir.

Modes: an executable of the source (the plugin) is installed 0755, whatever its mode in the
image, because the runtime (root) execs it and a node's CNI bin dir is conventionally readable by
all; a non-executable top-level file gets the agent's file mode (0600, or 0640 with
cniConfGroupRead). Support dirs keep the modes of the image's tree (they hold executables).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import shutil
import stat
from dataclasses import dataclass, field

from agent.errors import InstallError
from agent.install.atomic import (
    atomic_rename,
    atomic_write,
    create_temp_dir,
    fsync_dir,
    is_temp_name,
    remove_stale_temps,
    remove_tree,
    temp_path,
)
from agent.install.ledger import ABSENT, WriteLedger

log = logging.getLogger(__name__)

PLUGIN_MODE = 0o755
"""Mode of an installed executable: the runtime execs it."""
SUPPORT_PREFIX = "istio-cni"
SUPPORT_SUFFIX = ".d"
READ_ONLY_HINT = (
    "the node's CNI bin dir is read-only here: use the chart's platform preset for this node "
    "(e.g. GKE: platform: gke, which installs into /home/kubernetes/bin)"
)


@dataclass
class BinaryResult:
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)


def is_support_dir(name: str) -> bool:
    return name.startswith(SUPPORT_PREFIX) and name.endswith(SUPPORT_SUFFIX)


def source_entries(source_dir: str) -> dict[str, bool]:
    """Top-level names of the built plugin -> True for a directory, False for a file."""
    try:
        entries = list(os.scandir(source_dir))
    except OSError as e:
        raise InstallError(f"read plugin source dir {source_dir}: {e.strerror}") from e
    out: dict[str, bool] = {}
    for entry in entries:
        if is_temp_name(entry.name):
            continue
        if entry.is_dir():
            out[entry.name] = True
        elif entry.is_file():
            out[entry.name] = False
    if "istio-cni" not in out or out["istio-cni"]:
        raise InstallError(f"plugin source dir {source_dir} has no istio-cni executable")
    return dict(sorted(out.items()))


def tree_digest(path: str) -> str:
    """One hash over a directory tree: relative names, modes, file contents, link targets."""
    h = hashlib.sha256()
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files + [d for d in dirs if os.path.islink(os.path.join(root, d))]):
            full = os.path.join(root, name)
            rel = os.path.relpath(full, path)
            st = os.lstat(full)
            h.update(f"{rel}\0{stat.S_IMODE(st.st_mode):o}\0".encode())
            if stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(full).encode())
            else:
                with open(full, "rb") as f:
                    h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def _write_error(action: str, path: str, e: OSError) -> InstallError:
    hint = f": {READ_ONLY_HINT}" if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM) else ""
    return InstallError(f"{action} {path}: {e.strerror}{hint}")


def installed_mode(src: str, file_mode: int) -> int:
    """The mode `src` gets in the bin dir: PLUGIN_MODE for an executable, else `file_mode`."""
    return PLUGIN_MODE if os.stat(src).st_mode & 0o111 else file_mode


def _same_file(src: str, dst: str, ledger: WriteLedger, file_mode: int) -> bool:
    try:
        want = installed_mode(src, file_mode)
        d = os.lstat(dst)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(d.st_mode) or stat.S_IMODE(d.st_mode) != want:
        return False
    return ledger.hashes.digest(src) == ledger.hashes.digest(dst)


def _install_file(src: str, dst: str, ledger: WriteLedger, file_mode: int) -> bool:
    if os.path.islink(dst) or os.path.isdir(dst):
        raise InstallError(
            f"install plugin {dst}: expected a regular file, found "
            f"{'a symlink' if os.path.islink(dst) else 'a directory'}; "
            "remove it by hand (it is not ours to delete)"
        )
    mode = installed_mode(src, file_mode)
    if _same_file(src, dst, ledger, file_mode):
        ledger.record(dst, ledger.hashes.digest(dst), mode=mode)
        return False
    with open(src, "rb") as f:
        data = f.read()
    try:
        atomic_write(dst, data, mode=mode, keep_mode=False)
    except OSError as e:
        raise _write_error("write plugin", dst, e) from e
    ledger.record_written(dst, data, mode=mode)
    return True


def _fsync_tree(path: str) -> None:
    for root, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            if not os.path.islink(full):
                fd = os.open(full, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        fsync_dir(root)


def _copy_file(src: str, dst: str) -> object:
    return shutil.copy2(src, dst)


def _install_tree(src: str, dst: str) -> bool:
    if os.path.islink(dst) or os.path.isfile(dst):
        raise InstallError(f"install plugin support dir {dst}: expected a directory")
    if os.path.isdir(dst) and tree_digest(dst) == tree_digest(src):
        return False
    try:
        tmp, lock = create_temp_dir(dst)
    except OSError as e:
        raise _write_error("write plugin support dir", dst, e) from e
    try:
        shutil.copytree(src, tmp, symlinks=True, copy_function=_copy_file, dirs_exist_ok=True)
        _fsync_tree(tmp)
        if os.path.isdir(dst):
            # Same hashed name, other content: a damaged copy. Swap it out, then drop it.
            old = temp_path(dst)
            os.rename(dst, old)
            atomic_rename(tmp, dst)
            shutil.rmtree(old, ignore_errors=True)
        else:
            atomic_rename(tmp, dst)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _write_error("write plugin support dir", dst, e) from e
    finally:
        os.close(lock)
    return True


def _prune_support_dirs(bin_dir: str, current: set[str]) -> list[str]:
    """Remove support dirs of former versions. While the source ships support dirs itself, the
    newest former one is kept (a plugin of that version may still be running and importing from
    it); a single-file source needs none, so all go. Called after the new files are in place."""
    old = [
        e
        for e in os.scandir(bin_dir)
        if is_support_dir(e.name) and e.name not in current and e.is_dir(follow_symlinks=False)
    ]
    old.sort(key=lambda e: e.stat(follow_symlinks=False).st_mtime_ns, reverse=True)
    removed = []
    for entry in old[1:] if current else old:
        with contextlib.suppress(OSError):
            remove_tree(entry.path)
            removed.append(entry.name)
    if removed:
        log.info(
            "removed support dirs of a former plugin version",
            extra={"fields": {"dir": bin_dir, "names": ",".join(removed)}},
        )
    return removed


def install_binaries(
    source_dir: str, bin_dir: str, ledger: WriteLedger, *, file_mode: int = 0o600
) -> BinaryResult:
    """Make bin_dir hold every top-level name of source_dir with the same content; `file_mode`
    is the mode of a non-executable top-level file (executables get PLUGIN_MODE)."""
    if not os.path.isdir(bin_dir):
        raise InstallError(f"CNI bin dir {bin_dir} does not exist (is the host path mounted?)")
    entries = source_entries(source_dir)
    result = BinaryResult()
    try:
        for name in remove_stale_temps(bin_dir):
            log.info("removed stale temp file", extra={"fields": {"dir": bin_dir, "name": name}})
    except OSError as e:
        raise _write_error("clean up", bin_dir, e) from e
    # Support trees before executables: a new executable never runs without what it needs.
    for name, is_dir in sorted(entries.items(), key=lambda item: not item[1]):
        src, dst = os.path.join(source_dir, name), os.path.join(bin_dir, name)
        changed = _install_tree(src, dst) if is_dir else _install_file(src, dst, ledger, file_mode)
        (result.written if changed else result.unchanged).append(dst)
    result.removed = _prune_support_dirs(bin_dir, {n for n, d in entries.items() if d})
    return result


def binary_problems(
    source_dir: str, bin_dir: str, ledger: WriteLedger, *, file_mode: int = 0o600
) -> list[str]:
    """What is missing or different in bin_dir, its mode included (empty: all in place)."""
    problems = []
    for name, is_dir in source_entries(source_dir).items():
        src, dst = os.path.join(source_dir, name), os.path.join(bin_dir, name)
        if is_dir:
            if not os.path.isdir(dst) or os.path.islink(dst):
                problems.append(f"{dst}: support dir missing")
        elif not _same_file(src, dst, ledger, file_mode):
            problems.append(
                f"{dst}: plugin missing, different from {src} or not mode "
                f"{installed_mode(src, file_mode):04o}"
            )
    return problems


def uninstall_binaries(
    source_dir: str, bin_dir: str, ledger: WriteLedger
) -> tuple[list[str], list[str]]:
    """Remove our names, every old support dir and the temps a killed install left; returns
    (removed, errors)."""
    removed, errors = [], []
    try:
        removed += [os.path.join(bin_dir, n) for n in remove_stale_temps(bin_dir)]
    except FileNotFoundError:
        pass
    except OSError as e:
        errors.append(str(_write_error("clean up", bin_dir, e)))
    names: set[str] = {"istio-cni"}
    with contextlib.suppress(InstallError):
        names |= set(source_entries(source_dir))
    with contextlib.suppress(OSError):
        names |= {n for n in os.listdir(bin_dir) if is_support_dir(n)}
    for name in sorted(names):
        path = os.path.join(bin_dir, name)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                remove_tree(path)
            elif os.path.lexists(path):
                os.unlink(path)
            else:
                continue
            removed.append(path)
            ledger.record(path, ABSENT)
        except OSError as e:
            errors.append(str(_write_error("remove", path, e)))
    with contextlib.suppress(OSError):
        fsync_dir(bin_dir)
    return removed, errors
