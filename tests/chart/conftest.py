"""Chart tests run real Helm 3 and Helm 4 binaries, installed by ci/setup-helm into the cache.

A missing binary fails the test (never skips) with a message naming ci/setup-helm.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "istio-cni"
EXAMPLES = REPO_ROOT / "values-examples"
HELM_VERSIONS = ("3.17.3", "4.1.4")
PLATFORMS = tuple(sorted(p.stem for p in EXAMPLES.glob("*.yaml")))
RELEASE = "istio-cni"
NAMESPACE = "kube-system"


def cache_dir() -> Path:
    """The directory ci/lib.sh calls $CACHE_DIR."""
    if env := os.environ.get("ISTIO_CNI_CACHE"):
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "istio-cni"


class HelmFailed(Exception):
    def __init__(self, argv: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
        super().__init__(f"{' '.join(argv)} exited {returncode}:\n{stderr}{stdout}")
        self.stdout, self.stderr = stdout, stderr


@dataclass(frozen=True)
class Helm:
    binary: Path
    version: str
    home: Path
    """Helm's cache/config/data dirs: nothing is written to the user's home."""

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ)
        env.update(
            HELM_CACHE_HOME=str(self.home / "cache"),
            HELM_CONFIG_HOME=str(self.home / "config"),
            HELM_DATA_HOME=str(self.home / "data"),
        )
        argv = [str(self.binary), *args]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise HelmFailed(argv, proc.returncode, proc.stdout, proc.stderr)
        return proc

    def template(
        self,
        *,
        values: Sequence[Path] = (),
        sets: Sequence[str] = (),
        chart: Path = CHART,
        release: str = RELEASE,
        namespace: str = NAMESPACE,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        args = ["template", release, str(chart), "--namespace", namespace]
        for v in values:
            args += ["--values", str(v)]
        for s in sets:
            args += ["--set", s]
        return self.run(*args, check=check)

    def render(self, **kwargs: Any) -> list[dict[str, Any]]:
        """The manifests `helm template` renders, as parsed documents."""
        return [d for d in yaml.safe_load_all(self.template(**kwargs).stdout) if d]


@pytest.fixture(params=HELM_VERSIONS, ids=[f"helm{v.split('.')[0]}" for v in HELM_VERSIONS])
def helm(request: pytest.FixtureRequest, tmp_path: Path) -> Helm:
    version: str = request.param
    binary = cache_dir() / "helm" / version / "helm"
    if not os.access(binary, os.X_OK):
        pytest.fail(f"Helm {version} missing at {binary}: run ci/setup-helm", pytrace=False)
    return Helm(binary=binary, version=version, home=tmp_path / "helm-home")


def platform_values(platform: str) -> list[Path]:
    """The values files of a preset id ('default' = none)."""
    return [] if platform == "default" else [EXAMPLES / f"{platform}.yaml"]


def only(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, rendered {len(found)}"
    return found[0]


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def agent_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = only(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def host_paths(docs: list[dict[str, Any]]) -> dict[str, str]:
    """Volume name -> host path of the DaemonSet's hostPath volumes."""
    volumes = only(docs, "DaemonSet")["spec"]["template"]["spec"]["volumes"]
    return {v["name"]: v["hostPath"]["path"] for v in volumes if "hostPath" in v}


def mounts(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Mount path -> its volumeMount in the agent container."""
    return {m["mountPath"]: m for m in agent_container(docs)["volumeMounts"]}


def agent_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(only(docs, "ConfigMap")["data"]["config.yaml"])
    return data
