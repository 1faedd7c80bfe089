"""Debian's Prometheus binaries (ci/setup-apt installs the `prometheus` package): found or the
test fails naming the script that installs them, never skipped."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "istio-cni"
ALERTS = CHART / "files" / "alerts.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"
ALERT_TESTS = Path(__file__).resolve().parent / "alerts_test.yaml"


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} not found: install Debian's prometheus package (ci/setup-apt)", pytrace=False
        )
    return path


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary("promtool"), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=cwd,
    )
