"""The run's report (bench/soak/report.py): the contract's JSON keys, the markdown table and
the plot."""

from __future__ import annotations

import json
from pathlib import Path

from bench.soak import report
from bench.soak.invariants import Firing, Violation
from bench.soak.procstats import AgentSample

CONTRACT = {
    "pods_started", "violations", "start_p99_s", "faults", "rss_slope_mib_per_h",
    "fd_slope_per_h", "leftovers",
}  # fmt: skip


def a_result() -> report.RunResult:
    result = report.RunResult(minutes=5.0, seed=3, mode="sidecar")
    for i in range(100):
        faulted = i % 4 == 0
        result.pods.append(
            report.PodStart(
                f"p{i}", "n1", float(i), i + (5.0 if faulted else 1.0 + i / 1000), faulted
            )
        )
    result.pods.append(report.PodStart("never", "n2", 250.0, None, True))
    result.firings = [
        Firing("agent_kill9", "n1", 30.0, 30.0, 42.5),
        Firing("agent_kill9", "n2", 90.0, 90.0, 95.0),
        Firing("api_429", None, 60.0, 80.0, None),
    ]
    result.violations = [Violation("uncaptured", 31.0, "n1", "pod p7", ("agent_kill9@n1",))]
    result.samples = [
        AgentSample(float(t), node, pid, 50.0 + t / 100, 8, 20, 20.0 + t / 100, 30.0)
        for node, pid in (("n1", 10), ("n2", 11))
        for t in range(0, 300, 2)
    ]
    result.leftovers = ["netns cni-1"]
    result.fault_errors = ["helm_rollback start: HelmError: no revision (at 50.0 s)"]
    result.unavailable = {"node_reboot": "waits for the reboot bed"}
    return result


def test_percentile_is_nearest_rank() -> None:
    values = list(range(1, 101))
    assert report.percentile(values, 50) == 50
    assert report.percentile(values, 99) == 99
    assert report.percentile([3.0], 99) == 3.0
    assert report.percentile([], 50) is None


def test_the_json_holds_the_contract_keys_with_the_run_figures() -> None:
    data = report.summary(a_result())
    assert set(data) >= CONTRACT
    assert data["pods_started"] == 100 and data["pods_never_started"] == 1
    assert data["faults"] == {"agent_kill9": 2, "api_429": 1}
    assert data["violations"][0]["faults"] == ["agent_kill9@n1"]
    assert data["leftovers"] == ["netns cni-1"]
    assert data["start_p99_s_faulted"] == 5.0 and data["start_p99_s_quiet"] < 1.2
    assert data["recovery_s_max"] == {"agent_kill9": 12.5}
    assert data["unrecovered"] == ["api_429"]
    assert 30.0 < data["rss_slope_mib_per_h"] < 42.0  # 36 MiB an hour
    assert data["fd_slope_per_h"] == 0.0
    # The RSS's split, reported beside it: the rise is all anonymous here.
    assert 30.0 < data["rss_anon_slope_mib_per_h"] < 42.0
    assert data["rss_file_slope_mib_per_h"] == 0.0
    assert set(data["slope_intervals_per_h"]) == {
        "rss_mib",
        "fds",
        "threads",
        "anon_mib",
        "file_mib",
    }
    json.dumps(data)  # serialisable as it is


def test_the_markdown_names_faults_unavailable_kinds_and_violations() -> None:
    text = report.markdown(report.summary(a_result()))
    assert "| agent_kill9 | 2 | 12.5 |" in text
    assert "| node_reboot | not available: waits for the reboot bed | - |" in text
    assert "| 31.0 | uncaptured | n1 | agent_kill9@n1 | pod p7 |" in text
    assert "- helm_rollback start: HelmError: no revision (at 50.0 s)" in text
    assert "| of it anonymous / file-backed, not judged | 36" in text


def test_write_puts_markdown_json_and_a_png_beside_each_other(tmp_path: Path) -> None:
    data = report.write(a_result(), tmp_path / "out" / "soak.md")
    assert (tmp_path / "out" / "soak.md").read_text().startswith("# Soak: 5.0 min, seed 3")
    assert json.loads((tmp_path / "out" / "soak.json").read_text()) == data
    png = (tmp_path / "out" / "soak.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


def test_write_lists_every_pods_start_with_its_distance_from_the_last_fault(
    tmp_path: Path,
) -> None:
    result = a_result()
    result.pods = [
        report.PodStart("p0", "n1", 10.0, 12.5, False, "sidecar", 4.0, 1.0, 2.0),
        report.PodStart("p1", "n2", 20.0, None, True, "ambient"),
    ]
    report.write(result, tmp_path / "soak.md")
    lines = (tmp_path / "soak.pods.csv").read_text().splitlines()
    assert lines == [
        "name,node,mode,created_s,running_s,start_s,faulted,after_fault_s,scheduled_s,sandbox_s",
        "p0,n1,sidecar,10.00,12.50,2.50,0,4.00,1.00,2.00",
        "p1,n2,ambient,20.00,,,1,,,",
    ]


def test_the_slowest_quiet_starts_are_listed_with_where_they_waited() -> None:
    result = a_result()
    result.pods += [
        report.PodStart("slow", "n2", 0.0, 9.0, False, "ambient", 0.5, 6.0, 7.0),
        report.PodStart("slower-but-faulted", "n2", 0.0, 30.0, True, "ambient"),
    ]
    data = report.summary(result)
    slowest = data["slowest_quiet_starts"]
    assert len(slowest) == report.SLOWEST_SHOWN
    assert slowest[0] == {
        "name": "slow", "node": "n2", "mode": "ambient", "start_s": 9.0,
        "scheduled_s": 6.0, "sandbox_s": 7.0, "after_fault_s": 0.5,
    }  # fmt: skip
    assert all(p["name"] != "slower-but-faulted" for p in slowest)
    assert [p["start_s"] for p in slowest] == sorted((p["start_s"] for p in slowest), reverse=True)
    assert "| slow | n2 | 9.0 | 6.0 | 7.0 | 0.5 |" in report.markdown(data)


def test_the_json_gives_each_modes_pods_and_every_recovery() -> None:
    result = a_result()
    result.pods += [
        report.PodStart("a0", "n1", 0.0, 2.0, False, "ambient"),
        report.PodStart("a1", "n2", 0.0, 4.0, True, "ambient"),
        report.PodStart("a2", "n3", 0.0, None, True, "ambient"),
    ]
    data = report.summary(result)
    assert data["by_mode"]["ambient"] == {
        "pods_started": 2, "start_p50_s": 2.0, "start_p99_s": 4.0,
    }  # fmt: skip
    assert data["by_mode"]["sidecar"]["pods_started"] == 100
    assert data["pods_started"] == 102
    assert data["recovery_s"] == {"agent_kill9": [12.5, 5.0]}


def test_a_start_soon_after_a_fault_is_quiet_but_not_settled() -> None:
    result = report.RunResult(minutes=1, seed=1, mode="sidecar")
    late = report.SETTLED_S + 1.0
    result.pods = [
        report.PodStart("never-faulted", "n1", 0.0, 1.0, faulted=False),
        report.PodStart("long-after", "n1", 0.0, 2.0, faulted=False, after_fault_s=late),
        report.PodStart("just-after", "n1", 0.0, 9.0, faulted=False, after_fault_s=2.0),
        report.PodStart("during", "n1", 0.0, 40.0, faulted=True, after_fault_s=None),
    ]
    data = report.summary(result)
    assert data["start_p99_s_quiet"] == 9.0 and data["start_p99_s_settled"] == 2.0
    assert data["start_p99_s_faulted"] == 40.0
    assert "no fault in the 30 s before | 1.0 / 2.0 |" in report.markdown(data)
