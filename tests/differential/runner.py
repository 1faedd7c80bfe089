"""Run generated cases, grouped by host, each group in its own fresh network + mount namespace.

Cases that share a Host share a namespace (one `unshare` and one Python start per group), which
keeps a run of a thousand cases within a few minutes on two cores.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tests.differential.generator import Case, Host

REPO = Path(__file__).resolve().parents[2]


def run_cases(
    pilot_agent: Path,
    hosts: list[Host],
    cases: list[Case],
    *,
    parallel: int = 2,
    native: bool = False,
) -> dict[int, dict[str, Any]]:
    """Results by case index: {"istio": {rc, lines, error}, "ours": {...}}. `native`: the cases
    are native-nftables ones; each side's rules are also applied and listed (`ruleset`)."""
    groups: dict[int, list[Case]] = {}
    for case in cases:
        groups.setdefault(case.host, []).append(case)
    with tempfile.TemporaryDirectory(prefix="istio-diff-run-") as tmp:

        def one(host_index: int) -> list[dict[str, Any]]:
            return _run_group(
                pilot_agent, hosts[host_index], groups[host_index], Path(tmp), host_index, native
            )

        with ThreadPoolExecutor(max_workers=parallel) as pool:
            batches = list(pool.map(one, sorted(groups)))
    return {result["index"]: result for batch in batches for result in batch}


def _run_group(
    pilot_agent: Path, host: Host, cases: list[Case], tmp: Path, host_index: int, native: bool
) -> list[dict[str, Any]]:
    spec = tmp / f"spec-{host_index}.json"
    out = tmp / f"out-{host_index}.json"
    spec.write_text(
        json.dumps(
            {
                "pilot_agent": str(pilot_agent),
                "host": {
                    "links": [list(link) for link in host.links],
                    "resolv_conf": host.resolv_conf,
                },
                "cases": [asdict(case) for case in cases],
                "native": native,
            }
        )
    )
    proc = subprocess.run(
        [
            "unshare",
            "--net",
            "--mount",
            "--",
            sys.executable,
            "-m",
            "tests.differential.batch",
            str(spec),
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"differential batch for host {host_index} ({host}) failed: {proc.stderr[-2000:]}"
        )
    results: list[dict[str, Any]] = json.loads(out.read_text())
    return results
