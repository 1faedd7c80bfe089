"""A mount namespace of the node's own, where a platform's paths (/home/kubernetes/bin,
/var/lib/rancher/k3s/..., /var/snap/microk8s/...) are bind mounts of dirs under the node's dir.

containerd and kubelet run in it, so the runtime, kubelet's hostPath volumes and the agent's
container all see the platform's layout, while the machine's own /etc/cni, /opt, /var/lib keep
what they hold. A holder process (`sleep`, in the node netns) keeps the namespace alive; killing
it with the node's other processes ends the namespace and its mounts.

Propagation: the namespace is a one-way copy of the machine's (every mount a slave): nothing
mounted in it reaches the machine, not even below a mount the machine shares (/run/netns). Within
it the binds and the node's dir are shared again, for the pods' HostToContainer volumes.
A bind target must exist as a dir: those missing on the machine are made empty and listed in
`made_dirs`, for nodeclean to remove.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.process import PartFailedError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Bind:
    source: Path
    """A dir under the node's dir (seen from the machine)."""
    target: str
    """The node path it appears at, in the namespace."""


@dataclass(frozen=True)
class Overlay:
    """`target` (an existing dir of the machine, e.g. /usr/bin) with `upper` over it: new files
    go to `upper`, the machine's files stay readable and untouched."""

    target: str
    upper: Path
    work: Path


class MountNamespace:
    """create() once; `prefix()` runs a program in it; close() kills the holder."""

    def __init__(self, net_prefix: list[str], shared: list[str]) -> None:
        """`shared`: mounts (the node's dir) whose later mounts must reach pods."""
        self._net_prefix = net_prefix
        self._shared = shared
        self._holder: subprocess.Popen[bytes] | None = None
        self.made_dirs: list[str] = []

    @property
    def path(self) -> str:
        assert self._holder is not None, "create() first"
        return f"/proc/{self._holder.pid}/ns/mnt"

    @property
    def root(self) -> Path:
        """The namespace's / as the machine sees it: what is mounted there (a pod's netns file)
        shows only through it."""
        assert self._holder is not None, "create() first"
        return Path(f"/proc/{self._holder.pid}/root")

    def create(self, binds: list[Bind], overlays: list[Overlay]) -> None:
        for bind in binds:
            self._make_target(bind.target)
        self._holder = subprocess.Popen(
            [*self._net_prefix, "unshare", "--mount", "--propagation", "unchanged", "sleep", "inf"],
            stdin=subprocess.DEVNULL,
        )
        # unshare execs sleep once the namespace exists: wait for that exec.
        deadline = time.monotonic() + 10
        while Path(f"/proc/{self._holder.pid}/comm").read_text().strip() != "sleep":
            if self._holder.poll() is not None or time.monotonic() > deadline:
                raise PartFailedError(f"unshare --mount did not start (rc {self._holder.poll()})")
            time.sleep(0.02)
        # Nothing mounted here reaches the machine (/run/netns, say, is shared with the
        # machine's own); what is mounted in the namespace reaches the pods' HostToContainer
        # volumes, so each bind is shared again, within the namespace.
        self.run(["mount", "--make-rslave", "/"])
        # containerd wants a hostPath's mount shared or slave for HostToContainer, and looks it
        # up by the unresolved path (/var/run/netns is on "/" to it, whatever /run is).
        self.run(["mount", "--make-shared", "/"])
        for shared in self._shared:
            self.run(["mount", "--make-rshared", shared])
        for bind in binds:
            bind.source.mkdir(parents=True, exist_ok=True)
            self.run(["mount", "--bind", str(bind.source), bind.target])
            self.run(["mount", "--make-shared", bind.target])
        for overlay in overlays:
            overlay.upper.mkdir(parents=True, exist_ok=True)
            overlay.work.mkdir(parents=True, exist_ok=True)
            options = f"lowerdir={overlay.target},upperdir={overlay.upper},workdir={overlay.work}"
            self.run(["mount", "-t", "overlay", "overlay", "-o", options, overlay.target])

    def prefix(self) -> list[str]:
        """Runs a program in the node netns and this mount namespace."""
        assert self._net_prefix[-1] == "--"
        return [*self._net_prefix[:-1], f"--mount={self.path}", "--"]

    def run(self, argv: list[str]) -> None:
        done = subprocess.run(
            ["nsenter", f"--mount={self.path}", "--", *argv],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise PartFailedError(f"in the node's mount namespace, {' '.join(argv)}: {done.stderr}")

    def close(self) -> None:
        """Kill the holder (the node's processes in the namespace must be gone first)."""
        if self._holder is not None:
            self._holder.kill()
            self._holder.wait(10)
            self._holder = None

    def _make_target(self, target: str) -> None:
        missing: list[Path] = []
        path = Path(target)
        while not path.exists():
            missing.append(path)
            path = path.parent
        if not path.is_dir():
            raise PartFailedError(f"{target}: {path} exists and is not a dir")
        for d in reversed(missing):
            d.mkdir()
            self.made_dirs.append(str(d))


def remove_made_dirs(made: list[str]) -> None:
    """rmdir what `_make_target` made, deepest first; one that holds files is left (and named).
    One that another live node's namespace mounts on is left too, with the dirs above it: an
    rmdir of it here would detach that mount there (Linux 3.18+), and with it, say, that node's
    whole CNI bin dir while its pods still start (beds run side by side)."""
    left = []
    in_use = mounted_in_other_namespaces(made)
    for d in sorted(made, key=lambda p: p.count("/"), reverse=True):
        if any(m == d or m.startswith(d + "/") for m in in_use):
            log.info("%s: another mount namespace mounts on it; left in place", d)
            continue
        try:
            Path(d).rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            left.append(d)
    if left:
        raise OSError(f"not empty, left in place: {', '.join(left)}")


def mounted_in_other_namespaces(paths: list[str]) -> set[str]:
    """The mount points of mount namespaces other than this process's (one process of each
    read) that are among `paths` or below one of them."""
    own = _namespace_of("self")
    seen = {own} if own is not None else set()
    found: set[str] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        namespace = _namespace_of(entry.name)
        if namespace is None or namespace in seen:
            continue
        seen.add(namespace)
        try:
            lines = (entry / "mountinfo").read_text().splitlines()
        except OSError:
            continue  # gone meanwhile
        for line in lines:
            fields = line.split()
            point = fields[4] if len(fields) > 4 else ""
            if any(point == p or point.startswith(p + "/") for p in paths):
                found.add(point)
    return found


def _namespace_of(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/mnt").st_ino
    except OSError:
        return None
