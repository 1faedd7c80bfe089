"""What the soak's test-bed bed (bench/soak/testbed_bed.py) decides without a node: the uninstall
line it looks for, as the agent's own formatters write it, the timeline its kinds make, and the
pod events it makes of the churn's report."""

from __future__ import annotations

import logging
import types
from pathlib import Path

import pytest

from agent.logs import JsonFormatter, KeyValueFormatter
from bench.soak import faults, schedule
from bench.soak.testbed_bed import LACKS, UNINSTALLED, NodesBed
from testbed.churn import ChurnPod, ChurnReport


def agent_line(formatter: logging.Formatter, message: str) -> str:
    record = logging.LogRecord("agent.lifecycle", logging.INFO, __file__, 1, message, None, None)
    record.fields = {"removed": "plugin,entry"}
    # kubelet's CRI log format in front, as in its pod log files
    return "2026-12-06T20:00:00.000000000Z stderr F " + formatter.format(record)


@pytest.mark.parametrize(
    "formatter", [KeyValueFormatter(), JsonFormatter()], ids=["logfmt", "json"]
)
def test_the_agents_uninstall_line_is_recognised_and_no_other(formatter: logging.Formatter) -> None:
    assert UNINSTALLED.search(agent_line(formatter, "uninstalled"))
    for other in ("uninstalled nothing? no: upgrade", "install done", "not uninstalled"):
        assert not UNINSTALLED.search(agent_line(formatter, other)), other


def test_the_kinds_this_bed_lacks_are_in_the_catalogue_and_the_rest_plan_in_four_minutes() -> None:
    names = faults.catalogue_by_name()
    assert set(LACKS) <= set(names)
    kinds = [k for k in faults.available() if k.name not in LACKS]
    nodes = ["tb-node-1", "tb-node-2", "tb-node-3"]
    for seed in range(1, 51):
        windows = schedule.plan(
            kinds, nodes, minutes=4, seed=seed, targets={"node_reboot": nodes[1:]}
        )
        assert {w.kind for w in windows} == {k.name for k in kinds}


def test_the_beds_timeline_never_reboots_the_node_holding_the_control_plane(
    tmp_path: Path,
) -> None:
    bed = NodesBed(tmp_path, Path("/nonexistent/helm"), pods_per_minute=30)
    kinds = [k for k in faults.available() if k.name not in LACKS]
    first = bed.nodes[0]  # the first node started, which runs the control plane
    assert first not in bed.targets()["node_reboot"]
    for seed in range(1, 51):
        windows = schedule.plan(kinds, bed.nodes, minutes=5, seed=seed, targets=bed.targets())
        reboots = [w for w in windows if w.kind == "node_reboot"]
        assert reboots and all(w.node != first for w in reboots), reboots


def test_churn_pods_become_events_once_per_change_on_the_runs_clock(tmp_path: Path) -> None:
    bed = NodesBed(tmp_path, Path("/nonexistent/helm"), pods_per_minute=30)
    churn = types.SimpleNamespace(report=ChurnReport())
    bed.churn = churn  # type: ignore[assignment]
    bed.epoch = 1000.0
    pod = ChurnPod("churn-0", created=1001.0, node="tb-node-2")
    churn.report.pods.append(pod)
    (waiting,) = bed.pod_events()
    assert (waiting.name, waiting.node, waiting.created, waiting.running) == (
        "churn-0", "tb-node-2", 1.0, None,
    )  # fmt: skip
    assert bed.pod_events() == []  # nothing changed
    pod.running, pod.captured = 1003.5, False
    (seen,) = bed.pod_events()
    assert (seen.at, seen.running, seen.captured) == (3.5, 3.5, False)
    assert bed.pod_events() == []


def test_ambient_churn_pods_become_events_of_their_mode(tmp_path: Path) -> None:
    bed = NodesBed(tmp_path, Path("/nonexistent/helm"), pods_per_minute=30)
    sidecar, meshed = ChurnReport(), ChurnReport()
    bed.churn = types.SimpleNamespace(report=sidecar)  # type: ignore[assignment]
    bed.ambient_churn = types.SimpleNamespace(report=meshed)  # type: ignore[assignment]
    sidecar.pods.append(ChurnPod("churn-0", created=1.0, node="tb-node-1"))
    meshed.pods.append(ChurnPod("ambient-0", created=2.0, node="tb-node-1"))
    assert {(e.name, e.mode) for e in bed.pod_events()} == {
        ("churn-0", "sidecar"), ("ambient-0", "ambient"),
    }  # fmt: skip
    meshed.pods[0].running, meshed.pods[0].captured = 3.0, False
    (seen,) = bed.pod_events()
    assert (seen.name, seen.mode, seen.captured) == ("ambient-0", "ambient", False)
