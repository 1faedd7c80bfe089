"""The agent run as the DaemonSet runs it, on this machine, for one simulated node.

The chart mounts the node's dirs into the agent container at fixed paths (`/host/opt/cni/bin`,
`/host/etc/cni/net.d`, `/host/proc`, `/host/var/run/netns`) and the image holds the plugin build
at `/opt/istio-cni/bin`. To run the agent with exactly the rendered `config.yaml`, it starts in
its own mount namespace where those paths are bind mounts of the test node's dirs, the plugin
build and the machine's /proc and netns dir. Propagation is `slave`, like the chart's
HostToContainer: pod namespaces created later on the machine appear inside; nothing mounted
inside leaks out. Its environment is the DaemonSet's: NODE_NAME, POD_NAME, POD_NAMESPACE from the
downward API, and a kubeconfig holding a token of the chart's ServiceAccount.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from testbed.process import pid_alive

REPO_ROOT = Path(__file__).resolve().parents[1]
HOST_ROOT = Path("/host")
IMAGE_PLUGIN_DIR = "/opt/istio-cni/bin"


@dataclass(frozen=True)
class NodeDirs:
    """Node paths the DaemonSet would mount: what the container runtime and plugin see."""

    cni_bin_dir: Path
    cni_conf_dir: Path
    netns_dir: Path = Path("/var/run/netns")


class DaemonAgent:
    """One `istio-cni-agent run` process; `stop()` sends SIGTERM as the kubelet does."""

    def __init__(self, proc: subprocess.Popen[bytes], log_path: Path, metrics_port: int) -> None:
        self.proc = proc
        self.log_path = log_path
        self.metrics_port = metrics_port
        self.token = ""
        """The ServiceAccount token the agent holds (set by the harness)."""

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, path: str) -> tuple[int, str]:
        url = f"http://127.0.0.1:{self.metrics_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"agent exited {self.proc.returncode}:\n{self.logs()}")
            try:
                if self.get("/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"agent not ready on /readyz within {timeout}s:\n{self.logs()}")

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait; the exit code. Kills (and fails) if it does not end in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"agent ignored SIGTERM for {timeout}s:\n{self.logs()}") from None


def start_daemon_agent(
    *,
    config_yaml: str,
    node: NodeDirs,
    plugin_build: Path,
    kubeconfig: Path,
    node_name: str,
    pod_name: str,
    pod_namespace: str,
    workdir: Path,
) -> DaemonAgent:
    """Start the agent with the ConfigMap's `config.yaml` as the DaemonSet pod would."""
    settings = yaml.safe_load(config_yaml) or {}
    workdir.mkdir(parents=True, exist_ok=True)
    config_path = workdir / "config.yaml"
    config_path.write_text(config_yaml)
    _claim_host_root()
    binds = [
        (node.cni_bin_dir, settings.get("mountedCniBinDir", "/host/opt/cni/bin")),
        (node.cni_conf_dir, settings.get("mountedCniConfDir", "/host/etc/cni/net.d")),
        (Path("/proc"), settings.get("hostProcDir", "/host/proc")),
        (node.netns_dir, settings.get("mountedNetnsDir", "/host/var/run/netns")),
    ]
    node.netns_dir.mkdir(parents=True, exist_ok=True)
    script = ["set -e", f"mount -t tmpfs istio-cni-host {HOST_ROOT}"]
    for source, target in binds:
        script += [
            f"mkdir -p {shlex.quote(target)}",
            f"mount --rbind {shlex.quote(str(source))} {shlex.quote(target)}",
        ]
    plugin_dir = settings.get("pluginSourceDir", IMAGE_PLUGIN_DIR)
    # The image's plugin dir: a tmpfs over its top-level dir holds only the build.
    top = "/" + Path(plugin_dir).parts[1]
    script += [
        f"mount -t tmpfs istio-cni-image {top}",
        f"mkdir -p {shlex.quote(plugin_dir)}",
        f"mount --bind {shlex.quote(str(plugin_build))} {shlex.quote(plugin_dir)}",
    ]
    agent = [sys.executable, "-m", "agent.cli", "run", "--config", str(config_path)]
    script.append("exec " + shlex.join(agent))
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "PYTHONPATH": str(REPO_ROOT),
        "NODE_NAME": node_name,
        "POD_NAME": pod_name,
        "POD_NAMESPACE": pod_namespace,
        "KUBECONFIG": str(kubeconfig),
    }
    log_path = workdir / "agent.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "slave", "--", "bash", "-c", "\n".join(script)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
        )
    return DaemonAgent(proc, log_path, int(settings.get("metricsPort", 15014)))


# /host is one directory of the machine that every test process running agents shares (the
# mounts under it live in each agent's own mount namespace). Removing it detaches those mounts in
# every namespace, so it is removed only by the last process using it: each user holds a file
# here, changed under an flock.
HOST_USERS = Path("/run/istio-cni-e2e-host")
_claimed: list[Path] = []


@contextlib.contextmanager
def _host_lock() -> Iterator[None]:
    while True:
        HOST_USERS.mkdir(exist_ok=True)
        fd = os.open(HOST_USERS / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.stat(HOST_USERS / ".lock").st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False  # the last user removed the dir meanwhile: take a fresh lock
            if same:
                yield
                return
        finally:
            os.close(fd)


def _claim_host_root() -> None:
    if _claimed:
        return
    with _host_lock():
        if not HOST_ROOT.exists():
            HOST_ROOT.mkdir()  # a mount point only; the last user removes it again
            (HOST_USERS / "created").touch()
        user = HOST_USERS / f"user-{os.getpid()}"
        user.touch()
        _claimed.append(user)


def cleanup_host_root() -> None:
    """Give up this process's use of /host; the last user removes it if a user made it."""
    if not _claimed:
        return
    with _host_lock():
        _claimed.pop().unlink(missing_ok=True)
        others = False
        for user in HOST_USERS.glob("user-*"):
            if pid_alive(int(user.name.removeprefix("user-"))):
                others = True
            else:
                user.unlink(missing_ok=True)  # a process that died without cleaning up
        if others:
            return
        if (HOST_USERS / "created").exists():
            with contextlib.suppress(OSError):
                HOST_ROOT.rmdir()
            (HOST_USERS / "created").unlink(missing_ok=True)
        (HOST_USERS / ".lock").unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            HOST_USERS.rmdir()
