"""The real agent on the real node while its API server fails, one fault after another, pods
starting meanwhile. The agent reaches the API server as on a real node (the `kubernetes`
Service's ClusterIP from its host network), here through the test bed's fault proxy
(testbed/apifaults.py); kubelet and the test reach the API server directly.

For each fault (latency, 429 with Retry-After, 401, 503, resets, silence, 410 on resume, etcd
stopped): a sidecar pod created just before it and one during it. Checked, each fault:
- no uninstall: the node's conflist holds the agent's entry at every sample (every 0.5 s);
- no pod uncaptured: both pods end Running with Istio's rules in their network namespace (the
  ADD was served from the cache, or failed closed and succeeded once the API server was back);
- the agent's request rate through the proxy during the fault stays within its own token bucket
  (the chart's kubeApi.qps and burst: no retry storm);
- the pods reach Running within a bound after the fault ends;
- the agent never restarted;
and once the faults are over, a last blip (every connection reset for 10 s) and `helm uninstall`
3 s after it: the uninstall is still heard and removes the entry.
The figures (requests per minute before and during each fault, time to converge) are printed as
a table; bench/README.md ("API server faults on the real node") keeps them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from testbed import chart as agent_mod
from testbed import kubepods, podnet
from testbed.apifaults import ApiFaultProxy, Fault
from testbed.controlplane import SERVICE_IP
from testbed.images import Image
from testbed.nodenet import iptables
from testbed.realnode import RealCluster

pytestmark = [pytest.mark.kubefaults]

FAULT_SECONDS = 20.0
ETCD_SECONDS = 60.0
CONVERGE_TIMEOUT = 90.0
"""From the fault's end to both pods Running: kubelet's sandbox retry back-off (up to ~40 s after
several refusals) plus the agent's reconnect back-off."""
QPS, BURST = 5, 10
"""The chart's kubeApi defaults (client-go's)."""
SAMPLE_SECONDS = 0.5
BLIP_SECONDS = 10.0
"""Resets in a row long enough for a doubling back-off to reach 8 s."""
UNINSTALL_AFTER_BLIP_SECONDS = 3.0
LOOP = ["connect-loop", "203.0.113.10", "80", "1"]


@dataclass
class FaultResult:
    name: str
    requests_per_minute_before: float = 0.0
    requests_per_minute_during: float = 0.0
    converge_seconds: float = 0.0
    pods: list[str] = field(default_factory=list)


@contextlib.contextmanager
def agent_through_proxy(cluster: RealCluster, workdir: Any) -> Iterator[ApiFaultProxy]:
    """The proxy on the API server's address, and the node's Service DNAT pointed at it (first
    in the chain) for as long as the test runs."""
    plane = cluster.plane
    assert plane is not None and plane.ca is not None
    proxy = ApiFaultProxy(
        workdir, plane.ca, (plane.address, plane.port), plane.address, (SERVICE_IP,)
    )
    rule = [
        "-d", f"{SERVICE_IP}/32", "-p", "tcp", "--dport", "443",
        "-j", "DNAT", "--to-destination", f"{proxy.address}:{proxy.port}",
    ]  # fmt: skip
    ns = cluster.network.netns_name
    with proxy:
        iptables(ns, "-t", "nat", "-I", "OUTPUT", "1", *rule)
        try:
            yield proxy
        finally:
            iptables(ns, "-t", "nat", "-D", "OUTPUT", *rule)


@contextlib.contextmanager
def following_log(core: Any, pod: str) -> Iterator[list[str]]:
    """The agent container's log lines from now on, streamed until its end (the pod stopped) or
    the block's end plus a few seconds: the agent's stop decision outlives its pod this way."""
    lines: list[str] = []
    response = core.read_namespaced_pod_log(
        pod,
        agent_mod.AGENT_NAMESPACE,
        container=agent_mod.AGENT_CONTAINER,
        follow=True,
        since_seconds=1,
        _preload_content=False,
    )

    def read() -> None:
        with contextlib.suppress(Exception):  # the stream ends as the pod goes
            for line in response.stream():
                lines.extend(line.decode(errors="replace").splitlines())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield lines
    finally:
        reader.join(5)
        response.release_conn()


class EntryWatch:
    """Samples the node's conflist: every sample must hold the agent's plugin entry."""

    def __init__(self, cluster: RealCluster) -> None:
        self.cluster = cluster
        self.missing: list[str] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self.samples += 1
            try:
                types = agent_mod.plugin_types(self.cluster)
            except (OSError, ValueError) as e:
                self.missing.append(f"{time.strftime('%H:%M:%S')} unreadable: {e}")
                continue
            if "istio-cni" not in types:
                self.missing.append(f"{time.strftime('%H:%M:%S')} plugins {types}")

    def __enter__(self) -> EntryWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


@contextlib.contextmanager
def etcd_stopped(cluster: RealCluster) -> Iterator[None]:
    """etcd frozen (SIGSTOP): the API server stays up and answers nothing that needs storage."""
    plane = cluster.plane
    assert plane is not None
    etcd = next(d for d in plane.daemons if d.name == "etcd")
    assert etcd.pid is not None
    os.killpg(etcd.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(etcd.pid, signal.SIGCONT)


def proxied(
    proxy: ApiFaultProxy, fault: Fault
) -> Callable[[], contextlib.AbstractContextManager[None]]:
    return lambda: proxy.faulted(fault)


def faults(
    proxy: ApiFaultProxy, cluster: RealCluster
) -> list[tuple[str, Callable[[], Any], float]]:
    return [
        ("latency 3 s", proxied(proxy, Fault("latency", seconds=3)), FAULT_SECONDS),
        ("429 Retry-After 5", proxied(proxy, Fault("status", code=429, retry_after=5)),
         FAULT_SECONDS),
        ("401", proxied(proxy, Fault("status", code=401)), FAULT_SECONDS),
        ("503", proxied(proxy, Fault("status", code=503)), FAULT_SECONDS),
        ("connections reset", proxied(proxy, Fault("reset")), FAULT_SECONDS),
        ("silence", proxied(proxy, Fault("silence")), FAULT_SECONDS),
        ("410 on resume", proxied(proxy, Fault("gone_on_resume")), FAULT_SECONDS),
        ("etcd stopped", lambda: etcd_stopped(cluster), ETCD_SECONDS),
    ]  # fmt: skip


def per_minute(proxy: ApiFaultProxy, start: float, end: float) -> float:
    return len(proxy.seen_between(start, end)) * 60.0 / max(end - start, 1e-3)


def captured(cluster: RealCluster, core: Any, ns: str, name: str, timeout: float) -> None:
    view = kubepods.wait_running(core, ns, name, timeout=timeout, ready=False)
    netns = cluster.pod_netns(view.uid)
    assert podnet.has_istio_rules(netns), f"{ns}/{name} runs without Istio's rules"


@pytest.mark.timeout(1800)
def test_api_server_faults_keep_the_plugin_and_capture_every_pod(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
    tmp_path: Any,
) -> None:
    image = real_cluster.images["workload"].ref
    results: list[FaultResult] = []
    with contextlib.ExitStack() as stack:
        proxy = stack.enter_context(agent_through_proxy(real_cluster, tmp_path / "proxy"))
        helm = node_helm("4")
        agent = agent_mod.install(helm, real_cluster, node_core, agent_image)
        assert proxy.requests, "the agent's requests do not go through the fault proxy"
        entry = stack.enter_context(EntryWatch(real_cluster))
        for index, (name, make_fault, seconds) in enumerate(faults(proxy, real_cluster)):
            result = FaultResult(name)
            quiet_start = time.monotonic()
            time.sleep(5)
            result.requests_per_minute_before = per_minute(proxy, quiet_start, time.monotonic())
            before, during = f"before-{index}", f"during-{index}"
            node_core.create_namespaced_pod(
                workload_ns, kubepods.pod_manifest(before, image, app_command=LOOP, sidecar=True)
            )
            with make_fault():
                began = time.monotonic()
                if name != "etcd stopped":  # nothing can be created while etcd is frozen
                    time.sleep(2)
                    node_core.create_namespaced_pod(
                        workload_ns,
                        kubepods.pod_manifest(during, image, app_command=LOOP, sidecar=True),
                    )
                    result.pods.append(during)
                time.sleep(max(0.0, seconds - (time.monotonic() - began)))
                ended = time.monotonic()
            result.requests_per_minute_during = per_minute(proxy, began, ended)
            result.pods.insert(0, before)
            for pod in result.pods:
                captured(real_cluster, node_core, workload_ns, pod, CONVERGE_TIMEOUT)
            result.converge_seconds = time.monotonic() - ended
            results.append(result)
        agent_now = kubepods.pod_view(node_core, agent_mod.AGENT_NAMESPACE, agent.pod.name)
        entry.__exit__()
        # The faults over, a blip just before the uninstall: every connection of the agent reset
        # for BLIP_SECONDS (each retry fails, the back-off grows); `helm uninstall` a few
        # seconds after it must still be heard (through the proxy, as before), though the
        # ServiceAccount and RBAC go with the DaemonSet (agent.pods.own_daemonset).
        with proxy.faulted(Fault("reset")):
            time.sleep(BLIP_SECONDS)
        time.sleep(UNINSTALL_AFTER_BLIP_SECONDS)
        with following_log(node_core, agent.pod.name) as log:
            agent_mod.uninstall(helm, node_core)
        decided = [line for line in log if "keeping the plugin" in line or "uninstalling" in line]
        assert "istio-cni" not in agent_mod.plugin_types(real_cluster), decided or log[-20:]
    print("\nfault                  req/min before  req/min during  converged (s)  pods")
    for r in results:
        print(
            f"{r.name:<22} {r.requests_per_minute_before:>14.1f} "
            f"{r.requests_per_minute_during:>15.1f} {r.converge_seconds:>14.1f}  {len(r.pods)}"
        )
    assert entry.samples > 100 and entry.missing == [], entry.missing[:5]
    storm = [r for r in results if r.requests_per_minute_during > (QPS * 60 + BURST)]
    assert storm == [], storm
    assert agent_now is not None, "the agent pod was replaced"
    assert all(c["restarts"] == 0 for c in agent_now.containers.values()), agent_now
