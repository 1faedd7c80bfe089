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
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
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
    if not HOST_ROOT.exists():
        HOST_ROOT.mkdir()  # a mount point only; cleanup_host_root() removes it again
        _created_host_root.append(HOST_ROOT)
    binds = [
        (node.cni_bin_dir, settings.get("mountedCniBinDir", "/host/opt/cni/bin")),
        (node.cni_conf_dir, settings.get("mountedCniConfDir", "/host/etc/cni/net.d")),
        (Path("/proc"), settings.get("hostProcDir", "/host/proc")),
        (node.netns_dir, settings.get("mountedNetnsDir", "/host/var/run/netns")),
    ]
    node.netns_dir.mkdir(parents=True, exist_ok=True)
    script = ["set -e", f"mount -t tmpfs istio-cni-host {HOST_ROOT}"]
    for source, target in binds:
        script += [f"mkdir -p {shlex.quote(target)}",
                   f"mount --rbind {shlex.quote(str(source))} {shlex.quote(target)}"]
    plugin_dir = settings.get("pluginSourceDir", IMAGE_PLUGIN_DIR)
    # The image's plugin dir: a tmpfs over its top-level dir holds only the build.
    top = "/" + Path(plugin_dir).parts[1]
    script += [f"mount -t tmpfs istio-cni-image {top}", f"mkdir -p {shlex.quote(plugin_dir)}",
               f"mount --bind {shlex.quote(str(plugin_build))} {shlex.quote(plugin_dir)}"]
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
            ["unshare", "--mount", "--propagation", "slave", "--", "bash", "-c",
             "\n".join(script)],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
        )
    return DaemonAgent(proc, log_path, int(settings.get("metricsPort", 15014)))


_created_host_root: list[Path] = []


def cleanup_host_root() -> None:
    """Remove the /host mount point if we made it (it stays empty: mounts live inside)."""
    while _created_host_root:
        with contextlib.suppress(OSError):
            _created_host_root.pop().rmdir()
