"""Fixtures of the foreign-userland tests: the built plugin, the roots, a real agent."""

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


@pytest.fixture(scope="session")
def built_plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("foreign-plugin")
    done = subprocess.run(
        [str(REPO / "ci" / "build-plugin"), str(out)],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    assert done.returncode == 0, f"ci/build-plugin failed:\n{done.stderr[-3000:]}"
    return out / "istio-cni"


@pytest.fixture(scope="session")
def cached_roots() -> dict[str, Path]:
    return setup_roots()


@pytest.fixture(params=["bullseye", "empty"])
def root(
    request: pytest.FixtureRequest, built_plugin: Path, cached_roots: dict[str, Path]
) -> Iterator[ForeignRoot]:
    """Each test runs once in Debian 11 and once in an empty root."""
    name = str(request.param)
    scratch = Path(tempfile.mkdtemp(prefix="istio-cni-root-"))
    try:
        yield ForeignRoot(
            name, cached_roots[name] if name != "empty" else None, built_plugin, scratch
        )
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
