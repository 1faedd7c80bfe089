"""Chart tests run real Helm 3 and Helm 4 binaries, installed by ci/setup-helm into the cache.

A missing binary fails the test (never skips) with a message naming ci/setup-helm.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.helm import Helm
from testbed.parts import REPO_ROOT, cache_dir

EXAMPLES = REPO_ROOT / "values-examples"
HELM_VERSIONS = ("3.17.3", "4.1.4")
PLATFORMS = tuple(sorted(p.stem for p in EXAMPLES.glob("*.yaml")))


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
