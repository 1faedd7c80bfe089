"""Each available fault kind on the test bed's parts (testbed/): the acts themselves, small and
checkable one by one, and `build`, which makes the Fault of a kind for one node or the cluster.

The acts take what they touch as parameters (a pid, a path, a Daemon, the API fault proxy), so
that each can be run against a real process or file alone."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.soak.faults import Fault, FaultKind, Held, Instant

SMALL_MOUNT_BYTES = 256 * 1024 * 1024
"""The largest file system `fill` agrees to fill: the conf dir must be a small mount of its own
(a tmpfs the bed made), never the machine's disk."""
THROTTLE_PERCENT = 2
CFS_PERIOD_US = 100_000
CGROUP_FS = Path("/sys/fs/cgroup")


class ActError(RuntimeError):
    """A fault could not be done on this bed (the reason names the part)."""


# -- processes ---------------------------------------------------------------------------------


def kill9(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # already gone: the fault is done either way
        os.kill(pid, signal.SIGKILL)


def cpu_cgroup(pid: int, proc: Path = Path("/proc")) -> Path:
    """The dir of `pid`'s CPU cgroup: cgroup v1's `cpu` controller, else the unified (v2) one."""
    unified: Path | None = None
    for line in (proc / str(pid) / "cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return CGROUP_FS / "cpu" / path.lstrip("/")
        if controllers == "":
            unified = CGROUP_FS / path.lstrip("/")
    if unified is None:
        raise ActError(f"no cpu cgroup for pid {pid}")
    return unified


def throttle(cgroup: Path, percent: int = THROTTLE_PERCENT) -> Callable[[], None]:
    """The cgroup held to `percent` of one CPU; returns the undo (the quota it had)."""
    quota = CFS_PERIOD_US * percent // 100
    v1 = cgroup / "cpu.cfs_quota_us"
    if v1.exists():
        saved = v1.read_text()
        v1.write_text(f"{quota}\n")
        return lambda: _write(v1, saved)
    v2 = cgroup / "cpu.max"
    if v2.exists():
        saved = v2.read_text()
        v2.write_text(f"{quota} {CFS_PERIOD_US}\n")
        return lambda: _write(v2, saved)
    raise ActError(f"{cgroup}: no cpu.cfs_quota_us or cpu.max (cpu controller off)")


def _write(path: Path, text: str) -> None:
    """The quota put back; a cgroup gone meanwhile (its container replaced: a kill, a new pod)
    has nothing left to restore."""
    if not path.parent.is_dir():
        return
    path.write_text(text)


# -- files -------------------------------------------------------------------------------------


def fill(directory: Path, limit: int = SMALL_MOUNT_BYTES) -> Path:
    """A file filling `directory`'s file system to its last byte; refuses a file system larger
    than `limit` or not mounted at `directory` itself."""
    if not os.path.ismount(directory):
        raise ActError(f"{directory} is not a mount of its own: will not fill its file system")
    st = os.statvfs(directory)
    if st.f_blocks * st.f_frsize > limit:
        raise ActError(f"{directory}: {st.f_blocks * st.f_frsize} bytes, more than {limit}")
    filler = directory / ".soak-filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for chunk in (65536, 4096, 1):
            with contextlib.suppress(OSError):  # ENOSPC: full at this chunk size
                while True:
                    os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)
    return filler


def write_conflist(path: Path, conf: dict[str, Any]) -> None:
    """As a primary CNI writes its own file: in place, its own content (our entry not in it)."""
    path.write_text(json.dumps(conf, indent=2) + "\n")


def restore_if_missing(path: Path, conf: dict[str, Any]) -> None:
    if not path.exists():
        write_conflist(path, conf)


# -- building a kind's fault -------------------------------------------------------------------


@dataclass
class Parts:
    """What the acts reach on a bed. Callables rather than the bed's classes, so that a part
    the bed lacks is a missing entry (an ActError naming it), not an attribute error."""

    agent_pid: Callable[[str], int]
    """node -> pid of the agent's process there (as the runtime sees it)."""
    delete_agent_pod: Callable[[str], None]
    runtime_restart: Callable[[str], None]
    conflist: Callable[[str], Path]
    """node -> the primary conflist the runtime loads."""
    primary_conf: Callable[[str], dict[str, Any]]
    """node -> the primary CNI's own config (without our entry)."""
    plugin: Callable[[str], Path]
    conf_dir: Callable[[str], Path]
    node_healthy: Callable[[str], bool]
    """node -> the agent Ready and its entry loaded there."""
    cluster_healthy: Callable[[], bool]
    """The API server answering and every node healthy."""
    daemons: dict[str, tuple[Callable[[], None], Callable[[], None]]] = field(default_factory=dict)
    """Control-plane process name (kube-apiserver, etcd) -> (stop, start)."""
    api_fault: Callable[[str], Callable[[], None]] | None = None
    """proxy fault name (silence, 429, 401) -> set it, returning the clear (None: no proxy)."""
    helm: dict[str, Callable[[], None]] = field(default_factory=dict)
    """upgrade, rollback -> the Helm operation on the chart's release."""
    ztunnel_restart: Callable[[str], None] | None = None
    """node -> the node's ztunnel stand-in stopped and started fresh (nothing held)."""
    ztunnel_whole: Callable[[str], bool] | None = None
    """node -> the node's stand-in, since its last restart, connected to the agent and holding
    the snapshot of every ambient pod running there."""
    node_reboot: Callable[[str], None] | None = None
    """node -> the node hard-rebooted (every process killed, its run dirs emptied, then started
    again); None when the bed cannot."""
    node_ready: Callable[[str], bool] | None = None
    """node -> its Node Ready (kubelet back and reporting): part of a reboot's recovery."""


def build(kind: FaultKind, node: str | None, parts: Parts) -> Fault:
    """The fault of `kind` on `node` (None for a cluster fault); ActError when the parts lack
    what it needs."""
    if not kind.available:
        raise ActError(f"{kind.name}: {kind.unavailable}")
    if kind.scope == "node":
        if node is None:
            raise ActError(f"{kind.name} is a node fault: no node given")
        return _node_fault(kind.name, node, parts)
    return _cluster_fault(kind.name, parts)


def _node_fault(name: str, node: str, parts: Parts) -> Fault:
    nodes = (node,)

    def healthy() -> bool:
        return parts.node_healthy(node)

    def instant(act: Callable[[], None]) -> Fault:
        return Instant(name, nodes, act, healthy)

    if name == "agent_kill9":
        return instant(lambda: kill9(parts.agent_pid(node)))
    if name == "agent_pod_delete":
        return instant(lambda: parts.delete_agent_pod(node))
    if name == "runtime_restart":
        return instant(lambda: parts.runtime_restart(node))
    if name == "conflist_rewrite":
        return instant(lambda: write_conflist(parts.conflist(node), parts.primary_conf(node)))
    if name == "conflist_delete":
        conf = parts.primary_conf(node)
        path = parts.conflist(node)
        return Held(name, nodes, lambda: path.unlink(missing_ok=True),
                    lambda: restore_if_missing(path, conf), healthy)  # fmt: skip
    if name == "plugin_delete":
        return instant(lambda: parts.plugin(node).unlink(missing_ok=True))
    if name == "conf_dir_full":
        filled: list[Path] = []
        return Held(name, nodes, lambda: filled.append(fill(parts.conf_dir(node))),
                    lambda: _unlink_all(filled), healthy)  # fmt: skip
    if name == "agent_cpu_throttle":
        undo: list[Callable[[], None]] = []
        return Held(name, nodes, lambda: undo.append(throttle(cpu_cgroup(parts.agent_pid(node)))),
                    lambda: _call_all(undo), healthy)  # fmt: skip
    if name == "ztunnel_restart":
        restart, whole = parts.ztunnel_restart, parts.ztunnel_whole
        if restart is None or whole is None:
            raise ActError("ztunnel_restart: the bed runs no ztunnel stand-in")
        return Instant(name, nodes, lambda: restart(node), lambda: healthy() and whole(node))
    if name == "node_reboot":
        reboot = parts.node_reboot
        ready = parts.node_ready
        if reboot is None or ready is None:
            raise ActError("node_reboot: the bed cannot reboot a node")
        # Recovered once the agent is back and kubelet reports the node Ready again.
        return Instant(name, nodes, lambda: reboot(node), lambda: healthy() and ready(node))
    raise ActError(f"{name}: no node act")


def _cluster_fault(name: str, parts: Parts) -> Fault:
    healthy = parts.cluster_healthy
    if name in ("api_stopped", "etcd_restart"):
        daemon = "kube-apiserver" if name == "api_stopped" else "etcd"
        if daemon not in parts.daemons:
            raise ActError(f"{name}: the bed cannot stop {daemon}")
        stop, start = parts.daemons[daemon]
        if name == "etcd_restart":  # a restart: stopped and started at once, then recovering
            return Instant(name, (), lambda: _call_all([stop, start]), healthy)
        return Held(name, (), stop, start, healthy)
    if name in ("api_silence", "api_429", "api_401"):
        set_fault = parts.api_fault
        if set_fault is None:
            raise ActError(f"{name}: the bed has no API fault proxy in front of the agents")
        clear: list[Callable[[], None]] = []
        which = name.removeprefix("api_")
        return Held(name, (), lambda: clear.append(set_fault(which)),
                    lambda: _call_all(clear), healthy)  # fmt: skip
    if name in ("helm_upgrade", "helm_rollback"):
        op = name.removeprefix("helm_")
        if op not in parts.helm:
            raise ActError(f"{name}: the bed has no Helm release to {op}")
        return Instant(name, (), parts.helm[op], healthy)
    raise ActError(f"{name}: no cluster act")


def _call_all(calls: list[Callable[[], None]]) -> None:
    """Each in turn; the undo lists are emptied so a second stop() undoes nothing twice."""
    while calls:
        calls.pop(0)()


def _unlink_all(paths: list[Path]) -> None:
    while paths:
        paths.pop().unlink(missing_ok=True)
