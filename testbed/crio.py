"""CRI-O (built by ci/setup-testbed) with conmon and runc (Debian's), as OpenShift's nodes run
it: the `platforms` tier's OpenShift node (RealCluster.relayout).

Everything it keeps is under one dir of the test bed: its storage (containers/storage, overlay),
run root, socket, conmon's exit and attach dirs, runc's state (below the containerd runc root
nodeclean already sweeps). Its CNI dirs are the platform's (network_dir, plugin_dirs); pod
namespaces are pinned by pinns under `namespaces_dir` (/var/run: the netns in /var/run/netns, as
on OpenShift). Images come from the test bed's docker-archives, put into its storage by buildah
before it starts: nothing is pulled.

Settings this machine needs, each for a reason of the machine, not of CRI-O's defaults:
cgroupfs (no systemd here; kubelet's driver too), and a runc wrapper that raises an OCI spec's
oomScoreAdj to the runtime's own (CAP_SYS_RESOURCE is withheld here, so runc cannot lower it;
containerd's `restrict_oom_score_adj` does the same for the containerd node) and drops hugetlb
limits (no hugetlb hierarchy is mounted here, though the kernel lists the controller).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed import parts
from testbed.images import Image
from testbed.process import Daemon

STORAGE_DRIVER = "overlay"
CONMON = "/usr/bin/conmon"
NAMESPACES_DIR = "/var/run"
"""pinns pins a pod's netns at <this>/netns/<id>: /var/run/netns, the chart's cniNetnsDir."""
PINNED_DIRS = tuple(f"{NAMESPACES_DIR}/{kind}ns" for kind in ("ipc", "uts", "user"))
"""The other pinned namespaces' dirs (the layout gives them a dir of their own)."""

_WRAPPER = """#!/usr/bin/python3
# runc for CRI-O on the istio-cni test bed (testbed/crio.py), for two things this machine lacks:
# CAP_SYS_RESOURCE (a spec's oomScoreAdj below the runtime's own cannot be set: it is raised to
# it, as containerd's restrict_oom_score_adj does) and a hugetlb cgroup hierarchy (CRI-O sees the
# controller in /proc/cgroups and sets limits runc cannot apply: they are dropped). Then the real
# runc runs.
import json, os, sys

RUNC = {runc!r}
args = sys.argv[1:]
if "create" in args or "run" in args:
    bundle = "."
    for i, a in enumerate(args):
        if a in ("--bundle", "-b") and i + 1 < len(args):
            bundle = args[i + 1]
        elif a.startswith("--bundle="):
            bundle = a.split("=", 1)[1]
    path = os.path.join(bundle, "config.json")
    with open(path) as f:
        spec = json.load(f)
    changed = False
    with open("/proc/self/oom_score_adj") as f:
        floor = int(f.read())
    process = spec.get("process") or {{}}
    if process.get("oomScoreAdj") is not None and process["oomScoreAdj"] < floor:
        process["oomScoreAdj"] = floor
        changed = True
    resources = (spec.get("linux") or {{}}).get("resources") or {{}}
    if resources.get("hugepageLimits") and not os.path.isdir("/sys/fs/cgroup/hugetlb"):
        del resources["hugepageLimits"]
        changed = True
    if changed:
        with open(path + ".tmp", "w") as f:
            json.dump(spec, f)
        os.replace(path + ".tmp", path)
os.execv(RUNC, [RUNC, *args])
"""


@dataclass(frozen=True)
class CrioDirs:
    base: Path
    runc_root: Path
    """runc's --root (a dir below the containerd node's runc root, which nodeclean sweeps)."""

    @property
    def storage(self) -> Path:
        return self.base / "storage"

    @property
    def run_root(self) -> Path:
        return self.base / "run"

    @property
    def socket(self) -> Path:
        return self.base / "crio.sock"

    @property
    def config(self) -> Path:
        return self.base / "crio.conf"

    @property
    def config_dir(self) -> Path:
        """--config-dir: empty (no drop-ins from the machine's /etc/crio)."""
        return self.base / "crio.conf.d"

    @property
    def policy(self) -> Path:
        return self.base / "policy.json"

    @property
    def runc_wrapper(self) -> Path:
        return self.base / "runc-oom-floor"


def render_config(
    dirs: CrioDirs,
    *,
    pause_image: str,
    pinns: Path,
    cni_bin_dir: str,
    cni_conf_dir: str,
) -> str:
    """crio.conf for the node: the CNI dirs as OpenShift sets them (network_dir, plugin_dirs)."""
    d = dirs.base
    return f"""[crio]
root = "{dirs.storage}"
runroot = "{dirs.run_root}"
storage_driver = "{STORAGE_DRIVER}"
log_dir = "{d / "pod-logs"}"
version_file = "{d / "version"}"
version_file_persist = "{d / "version-persist"}"
clean_shutdown_file = "{d / "clean.shutdown"}"
internal_wipe = true

[crio.api]
listen = "{dirs.socket}"
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
selinux = false
namespaces_dir = "{NAMESPACES_DIR}"
pinns_path = "{pinns}"
container_exits_dir = "{d / "exits"}"
container_attach_socket_dir = "{d / "attach"}"
hooks_dir = ["{d / "hooks.d"}"]
irqbalance_config_file = "{d / "irqbalance"}"
irqbalance_config_restore_file = "disable"

[crio.runtime.runtimes.runc]
runtime_path = "{dirs.runc_wrapper}"
runtime_type = "oci"
runtime_root = "{dirs.runc_root}"
monitor_path = "{CONMON}"
monitor_cgroup = "pod"

[crio.image]
pause_image = "{pause_image}"
pause_command = "/pause"
signature_policy = "{dirs.policy}"
signature_policy_dir = "{d / "policies"}"

[crio.network]
network_dir = "{cni_conf_dir}"
plugin_dirs = ["{cni_bin_dir}"]

[crio.metrics]
enable_metrics = false

[crio.nri]
enable_nri = false
"""


class Crio:
    """start() / stop(), as testbed.containerd.Containerd; images go in with import_image()
    while it is stopped or running (containers/storage locks its files)."""

    def __init__(
        self,
        dirs: CrioDirs,
        log_path: Path,
        *,
        prefix: list[str],
        pause_image: str,
        cni_bin_dir: str,
        cni_conf_dir: str,
    ) -> None:
        self.dirs = dirs
        self.binary = parts.crio().require()
        self.pinns = parts.crio("pinns").require()
        parts.Part("conmon (Debian package conmon)", Path(CONMON), parts.SETUP_APT).require()
        self.runc = parts.debian_tool("runc", "runc").require()
        self.buildah = parts.debian_tool("buildah", "buildah").require()
        self.prefix = prefix
        self.pause_image = pause_image
        self.cni_bin_dir = cni_bin_dir
        self.cni_conf_dir = cni_conf_dir
        self.daemon = Daemon("crio", [], log_path)

    @property
    def socket(self) -> Path:
        return self.dirs.socket

    def start(self, timeout: float = 60.0) -> None:
        for d in (self.dirs.storage, self.dirs.run_root, self.dirs.config_dir, self.dirs.runc_root):
            d.mkdir(parents=True, exist_ok=True)
        (self.dirs.base / "hooks.d").mkdir(exist_ok=True)
        self.dirs.policy.write_text('{"default": [{"type": "insecureAcceptAnything"}]}\n')
        self.dirs.runc_wrapper.write_text(_WRAPPER.format(runc=str(self.runc)))
        self.dirs.runc_wrapper.chmod(0o755)
        self.dirs.config.write_text(
            render_config(
                self.dirs,
                pause_image=self.pause_image,
                pinns=self.pinns,
                cni_bin_dir=self.cni_bin_dir,
                cni_conf_dir=self.cni_conf_dir,
            )
        )
        self.daemon.argv = [
            *self.prefix,
            str(self.binary),
            "--config",
            str(self.dirs.config),
            "--config-dir",
            str(self.dirs.config_dir),
            "--log-level",
            "info",
        ]
        self.daemon.start()
        deadline = time.monotonic() + timeout
        while not self._serving():
            if not self.daemon.alive():
                raise self.daemon.failure("exited at start")
            if time.monotonic() > deadline:
                raise self.daemon.failure(f"did not serve its socket within {timeout}s")
            time.sleep(0.2)

    def _serving(self) -> bool:
        """CRI-O's own HTTP endpoint on its socket answers /info once the CRI is up."""
        if not self.dirs.socket.exists():
            return False
        done = subprocess.run(
            [
                "curl",
                "-fsS",
                "--max-time",
                "2",
                "--unix-socket",
                str(self.dirs.socket),
                "http://localhost/info",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        return done.returncode == 0

    def stop(self) -> None:
        self.daemon.stop()

    def alive(self) -> bool:
        return self.daemon.alive()

    # -- images -------------------------------------------------------------------------------

    def _buildah(self, *args: str) -> str:
        argv = [
            str(self.buildah),
            "--root",
            str(self.dirs.storage),
            "--runroot",
            str(self.dirs.run_root),
            "--storage-driver",
            STORAGE_DRIVER,
            *args,
        ]
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()[-2000:]}")
        return done.stdout

    def import_images(self, images: Iterable[Image]) -> None:
        """Put each image's docker-archive into CRI-O's storage under its ref (those not there
        yet)."""
        present = self.images()
        for image in images:
            if image.ref in present:
                continue
            archive = f"docker-archive:{image.archive}"
            image_id = self._buildah("pull", "--quiet", archive).split()[-1]
            self._buildah("tag", image_id, image.ref)

    def images(self) -> set[str]:
        out = self._buildah("images", "--json")
        return {name for image in json.loads(out or "[]") for name in image.get("names") or []}

    def remove_image(self, ref: str) -> None:
        self._buildah("rmi", ref)

    # -- containers (runc's state: CRI-O's spec annotations name pod and container) -----------

    def _containers(self) -> list[dict[str, Any]]:
        done = subprocess.run(
            [str(self.runc), "--root", str(self.dirs.runc_root), "list", "--format", "json"],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"runc list failed: {done.stderr.strip()}")
        return list(json.loads(done.stdout or "null") or [])

    def _running(self, pod_uid: str, name: str | None = None) -> Iterator[dict[str, Any]]:
        """The pod's running containers (only `name`, when given)."""
        for c in self._containers():
            notes = c.get("annotations") or {}
            if (
                c.get("status") == "running"
                and notes.get("io.kubernetes.pod.uid") == pod_uid
                and name in (None, notes.get("io.kubernetes.container.name"))
            ):
                yield c

    def running_container(self, pod_uid: str, name: str) -> tuple[str, int]:
        """(container id, pid) of the pod's running container `name`."""
        for c in self._running(pod_uid, name):
            return str(c["id"]), int(c["pid"])
        raise AssertionError(f"no running container {name} of pod {pod_uid} in CRI-O")

    def sandbox_pid(self, pod_uid: str) -> int | None:
        """A running process of the pod (CRI-O drops the infra container: the pod's netns is
        pinned, and every container of the pod is in it), or None."""
        for c in self._running(pod_uid):
            return int(c["pid"])
        return None

    def container_spec(self, container_id: str) -> dict[str, Any]:
        for c in self._containers():
            if c.get("id") == container_id:
                spec: dict[str, Any] = json.loads((Path(c["bundle"]) / "config.json").read_text())
                return spec
        raise AssertionError(f"no container {container_id} in CRI-O")
