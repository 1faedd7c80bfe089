"""Pods as network namespaces on one node bridge, meshed or not, for traffic through a real Envoy:
no kubelet, no API server.

A "node" netns holds a bridge; each pod is a netns with eth0 on it (a veth), an address of the
node's /24 and a default route via the bridge, as the reference bridge plugin leaves a pod. A
meshed pod gets what a sidecar pod gets on a node: the agent's rules, programmed by the code the
pod server runs for its ADD (agent.rules.sidecar.redirector.RulesRedirector with the agent's
default settings, decide then apply, from the pod's manifest and annotations), and a real Envoy
(testbed/envoy_proc.py) in the netns. Every pod runs an app (testbed/http_echo.py).

    with MeshBed() as bed:
        a = bed.pod("a", meshed=True); b = bed.pod("b", meshed=True)
        answer, local = bed.get(a, b.ip, APP_PORT)

Everything made is removed on close, also after a failure half way.
"""

from __future__ import annotations

import contextlib
import ctypes
import random
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from agent.config import Settings
from agent.netns import run_in_netns, setns_preexec
from agent.rules.sidecar.redirector import RulesRedirector
from testbed import netns
from testbed.envoy_proc import SidecarEnvoy, sidecar_envoy
from testbed.http_echo import get

APP_PORT = 8080
PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)
APP = Path(__file__).with_name("http_echo.py")
T = TypeVar("T")


def sidecar_manifest(name: str, ip: str, annotations: Mapping[str, str]) -> dict[str, Any]:
    """A pod as Istio's injector leaves it (an istio-proxy container, sidecar.istio.io/status)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "mesh",
            "uid": f"uid-{name}",
            "annotations": {
                "sidecar.istio.io/status": '{"containers":["istio-proxy"]}',
                **annotations,
            },
        },
        "spec": {
            "containers": [
                {"name": "app", "image": "registry.invalid/app:1"},
                {"name": "istio-proxy", "image": "registry.invalid/proxyv2:1"},
            ]
        },
        "status": {"podIP": ip, "podIPs": [{"ip": ip}]},
    }


@dataclass
class Pod:
    name: str
    netns_name: str
    ip: str
    app: subprocess.Popen[str] | None = None
    envoy: SidecarEnvoy | None = None
    manifest: dict[str, Any] | None = None

    @property
    def netns(self) -> str:
        return str(netns.NETNS_DIR / self.netns_name)

    @property
    def proxy(self) -> SidecarEnvoy:
        assert self.envoy is not None, f"pod {self.name} is not meshed"
        return self.envoy


@dataclass
class MeshBed:
    backend: str = field(default_factory=lambda: Settings().ruleBackend)
    node: str = field(default_factory=lambda: netns.unique_name("mesh-node"))
    subnet: str = field(default_factory=lambda: f"10.251.{random.randrange(1, 255)}")
    pods: list[Pod] = field(default_factory=list)
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    BRIDGE = "meshbr0"

    def __enter__(self) -> MeshBed:
        try:
            netns.add(self.node)
            self._stack.callback(netns.delete, self.node)
            netns.ip("link", "add", self.BRIDGE, "type", "bridge", netns=self.node)
            netns.ip("addr", "add", f"{self.subnet}.1/24", "dev", self.BRIDGE, netns=self.node)
            netns.ip("link", "set", self.BRIDGE, "up", netns=self.node)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Envoys and apps stopped, then every netns deleted (the veths go with them)."""
        self._stack.close()

    def pod(
        self,
        name: str,
        *,
        meshed: bool,
        annotations: Mapping[str, str] | None = None,
        ports: Sequence[int] = (APP_PORT,),
    ) -> Pod:
        """A pod with its app listening on `ports`; `meshed`: a sidecar pod (see capture)."""
        pod = Pod(name, netns.unique_name(f"mesh-{name}"), f"{self.subnet}.{len(self.pods) + 2}")
        netns.add(pod.netns_name)
        self._stack.callback(netns.delete, pod.netns_name)
        self.pods.append(pod)
        host_end = f"mv{pod.netns_name[-8:]}"
        netns.ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0",
                 "netns", pod.netns_name, netns=self.node)  # fmt: skip
        netns.ip("link", "set", host_end, "master", self.BRIDGE, "up", netns=self.node)
        netns.ip("addr", "add", f"{pod.ip}/24", "dev", "eth0", netns=pod.netns_name)
        netns.ip("link", "set", "eth0", "up", netns=pod.netns_name)
        netns.ip("route", "add", "default", "via", f"{self.subnet}.1", netns=pod.netns_name)
        pod.app = self._start_app(pod, ports)
        if meshed:
            self.capture(pod, annotations or {})
        return pod

    def capture(self, pod: Pod, annotations: Mapping[str, str]) -> None:
        """Make `pod` a sidecar pod: the agent's rules for its manifest, then its Envoy (TPROXY
        mode when the annotations ask for it, as the injector runs the proxy then)."""
        pod.manifest = sidecar_manifest(pod.name, pod.ip, annotations)
        redirector = RulesRedirector(
            exclude_namespaces=Settings().excludeNamespaces, backend=self.backend
        )
        decision = redirector.decide(pod.manifest)
        if not decision.redirect:
            raise AssertionError(f"the agent would not capture pod {pod.name}: {decision.reason}")
        redirector.apply(pod.netns, pod.manifest)
        tproxy = annotations.get("sidecar.istio.io/interceptionMode") == "TPROXY"
        pod.envoy = self._stack.enter_context(sidecar_envoy(pod.netns, tproxy=tproxy))

    def _start_app(self, pod: Pod, ports: Sequence[int]) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-I", str(APP), pod.name, *map(str, ports)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_in_netns_until_parent_dies(pod.netns),
        )
        self._stack.callback(_stop, proc)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            proc.kill()
            raise RuntimeError(f"app of pod {pod.name} did not start: {proc.communicate()[1]}")
        return proc

    def run(self, pod: Pod, fn: Callable[[], T]) -> T:
        """`fn()` on a thread inside the pod's netns: a connection it opens is the app's."""
        return run_in_netns(pod.netns, fn)

    def get(self, pod: Pod, host: str, port: int, path: str = "/") -> tuple[dict[str, Any], str]:
        """GET from `pod`: (the answering app's JSON, this connection's local address)."""
        return self.run(pod, lambda: get(host, port, path))


def _in_netns_until_parent_dies(path: str) -> Callable[[], None]:
    """preexec_fn: into the netns; killed with the test process even if it dies uncleanly."""
    enter = setns_preexec(path)

    def preexec() -> None:
        enter()
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return preexec


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.communicate()
