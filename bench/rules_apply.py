"""Benchmark: time to apply the default sidecar pod's rules, per backend.

Each sample applies into a fresh network namespace (created before and deleted after the timed
call, so only `apply_rules` is measured). One untimed apply per backend first loads what a
long-running agent loads once (python-iptables' xtables extensions). Prints p50/p99/mean per
backend in milliseconds. Needs root and the project installed (`pip install -e .`).

    /root/.pyenv/versions/3.11.7/bin/python3 bench/rules_apply.py [--runs 200] [--ipv6]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import uuid

from agent.rules.backends import BACKENDS
from agent.rules.sidecar.apply import apply_rules
from agent.rules.sidecar.pod import capture_config_for_pod

POD = {
    "kind": "Pod",
    "metadata": {
        "name": "bench",
        "namespace": "default",
        "annotations": {"sidecar.istio.io/status": "{}"},
    },
    "spec": {"containers": [{"name": "app"}, {"name": "istio-proxy"}]},
}


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(backend: str, runs: int, ipv6: bool) -> list[float]:
    config = capture_config_for_pod(POD, ipv6=ipv6, dns_servers=[])
    samples: list[float] = []
    for i in range(runs + 1):
        name = f"icni-bench-{uuid.uuid4().hex[:8]}"
        subprocess.run(["ip", "netns", "add", name], check=True)
        try:
            subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
            start = time.perf_counter()
            apply_rules(f"/var/run/netns/{name}", config, backend=backend)
            if i:  # the first apply is the warm-up
                samples.append((time.perf_counter() - start) * 1000)
        finally:
            subprocess.run(["ip", "netns", "del", name], check=True)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--ipv6", action="store_true")
    parser.add_argument("--backend", action="append", choices=BACKENDS)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, runs={args.runs}, ipv6={args.ipv6}")
    print(f"{'backend':<16} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for backend in args.backend or BACKENDS:
        samples = measure(backend, args.runs, args.ipv6)
        print(
            f"{backend:<16} {percentile(samples, 0.5):8.1f} {percentile(samples, 0.99):8.1f} "
            f"{statistics.fmean(samples):8.1f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
