"""Leaving nothing of a real node behind, also after a failed or killed test run.

A container runtime leaves more than its own process: containerd-shim processes (their own
sessions, so they outlive containerd), the containers runc started, mounts (container root
file systems, /dev/shm of sandboxes, pod network namespaces, kubelet's volume tmpfs), shim
sockets under /run/containerd/s, libcni's result cache under /var/lib/cni, kubelet's symlinks in
/var/log/containers, and the kernel settings kubelet changes at start. Each node writes a record
of what it is made of before it starts anything; `clean(record)` removes all of it and is
idempotent, and `sweep_stale()` cleans the records of test processes that died without doing so.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed import netns
from testbed.mountns import remove_made_dirs
from testbed.process import pid_alive

log = logging.getLogger(__name__)

RECORDS = Path("/run/istio-cni-testbed/nodes")
TRAVERSABLE = Path("/run/istio-cni-testbed/traversable")
"""Node dirs every uid may traverse (NodeRecord.traversable_dir)."""
LIBCNI_CACHE = Path("/var/lib/cni/results")
SHARED_RUN_DIR = Path("/run/containerd")
CONTAINER_LOG_LINKS = Path("/var/log/containers")  # kubelet's fixed dir of log symlinks
XTABLES_LOCK = Path("/run/xtables.lock")
CGROUP_ROOT = Path("/sys/fs/cgroup")
RUNTIME_CGROUP = "k8s.io"  # containerd puts a namespace's containers under /<namespace>/<id>
# What kubelet sets at start (setupKernelTunables); restored afterwards.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)


@dataclass
class NodeRecord:
    owner_pid: int
    base: str
    """Everything on disk lives below: runtime and kubelet dirs, CNI dirs, logs."""
    netns_name: str
    host_ifname: str
    runtime_socket: str
    runc_root: str
    cni_network: str
    sysctls: dict[str, str] = field(default_factory=dict)
    made_log_links_dir: bool = False
    made_xtables_lock: bool = False
    """The chart mounts /run/xtables.lock (FileOrCreate): kubelet creates it when missing."""
    made_cgroups: list[str] = field(default_factory=list)
    """The runtime's per-namespace cgroup (k8s.io) of each controller, where this node made it."""
    kubelet_cgroup_root: str = ""
    """kubelet's cgroupRoot (the node's own): its tree in every controller goes at clean-up."""
    made_dirs: list[str] = field(default_factory=list)
    """Empty dirs made on the machine as mount points of a platform layout (mountns.py)."""
    extra_netns: list[str] = field(default_factory=list)
    """Network namespaces made beside the node's (the fabric between several nodes, nodes.py)."""
    other_runtime_sockets: list[str] = field(default_factory=list)
    """Sockets of the node's other containerd (containerd 2, containerd2.py): its shims'
    `-address`."""

    @property
    def path(self) -> Path:
        return RECORDS / f"{self.owner_pid}-{self.netns_name}.json"

    @property
    def traversable_dir(self) -> Path:
        """The node's dir outside `base` whose path every uid may traverse, for containerd 2's
        state: runc's init looks a container's rootfs mount point up by path as the container's
        root, in a user-namespaced pod (hostUsers: false) a uid that maps no uid of the machine,
        so it has no DAC override there and `base` below pytest's 0700 dirs is out of its reach
        (EACCES). Named after the record: clean() finds it without a field of its own."""
        return TRAVERSABLE / self.path.stem

    def make_traversable_dir(self) -> Path:
        path = self.traversable_dir
        for d in (TRAVERSABLE, path):
            d.mkdir(exist_ok=True, parents=True)
            d.chmod(0o711)  # search, not list
        return path

    def save(self) -> None:
        RECORDS.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, self.path)


def snapshot_sysctls() -> dict[str, str]:
    values = {}
    for key in KUBELET_SYSCTLS:
        with contextlib.suppress(OSError):
            values[key] = (Path("/proc/sys") / key).read_text().strip()
    return values


def clean(record: NodeRecord) -> list[str]:
    """Remove everything of the node; returns what could not be removed (empty when clean)."""
    errors: list[str] = []

    def attempt(what: str, step: Callable[[], object]) -> None:
        try:
            step()
        except Exception as e:  # keep going: the rest must still be removed
            errors.append(f"{what}: {e}")

    shim_sockets = _shim_sockets(Path(record.base))
    attempt("runc containers", lambda: _delete_runc_containers(Path(record.runc_root)))
    for socket in (record.runtime_socket, *record.other_runtime_sockets):
        attempt("containerd shims", functools.partial(_kill_shims, socket))
    attempt("processes in the node netns", lambda: _kill_netns_processes(record.netns_name))
    attempt("mounts", lambda: unmount_below(Path(record.base)))
    attempt("traversable dir mounts", lambda: unmount_below(record.traversable_dir))
    attempt("node netns", lambda: netns.delete(record.netns_name))
    for name in record.extra_netns:
        attempt(f"netns {name}", functools.partial(netns.delete, name))
    attempt("veth", lambda: netns.delete_link(record.host_ifname))
    for sock in shim_sockets:
        with contextlib.suppress(OSError):
            sock.unlink()
    # Made by containerd's shims and ctr whatever the configured dirs; removed once empty (so
    # another containerd's files are left alone).
    for d in (
        *SHARED_RUN_DIR.glob("runc/*"),
        *(SHARED_RUN_DIR / n for n in ("s", "fifo", "runc")),
        SHARED_RUN_DIR,
    ):
        with contextlib.suppress(OSError):
            d.rmdir()
    for cached in LIBCNI_CACHE.glob(f"{record.cni_network}-*"):
        cached.unlink(missing_ok=True)
    attempt(
        "container log links",
        lambda: _remove_log_links(Path(record.base), record.made_log_links_dir),
    )
    attempt("kernel settings", lambda: _restore_sysctls(record.sysctls))
    if record.made_xtables_lock:
        XTABLES_LOCK.unlink(missing_ok=True)
    for cgroup in record.made_cgroups:  # rmdir fails while another runtime uses it: fine
        with contextlib.suppress(OSError):
            Path(cgroup).rmdir()
    if record.kubelet_cgroup_root:
        attempt("kubelet cgroups", lambda: _remove_cgroups(record.kubelet_cgroup_root))
    attempt("files", lambda: _remove_tree(Path(record.base)))
    attempt("traversable dir", lambda: _remove_tree(record.traversable_dir))
    attempt("mount points", lambda: remove_made_dirs(record.made_dirs))
    if not errors:
        record.path.unlink(missing_ok=True)
        for d in (RECORDS, TRAVERSABLE, RECORDS.parent):
            with contextlib.suppress(OSError):
                d.rmdir()
    return errors


def make_cgroups(root: str) -> None:
    """kubelet's cgroupRoot must exist in every hierarchy before it starts (cpuset's with the
    parent's CPUs and memory nodes, which a new v1 cpuset starts without)."""
    for controller in sorted(CGROUP_ROOT.iterdir()):
        if not (controller / "cgroup.procs").exists():
            continue
        top = controller / root.lstrip("/")
        top.mkdir(exist_ok=True)
        for setting in ("cpuset.cpus", "cpuset.mems"):
            if (controller / setting).exists() and not (top / setting).read_text().strip():
                (top / setting).write_text((controller / setting).read_text())


def _remove_cgroups(root: str) -> None:
    """rmdir kubelet's tree (`root` in every controller) bottom-up, once its processes are gone."""
    left = []
    for controller in sorted(CGROUP_ROOT.iterdir()):
        top = controller / root.lstrip("/")
        if not top.is_dir():
            continue
        dirs = sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts))
        for d in [*dirs, top]:
            try:
                d.rmdir()
            except OSError as e:
                left.append(f"{d}: {e.strerror}")
    if left:
        raise OSError("cgroups left: " + "; ".join(left[:5]))


def missing_runtime_cgroups() -> list[str]:
    """The runtime cgroup dirs that do not exist yet (this node's runtime will make them)."""
    return [
        str(c / RUNTIME_CGROUP)
        for c in sorted(CGROUP_ROOT.iterdir())
        if (c / "cgroup.procs").exists() and not (c / RUNTIME_CGROUP).exists()
    ]


def kill_containers(record: NodeRecord) -> None:
    """Every container of the node dies (its runtime is down), as in a reboot: runc's
    containers and the shims; mounts and the node netns stay for the runtime to clean up."""
    # A killed shim leaves its socket, and the restarted containerd removes the bundle that
    # names it: collect them first.
    sockets = _shim_sockets(Path(record.base))
    _delete_runc_containers(Path(record.runc_root))
    for socket in (record.runtime_socket, *record.other_runtime_sockets):
        _kill_shims(socket)
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.unlink()


def sweep_stale() -> None:
    """Clean the nodes of test processes that are gone (killed before their teardown)."""
    for path in sorted(RECORDS.glob("*.json")):
        try:
            record = NodeRecord(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if pid_alive(record.owner_pid):
            continue
        # Only the base dir: its logs are not worth keeping once the owner is gone.
        errors = clean(record)
        if errors:
            log.warning("stale node %s: %s", path, "; ".join(errors))


# -- parts --------------------------------------------------------------------------------------


def _shim_sockets(base: Path) -> list[Path]:
    """The shims' ttrpc sockets, from the `address` file in each task bundle (containerd 1.6)
    or its `bootstrap.json` (containerd 2): they live in /run/containerd/s whatever containerd's
    state dir is."""
    found = []
    for bundle in base.glob("**/io.containerd.runtime.v2.task/*/*/"):
        text = ""
        with contextlib.suppress(OSError):
            text = (bundle / "address").read_text().strip()
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            text = text or str(json.loads((bundle / "bootstrap.json").read_text())["address"])
        if text.startswith("unix://"):
            found.append(Path(text.removeprefix("unix://")))
    return found


def _delete_runc_containers(runc_root: Path) -> None:
    if not runc_root.is_dir():
        return
    for ns_root in runc_root.iterdir():
        if not ns_root.is_dir():
            continue
        listed = subprocess.run(
            ["runc", "--root", str(ns_root), "list", "-q"],
            capture_output=True,
            text=True,
            check=False,
        )
        for cid in listed.stdout.split():
            subprocess.run(
                ["runc", "--root", str(ns_root), "delete", "--force", cid],
                capture_output=True,
                text=True,
                check=False,
                timeout=60,
            )


def pids_with_cmdline(match: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if match.encode() in args:
            pids.append(int(proc.name))
    return pids


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(pid_alive(p) and not _zombie(p) for p in pids):
        time.sleep(0.05)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _kill_shims(runtime_socket: str) -> None:
    """containerd-shim-runc-v2 processes of this containerd (`-address <socket>`)."""
    _kill(pids_with_cmdline(runtime_socket))


def _kill_netns_processes(name: str) -> None:
    """Whatever still runs in the node netns (containers of hostNetwork pods that runc no longer
    knows, after a crash)."""
    path = netns.NETNS_DIR / name
    if not path.exists():
        return
    target = os.stat(path).st_ino
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            with contextlib.suppress(OSError):
                if os.stat(proc / "ns" / "net").st_ino == target:
                    pids.append(int(proc.name))
    _kill(pids)


def _mountpoints() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        points.append(point)
    return points


def mounted_below(base: Path) -> list[str]:
    prefix = str(base).rstrip("/") + "/"
    return [p for p in _mountpoints() if p == str(base) or p.startswith(prefix)]


def unmount_below(base: Path) -> None:
    """Unmount everything at or below `base`, deepest first (lazily: a busy one goes once its
    last user is gone, and the name is free at once)."""
    for _ in range(3):
        points = mounted_below(base)
        if not points:
            return
        for point in sorted(set(points), key=lambda p: p.count("/"), reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    left = mounted_below(base)
    if left:
        raise RuntimeError(f"still mounted: {left[:5]}")


def _remove_tree(base: Path) -> None:
    if mounted_below(base):  # reported above; never delete through a mount
        return
    if base.exists():
        shutil.rmtree(base)


def _remove_log_links(base: Path, made_dir: bool) -> None:
    if not CONTAINER_LOG_LINKS.is_dir():
        return
    prefix = str(base).rstrip("/") + "/"
    for link in CONTAINER_LOG_LINKS.iterdir():
        if link.is_symlink() and os.readlink(link).startswith(prefix):
            link.unlink()
    if made_dir:
        with contextlib.suppress(OSError):
            CONTAINER_LOG_LINKS.rmdir()


def _restore_sysctls(values: dict[str, str]) -> None:
    for key, value in values.items():
        path = Path("/proc/sys") / key
        if path.read_text().strip() != value:
            path.write_text(value + "\n")
