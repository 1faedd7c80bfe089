"""ci/setup-testbed: a failed build stops the run naming the part; cached parts are reused."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from testbed import operator_crds, parts
from testbed.istio_binaries import istio_version

# The script checks Debian's etcd, a part of the cluster tier.
pytestmark = pytest.mark.cluster

SCRIPT = parts.REPO_ROOT / "ci" / "setup-testbed"


def _run(cache: Path) -> subprocess.CompletedProcess[str]:
    # GO=/bin/false: any attempt to build fails at once, so a pass proves nothing was built.
    env = dict(os.environ, ISTIO_CNI_CACHE=str(cache), GO="/bin/false")
    return subprocess.run(
        [str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_failed_build_names_the_part_and_leaves_no_partial_binary(tmp_path: Path) -> None:
    result = _run(tmp_path)
    assert result.returncode != 0
    assert "build of kube-apiserver failed" in result.stderr
    kube_dir = tmp_path / "kube" / parts.kube_version()
    assert not list(kube_dir.glob("*")), "no binary, no temp file left behind"
    assert not list(tmp_path.glob("build-*/")), "scratch dirs removed"


def test_cached_parts_are_reused_without_building(tmp_path: Path) -> None:
    version = parts.kube_version()
    cni_version = parts.pinned_version("cnitool", "github.com/containernetworking/cni")
    crio_version = parts.setup_testbed_version("CRIO_VERSION")
    for rel in (
        f"kube/{version}/kube-apiserver",
        f"kube/{version}/kube-controller-manager",
        f"kube/{version}/kube-scheduler",
        f"kube/{version}/kubelet",
        f"kube/{version}/kubectl",
        f"cnitool/{cni_version}/cnitool",
        str(parts.libcni_oracle().path.relative_to(parts.cache_dir())),
        f"istio/{istio_version()}/pilot-agent",
        f"istio/{istio_version()}/istio-cni",
        f"istio/{istio_version()}/pilot-discovery",
        f"istio/{istio_version()}/install-cni",
        f"crio/{crio_version}/crio",
        f"crio/{crio_version}/pinns",
        f"multus/{parts.setup_testbed_version('MULTUS_VERSION')}/multus",
        *(
            f"prometheus-operator-crds/{operator_crds.VERSION}/{f}"
            for f in operator_crds.FILES.values()
        ),
    ):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    result = _run(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("cached at") == 14
    assert f"kube-apiserver {tmp_path}/kube/{version}/kube-apiserver" in result.stdout
    discovery = f"pilot-discovery {tmp_path}/istio/{istio_version()}/pilot-discovery"
    assert discovery in result.stdout
    assert f"install-cni {tmp_path}/istio/{istio_version()}/install-cni" in result.stdout
    assert f"crio {tmp_path}/crio/{crio_version}/crio" in result.stdout
