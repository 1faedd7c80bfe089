"""The sandbox process of a simulated pod: a process inside the pod's network namespace and in a
cgroup named as kubelet names a pod's (`.../kubepods/pod<uid>/<sandbox id>`), so the agent finds
the pod's namespace by the pod's identity, as on a real node, and not by the addresses in it.

The cgroups live under one dir of this test process (`istio-cni-testbed-<pid>`) of the pids
hierarchy (cgroup v1) or of the unified one (v2); `close()` kills the processes and removes the
dirs, and `sweep_stale()` removes those of test processes that died without doing so.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import time
from pathlib import Path

from testbed.process import pid_alive

CGROUP_FS = Path("/sys/fs/cgroup")
PREFIX = "istio-cni-testbed-"


def hierarchy() -> Path:
    """Where this machine lets root make cgroups: v1's pids controller, else the v2 tree."""
    for candidate in (CGROUP_FS / "pids", CGROUP_FS / "unified", CGROUP_FS):
        if (candidate / "cgroup.procs").exists():
            return candidate
    raise RuntimeError(f"no cgroup hierarchy under {CGROUP_FS} to put sandbox processes in")


class PodSandboxes:
    """start(netns, pod_uid) -> pid of a `sleep` in that netns and the pod's cgroup."""

    def __init__(self) -> None:
        self.base = hierarchy() / f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        self._procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, netns_path: str, pod_uid: str) -> int:
        leaf = self.base / "kubepods" / f"pod{pod_uid}" / secrets.token_hex(32)
        leaf.mkdir(parents=True)
        procs = leaf / "cgroup.procs"

        def join_cgroup() -> None:  # in the child, before it execs: it starts in the pod
            procs.write_text("0")

        proc = subprocess.Popen(
            ["nsenter", f"--net={netns_path}", "--", "sleep", "infinity"],
            preexec_fn=join_cgroup,
        )
        self._procs.append((proc, leaf))
        ns = f"/proc/{proc.pid}/ns/net"
        deadline = time.monotonic() + 10
        while os.stat(ns).st_ino != os.stat(netns_path).st_ino:  # nsenter has not exec'd yet
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"sandbox process for pod {pod_uid} did not enter {netns_path}")
            time.sleep(0.01)
        return proc.pid

    def stop(self, pid: int) -> None:
        """Kill one sandbox process (the pod's sandbox is gone) and remove its cgroup."""
        for proc, leaf in list(self._procs):
            if proc.pid == pid:
                self._end(proc, leaf)
                self._procs.remove((proc, leaf))

    def close(self) -> None:
        for proc, leaf in self._procs:
            self._end(proc, leaf)
        self._procs.clear()
        _remove_tree(self.base)

    @staticmethod
    def _end(proc: subprocess.Popen[bytes], leaf: Path) -> None:
        proc.kill()
        proc.wait()
        for d in (leaf, leaf.parent):
            with contextlib.suppress(OSError):
                d.rmdir()


def sweep_stale() -> None:
    """Remove the cgroup dirs of test processes that are gone (their sandboxes died with them)."""
    try:
        root = hierarchy()
    except RuntimeError:
        return
    for d in root.glob(f"{PREFIX}*"):
        owner = d.name.removeprefix(PREFIX).split("-", 1)[0]
        if owner.isdigit() and not pid_alive(int(owner)):
            _remove_tree(d)


def _remove_tree(base: Path) -> None:
    """rmdir bottom-up (a cgroup dir is removed with rmdir, never by deleting its files)."""
    if not base.exists():
        return
    for d in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            d.rmdir()
    with contextlib.suppress(OSError):  # still in use: left for sweep_stale
        base.rmdir()
