"""Helpers of the plugin tests: run the dispatcher in-process, and an agent test double.

The agent is built separately; where a test needs one it gets `AgentTestDouble`, a real HTTP/1.1
server on a real Unix socket that answers what the test tells it and records what it received.
"""

from __future__ import annotations

import io
import json
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from plugin.commands import Plugin
from plugin.skel import dispatch

VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
LEGACY_VERSIONS = ("0.1.0", "0.2.0")
"""Results with ip4/ip6 instead of ips[] (no interfaces)."""
POD_ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=app-1;K8S_POD_UID=uid-1"


class Run:
    """Exit code, parsed stdout (None when empty) and stderr text of one plugin invocation."""

    def __init__(self, code: int, stdout: str, stderr: str) -> None:
        self.code = code
        self.raw = stdout
        self.out: Any = json.loads(stdout) if stdout.strip() else None
        self.err = stderr


def run_plugin(env: dict[str, str], stdin: bytes | str | dict[str, Any]) -> Run:
    """Invoke the plugin as the runtime would, without a process."""
    if isinstance(stdin, dict):
        stdin = json.dumps(stdin)
    if isinstance(stdin, str):
        stdin = stdin.encode()
    out, err = io.StringIO(), io.StringIO()
    code = dispatch(
        Plugin(stderr=err).commands(), environ=env, stdin=io.BytesIO(stdin), stdout=out, stderr=err
    )
    return Run(code, out.getvalue(), err.getvalue())


def cni_env(command: str, **extra: str) -> dict[str, str]:
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": "c0ffee",
        "CNI_NETNS": "/var/run/netns/x",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": "/opt/cni/bin",
        "CNI_ARGS": POD_ARGS,
    }
    env.update(extra)
    return env


def result_for(version: str) -> dict[str, Any]:
    """A bridge-like result in the shape of `version`."""
    if version in LEGACY_VERSIONS:
        return {
            "cniVersion": version,
            "ip4": {
                "ip": "10.1.0.5/24",
                "gateway": "10.1.0.1",
                "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}],
            },
            "ip6": {"ip": "fd00::5/64", "gateway": "fd00::1"},
            "dns": {"nameservers": ["10.96.0.10"]},
        }
    ips: list[dict[str, Any]] = [
        {"address": "10.1.0.5/24", "gateway": "10.1.0.1", "interface": 2},
        {"address": "fd00::5/64", "gateway": "fd00::1", "interface": 2},
    ]
    if version.startswith("0."):
        ips[0]["version"], ips[1]["version"] = "4", "6"
    return {
        "cniVersion": version,
        "interfaces": [
            {"name": "cni0", "mac": "aa:bb:cc:dd:ee:01"},
            {"name": "veth1", "mac": "aa:bb:cc:dd:ee:02"},
            {"name": "eth0", "mac": "aa:bb:cc:dd:ee:03", "sandbox": "/var/run/netns/x"},
        ],
        "ips": ips,
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}],
        "dns": {"nameservers": ["10.96.0.10"]},
    }


def net_conf(version: str = "1.0.0", run_dir: str = "/nonexistent", **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "cniVersion": version,
        "name": "k8s-pod-network",
        "type": "istio-cni",
        "plugin_log_level": "debug",
        "cni_agent_run_dir": run_dir,
        "exclude_namespaces": ["istio-system", "kube-system"],
        "pod_namespace": "istio-system",
        "agent_pod_prefix": "istio-cni-node-",
        "prevResult": result_for(version),
    }
    conf.update(extra)
    return conf


class Answer:
    """What the double answers on one path: status, raw body, and a delay before answering."""

    def __init__(self, status: int, body: bytes | dict[str, Any], delay: float = 0.0) -> None:
        self.status = status
        self.body = json.dumps(body).encode() if isinstance(body, dict) else body
        self.delay = delay


class AgentTestDouble:
    """A real HTTP/1.1 server on `<run_dir>/pluginevent.sock` standing in for the agent."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.requests: list[tuple[str, str, Any]] = []
        self.arrivals: list[float] = []
        """CLOCK_BOOTTIME when each request's body was read."""
        self.answers: dict[str, Answer] = {
            "/v1/cni/add": Answer(200, {"result": "redirected", "reason": "sidecar"}),
            "/v1/cni/check": Answer(200, {"result": "redirected", "reason": "rules present"}),
            "/v1/cni/del": Answer(200, {"result": "skipped", "reason": "nothing kept"}),
            "/v1/cni/gc": Answer(200, {"result": "skipped", "reason": "gc"}),
            "/v1/status": Answer(200, {"ready": True}),
            "/v1/log": Answer(200, {"result": "skipped", "reason": "logged"}),
        }
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                double.arrivals.append(time.clock_gettime(time.CLOCK_BOOTTIME))
                double.requests.append((self.command, self.path, json.loads(raw) if raw else None))
                answer = double.answers.get(self.path, Answer(404, {"code": 999, "msg": "?"}))
                time.sleep(answer.delay)  # a slow agent, injected on purpose
                try:
                    self.send_response(answer.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(answer.body)))
                    self.end_headers()
                    self.wfile.write(answer.body)
                except OSError:
                    pass  # the plugin hung up first (timeout, body limit): that is the point

            do_GET = do_POST = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True
            request_queue_size = 128

        self.server = Server(str(run_dir / "pluginevent.sock"), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def paths(self) -> list[str]:
        return [path for _, path, _ in self.requests if path != "/v1/log"]

    def logs(self) -> list[Any]:
        return [body for _, path, body in self.requests if path == "/v1/log"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
