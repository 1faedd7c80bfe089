"""The CLI (python -m bench.soak): the catalogue listed, each kind available or not and why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.soak import faults
from bench.soak.__main__ import parse

REPO = Path(__file__).resolve().parents[2]


def test_list_faults_names_each_kind_and_whether_it_is_available() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--list-faults"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert len(lines) == 17
    reboot = next(line for line in lines if line.startswith("node_reboot"))
    assert reboot.endswith("; available"), reboot
    assert sum("NOT AVAILABLE" in line for line in lines) == len(faults.unavailable())


def test_without_leaves_kinds_out_and_refuses_an_unknown_one() -> None:
    args = parse(["--without", "agent_kill9,helm_upgrade", "--without", "node_reboot"])
    assert args.without == {"agent_kill9", "helm_upgrade", "node_reboot"}
    assert parse([]).without == set()
    done = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--without", "agent_kill9,no_such_fault"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--without: no fault kind no_such_fault" in done.stderr
