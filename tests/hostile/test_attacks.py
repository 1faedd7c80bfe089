"""A neighbour attacks the agent's doors with single requests that once ended a serving loop,
while pods start: a pipelined burst of requests in one write, a Content-Length past Python's
integer limit (HTTP port and pod socket alike), and connections flooding /metrics in batches.
The agent is the real process in a node netns of its own (testbed/netns_agent.py); the attacker
is another (testbed/attacks.py). CNI ADDs through the pod socket keep their quiet latency (p99
within 1.5x, +20 ms) and never fail, kubelet's liveness probe is answered within 1 s, the agent
never restarts, and every door still accepts connections when the attack ends."""

from __future__ import annotations

import pytest

from testbed.flood import Flood
from testbed.netns_agent import NetnsAgentBed
from tests.hostile.test_flood import assert_unharmed

pytestmark = pytest.mark.hostile

ADDS = 200
PIPELINED = 400
"""Past the recursion a reply per request once took (about 250 in one write)."""
DIGITS = 4400
"""Past Python's 4,300-digit limit for int() of a string."""


def targets(bed: NetnsAgentBed) -> list[str]:
    host, port = bed.http_address
    return ["--target", f"tcp:{host}:{port}", "--target", f"unix:{bed.pod_socket}"]


def attack(bed: NetnsAgentBed, *how: str) -> dict[str, dict[str, int]]:
    quiet = bed.measure(ADDS)
    with Flood([*targets(bed), *how], module="testbed.attacks") as attacker:
        attacked = bed.measure(ADDS)
        report: dict[str, dict[str, int]] = attacker.stop()
    print(report)
    assert_unharmed(quiet, attacked, bed)
    after = bed.measure(20)  # every door still serves once the attack is over
    assert after.failures == [] and after.probe_failures == [], (after.failures, after.probes)
    assert report and all(c["refused"] == 0 for c in report.values()), report
    return report


def test_pipelined_requests_in_one_write(bed: NetnsAgentBed) -> None:
    # Once a second: the attack as a neighbour repeats it. A sustained flood of requests is
    # bench/request_flood.py's (bench/README "a sustained request flood").
    report = attack(bed, "--pipelined", str(PIPELINED), "--pause", "1")
    for name, count in report.items():
        assert count["rounds"] > 0, (name, count)
        if name.startswith("pipelined unix:"):  # the pod socket answers every one, in order
            assert count["replies"] == PIPELINED * count["rounds"], (name, count)
        else:  # the HTTP port up to its request budget, then 429 and closed (serving.budget)
            assert 0 < count["replies"] < PIPELINED * count["rounds"], (name, count)


def test_a_content_length_past_the_integer_limit(bed: NetnsAgentBed) -> None:
    report = attack(bed, "--long-length", str(DIGITS))
    for name, count in report.items():  # refused with one reply each, never a dropped loop
        assert count["rounds"] > 0 and count["replies"] == count["rounds"], (name, count)


def test_a_metrics_flood_leaves_the_probes_answered(bed: NetnsAgentBed) -> None:
    report = attack(bed, "--metrics-flood", "8,40")
    assert sum(c["replies"] for c in report.values()) >= 8 * 40, report
