"""The seeded 5-minute soak (python -m bench.soak) on the three-node test bed: every fault kind
the bed wires fired at least once, alone and overlapping, and no invariant broken: every pod
captured, none stuck past the bound, no agent uninstalling, the nodes' CNI files always
working, nothing left on the nodes afterwards. On failure the report's table is printed.

The run is a child process: on a timeout or an error here it is interrupted (SIGINT), and it
tears the bed down itself before it exits."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from bench.soak import faults
from bench.soak.testbed_bed import LACKS

REPO = Path(__file__).resolve().parents[2]
MINUTES = 5
SEED = 1
RUN_TIMEOUT_S = 900
"""The bed's start (~40 s), the run, its recovery tail, the drain and the teardown, with room
for a loaded machine."""
INTERRUPTED_TEARDOWN_S = 180


def wired() -> list[str]:
    """The kinds this bed fires: the catalogue's available ones less what the bed lacks."""
    return sorted(k.name for k in faults.available() if k.name not in LACKS)


def soak(report: Path, workdir: Path) -> tuple[int, str, str]:
    argv = [
        sys.executable, "-m", "bench.soak", "--minutes", str(MINUTES), "--seed", str(SEED),
        "--report", str(report), "--json", "--workdir", str(workdir),
    ]  # fmt: skip
    log = report.with_suffix(".log")
    with log.open("w") as err:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
        finally:
            if proc.poll() is None:  # timed out, or this test was interrupted: bed torn down
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(INTERRUPTED_TEARDOWN_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    return proc.returncode, out, log.read_text(errors="replace")


def _remove_unless_mounted(path: Path) -> None:
    """The soak tears its bed down itself; a mount it left below `path` is not descended into
    (and the dir is left for a look)."""
    with open("/proc/self/mountinfo") as f:
        mounted = [line.split()[4] for line in f]
    if any(m == str(path) or m.startswith(f"{path}/") for m in mounted):
        return
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.soak
@pytest.mark.timeout(RUN_TIMEOUT_S + INTERRUPTED_TEARDOWN_S + 60)
def test_a_seeded_soak_under_every_wired_fault_breaks_no_invariant(tmp_path: Path) -> None:
    # The bed's sockets live under its workdir: a Unix socket path holds at most 107 bytes
    # (containerd refuses its .ttrpc one past 104), too few below pytest's tmp_path.
    bed = Path(tempfile.mkdtemp(prefix="soak-", dir="/tmp"))
    try:
        code, out, err = soak(tmp_path / "soak.md", bed)
    finally:
        _remove_unless_mounted(bed)
    if code == 2:  # the bed could not start: a missing part of the test bed fails the run
        pytest.fail(err.strip().splitlines()[-1])
    lines = out.strip().splitlines()
    table = "\n".join(lines[:-1])
    tail = "\n".join(err.splitlines()[-40:])
    assert lines and lines[-1].startswith("{"), f"no JSON object last (exit {code}):\n{tail}"
    data: dict[str, Any] = json.loads(lines[-1])
    context = f"exit {code}\n{table}\nfault errors: {data['fault_errors']}\nstderr:\n{tail}"
    missed = [k for k in wired() if data["faults"].get(k, 0) < 1]
    assert not missed, f"kinds never fired: {missed}\n{context}"
    assert data["violations"] == [], context
    assert data["leftovers"] == [], context
    assert data["fault_errors"] == [] and data["pods_never_started"] == 0, context
    assert data["interrupted_at_s"] is None and code == 0, context
    assert data["pods_started"] > 0, context
