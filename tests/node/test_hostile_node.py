"""A hostile peer on the kubelet's node: with the chart's agent running (hostNetwork, port 15014 on
the node's address, its pod socket under the node's run dir), processes of a hostNetwork pod
(so from the node's own address, kubelet's, and in a pod's cgroup) flood every door the node
reaches (idle connections and a slowloris on the HTTP port, idle connections past the pod
socket's cap, pipelined requests and a Content-Length past Python's integer limit on both; then,
alone, the Go flooder's pipelined /healthz as fast as the machine sends) while kubelet starts
sidecar pods. Every pod starts (no FailedCreatePodSandBox) captured, the agent's container never
restarts, no handshake is dropped at the agent's full accept queue, /healthz is answered 200
within kubelet's 1 s to a node process on the node's address throughout (and kubelet's own probes
never fail), and every ADD, by the agent's own istio_cni_add_duration_seconds, finishes within
1 s (its p50/p99 are printed; the latency rule is the netns bed's). Figures: bench/README "the
hostile peer on the kubelet node"."""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.netns import run_in_netns
from agent.serving import limits
from plugin import wire
from plugin.config import DEFAULT_TIMEOUT
from testbed import chart as agent_mod
from testbed import kubepods, parts, podnet
from testbed.flood import REPO_ROOT, Flood
from testbed.images import Image
from testbed.realnode import RealCluster

pytestmark = [pytest.mark.node, pytest.mark.hostile]

PORT = 15014  # the chart's default metricsPort, on the node's address
PODS = 12
"""Pods started quiet, and as many again under the flood."""
PROBE_EVERY = 0.2
PROBE_BOUND = 1.0  # kubelet's default probe timeout (the chart allows more)
PIPELINED = 400
DIGITS = 4400
ADD_BOUND_S = 1.0
"""Every ADD finishes within this (a bucket bound of istio_cni_add_duration_seconds)."""
assert ADD_BOUND_S * 10 <= DEFAULT_TIMEOUT
LORIS_HELD = limits.HTTP.request_timeout + 1.5
"""The flood lasts at least this long: a slowloris connection's timeout, and a sweep."""


@dataclass
class Prober:
    """GET /healthz on the node's address from the node's network namespace, as kubelet
    probes, every PROBE_EVERY seconds until stopped: (status or the error, seconds) each."""

    netns: str
    host: str
    samples: list[tuple[int | str, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _probe(self) -> tuple[int | str, float]:
        began = time.monotonic()
        conn = http.client.HTTPConnection(self.host, PORT, timeout=5)
        try:
            conn.request("GET", "/healthz")
            status: int | str = conn.getresponse().status
        except OSError as e:
            status = type(e).__name__
        finally:
            conn.close()
        return status, time.monotonic() - began

    def _loop(self) -> None:
        while not self._stop.wait(PROBE_EVERY):
            self.samples.append(self._probe())

    def __enter__(self) -> Prober:
        self._thread = threading.Thread(
            target=run_in_netns, args=(self.netns, self._loop), name="healthz-prober", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def bad(self) -> list[tuple[int | str, float]]:
        return [(s, t) for s, t in self.samples if s != 200 or t > PROBE_BOUND]


def listen_drops(netns: str) -> int:
    """The node's TcpExtListenDrops: handshakes dropped because a listener's accept queue was
    full (the peer retries after TCP's 1 s retransmit timeout)."""

    def read() -> str:
        with open("/proc/thread-self/net/netstat", encoding="ascii") as f:
            return f.read()

    lines = [line.split() for line in run_in_netns(netns, read).splitlines()]
    for names, values in zip(lines[::2], lines[1::2], strict=True):
        if names[0] == "TcpExt:":
            return int(values[names.index("ListenDrops")])
    raise AssertionError("no TcpExt line in the node's /proc/net/netstat")


def add_buckets(cluster: RealCluster) -> dict[float, float]:
    """istio_cni_add_duration_seconds{mode="sidecar",result="ok"}: upper bound -> count."""

    def scrape() -> str:
        conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=10)  # a scraper's address
        try:
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            assert response.status == 200, response.status
            return response.read().decode()
        finally:
            conn.close()

    text = run_in_netns(cluster.network.netns_path, scrape)
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "istio_cni_add_duration_seconds":
            continue
        for sample in family.samples:
            labels = sample.labels
            ours = labels.get("mode") == "sidecar" and labels.get("result") == "ok"
            if sample.name.endswith("_bucket") and ours:
                buckets[float(labels["le"])] = sample.value
    return buckets


def quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus' histogram_quantile of cumulative `buckets` (linear within a bucket), ms."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    assert total > 0, buckets
    rank, lower, below = q * total, 0.0, 0.0
    for bound in bounds:
        if buckets[bound] >= rank:
            if bound == float("inf"):
                return lower * 1000
            width = buckets[bound] - below
            return 1000 * (lower + (bound - lower) * (rank - below) / width)
        lower, below = bound, buckets[bound]
    return lower * 1000


def since(after: dict[float, float], before: dict[float, float]) -> dict[float, float]:
    return {le: n - before.get(le, 0.0) for le, n in after.items()}


def start_pods(
    core: Any, ns: str, image: str, prefix: str, count: int = PODS
) -> list[kubepods.PodView]:
    """`count` sidecar pods created at once, then each waited Running and Ready."""
    names = [f"{prefix}-{i}" for i in range(count)]
    for name in names:
        core.create_namespaced_pod(
            ns, kubepods.pod_manifest(name, image, app_command=["sleep"], sidecar=True)
        )
    return [kubepods.wait_running(core, ns, name, timeout=90) for name in names]


def agent_restarts(core: Any) -> int:
    [pod] = [p for p in agent_mod.agent_pods(core) if not p.metadata.deletion_timestamp]
    [status] = [c for c in pod.status.container_statuses if c.name == agent_mod.AGENT_CONTAINER]
    return int(status.restart_count)


def host_network_pod(
    name: str, image: str, command: list[str], mounts: list[Path], *, stdin: bool = False
) -> dict[str, Any]:
    """A hostNetwork pod (so from the node's address, kubelet's) running `command`, each of
    `mounts` (node paths) mounted at the same path."""
    volumes = [{"name": f"m{i}", "hostPath": {"path": str(p)}} for i, p in enumerate(mounts)]
    container: dict[str, Any] = {
        "name": "peer",
        "image": image,
        "command": command,
        "stdin": stdin,  # attacks-go floods until its stdin closes or its duration ends
        "volumeMounts": [{"name": f"m{i}", "mountPath": str(p)} for i, p in enumerate(mounts)],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "hostNetwork": True,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "containers": [container],
            "volumes": volumes,
        },
    }


@contextmanager
def hostile_peer(cluster: RealCluster, core: Any, ns: str) -> Iterator[tuple[Flood, Flood]]:
    """The flood and the attacks, both from processes of a hostNetwork pod (exec'd into its
    container, as `kubectl exec` would), so from the node's address and a pod's cgroup."""
    tcp = f"{cluster.network.node_ip}:{PORT}"
    pod_socket = wire.socket_path(str(cluster.agent_run_dir))
    image = cluster.images["workload"].ref
    sleeper = ["/usr/bin/python3", "-c", "import time; time.sleep(3600)"]
    pod = host_network_pod("peer", image, sleeper, [REPO_ROOT, cluster.agent_run_dir])
    core.create_namespaced_pod(ns, pod)
    view = kubepods.wait_running(core, ns, "peer", timeout=60)
    assert cluster.runtime is not None
    container, _ = cluster.runtime.running_container(view.uid, "peer")

    def via(name: str) -> list[str]:
        assert cluster.runtime is not None
        return cluster.runtime.exec_argv(container, f"{name}-{os.getpid()}", cwd=str(REPO_ROOT))

    flood = ["--tcp", tcp, "--idle", "2000", "--slowloris", "100"]
    flood += ["--stream", pod_socket, "--stream-idle", "400"]  # past the socket's cap (256)
    attacks = ["--target", f"tcp:{tcp}", "--target", f"unix:{pod_socket}"]
    attacks += ["--pipelined", str(PIPELINED), "--long-length", str(DIGITS), "--pause", "1"]
    python = "/usr/bin/python3"
    with (
        Flood(flood, via=via("flood"), python=python, duration=120) as flooder,
        Flood(attacks, module="testbed.attacks", via=via("attacks"), python=python) as attacker,
    ):
        yield flooder, attacker


def test_a_hostile_host_network_pod_while_pods_start(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
) -> None:
    agent_mod.install(node_helm("4"), real_cluster, node_core, agent_image)
    restarts = agent_restarts(node_core)
    image = real_cluster.images["workload"].ref
    # The agent's first ADD pays for what every later one finds ready (the rule backend's
    # probe, the caches): one pod first, so the quiet figures are a warm agent's.
    warm = start_pods(node_core, workload_ns, image, "warm", count=1)
    with Prober(real_cluster.network.netns_path, real_cluster.network.node_ip) as prober:
        before = add_buckets(real_cluster)
        quiet_pods = start_pods(node_core, workload_ns, image, "quiet")
        quiet = since(add_buckets(real_cluster), before)
        quiet_probes = len(prober.samples)
        drops_before = listen_drops(real_cluster.network.netns_path)
        with hostile_peer(real_cluster, node_core, workload_ns) as (flooder, attacker):
            began = time.monotonic()
            flooded_pods = start_pods(node_core, workload_ns, image, "flooded")
            flooded = since(since(add_buckets(real_cluster), before), quiet)
            # Long enough for the first slowloris connections to meet their timeout.
            time.sleep(max(0.0, LORIS_HELD - (time.monotonic() - began)))
            flood_report, attack_report = flooder.stop(), attacker.stop()
        drops = listen_drops(real_cluster.network.netns_path) - drops_before
    print(f"flood: {flood_report}\nattacks: {attack_report}")
    probe_ms = [1000 * t for _, t in prober.samples]
    figures = {
        "quiet p50/p99 ms": (round(quantile(0.5, quiet), 1), round(quantile(0.99, quiet), 1)),
        "flooded p50/p99 ms": (round(quantile(0.5, flooded), 1), round(quantile(0.99, flooded), 1)),
        "probes (quiet, flooded)": (quiet_probes, len(probe_ms) - quiet_probes),
        "probe max ms (quiet, flooded)": (
            round(max(probe_ms[:quiet_probes]), 1),
            round(max(probe_ms[quiet_probes:]), 1),
        ),
    }
    print(figures)

    events = node_core.list_namespaced_event(workload_ns).items
    failed = [
        f"{e.involved_object.name}: {e.message}" for e in events if e.reason.startswith("Failed")
    ]
    assert failed == [], failed
    for view in warm + quiet_pods + flooded_pods:
        assert podnet.has_istio_rules(real_cluster.pod_netns(view.uid)), f"{view.name} uncaptured"
    assert agent_restarts(node_core) == restarts
    # The flood's burst of connections fits the agent's accept queue: a probe's handshake
    # dropped there would wait out TCP's 1 s retransmit, kubelet's whole probe timeout.
    assert drops == 0, f"{drops} handshakes dropped at a full accept queue on the node"
    assert prober.bad() == [], (prober.bad()[:5], len(prober.samples))
    assert quiet[float("inf")] == PODS and flooded[float("inf")] == PODS, (quiet, flooded)
    # No ADD was starved: each of both phases finished within ADD_BOUND_S, a tenth of the
    # plugin's deadline for its agent. The tier's latency rule (flooded p99 within 1.5x quiet)
    # is held where it has the ADDs to be a measurement, the netns bed's 250 a phase
    # (tests/hostile/test_flood.py); a dozen here make the p99 the slowest single ADD, which
    # moves with the shared cores (bench/README, "the hostile peer on the kubelet node").
    assert quiet[ADD_BOUND_S] == PODS and flooded[ADD_BOUND_S] == PODS, (figures, quiet, flooded)
    # The peer was real: its connections were made and its attacks answered.
    assert flood_report["tcp"]["made"] >= 1900 and flood_report["stream"]["made"] >= 390, (
        flood_report
    )
    loris = flood_report["slowloris"]
    assert loris["held_count"] >= 100, loris  # each closed by the agent, none held past
    # Its timeout, after up to a second unread while the agent finds out who made it (from the
    # node's address, contested: agent.serving.origins).
    assert loris["held_max"] <= limits.HTTP.request_timeout + 2.0, loris
    assert all(c["rounds"] > 0 for c in attack_report.values()), attack_report


FLOOD_SECONDS = 20.0
GO_SENDERS = 4
GO_PAUSE = 0.05


def unhealthy_since(core: Any, pod: str, since_ts: float) -> list[str]:
    """The agent pod's failed probes (kubelet's Unhealthy events) after `since_ts`."""
    events = core.list_namespaced_event(
        agent_mod.AGENT_NAMESPACE, field_selector=f"involvedObject.name={pod}"
    ).items
    return [
        e.message
        for e in events
        if e.reason == "Unhealthy"
        and (e.last_timestamp or e.event_time or e.first_timestamp).timestamp() >= since_ts
    ]


def test_a_hostnetwork_pods_flood_leaves_kubelets_probes_answered(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
) -> None:
    """A hostNetwork pod shares kubelet's address: its flood of probe paths (the Go flooder, as
    fast as the machine sends) is charged to it, not to the node's own processes, so kubelet's
    probes and the node's own prober keep being answered."""
    agent_mod.install(node_helm("4"), real_cluster, node_core, agent_image)
    [agent] = [p for p in agent_mod.agent_pods(node_core) if not p.metadata.deletion_timestamp]
    restarts = agent_restarts(node_core)
    image = real_cluster.images["workload"].ref
    program = parts.attacks_go().require()
    node_ip = real_cluster.network.node_ip
    start_pods(node_core, workload_ns, image, "warm", count=1)  # kubelet has probed by now
    began = time.time()
    drops_before = listen_drops(real_cluster.network.netns_path)
    with Prober(real_cluster.network.netns_path, node_ip) as prober:
        command = [str(program), "--target", f"tcp:{node_ip}:{PORT}"]
        command += ["--pipelined", str(PIPELINED), "--senders", str(GO_SENDERS)]
        command += ["--pause", str(GO_PAUSE), "--duration", str(FLOOD_SECONDS)]
        pod = host_network_pod("flood", image, command, [program.parent], stdin=True)
        node_core.create_namespaced_pod(workload_ns, pod)
        kubepods.wait_running(node_core, workload_ns, "flood", timeout=60)
        flooded_pods = start_pods(node_core, workload_ns, image, "flooded", count=6)
        line = kubepods.wait_log_line(
            node_core,
            workload_ns,
            "flood",
            "peer",
            lambda line: line.startswith('{"pipelined'),
            "the flood's report",
            timeout=FLOOD_SECONDS + 30,
        )
    drops = listen_drops(real_cluster.network.netns_path) - drops_before
    [counts] = json.loads(line).values()
    print(f"flood: {counts}; probes: {len(prober.samples)}")
    logs = node_core.read_namespaced_pod_log(
        agent.metadata.name, agent_mod.AGENT_NAMESPACE, container=agent_mod.AGENT_CONTAINER
    )

    # The flood was real and met its budget: its rounds (a connection each) were held unread
    # until a scan told them a pod's, then charged to the node's address, over budget.
    assert counts["rounds"] >= GO_SENDERS, counts
    assert counts["replies"] < counts["rounds"] * PIPELINED / 2, counts
    # The flood's burst of connections fits the agent's accept queue: a probe's handshake
    # dropped there would wait out TCP's 1 s retransmit, kubelet's whole probe timeout.
    assert drops == 0, f"{drops} handshakes dropped at a full accept queue on the node"
    assert prober.bad() == [], (prober.bad()[:5], len(prober.samples))
    assert unhealthy_since(node_core, agent.metadata.name, began) == []
    assert agent_restarts(node_core) == restarts
    assert "a node process connects to the agent" in logs
    for view in flooded_pods:
        assert podnet.has_istio_rules(real_cluster.pod_netns(view.uid)), f"{view.name} uncaptured"
