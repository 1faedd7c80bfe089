"""What a cluster of N nodes' agents costs the API server, by simulation: N agents' own pod and
namespace caches (agent/pods: the real list + watch code, one per simulated node, in one process;
each node its own agent.kube client, as each agent has its own connection pool and rate limit)
against the test bed's kube-apiserver, the cluster's pods and namespaces
created through the API (testbed/apiload.py; no kubelet runs them).

For each N (cumulative: the cluster grows between steps):
  start    the N nodes' caches started, --start-rate nodes a second (a DaemonSet rolling out;
           0: all at once, as after an API server restart): until all listed, the retries the
           caches logged, the requests the agents' identity made (the API server's
           audit log: list pages and watches), the LIST response bytes (apiserver_response_sizes),
           the API server's CPU seconds;
  steady   the caches running for --window seconds with their timers divided by --speedup (the
           resync and watch timeout of the agent's defaults, 10x faster by default), so a few
           minutes of a real cluster fit in the window: requests, LIST and watch-event bytes and
           API server CPU per minute of the real timers (measured / speedup), open watches
           (apiserver_longrunning_requests), and the API server's RSS.
Then the slope per node (least squares over the N) and the extrapolation to --extrapolate nodes.

    .venv/bin/python -m bench.api_load --nodes 100,300,1000 --json
With --json the last line is one JSON object: {"steps": [...], "slope_per_node": {...},
"extrapolated": {...}}.
"""

from __future__ import annotations

import argparse
import http.client
import inspect
import json
import logging
import re
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agent.kube import build_clients
from agent.logs import setup_logging
from agent.pods.cache import ListWatchCache
from agent.pods.namespaces import NamespaceCache
from agent.pods.pod_cache import PodCache
from testbed import apiload
from testbed.controlplane import Binaries, ControlPlane

ADMIN = "admin"
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  verbs: [get, list, watch]
  resources: [{group: "", resources: [pods, namespaces]}]
- level: None
"""
_CACHE_DEFAULTS = inspect.signature(ListWatchCache.__init__).parameters
RESYNC_SECONDS: float | None = _CACHE_DEFAULTS["resync_seconds"].default
WATCH_TIMEOUT_SECONDS: int = _CACHE_DEFAULTS["watch_timeout_seconds"].default
"""The caches' defaults (agent/pods/cache.py), which the steady phase divides by --speedup."""
POD_HOLDERS = apiload.POD_NAMESPACES
AGENT_READS = ("pods", "namespaces")


@dataclass
class Step:
    nodes: int
    pods: int
    namespaces: int
    start_seconds: float
    start_failures: dict[str, int]
    steady_failures: int
    start_requests: dict[str, int]
    start_list_mib: float
    start_apiserver_cpu_s: float
    steady_requests_per_min: dict[str, float]
    steady_list_mib_per_min: float
    steady_watch_event_mib_per_min: float
    steady_apiserver_cpu_s_per_min: float
    open_watches: int
    apiserver_rss_mib: float
    bench_rss_mib: float


def node_name(i: int) -> str:
    return f"sim-node-{i:05d}"


def load_pods(plane: ControlPlane, first_node: int, nodes: int, per_node: int) -> float:
    """`per_node` pods on each node of [first_node, nodes); seconds taken."""
    requests = []
    for node in range(first_node, nodes):
        for j in range(per_node):
            i = node * per_node + j
            body = apiload.pod_body(i)
            body["spec"]["nodeName"] = node_name(node)
            holder = apiload.namespace_name(i % POD_HOLDERS)
            requests.append((f"/api/v1/namespaces/{holder}/pods", body))
    return apiload.create_all(plane, requests)


class Apiserver:
    """The API server's own figures: its process (CPU, RSS) and its /metrics."""

    def __init__(self, plane: ControlPlane) -> None:
        [daemon] = [d for d in plane.daemons if d.name == "kube-apiserver"]
        assert daemon.pid is not None
        self.pid = daemon.pid
        self.plane = plane

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / 100.0  # utime + stime, clock ticks

    def rss_mib(self) -> float:
        return rss_mib(self.pid)

    def metrics(self) -> str:
        conn = http.client.HTTPSConnection(
            self.plane.address, self.plane.port, timeout=30, context=self.plane.ssl_context()
        )
        try:
            conn.request("GET", "/metrics")
            reply = conn.getresponse()
            body = reply.read().decode()
            assert reply.status == 200, f"/metrics: {reply.status} {body[:300]}"
            return body
        finally:
            conn.close()

    def metric_sum(self, name: str, **labels: str | tuple[str, ...]) -> float:
        """The sum over every series of `name` whose labels match `labels` (a tuple: any of
        its values), from one scrape."""
        wanted = [
            [f'{k}="{v}"' for v in (values if isinstance(values, tuple) else (values,))]
            for k, values in labels.items()
        ]
        total = 0.0
        for line in self.metrics().splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            series, value = line.rsplit(" ", 1)
            if all(any(label in series for label in choices) for choices in wanted):
                total += float(value)
        return total

    # Pods and namespaces: what the agents read (the controller-manager's share is the same in
    # every step and taken out as the baseline before the caches start).
    def list_bytes(self) -> float:
        return self.metric_sum("apiserver_response_sizes_sum", verb="LIST", resource=AGENT_READS)

    def watch_event_bytes(self) -> float:
        return self.metric_sum("apiserver_watch_events_sizes_sum", resource=AGENT_READS)

    def open_watches(self) -> int:
        return int(
            self.metric_sum("apiserver_longrunning_requests", verb="WATCH", resource=AGENT_READS)
        )


def rss_mib(pid: int | str) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]


class AuditCounter:
    """Requests in the audit log since the last mark, by verb and resource."""

    def __init__(self, plane: ControlPlane) -> None:
        self.path = plane.audit_log
        self.offset = 0

    def mark(self) -> None:
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def since_mark(self) -> Counter[str]:
        """Each request once (a watch logs ResponseStarted and ResponseComplete)."""
        counts: Counter[str] = Counter()
        seen: set[str] = set()
        with self.path.open("rb") as f:
            f.seek(self.offset)
            for line in f:
                event = json.loads(line)
                if event["auditID"] in seen:
                    continue
                seen.add(event["auditID"])
                ref = event.get("objectRef") or {}
                counts[f"{event['verb']} {ref.get('resource', '?')}"] += 1
        return counts


def start_caches(
    kubeconfig: Path, clients: list[Any], nodes: int, speedup: float, rate: float
) -> list[Any]:
    """Every node's pod and namespace caches, `rate` nodes a second (0: all at once), each
    node's two over a client of its own (made here, kept in `clients` to be closed)."""
    caches: list[Any] = []
    for i in range(nodes):
        clients.append(build_clients({"KUBECONFIG": str(kubeconfig)}))
        for kind in (PodCache, NamespaceCache):
            caches.append(
                kind(
                    clients[-1].core,
                    node_name(i),
                    resync_seconds=None if RESYNC_SECONDS is None else RESYNC_SECONDS / speedup,
                    watch_timeout_seconds=max(1, int(WATCH_TIMEOUT_SECONDS / speedup)),
                )
            )
    began = time.monotonic()
    for n, cache in enumerate(caches):
        if rate > 0:
            time.sleep(max(0.0, began + (n // 2) / rate - time.monotonic()))
        cache.start()
    return caches


class FailureCount(logging.Handler):
    """The caches' warnings (a list or watch that failed and is retried), by error type."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "fields", {}) or {}
        self.counts[str(fields.get("error", record.getMessage())).split(":")[0]] += 1


def wait_ready(caches: list[Any], timeout: float) -> float:
    began = time.monotonic()
    while not all(c.ready() for c in caches):
        if time.monotonic() - began > timeout:
            raise RuntimeError(f"{sum(not c.ready() for c in caches)} caches not listed")
        time.sleep(0.05)
    return time.monotonic() - began


def run(args: argparse.Namespace) -> dict[str, Any]:
    steps: list[Step] = []
    workdir = Path(tempfile.mkdtemp(prefix="api-load-"))
    plane = ControlPlane(
        workdir / "controlplane",
        Binaries.from_cache(),
        audit_policy=AUDIT_POLICY,
        etcd_fsync=False,
    )
    caches: list[Any] = []
    clients: list[Any] = []
    threading.stack_size(512 * 1024)  # thousands of cache threads: their stacks stay small
    failures = FailureCount()
    logging.getLogger("agent.pods.cache").addHandler(failures)
    try:
        plane.start()
        apiserver = Apiserver(plane)
        audit = AuditCounter(plane)
        began = time.monotonic()
        apiload.load_cluster(plane, namespaces=args.namespaces, pods=0)
        for i in range(POD_HOLDERS):
            apiload.wait_service_account(plane, apiload.namespace_name(i))
        print(f"{args.namespaces} namespaces in {time.monotonic() - began:.1f} s", file=sys.stderr)
        loaded_nodes = 0
        for nodes in args.nodes:
            for cache in caches:  # each step starts its N nodes' agents afresh, all at once
                cache.stop()
            for client in clients:
                client.close()
            caches, clients = [], []
            seconds = load_pods(plane, loaded_nodes, nodes, args.pods_per_node)
            print(f"{nodes} nodes: pods loaded in {seconds:.1f} s", file=sys.stderr)
            loaded_nodes = nodes
            time.sleep(2.0)  # the watches of the stopped caches closed, the load settled
            audit.mark()
            watches0 = apiserver.open_watches()
            cpu0, list0 = apiserver.cpu_seconds(), apiserver.list_bytes()
            failures.counts.clear()
            started = time.monotonic()
            caches = start_caches(plane.kubeconfig, clients, nodes, args.speedup, args.start_rate)
            wait_ready(caches, 1200)
            start_seconds = time.monotonic() - started
            start_failures = dict(failures.counts)
            time.sleep(1.0)  # the audit log's last lines written
            start_requests = audit.since_mark()
            cpu1, list1 = apiserver.cpu_seconds(), apiserver.list_bytes()
            watch1 = apiserver.watch_event_bytes()
            audit.mark()
            time.sleep(args.window)
            steady = audit.since_mark()
            steady_failures = sum(failures.counts.values()) - sum(start_failures.values())
            cpu2, list2 = apiserver.cpu_seconds(), apiserver.list_bytes()
            watch2 = apiserver.watch_event_bytes()
            real_minutes = args.window / 60.0 * args.speedup
            step = Step(
                nodes=nodes,
                pods=nodes * args.pods_per_node,
                namespaces=args.namespaces,
                start_seconds=round(start_seconds, 2),
                start_failures=start_failures,
                steady_failures=steady_failures,
                start_requests=dict(sorted(start_requests.items())),
                start_list_mib=round((list1 - list0) / 2**20, 2),
                start_apiserver_cpu_s=round(cpu1 - cpu0, 2),
                steady_requests_per_min={
                    k: round(v / real_minutes, 2) for k, v in sorted(steady.items())
                },
                steady_list_mib_per_min=round((list2 - list1) / 2**20 / real_minutes, 3),
                steady_watch_event_mib_per_min=round((watch2 - watch1) / 2**20 / real_minutes, 4),
                steady_apiserver_cpu_s_per_min=round((cpu2 - cpu1) / real_minutes, 3),
                open_watches=apiserver.open_watches() - watches0,
                apiserver_rss_mib=round(apiserver.rss_mib(), 1),
                bench_rss_mib=round(rss_mib("self"), 1),
            )
            print(json.dumps(asdict(step)), file=sys.stderr)
            steps.append(step)
    finally:
        for cache in caches:
            cache.stop()
        for client in clients:
            client.close()
        plane.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return {"steps": [asdict(s) for s in steps], **extrapolate(steps, args.extrapolate)}


def slope(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x: (a, b)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    return my - b * mx, b


def extrapolate(steps: list[Step], nodes: int) -> dict[str, Any]:
    if len(steps) < 2:
        return {}
    xs = [float(s.nodes) for s in steps]
    figures = {
        "start_requests": [float(sum(s.start_requests.values())) for s in steps],
        "start_list_mib": [s.start_list_mib for s in steps],
        "start_apiserver_cpu_s": [s.start_apiserver_cpu_s for s in steps],
        "steady_requests_per_min": [float(sum(s.steady_requests_per_min.values())) for s in steps],
        "steady_list_mib_per_min": [s.steady_list_mib_per_min for s in steps],
        "steady_apiserver_cpu_s_per_min": [s.steady_apiserver_cpu_s_per_min for s in steps],
        "open_watches": [float(s.open_watches) for s in steps],
        "apiserver_rss_mib": [s.apiserver_rss_mib for s in steps],
    }
    per_node = {}
    at = {}
    for name, ys in figures.items():
        a, b = slope(xs, ys)
        per_node[name] = round(b, 4)
        at[name] = round(a + b * nodes, 1)
    return {"slope_per_node": per_node, "extrapolated": {"nodes": nodes, **at}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="100,300,1000", help="simulated node counts, rising")
    parser.add_argument("--pods-per-node", type=int, default=30)
    parser.add_argument("--namespaces", type=int, default=2000)
    parser.add_argument("--window", type=float, default=60.0, help="steady seconds per step")
    parser.add_argument("--speedup", type=float, default=10.0, help="timers divided by this")
    parser.add_argument(
        "--start-rate",
        type=float,
        default=5.0,
        help="nodes whose agents start per second (0: all at once, as after an API server restart)",
    )
    parser.add_argument("--extrapolate", type=int, default=5000, help="nodes to extrapolate to")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    setup_logging("warn", as_json=True)  # the caches' failures, with their reasons
    args.nodes = [int(n) for n in args.nodes.split(",")]
    if args.nodes != sorted(args.nodes):
        parser.error("--nodes must rise: the cluster grows between steps")
    result = run(args)
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
