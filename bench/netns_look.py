"""Benchmark: one look into a pod's netns (agent.netns.look) against pyroute2's address dump.

The pod server's ADD path looks into each pod's netns once (tables, addresses) before it picks
a backend and programs the rules; the look's netlink requests are hand-written because of this
comparison. A netns with a veth holding an IPv4 and an IPv6 address, like a pod's after the
bridge plugin; each sample enters it in a fresh thread (agent.netns.run_in_netns), as the agent
does. Prints p50/p99 per variant in milliseconds. Needs root.

    /root/.pyenv/versions/3.11.7/bin/python3 -m bench.netns_look [--runs 500]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from pyroute2 import IPRoute

from agent.netns import run_in_netns
from agent.netns.look import look_here
from testbed import netns


def pyroute2_addresses() -> list[str]:
    """What the agent's address reads were with pyroute2: IFA_LOCAL or IFA_ADDRESS."""
    with IPRoute() as ipr:
        return [str(m.get_attr("IFA_LOCAL") or m.get_attr("IFA_ADDRESS")) for m in ipr.get_addr()]


def timed(path: str, fn: Callable[[], object], runs: int) -> tuple[float, float]:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        run_in_netns(path, fn)
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return samples[len(samples) // 2], samples[min(len(samples) - 1, int(len(samples) * 0.99))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=500)
    args = parser.parse_args()
    name = netns.unique_name("bench-look")
    path = str(netns.add(name))
    try:
        netns.ip("link", "add", "eth0", "type", "veth", "peer", "name", "peer0", netns=name)
        netns.ip("link", "set", "eth0", "up", netns=name)
        netns.ip("addr", "add", "10.244.0.7/24", "dev", "eth0", netns=name)
        netns.ip("addr", "add", "fd00:10:244::7/64", "dev", "eth0", "nodad", netns=name)
        for label, fn in (
            ("look (tables + addresses)", look_here),
            ("pyroute2 addresses", pyroute2_addresses),
        ):
            timed(path, fn, 20)  # warm-up
            p50, p99 = timed(path, fn, args.runs)
            print(f"{label:28} p50 {p50:.3f} ms  p99 {p99:.3f} ms")
    finally:
        netns.delete(name)


if __name__ == "__main__":
    main()
