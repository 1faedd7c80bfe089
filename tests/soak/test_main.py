"""The CLI (python -m bench.soak): the catalogue listed with what is unavailable and why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_list_faults_names_each_kind_and_why_one_is_unavailable() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--list-faults"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert len(lines) == 17
    reboot = next(line for line in lines if line.startswith("node_reboot"))
    assert "NOT AVAILABLE: " in reboot and "reboot" in reboot.split("NOT AVAILABLE:")[1]
    assert sum("NOT AVAILABLE" in line for line in lines) == 1
