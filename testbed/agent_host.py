"""The agent as a host process over a node's CNI dirs in a temp dir: for tests and benchmarks.

`make_node` lays out the bin, conf and plugin source dirs (a tiny shell plugin stands in for the
built one); `running_agent` starts `istio-cni-agent` against them with an API server that cannot
be reached unless the caller names one; `http_get`/`wait_status` talk to its HTTP port.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import yaml

from agent.config import Settings
from testbed.parts import REPO_ROOT
from testbed.ports import free_port
from testbed.wait import wait_for

PLUGIN_SCRIPT = '#!/bin/sh\n# test plugin {version}\necho \'{{"cniVersion":"1.0.0"}}\'\n'
"""Stands in for the built plugin: a real executable the tests exec."""


@dataclass
class Node:
    root: pathlib.Path
    bin_dir: pathlib.Path
    conf_dir: pathlib.Path
    src_dir: pathlib.Path
    settings: Settings

    def write_primary(self, config: Mapping[str, Any], name: str = "10-net.conflist") -> None:
        """The primary CNI's config, and its plugins in the bin dir (empty stubs), as the
        primary's installer leaves a node (the agent's cni-bin-dir check looks for them)."""
        (self.conf_dir / name).write_text(json.dumps(config))
        for plugin in config.get("plugins") or [config]:
            (self.bin_dir / str(plugin["type"])).touch()

    def with_settings(self, **overrides: Any) -> Settings:
        self.settings = replace(self.settings, **overrides)
        return self.settings

    def write_config_yaml(self, **overrides: Any) -> pathlib.Path:
        """config.yaml for a subprocess agent: these dirs plus `overrides`."""
        data: dict[str, Any] = {
            "mountedCniBinDir": str(self.bin_dir),
            "mountedCniConfDir": str(self.conf_dir),
            "pluginSourceDir": str(self.src_dir),
            "metricsAddress": "127.0.0.1",
            "cniAgentRunDir": str(self.root / "run"),
            # The node's netns dir: empty, as on a node with no pod yet.
            "cniNetnsDir": str(self.root / "netns"),
        }
        (self.root / "netns").mkdir(exist_ok=True)
        for key, value in vars(self.settings).items():
            if key in (
                "cniConfFileName",
                "chained",
                "istioOwnedCNIConfig",
                "istioOwnedCNIConfigFileName",
                "logLevel",
                "uninstallOnStop",
            ):
                data[key] = value
        data.update(overrides)
        path = self.root / "config.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    def conf(self, name: str) -> dict[str, Any]:
        value: dict[str, Any] = json.loads((self.conf_dir / name).read_text())
        return value


def write_plugin(src_dir: pathlib.Path, version: str = "1") -> None:
    src_dir.mkdir(parents=True, exist_ok=True)
    plugin = src_dir / "istio-cni"
    plugin.write_text(PLUGIN_SCRIPT.format(version=version))
    plugin.chmod(0o755)


def make_node(tmp_path: pathlib.Path) -> Node:
    """A node's CNI bin and conf dirs and a plugin source dir under `tmp_path`, with settings."""
    bin_dir, conf_dir, src_dir = tmp_path / "bin", tmp_path / "conf", tmp_path / "src"
    bin_dir.mkdir()
    conf_dir.mkdir()
    write_plugin(src_dir)
    settings = Settings(
        mountedCniBinDir=str(bin_dir),
        mountedCniConfDir=str(conf_dir),
        pluginSourceDir=str(src_dir),
        metricsAddress="127.0.0.1",
        cniAgentRunDir=str(tmp_path / "run"),
        mountedCniCacheDir=str(tmp_path / "cni-cache"),
    )
    return Node(tmp_path, bin_dir, conf_dir, src_dir, settings)


def http_get(port: int, path: str) -> tuple[int, str]:
    """GET on the agent's HTTP port over loopback: (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def agent_command(*args: str) -> list[str]:
    """The agent CLI as a subprocess of this interpreter (the console script's entry point)."""
    return [sys.executable, "-m", "agent.cli", *args]


UNREACHABLE_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:%d", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: not-a-token}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


def unreachable_kubeconfig() -> str:
    """A kubeconfig naming a closed loopback port: the agent runs with no API server to reach.

    Installer tests exercise files and signals only; lookups fail (retryable) and the stop
    policy keeps the install, as it must when the API cannot be asked.
    """
    path = pathlib.Path(tempfile.gettempdir()) / f"istio-cni-test-{os.getpid()}.kubeconfig"
    if not path.exists():
        path.write_text(UNREACHABLE_KUBECONFIG % free_port())
        atexit.register(path.unlink, missing_ok=True)
    return str(path)


def agent_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env.update(
        {
            "POD_NAME": "istio-cni-node-x",
            "POD_NAMESPACE": "istio-system",
            "NODE_NAME": "node-x",
            "KUBECONFIG": unreachable_kubeconfig(),
        }
    )
    env["PYTHONPATH"] = str(REPO_ROOT)
    env.update(extra)
    return env


def wait_status(port: int, path: str, status: int, timeout: float = 10.0) -> str:
    """Poll GET `path` on the agent's HTTP port until it answers `status`; the body."""
    last: list[object] = [None]

    def answered() -> tuple[str] | None:
        try:
            code, body = http_get(port, path)
        except OSError as e:
            last[0] = e
            return None
        last[0] = (code, body)
        return (body,) if code == status else None  # a tuple: an empty body is an answer too

    return wait_for(
        answered,
        f"{path} on port {port} to return {status}",
        timeout,
        interval=0.05,
        on_timeout=lambda: f"last: {last[0]!r}",
    )[0]


def check_passes(port: int, check: str) -> bool:
    """Whether the agent's readiness check `check` passes (istio_cni_ready_check on /metrics)."""
    return f'istio_cni_ready_check{{check="{check}"}} 1.0' in http_get(port, "/metrics")[1]


def wait_checks(port: int, *checks: str, timeout: float = 10.0) -> None:
    """Wait until each named readiness check passes: for agents whose other checks cannot pass
    where they run (a host process has no reachable API server, and no root without `netns`)."""

    def passed() -> bool:
        try:
            return all(check_passes(port, c) for c in checks)
        except OSError:
            return False

    def last() -> str:
        try:
            return http_get(port, "/readyz")[1]
        except OSError as e:
            return str(e)

    wait_for(
        passed,
        f"readiness checks {', '.join(checks)} on port {port}",
        timeout,
        interval=0.05,
        on_timeout=last,
    )


def wait_installed(port: int, timeout: float = 10.0) -> None:
    """The agent installed the plugin and its entry and serves the plugin's socket."""
    wait_checks(port, "install", "pod-socket", timeout=timeout)


class RunningAgent:
    """An agent process started by `running_agent`, its output in the file `log`."""

    def __init__(self, proc: subprocess.Popen[bytes], log: pathlib.Path) -> None:
        self.proc = proc
        self.log = log

    def stop(self) -> tuple[int, str]:
        """SIGTERM, wait for the exit: (exit code, the whole log)."""
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=30)
        return code, self.log.read_text()


@contextlib.contextmanager
def running_agent(command: list[str], **env: str) -> Iterator[RunningAgent]:
    """Run `command` (an agent) with `agent_env(**env)`; killed on the way out if still running."""
    with tempfile.TemporaryDirectory() as tmp:
        log = pathlib.Path(tmp) / "agent.log"
        with open(log, "wb") as out:  # a file, not a pipe: nobody reads while it runs
            proc = subprocess.Popen(command, env=agent_env(**env), stdout=out, stderr=out)
        try:
            yield RunningAgent(proc, log)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
