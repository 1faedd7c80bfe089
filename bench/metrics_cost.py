"""What the agent's metrics cost per CNI ADD, and what they add to the /metrics page.

    cd REPO && .venv/bin/python -m bench.metrics_cost [--adds 5000] [--rounds 30] [--json]

In one process, no root: the pod server's handlers (agent.podserver.handlers.PodHandlers)
answer ADD request bodies as the plugin sends them (with its `startedAt`), the pod from an
in-memory source and a redirector that decides and "applies" without touching a netns: what is
left is the agent's own work per ADD (parse, decide, note, reply) and its metrics. Timed per
round: `--adds` ADDs with the process-wide metrics, then as many with none (`metrics=None`);
rounds alternate so a busy neighbour slows both alike, and the fastest round of each is reported
(what the code costs; a neighbour only ever adds to it), the median rounds beside it. The
metrics' cost per ADD is the difference; on a busy machine that difference is noise around a
few microseconds, so the metrics calls an answered ADD makes are also timed alone in a loop
(fastest round). The ADDs cycle through sidecar, skipped and not-found pods.

Then the /metrics page: `generate_latest` of the process-wide registry after those ADDs (every
series they made), the mean of `--pages` builds (the page is built at most once a second).

The same file runs against another checkout for "before": `PYTHONPATH=OTHER_CHECKOUT` first on
the path (it prints the `agent` package it measured). The plugin's own added work per exec (the
read of its start time) is `plugin_start_read_us`, when the plugin has it.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import agent
import agent.lifecycle  # every module that defines a metric, as in the agent
from agent.podserver.handlers import PodHandlers
from agent.podserver.metrics import default_metrics
from agent.podserver.sandboxes import SandboxStore
from plugin import wire


@dataclass(frozen=True)
class _Decision:
    redirect: bool
    reason: str


class _Pods:
    def __init__(self) -> None:
        self.pods = {
            name: {"metadata": {"name": name, "namespace": "app", "uid": f"uid-{name}"}}
            for name in ("web-0", "plain-0")
        }

    def get_pod(
        self, namespace: str, name: str, uid: str | None = None
    ) -> Mapping[str, Any] | None:
        return self.pods.get(name)


class _Redirector:
    def decide(self, pod: Mapping[str, Any]) -> _Decision:
        name = pod["metadata"]["name"]
        return _Decision(name == "web-0", "sidecar" if name == "web-0" else "no sidecar")

    def apply(self, netns: str, pod: Mapping[str, Any]) -> str:
        return "iptables-nft"

    def present(self, netns: str, pod: Mapping[str, Any]) -> bool:
        return True


def _body(pod: str, started: float) -> bytes:
    request: dict[str, Any] = dict(
        wire.cni_request(
            command="ADD",
            container_id="c0ffee",
            netns="/var/run/netns/cni-bench",
            ifname="eth0",
            pod_name=pod,
            pod_namespace="app",
            pod_uid="",
            cni_version="1.0.0",
            prev_result=None,
        )
    )
    request["startedAt"] = started  # an agent without the field ignores it
    return wire.encode(request)


def _handlers(with_metrics: bool) -> PodHandlers:
    return PodHandlers(
        pods=_Pods(),
        redirector=_Redirector(),
        sandboxes=SandboxStore(),
        readiness=lambda: None,
        metrics=default_metrics() if with_metrics else None,
    )


def _per_add(handlers: PodHandlers, bodies: list[bytes], adds: int) -> float:
    """Seconds per ADD over `adds` ADDs."""
    n = len(bodies)
    start = time.perf_counter()
    for i in range(adds):
        handlers.add(bodies[i % n])
    return (time.perf_counter() - start) / adds


def _metrics_call_us(rounds: int, calls: int) -> float:
    """The metrics calls the handlers make for one answered ADD, alone in a loop: the fastest
    of `rounds` rounds, per call. Those of this checkout: `answered` (with the Trace and the
    CLOCK_BOOTTIME read that feed it) where it has one, else `observe` (the request counter and
    latency histogram, all an ADD recorded before)."""
    from prometheus_client import CollectorRegistry

    from agent.podserver import metrics as podserver_metrics
    from agent.podserver.requests import Reply

    m = podserver_metrics.PluginMetrics(CollectorRegistry())
    reply = Reply(200, wire.reply(wire.RESULT_REDIRECTED, "rules applied"))
    answered = getattr(m, "answered", None)
    if answered is None:

        def one() -> None:
            m.observe("add", reply.result, 0.012)

    else:
        trace_type = podserver_metrics.Trace  # type: ignore[attr-defined,unused-ignore]
        clock = podserver_metrics.boottime  # type: ignore[attr-defined,unused-ignore]
        started = clock() - 0.03

        def one() -> None:
            trace = trace_type()
            trace.mode, trace.started_at = "sidecar", started
            answered("add", reply, "", trace, 0.012, now=clock())

    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            one()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def _plugin_start_read_us() -> float | None:
    try:
        from plugin.commands import process_start  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        return None
    n = 20000
    start = time.perf_counter()
    for _ in range(n):
        process_start()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adds", type=int, default=5000, help="ADDs per round and case")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--pages", type=int, default=200, help="/metrics page builds timed")
    parser.add_argument("--json", action="store_true", help="one JSON object last")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)  # the agent's log lines are not what is measured

    from prometheus_client import REGISTRY, generate_latest

    now = time.clock_gettime(time.CLOCK_BOOTTIME)
    bodies = [_body(pod, now - 0.03) for pod in ("web-0", "plain-0", "gone-0")]
    on, off = _handlers(True), _handlers(False)
    _per_add(on, bodies, 1000)  # warm-up: every series created
    _per_add(off, bodies, 1000)
    with_m: list[float] = []
    without: list[float] = []
    for _ in range(args.rounds):
        with_m.append(_per_add(on, bodies, args.adds))
        without.append(_per_add(off, bodies, args.adds))
    start = time.perf_counter()
    for _ in range(args.pages):
        page = generate_latest(REGISTRY)
    build = (time.perf_counter() - start) / args.pages
    # The fastest round of each: what the code costs when nothing else takes the CPU away.
    add_with, add_without = min(with_m), min(without)
    result = {
        "agent_package": str(agent.__file__),
        "add_us_with_metrics": round(add_with * 1e6, 2),
        "add_us_without_metrics": round(add_without * 1e6, 2),
        "metrics_us_per_add": round((add_with - add_without) * 1e6, 2),
        "metrics_us_per_add_median_rounds": round(
            (statistics.median(with_m) - statistics.median(without)) * 1e6, 2
        ),
        "metrics_calls_us_per_add": round(_metrics_call_us(args.rounds * 3, 2000), 2),
        "metrics_page_bytes": len(page),
        "metrics_page_lines": page.count(b"\n"),
        "metrics_page_build_ms": round(build * 1e3, 3),
        "plugin_start_read_us": (
            None if (read := _plugin_start_read_us()) is None else round(read, 2)
        ),
    }
    for key, value in result.items():
        print(f"{key}: {value}")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
