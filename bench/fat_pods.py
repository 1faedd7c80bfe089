"""The agent's memory with fat pods on its node: RSS of the agent's pod cache, listing and then
watching N pods that carry large labels, annotations, managedFields and container args, against
the same with none.

    cd REPO && .venv/bin/python -m bench.fat_pods [--pods 20] [--size 1400000] [--json]

What runs (no root, no test bed): testbed/fakeapi.py (HTTPS on loopback) answers the pod list
(resourceVersion 0, the node's field selector) with N fat pods, and the watch that follows with
one MODIFIED event per pod (each event the whole fat pod, as the API server sends it), then
stays open. The measured process is a child: it imports agent.wiring (every module the agent
loads), sets malloc up as the agent's run does (agent.memory), builds the agent's own Kubernetes
client from a kubeconfig and runs agent.pods.PodCache
with the default settings' fields until it has listed and applied every event, collects garbage,
waits 2 s and reads its own /proc/self/status: VmRSS (now) and VmHWM (its peak). Each case runs
`--runs` times in fresh children, alternating; the medians are printed. The fat pod is `--size`
bytes of JSON (under etcd's 1.5 MiB object limit): a sidecar pod whose owner filled, a quarter
each, its labels (short keys), annotations (100-character values), managedFields (nested
entries) and its app container's args (2-character strings).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from testbed.fakeapi import FakeApiServer, Reply, Request

NODE = "node-1"


def pod(i: int, size: int) -> dict[str, Any]:
    """A fat pod of about `size` bytes of JSON (none added with 0)."""
    made = _pod(i, size)
    if size:  # the filling's shapes cost a little more than their estimate: scaled once
        made = _pod(i, int(size * size / len(json.dumps(made))))
    return made


def _pod(i: int, size: int) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": f"fat-{i}",
        "namespace": "default",
        "uid": f"uid-{i}",
        "resourceVersion": str(100 + i),
        "labels": {"app": "fat"},
        "annotations": {"sidecar.istio.io/status": '{"containers":["istio-proxy"]}'},
    }
    app: dict[str, Any] = {"name": "app", "image": "registry.invalid/app:1"}
    proxy = {"name": "istio-proxy", "image": "registry.invalid/proxyv2:1", "args": ["proxy"]}
    made = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": NODE, "containers": [app, proxy]},
        "status": {"phase": "Running", "podIP": f"10.1.0.{i % 250 + 1}"},
    }
    if size:
        quarter = size // 4
        meta["labels"] |= {f"l{n}": "v" for n in range(quarter // 12)}
        meta["annotations"] |= {f"a{n}": "x" * 100 for n in range(quarter // 110)}
        meta["managedFields"] = [
            {
                "manager": f"m{n}",
                "operation": "Update",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {f"f:k{n}": {}}}},
            }
            for n in range(quarter // 120)
        ]
        app["args"] = [f"{n % 100:02d}" for n in range(quarter // 5)]
    return made


def status_kib() -> dict[str, int]:
    lines = Path("/proc/self/status").read_text().splitlines()
    return {ln.split(":")[0]: int(ln.split()[1]) for ln in lines if ln.startswith("Vm")}


def child(kubeconfig: str, pods: int) -> None:
    import agent.wiring  # noqa: F401  (every module the agent loads)
    from agent.kube import build_clients
    from agent.memory import map_large_buffers
    from agent.pods.pod_cache import PodCache

    map_large_buffers()  # as the agent's run does at start
    clients = build_clients({"KUBECONFIG": kubeconfig})
    cache = PodCache(clients.core, NODE, watch_timeout_seconds=600)
    applied = threading.Event()
    seen: set[str] = set()

    def heard(event: str, old: Any, new: Any) -> None:
        if event == "update":
            seen.add(new["metadata"]["name"])
            if len(seen) >= pods:
                applied.set()

    cache.add_listener(heard)
    cache.start()
    while not cache.ready():
        time.sleep(0.05)
    if pods:
        applied.wait(120)
    else:
        time.sleep(1.0)
    gc.collect()
    time.sleep(2.0)
    kib = status_kib()
    print(json.dumps({"rss_mib": kib["VmRSS"] / 1024, "peak_mib": kib["VmHWM"] / 1024}))
    sys.stdout.flush()
    os._exit(0)  # the watch stays open: no clean stop to wait for


def measure(fake: FakeApiServer, pods: int, size: int) -> dict[str, float]:
    fat = [pod(i, size) for i in range(pods)]
    events = [
        {
            "type": "MODIFIED",
            "object": p | {"metadata": p["metadata"] | {"resourceVersion": str(500 + i)}},
        }
        for i, p in enumerate(fat)
    ]

    def route(request: Request) -> Reply:
        if request.query.get("watch") == "true":
            return Reply(events=events, then="silent")
        return Reply(body={"kind": "PodList", "metadata": {"resourceVersion": "400"}, "items": fat})

    fake.route = route
    done = subprocess.run(
        [sys.executable, "-m", "bench.fat_pods", "--child", str(fake.kubeconfig()), str(pods)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]))
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.fat_pods")
    parser.add_argument("--pods", type=int, default=20)
    parser.add_argument("--size", type=int, default=1_400_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args()
    size = len(json.dumps(pod(0, opts.size)))
    cases = {"none": (0, 0), "fat": (opts.pods, opts.size)}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory() as tmp, FakeApiServer(Path(tmp)) as fake:
        for _ in range(opts.runs):
            for name, (pods, fat) in cases.items():
                results[name].append(measure(fake, pods, fat))
    med = {
        name: {k: statistics.median(r[k] for r in runs) for k in ("rss_mib", "peak_mib")}
        for name, runs in results.items()
    }
    summary = {
        "pods": opts.pods,
        "pod_json_bytes": size,
        "rss_mib_none": round(med["none"]["rss_mib"], 1),
        "rss_mib_fat": round(med["fat"]["rss_mib"], 1),
        "rss_ratio": round(med["fat"]["rss_mib"] / med["none"]["rss_mib"], 3),
        "peak_mib_none": round(med["none"]["peak_mib"], 1),
        "peak_mib_fat": round(med["fat"]["peak_mib"], 1),
    }
    if not opts.json:
        for name, runs in results.items():
            print(name, [f"{r['rss_mib']:.1f} / {r['peak_mib']:.1f}" for r in runs])
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
