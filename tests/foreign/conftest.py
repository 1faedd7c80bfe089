"""Fixtures of the foreign-userland tests: the built plugins (this machine's and arm64's), the
roots, a real agent."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.config import Settings
from agent.podserver.server import PodServer
from agent.rules.sidecar.redirector import RulesRedirector
from plugin import wire
from tests.foreign.roots import REPO, ForeignRoot, setup_roots
from tests.podserver.helpers import HandlerRig, InMemoryPods, build_rig, make_pod


def build_plugin(out: Path, arch: str | None = None) -> Path:
    argv = [str(REPO / "ci" / "build-plugin"), *(["--arch", arch] if arch else []), str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600, check=False)
    assert done.returncode == 0, f"{' '.join(argv)} failed:\n{done.stderr[-3000:]}"
    return out / "istio-cni"


@pytest.fixture(scope="session")
def built_plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_plugin(tmp_path_factory.mktemp("foreign-plugin"))


@pytest.fixture(scope="session")
def built_plugin_arm64(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin cross-compiled for linux/arm64; it runs here under qemu-user (ci/setup-binfmt
    registers qemu-aarch64 with the F flag, so it runs in an empty root too)."""
    binfmt = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    assert binfmt.exists() and binfmt.read_text().startswith("enabled"), (
        "qemu-aarch64 is not enabled in binfmt_misc: run ci/setup-binfmt"
    )
    return build_plugin(tmp_path_factory.mktemp("foreign-plugin-arm64"), "arm64")


@pytest.fixture(scope="session")
def cached_roots() -> dict[str, Path]:
    return setup_roots()


@pytest.fixture(params=["bullseye", "empty", "empty-arm64"])
def root(request: pytest.FixtureRequest, cached_roots: dict[str, Path]) -> Iterator[ForeignRoot]:
    """Each test runs in Debian 11, in an empty root, and in an empty root with the arm64
    plugin (under qemu-user)."""
    name = str(request.param)
    plugin: Path = request.getfixturevalue(
        "built_plugin_arm64" if name.endswith("arm64") else "built_plugin"
    )
    base = None if name.startswith("empty") else cached_roots[name]
    scratch = Path(tempfile.mkdtemp(prefix="istio-cni-root-"))
    try:
        yield ForeignRoot(name, base, plugin, scratch)
    finally:
        # The mounts died with the run's namespace: only the empty mount point is left.
        shutil.rmtree(scratch, ignore_errors=True)


@dataclass
class RealAgent:
    """The agent's pod server on its Unix socket, with the real rule backends behind it."""

    run_dir: Path
    netns: Path
    rig: HandlerRig


@pytest.fixture
def real_agent(pod_netns: Path) -> Iterator[RealAgent]:
    """PodServer + PodHandlers + RulesRedirector (iptables-nft) into a real pod netns; the pod
    comes from memory instead of the API server (what the cache would hold for it)."""
    # sun_path is 108 bytes: a short dir, not pytest's tmp_path.
    base = Path(tempfile.mkdtemp(prefix="icni-", dir="/tmp"))
    server = None
    try:
        redirector = RulesRedirector(
            exclude_namespaces=Settings().excludeNamespaces, backend="iptables-nft"
        )
        pod = make_pod("app-1", "default", uid="uid-1")
        rig = build_rig(InMemoryPods(pod), redirector)
        server = PodServer(str(base / "run" / wire.SOCKET_NAME), rig.handlers)
        server.start()
        os.chmod(base, 0o755)
        yield RealAgent(base / "run", pod_netns, rig)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(base, ignore_errors=True)
