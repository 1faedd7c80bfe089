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


def _run(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # GO=/bin/false: any attempt to build fails at once, so a pass proves nothing was built.
    env = dict(os.environ, ISTIO_CNI_CACHE=str(cache), GO="/bin/false")
    return subprocess.run(
        [str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def _cache(root: Path, *rels: str) -> None:
    """Stand-ins for built parts: what the script finds there counts as built."""
    for rel in rels:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)


DEMO_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")


def _kube_parts(
    commands: tuple[str, ...] = (*DEMO_COMMANDS, "kubectl", "kube-proxy"),
) -> list[str]:
    version = parts.kube_version()
    cni_version = parts.pinned_version("cnitool", "github.com/containernetworking/cni")
    return [*(f"kube/{version}/{c}" for c in commands), f"cnitool/{cni_version}/cnitool"]


def _extra_kube_parts() -> list[str]:
    """The server binaries of the further releases (ci/go/kubernetes-1.<minor>)."""
    return [f"kube/{version}/{c}" for version in parts.extra_kube_versions() for c in DEMO_COMMANDS]


def test_failed_build_names_the_part_and_leaves_no_partial_binary(tmp_path: Path) -> None:
    result = _run(tmp_path)
    assert result.returncode != 0
    assert "build of kube-apiserver failed" in result.stderr
    kube_dir = tmp_path / "kube" / parts.kube_version()
    assert not list(kube_dir.glob("*")), "no binary, no temp file left behind"
    assert not list(tmp_path.glob("build-*/")), "scratch dirs removed"


def _base_parts() -> list[str]:
    """Every part but the further Kubernetes releases."""
    crio_version = parts.setup_testbed_version("CRIO_VERSION")
    return [
        *_kube_parts(),
        str(parts.coredns().path.relative_to(parts.cache_dir())),
        str(parts.libcni_oracle().path.relative_to(parts.cache_dir())),
        str(parts.attacks_go().path.relative_to(parts.cache_dir())),
        f"istio/{istio_version()}/pilot-agent",
        f"istio/{istio_version()}/istio-cni",
        f"istio/{istio_version()}/pilot-discovery",
        f"istio/{istio_version()}/install-cni",
        f"crio/{crio_version}/crio",
        f"crio/{crio_version}/pinns",
        f"multus/{parts.setup_testbed_version('MULTUS_VERSION')}/multus",
        str(parts.envoy().path.relative_to(parts.cache_dir())),
        str(parts.runc().path.relative_to(parts.cache_dir())),
        *(
            str(parts.containerd2(name).path.relative_to(parts.cache_dir()))
            for name in ("containerd", "containerd-shim-runc-v2", "ctr")
        ),
        *(
            str(parts.cni_plugin_1_1(name).path.relative_to(parts.cache_dir()))
            for name in ("ptp", "host-local", "portmap")
        ),
        *(
            f"prometheus-operator-crds/{operator_crds.VERSION}/{f}"
            for f in operator_crds.FILES.values()
        ),
    ]


def test_cached_parts_are_reused_without_building(tmp_path: Path) -> None:
    version = parts.kube_version()
    crio_version = parts.setup_testbed_version("CRIO_VERSION")
    _cache(tmp_path, *_base_parts(), *_extra_kube_parts())
    result = _run(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("cached at") == 23 + len(_extra_kube_parts())
    for extra in parts.extra_kube_versions():
        apiserver = f"kube/{extra}/kube-apiserver"
        assert f"kube-apiserver-{extra} {tmp_path}/{apiserver}" in result.stdout
        assert f"kubectl-{extra}" not in result.stdout, "kubectl only of the test bed's release"
    assert f"envoy {tmp_path}/envoy/{parts.envoy_version()}/envoy" in result.stdout
    assert f"kube-apiserver {tmp_path}/kube/{version}/kube-apiserver" in result.stdout
    assert f"kube-proxy {tmp_path}/kube/{version}/kube-proxy" in result.stdout
    coredns = parts.pinned_version("coredns", "github.com/coredns/coredns")
    assert f"coredns {tmp_path}/coredns/{coredns}/coredns" in result.stdout
    discovery = f"pilot-discovery {tmp_path}/istio/{istio_version()}/pilot-discovery"
    assert discovery in result.stdout
    assert f"install-cni {tmp_path}/istio/{istio_version()}/install-cni" in result.stdout
    assert f"crio {tmp_path}/crio/{crio_version}/crio" in result.stdout
    containerd2 = parts.setup_testbed_version("CONTAINERD2_VERSION")
    assert f"containerd2 {tmp_path}/containerd2/{containerd2}/containerd" in result.stdout
    runc = parts.setup_testbed_version("RUNC_VERSION")
    assert f"runc {tmp_path}/runc/{runc}/runc" in result.stdout


def test_the_demo_needs_only_the_kubernetes_parts(tmp_path: Path) -> None:
    """`--demo` with only the control plane, kubelet and cnitool cached (and any build failing):
    kubectl, Istio's binaries, CRI-O and Multus are never asked for."""
    _cache(tmp_path, *_kube_parts(DEMO_COMMANDS))
    result = _run(tmp_path, "--demo")
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("cached at") == 5
    listed = [line.split()[0] for line in result.stdout.splitlines()]
    assert listed == [*DEMO_COMMANDS, "cnitool", "etcd"]
    full = _run(tmp_path)
    assert full.returncode != 0, "without --demo the same cache lacks kubectl"
    assert "build of kubectl failed" in full.stderr


def test_the_further_releases_are_built_apart(tmp_path: Path) -> None:
    """ci/test builds every part but the further releases before the node tier
    (`--no-extra-kube`), and those beside it (`--extra-kube`), before the tiers that run them."""
    assert parts.extra_kube_versions(), "no further release pinned: nothing to build apart"
    _cache(tmp_path, *_base_parts())
    base = _run(tmp_path, "--no-extra-kube")
    assert base.returncode == 0, base.stderr
    assert not any(f"-{v} " in base.stdout for v in parts.extra_kube_versions())
    assert _run(tmp_path).returncode != 0, "the full set-up lacks the further releases"
    missing = _run(tmp_path, "--extra-kube")
    assert missing.returncode != 0
    first = parts.extra_kube_versions()[0]
    assert f"build of kube-apiserver-{first} failed" in missing.stderr
    _cache(tmp_path, *_extra_kube_parts())
    extra = _run(tmp_path, "--extra-kube")
    assert extra.returncode == 0, extra.stderr
    listed = [line.split()[0] for line in extra.stdout.splitlines()]
    assert listed == [f"{c}-{v}" for v in parts.extra_kube_versions() for c in DEMO_COMMANDS], (
        "only the further releases"
    )


def test_unknown_option_is_refused(tmp_path: Path) -> None:
    result = _run(tmp_path, "--all")
    assert result.returncode != 0
    assert "usage: ci/setup-testbed [--demo | --no-extra-kube | --extra-kube]" in result.stderr
