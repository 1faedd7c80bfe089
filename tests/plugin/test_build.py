"""The standalone build (ci/build-plugin, cached) runs without a host Python and speaks CNI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.plugin.helpers import AgentTestDouble, cni_env, net_conf, result_for

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("plugin-build")
    proc = subprocess.run([str(REPO / "ci" / "build-plugin"), str(out)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"ci/build-plugin failed:\n{proc.stderr[-3000:]}"
    yield out
    shutil.rmtree(out, ignore_errors=True)


def run_built(exe: Path, env: dict[str, str], stdin: dict[str, object] | str = "") -> tuple[
        int, object]:
    """Exec the built plugin with only the CNI variables: no PATH, no PYTHON* anything."""
    data = stdin if isinstance(stdin, str) else json.dumps(stdin)
    proc = subprocess.run([str(exe)], env=env, input=data.encode(), capture_output=True,
                          timeout=60)
    text = proc.stdout.decode()
    return proc.returncode, json.loads(text) if text.strip() else None


def test_layout_is_the_contract(build: Path) -> None:
    names = sorted(p.name for p in build.iterdir())
    assert len(names) == 2 and names[0] == "istio-cni", names
    assert names[1].startswith("istio-cni-") and names[1].endswith(".d")
    assert os.access(build / "istio-cni", os.X_OK)
    ldd = subprocess.run(["ldd", str(build / "istio-cni")], capture_output=True, text=True)
    python_lines = [line for line in ldd.stdout.splitlines() if "libpython" in line]
    assert python_lines and str(build / names[1]) in python_lines[0], ldd.stdout


def test_rebuild_is_identical(build: Path, tmp_path: Path) -> None:
    """Same sources, same support dir name: the content hash is reproducible."""
    proc = subprocess.run([str(REPO / "ci" / "build-plugin"), str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in build.iterdir())


def test_version(build: Path) -> None:
    code, out = run_built(build / "istio-cni", {"CNI_COMMAND": "VERSION"})
    assert code == 0
    assert out == {"cniVersion": "1.1.0",
                   "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]}


@pytest.mark.parametrize("version", ["0.3.1", "1.0.0"])
def test_add_in_excluded_namespace_passes_through(build: Path, version: str) -> None:
    env = cni_env("ADD", CNI_ARGS="K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-x")
    conf = net_conf(version, prevResult=result_for("1.0.0"))
    code, out = run_built(build / "istio-cni", env, conf)
    assert (code, out) == (0, result_for(version))


def test_add_through_the_agent(build: Path, agent: AgentTestDouble) -> None:
    code, out = run_built(build / "istio-cni", cni_env("ADD"),
                          net_conf("1.1.0", str(agent.run_dir)))
    assert (code, out) == (0, result_for("1.1.0"))
    assert agent.paths() == ["/v1/cni/add"]


def test_add_agent_down_fails_closed(build: Path, tmp_path: Path) -> None:
    code, out = run_built(build / "istio-cni", cni_env("ADD"), net_conf(run_dir=str(tmp_path)))
    assert code == 1 and isinstance(out, dict) and out["code"] == 11


def test_malformed_stdin_gives_error_object(build: Path) -> None:
    code, out = run_built(build / "istio-cni", cni_env("ADD"), "{oops")
    assert code == 1 and isinstance(out, dict) and out["code"] == 6

