"""Benchmark: pod-to-pod request latency through two real Envoys behind the agent's rules,
against the same two pods uncaptured.

Two pods on one node bridge (testbed/meshnet.py), each with its app. First uncaptured: the
client in pod A's netns sends `--requests` sequential HTTP GETs to B's app, each on a new
connection (capture is per connection). Then both pods get the agent's rules for a sidecar pod
and a real Envoy (testbed/envoy.py, `--concurrency 1`), and the same requests run again: A's app
-> A's Envoy (15001) -> B's Envoy (15006) -> B's app. Each sample is connect + request + whole
answer. Prints p50/p99/mean per variant in milliseconds. Needs root and the envoy part
(ci/setup-testbed); run it under the node lock where the machine is shared.

    .venv/bin/python -m bench.envoy_latency [--requests 2000] [--tproxy]
"""

from __future__ import annotations

import argparse
import statistics
import time

from testbed.envoy import INBOUND_LOG, OUTBOUND_LOG
from testbed.http_echo import get
from testbed.meshnet import APP_PORT, MeshBed, Pod

WARM_UP = 50


def timed(bed: MeshBed, client: Pod, server: Pod, requests: int) -> list[float]:
    def loop() -> list[float]:
        for _ in range(WARM_UP):
            get(server.ip, APP_PORT)
        samples = []
        for _ in range(requests):
            start = time.perf_counter()
            get(server.ip, APP_PORT)
            samples.append((time.perf_counter() - start) * 1000)
        return samples

    return bed.run(client, loop)


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    p50 = ordered[len(ordered) // 2]
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {p50:.3f} ms  p99 {p99:.3f} ms  mean {statistics.fmean(ordered):.3f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--tproxy", action="store_true", help="pod B in TPROXY mode")
    args = parser.parse_args()
    with MeshBed() as bed:
        a = bed.pod("a", meshed=False)
        b = bed.pod("b", meshed=False)
        plain = timed(bed, a, b, args.requests)
        print(f"uncaptured          {summary(plain)}", flush=True)
        bed.capture(a, {})
        tproxy = {"sidecar.istio.io/interceptionMode": "TPROXY"} if args.tproxy else {}
        bed.capture(b, tproxy)
        meshed = timed(bed, a, b, args.requests)
        print(f"through two Envoys  {summary(meshed)}", flush=True)
        total = args.requests + WARM_UP
        # Every request took both legs (a line each), none bypassed Envoy.
        out = a.proxy.wait_log_lines(OUTBOUND_LOG, total)
        inbound = b.proxy.wait_log_lines(INBOUND_LOG, total)
        print(f"access log lines: A outbound {len(out)}, B inbound {len(inbound)} (want {total})")


if __name__ == "__main__":
    main()
