"""The run's report: the JSON object the contract names (printed last with --json), a short
markdown table, and a plot (PNG: pods started, fault windows and the agents' RSS over time)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.soak import trend
from bench.soak.invariants import Firing, Violation
from bench.soak.procstats import AgentSample

SETTLED_S = 30.0
"""A start counts as settled when no fault on its node recovered within this before it."""


@dataclass(frozen=True)
class PodStart:
    name: str
    node: str
    created: float
    running: float | None
    faulted: bool
    """A fault affecting its node was active while it waited."""
    mode: str = "sidecar"
    after_fault_s: float | None = None
    """Seconds from the last recovery of a fault affecting its node to its creation (None: no
    fault had ended): whether a slow start with no fault active follows one closely."""
    scheduled_s: float | None = None
    """Seconds from creation until the scheduler bound it (the API's whole seconds)."""
    sandbox_s: float | None = None
    """Seconds from creation until kubelet had its sandbox, network set up by the CNI chain."""

    @property
    def start_s(self) -> float | None:
        return None if self.running is None else self.running - self.created

    @property
    def settled(self) -> bool:
        """No fault on its node while it waited, and none recovered within SETTLED_S before it
        was created: what the cluster's own components still catch up on after an outage (the
        scheduler's watch, kubelet's back-off) is behind it too."""
        quiet = not self.faulted
        return quiet and (self.after_fault_s is None or self.after_fault_s >= SETTLED_S)


@dataclass
class RunResult:
    minutes: float
    seed: int
    mode: str
    pods: list[PodStart] = field(default_factory=list)
    firings: list[Firing] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    samples: list[AgentSample] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)
    fault_errors: list[str] = field(default_factory=list)
    """Faults that could not be fired (the act raised): named, never counted as fired."""
    trends_unjudged: list[str] = field(default_factory=list)
    """Resources whose slope was not judged: no agent process sampled long enough
    (trend.JUDGED_SPAN_S)."""
    interrupted_at: float | None = None
    """Seconds into the run when it was interrupted (SIGINT): the figures are partial, the
    leftovers not scanned."""


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


JUDGED = ("rss_mib", "fds", "threads")
"""The resources whose trend is an invariant (trend.FLOORS_PER_H)."""
RSS_PARTS = ("anon_mib", "file_mib")
"""The RSS's anonymous and file-backed parts: reported beside it, to tell where a rise is."""


def slopes(
    samples: Sequence[AgentSample], names: Sequence[str] = JUDGED
) -> dict[str, trend.Slope | None]:
    """Per resource, the slope common to every agent process (segments by node and pid)."""
    segments: dict[tuple[str, int], list[AgentSample]] = defaultdict(list)
    for s in sorted(samples, key=lambda s: s.at):
        segments[(s.node, s.pid)].append(s)
    return {
        name: trend.slope(
            [[(s.at, float(getattr(s, name))) for s in seg] for seg in segments.values()]
        )
        for name in names
    }


def _per_h(found: trend.Slope | None) -> float | None:
    return None if found is None else round(found.per_h, 3)


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def summary(result: RunResult) -> dict[str, Any]:
    """The JSON object: the contract's keys first, then the figures behind them."""
    starts = [p.start_s for p in result.pods if p.start_s is not None]
    quiet = [p.start_s for p in result.pods if p.start_s is not None and not p.faulted]
    faulted = [p.start_s for p in result.pods if p.start_s is not None and p.faulted]
    settled = [p.start_s for p in result.pods if p.start_s is not None and p.settled]
    found = slopes(result.samples)
    parts = slopes(result.samples, RSS_PARTS)
    recoveries: dict[str, list[float]] = defaultdict(list)
    for f in result.firings:
        if f.recovery_s is not None:
            recoveries[f.kind].append(f.recovery_s)

    def per_h(name: str) -> float | None:
        return _per_h(found[name])

    return {
        "pods_started": len(starts),
        "violations": [v.as_dict() for v in result.violations],
        "start_p99_s": _rounded(percentile(starts, 99)),
        "faults": dict(sorted(Counter(f.kind for f in result.firings).items())),
        "rss_slope_mib_per_h": per_h("rss_mib"),
        "fd_slope_per_h": per_h("fds"),
        "leftovers": list(result.leftovers),
        "threads_slope_per_h": per_h("threads"),
        "slope_intervals_per_h": {
            k: None if s is None else [round(s.low_per_h, 3), round(s.high_per_h, 3)]
            for k, s in (found | parts).items()
        },
        "rss_anon_slope_mib_per_h": _per_h(parts["anon_mib"]),
        "rss_file_slope_mib_per_h": _per_h(parts["file_mib"]),
        "start_p50_s": _rounded(percentile(starts, 50)),
        "start_p50_s_quiet": _rounded(percentile(quiet, 50)),
        "start_p99_s_quiet": _rounded(percentile(quiet, 99)),
        "start_p50_s_settled": _rounded(percentile(settled, 50)),
        "start_p99_s_settled": _rounded(percentile(settled, 99)),
        "start_p50_s_faulted": _rounded(percentile(faulted, 50)),
        "start_p99_s_faulted": _rounded(percentile(faulted, 99)),
        "pods_never_started": sum(1 for p in result.pods if p.running is None),
        "slowest_quiet_starts": _slowest_quiet(result.pods),
        "by_mode": _by_mode(result.pods),
        "recovery_s_max": {k: round(max(v), 3) for k, v in sorted(recoveries.items())},
        "recovery_s": {k: [round(x, 3) for x in v] for k, v in sorted(recoveries.items())},
        "trends_unjudged": list(result.trends_unjudged),
        "unrecovered": sorted(f.label for f in result.firings if f.recovered is None),
        "fault_errors": list(result.fault_errors),
        "unavailable_faults": dict(result.unavailable),
        "interrupted_at_s": _rounded(result.interrupted_at),
        "minutes": result.minutes,
        "seed": result.seed,
        "mode": result.mode,
    }


SLOWEST_SHOWN = 10


def _slowest_quiet(pods: Sequence[PodStart]) -> list[dict[str, Any]]:
    """The slowest starts with no fault active, each split where it waited (scheduler, then
    kubelet and the CNI chain, then the containers) and how soon after a fault it came."""
    quiet = sorted(
        (p for p in pods if p.start_s is not None and not p.faulted),
        key=lambda p: -(p.start_s or 0.0),
    )
    return [
        {
            "name": p.name,
            "node": p.node,
            "mode": p.mode,
            "start_s": _rounded(p.start_s),
            "scheduled_s": _rounded(p.scheduled_s),
            "sandbox_s": _rounded(p.sandbox_s),
            "after_fault_s": _rounded(p.after_fault_s),
        }
        for p in quiet[:SLOWEST_SHOWN]
    ]


def _by_mode(pods: Sequence[PodStart]) -> dict[str, dict[str, Any]]:
    """Per mode (sidecar, ambient): pods started and their start p50/p99."""
    found: dict[str, list[float]] = defaultdict(list)
    for p in pods:
        found[p.mode]
        if p.start_s is not None:
            found[p.mode].append(p.start_s)
    return {
        mode: {
            "pods_started": len(starts),
            "start_p50_s": _rounded(percentile(starts, 50)),
            "start_p99_s": _rounded(percentile(starts, 99)),
        }
        for mode, starts in sorted(found.items())
    }


def markdown(data: dict[str, Any]) -> str:
    def fmt(v: Any) -> str:
        return "-" if v is None else str(v)

    def pair(a: str, b: str) -> str:
        return f"{fmt(data[a])} / {fmt(data[b])}"

    def slope(key: str, interval: str) -> str:
        unjudged = f" (not judged: no agent process sampled {trend.JUDGED_SPAN_S / 60:.0f} min)"
        note = unjudged if interval in data.get("trends_unjudged", ()) else ""
        return f"{fmt(data.get(key))} {fmt(data['slope_intervals_per_h'].get(interval))}{note}"

    never = data["pods_never_started"]
    lines = [
        f"# Soak: {data['minutes']} min, seed {data['seed']}, {data['mode']}",
        "",
        *(
            [f"Interrupted at {data['interrupted_at_s']} s: partial figures, no leftover scan.", ""]
            if data["interrupted_at_s"] is not None
            else []
        ),
        "| figure | value |",
        "|---|---|",
        f"| pods started | {data['pods_started']} (never started: {never}) |",
        f"| start p50 / p99 s, no fault | {pair('start_p50_s_quiet', 'start_p99_s_quiet')} |",
        f"| start p50 / p99 s, no fault in the {SETTLED_S:g} s before | "
        f"{pair('start_p50_s_settled', 'start_p99_s_settled')} |",
        f"| start p50 / p99 s, faulted | {pair('start_p50_s_faulted', 'start_p99_s_faulted')} |",
        f"| RSS slope MiB/h (95% interval) | {slope('rss_slope_mib_per_h', 'rss_mib')} |",
        f"| of it anonymous / file-backed, not judged | "
        f"{slope('rss_anon_slope_mib_per_h', 'anon_mib')} / "
        f"{slope('rss_file_slope_mib_per_h', 'file_mib')} |",
        f"| fd slope /h (95% interval) | {slope('fd_slope_per_h', 'fds')} |",
        f"| threads slope /h (95% interval) | {slope('threads_slope_per_h', 'threads')} |",
        f"| violations | {len(data['violations'])} |",
        f"| leftovers | {len(data['leftovers'])} |",
        "",
        "| fault | fired | longest recovery s |",
        "|---|---|---|",
    ]
    for kind, count in data["faults"].items():
        lines.append(f"| {kind} | {count} | {fmt(data['recovery_s_max'].get(kind))} |")
    for kind, why in data["unavailable_faults"].items():
        lines.append(f"| {kind} | not available: {why} | - |")
    if data["slowest_quiet_starts"]:
        lines += [
            "",
            "Slowest starts with no fault active (s after creation; API stamps, whole seconds):",
            "",
            "| pod | node | start | scheduled | sandbox | after a fault's recovery |",
            "|---|---|---|---|---|---|",
        ]
        for p in data["slowest_quiet_starts"]:
            lines.append(
                f"| {p['name']} | {p['node']} | {p['start_s']} | {fmt(p['scheduled_s'])} | "
                f"{fmt(p['sandbox_s'])} | {fmt(p['after_fault_s'])} |"
            )
    if data["fault_errors"]:
        lines += ["", "Faults not fired (their act failed):", ""]
        lines += [f"- {e}" for e in data["fault_errors"]]
    if data["violations"]:
        lines += [
            "",
            "| at s | invariant | node | faults active | detail |",
            "|---|---|---|---|---|",
        ]
        for v in data["violations"]:
            lines.append(
                f"| {v['at_s']} | {v['invariant']} | {fmt(v['node'])} | "
                f"{', '.join(v['faults']) or '-'} | {v['detail']} |"
            )
    return "\n".join(lines) + "\n"


def plot(result: RunResult, path: Path) -> None:
    """Three panels sharing the time axis: pods started (cumulative), each fault's windows
    (one row per kind: on, then recovering), and every agent process's RSS."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a node
    import matplotlib.pyplot as plt

    fig, (pods_ax, faults_ax, rss_ax) = plt.subplots(3, 1, sharex=True, figsize=(10, 8))
    started = sorted(p.running for p in result.pods if p.running is not None)
    pods_ax.step(started, range(1, len(started) + 1), where="post")
    pods_ax.set_ylabel("pods started")
    kinds = sorted({f.kind for f in result.firings})
    end = result.minutes * 60.0
    for row, kind in enumerate(kinds):
        # Dark while the fault is on, light while the bed recovers from it.
        mine = [f for f in result.firings if f.kind == kind]
        held = [(f.started, (f.stopped or end) - f.started) for f in mine]
        healing = [
            (f.stopped, (end if f.recovered is None else f.recovered) - f.stopped)
            for f in mine
            if f.stopped is not None
        ]
        faults_ax.broken_barh(healing, (row - 0.4, 0.8), color="tab:orange", alpha=0.4)
        faults_ax.broken_barh(held, (row - 0.4, 0.8), color="tab:red")
    faults_ax.set_yticks(range(len(kinds)), kinds, fontsize=7)
    faults_ax.set_ylabel("faults")
    by_process: dict[tuple[str, int], list[AgentSample]] = defaultdict(list)
    for s in result.samples:
        by_process[(s.node, s.pid)].append(s)
    for (node, pid), seg in sorted(by_process.items()):
        rss_ax.plot([s.at for s in seg], [s.rss_mib for s in seg], label=f"{node} {pid}")
    rss_ax.set_ylabel("agent RSS MiB")
    rss_ax.set_xlabel("seconds since start")
    if len(by_process) <= 12:
        rss_ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def _csv_s(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _pod_row(p: PodStart) -> str:
    times = (p.created, p.running, p.start_s)
    after = (p.after_fault_s, p.scheduled_s, p.sandbox_s)
    return ",".join(
        [p.name, p.node, p.mode, *map(_csv_s, times), str(int(p.faulted)), *map(_csv_s, after)]
    )


def write(result: RunResult, report: Path) -> dict[str, Any]:
    """FILE.md, FILE.png beside it, FILE.json, FILE.samples.csv and FILE.pods.csv (FILE as
    given, its suffix replaced)."""
    data = summary(result)
    report.parent.mkdir(parents=True, exist_ok=True)
    report.with_suffix(".md").write_text(markdown(data))
    report.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    # Every agent sample, for judging a slope by eye (the plot shows RSS only).
    rows = [
        f"{s.at:.2f},{s.node},{s.pid},{s.rss_mib:.3f},{s.threads},{s.fds},"
        f"{s.anon_mib:.3f},{s.file_mib:.3f}"
        for s in result.samples
    ]
    report.with_suffix(".samples.csv").write_text(
        "\n".join(["at_s,node,pid,rss_mib,threads,fds,anon_mib,file_mib", *rows]) + "\n"
    )
    # Every pod's start, for finding what the slow ones have in common.
    pods = [_pod_row(p) for p in result.pods]
    report.with_suffix(".pods.csv").write_text(
        "\n".join(
            [
                "name,node,mode,created_s,running_s,start_s,faulted,after_fault_s,scheduled_s,sandbox_s",
                *pods,
            ]
        )
        + "\n"
    )
    plot(result, report.with_suffix(".png"))
    return data
