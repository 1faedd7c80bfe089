"""containerd (Debian's 1.6) with its CRI plugin and runc, as a real node's container runtime.

Everything it keeps is under one directory of the test bed: root, state, socket, runc's state,
pod network namespaces (`netns_mounts_under_state_dir`). It runs in the node's network
namespace, so the CNI plugins it execs (bridge, ours) act there. Its CNI dirs are the node's.
Images come only from docker-archives imported with `ctr images import`: nothing is pulled (the
node netns has no route out anyway).
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from testbed import parts
from testbed.process import Daemon

NAMESPACE = "k8s.io"  # the CRI plugin's containerd namespace
SNAPSHOTTER = "overlayfs"  # the machine's / is ext4: overlay works (checked by the CRI at start)
# Plugins that only log errors here (no btrfs/zfs/devmapper/aufs), and tracing nobody collects.
DISABLED_PLUGINS = (
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.tracing.processor.v1.otlp",
    "io.containerd.internal.v1.tracing",
)


@dataclass(frozen=True)
class ContainerdDirs:
    base: Path
    runc_dir: Path | None = None
    """runc's --root when not below `base` (another containerd's, which nodeclean sweeps)."""
    state_dir: Path | None = None
    """The state dir when not below `base` (one that a user-namespaced pod's root can traverse:
    NodeRecord.traversable_dir)."""

    @property
    def root(self) -> Path:
        return self.base / "root"

    @property
    def state(self) -> Path:
        return self.state_dir or self.base / "state"

    @property
    def socket(self) -> Path:
        return self.base / "containerd.sock"

    @property
    def runc_root(self) -> Path:
        """runc's --root for the CRI's runtime; the shim adds the namespace below it."""
        return self.runc_dir or self.base / "runc"

    @property
    def netns_dir(self) -> Path:
        """Where the CRI bind-mounts pod network namespaces (netns_mounts_under_state_dir: the
        CRI plugin's own state dir)."""
        return self.state / "io.containerd.grpc.v1.cri" / "netns"

    @property
    def config(self) -> Path:
        return self.base / "config.toml"


def render_config(
    dirs: ContainerdDirs,
    *,
    sandbox_image: str,
    cni_bin_dir: Path,
    cni_conf_dir: Path,
    netns_under_state: bool = True,
) -> str:
    """config.toml (version 2) for a node of the test bed. Without `netns_under_state` pod
    netns go to containerd's own default, /var/run/netns (a platform layout's, see mountns.py)."""
    disabled = ", ".join(f'"{p}"' for p in DISABLED_PLUGINS)
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{dirs.root}"
state = "{dirs.state}"
disabled_plugins = [{disabled}]

[grpc]
  address = "{dirs.socket}"

[plugins."io.containerd.internal.v1.opt"]
  # default /opt/containerd: keep it under the test bed's dir
  path = "{dirs.base / "opt"}"

[{cri}]
  sandbox_image = "{sandbox_image}"
  # This machine withholds CAP_SYS_RESOURCE: without this runc fails every sandbox with
  # "can't get final child's PID from pipe: EOF" when it lowers oom_score_adj.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = {"true" if netns_under_state else "false"}
  # The kernel here has no AppArmor.
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[{cri}.registry]
  # hosts.toml per registry (testbed/registry.py trusts its own there); read at each pull.
  config_path = "{dirs.base / "certs.d"}"

[{cri}.cni]
  bin_dir = "{cni_bin_dir}"
  conf_dir = "{cni_conf_dir}"
  max_conf_num = 1

[{cri}.containerd]
  snapshotter = "{SNAPSHOTTER}"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  Root = "{dirs.runc_root}"
  SystemdCgroup = false
"""


class Containerd:
    """start() / stop(); `ctr()` runs the ctr CLI against this instance."""

    def __init__(
        self,
        dirs: ContainerdDirs,
        log_path: Path,
        *,
        prefix: list[str],
        sandbox_image: str,
        cni_bin_dir: Path,
        cni_conf_dir: Path,
    ) -> None:
        self.dirs = dirs
        self.binary, self.ctr_binary = self.binaries()
        self.prefix = prefix
        self.sandbox_image = sandbox_image
        self.cni_bin_dir = cni_bin_dir
        self.cni_conf_dir = cni_conf_dir
        self.netns_under_state = True
        self.daemon = Daemon("containerd", [], log_path)

    def binaries(self) -> tuple[Path, Path]:
        """(containerd, ctr), each checked there, as are the shim and runc it runs."""
        parts.debian_tool("runc", "runc").require()
        parts.debian_tool("containerd-shim-runc-v2", "containerd").require()
        return (
            parts.debian_tool("containerd", "containerd").require(),
            parts.debian_tool("ctr", "containerd").require(),
        )

    def render_config(self) -> str:
        return render_config(
            self.dirs,
            sandbox_image=self.sandbox_image,
            cni_bin_dir=self.cni_bin_dir,
            cni_conf_dir=self.cni_conf_dir,
            netns_under_state=self.netns_under_state,
        )

    def start(self, timeout: float = 60.0) -> None:
        for d in (self.dirs.root, self.dirs.state, self.dirs.runc_root):
            d.mkdir(parents=True, exist_ok=True)
        self.dirs.config.write_text(self.render_config())
        self.daemon.argv = [
            *self.prefix,
            str(self.binary),
            "--config",
            str(self.dirs.config),
            "--log-level",
            "info",
        ]
        self.daemon.start()
        deadline = time.monotonic() + timeout
        while True:
            if not self.daemon.alive():
                raise self.daemon.failure("exited at start")
            if self.dirs.socket.exists():
                done = self.ctr("plugins", "ls", check=False)
                if done.returncode == 0:
                    cri = [line for line in done.stdout.splitlines() if " cri " in line]
                    if cri and cri[0].split()[-1] == "ok":
                        if cri_answers(self.dirs.socket):
                            return
                    elif cri:
                        raise self.daemon.failure(f"loaded its CRI plugin with an error: {cri[0]}")
            if time.monotonic() > deadline:
                raise self.daemon.failure(f"did not serve its CRI plugin within {timeout}s")
            time.sleep(0.2)

    def stop(self) -> None:
        self.daemon.stop()

    def alive(self) -> bool:
        return self.daemon.alive()

    def ctr_argv(self, *args: str) -> list[str]:
        """The ctr command line for `args` against this instance, in the CRI's namespace."""
        # A stopped containerd fails at once instead of ctr waiting for it.
        argv = [str(self.ctr_binary), "--address", str(self.dirs.socket)]
        return [*argv, "--connect-timeout", "5s", "-n", NAMESPACE, *args]

    def ctr(
        self, *args: str, check: bool = True, timeout: float = 300.0
    ) -> subprocess.CompletedProcess[str]:
        argv = self.ctr_argv(*args)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}"
            )
        return done

    def import_image(self, archive: Path) -> None:
        """Load a docker-archive into the CRI's namespace, unpacked for its snapshotter."""
        self.ctr("images", "import", "--snapshotter", SNAPSHOTTER, str(archive))

    def sandbox_pid(self, pod_uid: str) -> int | None:
        """PID of the pause process of the pod's running sandbox (its netns is
        /proc/PID/ns/net), or None."""
        listed = self.ctr(
            "containers",
            "ls",
            "-q",
            f'labels."io.kubernetes.pod.uid"=={pod_uid},labels."io.cri-containerd.kind"==sandbox',
        )
        ids = set(listed.stdout.split())
        for line in self.ctr("tasks", "ls").stdout.splitlines()[1:]:
            task, pid, status = line.split()[:3]
            if task in ids and status == "RUNNING":
                return int(pid)
        return None

    def exec_argv(self, container_id: str, exec_id: str, *, cwd: str | None = None) -> list[str]:
        """`ctr tasks exec` into a running container (where `kubectl exec` ends): the command to
        put in front of the process's own; its stdio is the caller's."""
        where = [] if cwd is None else ["--cwd", cwd]
        return self.ctr_argv("tasks", "exec", "--exec-id", exec_id, *where, container_id)

    def running_container(self, pod_uid: str, name: str) -> tuple[str, int]:
        """(container id, pid) of the pod's running container `name`."""
        listed = self.ctr(
            "containers",
            "ls",
            "-q",
            f'labels."io.kubernetes.pod.uid"=={pod_uid},'
            f'labels."io.kubernetes.container.name"=={name}',
        )
        ids = set(listed.stdout.split())
        for line in self.ctr("tasks", "ls").stdout.splitlines()[1:]:
            task, pid, status = line.split()[:3]
            if task in ids and status == "RUNNING":
                return task, int(pid)
        raise AssertionError(f"no running container {name} of pod {pod_uid} in containerd")

    def container_spec(self, container_id: str) -> dict[str, Any]:
        """The OCI runtime spec of a container, as kubelet had the CRI make it (security
        context, mounts, environment)."""
        info = json.loads(self.ctr("containers", "info", container_id).stdout)
        return dict(info["Spec"])

    def images(self) -> set[str]:
        return set(self.ctr("images", "ls", "-q").stdout.split())

    def remove_image(self, ref: str) -> None:
        self.ctr("images", "rm", ref)


def cri_answers(socket: Path, timeout: float = 2.0) -> bool:
    """Whether the CRI on `socket` answers RuntimeService/Version. containerd lists its CRI
    plugin ok before the CRI server has loaded its state and serves; until then every call
    fails "server is not initialized", and a kubelet started then exits at its start."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        version = channel.unary_unary("/runtime.v1.RuntimeService/Version")
        try:
            version(b"", timeout=timeout)  # VersionRequest{} is no bytes
        except grpc.RpcError:
            return False
    return True
