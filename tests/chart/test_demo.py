"""ci/demo --render: renders, lints and validates the chart for a platform and prints it."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from testbed.parts import REPO_ROOT

pytestmark = pytest.mark.chart


def demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO_ROOT / "ci" / "demo"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_demo_renders_and_validates_a_platform() -> None:
    proc = demo("openshift")
    assert proc.returncode == 0, proc.stderr[-3000:]
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert "NetworkAttachmentDefinition" in {d["kind"] for d in docs}
    assert "0 failures" in proc.stderr
    assert "cniConfDir: /etc/cni/multus/net.d" in proc.stderr  # the summary of what was rendered


def test_demo_defaults_to_kind() -> None:
    proc = demo("--render")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "what was rendered for kind" in proc.stderr


def test_demo_names_the_known_platforms_for_an_unknown_one() -> None:
    proc = demo("nomad")
    assert proc.returncode != 0
    assert "unknown platform 'nomad'" in proc.stderr and "openshift" in proc.stderr
