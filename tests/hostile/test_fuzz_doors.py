"""Every door fuzzed for a short, seeded while (bench/fuzz_doors.py, coverage-guided with
atheris), and every input a fuzz run ever found replayed: a door that breaks its contract on any
of them fails here. The longer runs and their figures: bench/README.md."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.hostile

REPO = Path(__file__).resolve().parents[2]
FINDINGS = REPO / "tests" / "testdata" / "fuzz-findings"
SECONDS = 10
SEED = 20261206


def findings() -> list[Path]:
    return sorted(p for p in FINDINGS.glob("*/*") if p.is_file())


def test_every_door_survives_a_short_seeded_run(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.fuzz_doors", "--seconds", str(SECONDS), "--seed", str(SEED),
         "--workdir", str(tmp_path), "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=SECONDS * 12 + 120,
    )  # fmt: skip
    print(done.stdout[-6000:], done.stderr[-3000:])
    report = json.loads(done.stdout.strip().splitlines()[-1])["doors"]
    from bench.fuzz_doors import DOORS

    assert sorted(report) == sorted(DOORS)
    for name, figures in report.items():
        assert figures["execs"] > 0 and figures["coverage"] > 0, (name, figures)
        assert figures["crashes"] == 0, (name, figures["artifacts"], figures["finding"])
    assert done.returncode == 0


@pytest.mark.parametrize("found", findings(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_each_input_a_fuzz_run_found_is_handled(found: Path) -> None:
    door: ModuleType = importlib.import_module(f"bench.doors.{found.parent.name}")
    door.setup()
    try:
        door.one_input(found.read_bytes())
    finally:
        door.teardown()
