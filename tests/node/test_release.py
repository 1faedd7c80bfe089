"""`ci/release` against a real OCI registry (testbed/registry.py: Debian's docker-registry with
TLS, reachable from this machine and the node), then the chart installed as a platform team
would: from the OCI reference and from the classic chart repository (served on loopback), with
nothing but the node's dirs set, so the image is the chart's default, pulled by the node's
containerd from the registry (never imported)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed import chart as agent_mod
from testbed import kubepods, podnet
from testbed.helm import Helm
from testbed.parts import REPO_ROOT
from testbed.realnode import RealCluster
from testbed.registry import Registry, running_registry

pytestmark = [pytest.mark.node, pytest.mark.release]

REGISTRY_PATH = "istio-cni"
"""The repository path under the registry's address (as an organisation on a public registry)."""


@pytest.fixture
def registry(real_cluster: RealCluster, tmp_path: Path) -> Iterator[Registry]:
    with running_registry(real_cluster, tmp_path / "registry") as running:
        yield running


@contextlib.contextmanager
def served(directory: Path) -> Iterator[str]:
    """`directory` over HTTP on loopback; its base URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def release(registry: Registry, repo_dir: Path, repo_url: str) -> dict[str, str]:
    """Run ci/release; its printed artifacts by kind (image, chart, repo)."""
    done = subprocess.run(
        [
            str(REPO_ROOT / "ci" / "release"),
            "--registry",
            f"{registry.address}/{REGISTRY_PATH}",
            "--ca-file",
            str(registry.ca_file),
            "--repo-dir",
            str(repo_dir),
            "--repo-url",
            repo_url,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=1200,
    )
    assert done.returncode == 0, f"ci/release failed:\n{done.stderr[-4000:]}"
    printed = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert set(printed) == {"image", "chart", "repo"}, done.stdout
    return printed


def node_dirs(cluster: RealCluster) -> dict[str, Any]:
    """Only what the node needs: the image stays the chart's default."""
    return {
        "cniBinDir": str(cluster.cni_bin_dir),
        "cniConfDir": str(cluster.cni_conf_dir),
        "cniNetnsDir": str(cluster.netns_dir),
        "cniAgentRunDir": str(cluster.agent_run_dir),
        "logLevel": "debug",
    }


def install_from(helm: Helm, chart: str, values: dict[str, Any], *extra: str) -> None:
    values_path = helm.home / "release-values.yaml"
    values_path.write_text(yaml.safe_dump(values))
    helm.run(
        "install",
        agent_mod.RELEASE,
        chart,
        "--namespace",
        agent_mod.AGENT_NAMESPACE,
        "--values",
        str(values_path),
        *extra,
    )
    helm.releases.append((agent_mod.RELEASE, agent_mod.AGENT_NAMESPACE))


def assert_serves_pods(core: Any, cluster: RealCluster, namespace: str, name: str) -> None:
    image = cluster.images["workload"].ref
    core.create_namespaced_pod(
        namespace, kubepods.pod_manifest(name, image, app_command=["sleep"], sidecar=True)
    )
    view = kubepods.wait_running(core, namespace, name)
    assert podnet.has_istio_rules(cluster.pod_netns(view.uid)), f"{name} started uncaptured"


def test_release_to_a_registry_then_install_from_oci_and_from_the_chart_repository(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    registry: Registry,
    workload_ns: str,
    tmp_path: Path,
) -> None:
    repo_dir = tmp_path / "charts"
    with served(repo_dir.parent) as base_url:
        repo_url = f"{base_url}/charts"
        printed = release(registry, repo_dir, repo_url)
        version = yaml.safe_load((REPO_ROOT / "charts/istio-cni/Chart.yaml").read_text())
        chart_version, app_version = version["version"], version["appVersion"]
        image = f"{registry.address}/{REGISTRY_PATH}/istio-cni:{app_version}"
        image_ref, image_digest = printed["image"].split("@")
        assert image_ref == image and image_digest.startswith("sha256:"), printed
        chart_oci = f"oci://{registry.address}/{REGISTRY_PATH}/charts/istio-cni"
        assert printed["chart"].startswith(f"{chart_oci}:{chart_version}@sha256:"), printed
        package = repo_dir / f"istio-cni-{chart_version}.tgz"
        assert printed["repo"] == str(package) and package.exists()
        index = yaml.safe_load((repo_dir / "index.yaml").read_text())
        (entry,) = index["entries"]["istio-cni"]
        assert entry["version"] == chart_version
        assert entry["urls"] == [f"{repo_url}/istio-cni-{chart_version}.tgz"]

        # From the OCI reference: the default image is the one pushed, pulled by containerd.
        helm = node_helm("3")
        shown = helm.run(
            "show",
            "values",
            chart_oci,
            "--version",
            chart_version,
            "--ca-file",
            str(registry.ca_file),
        )
        assert yaml.safe_load(shown)["hub"] == f"{registry.address}/{REGISTRY_PATH}"
        install_from(
            helm,
            chart_oci,
            node_dirs(real_cluster),
            "--version",
            chart_version,
            "--ca-file",
            str(registry.ca_file),
        )
        agent = agent_mod.ready_agent(node_core, real_cluster)
        pod = node_core.read_namespaced_pod(agent.pod.name, agent_mod.AGENT_NAMESPACE)
        assert pod.spec.containers[0].image == image
        (status,) = [
            s for s in pod.status.container_statuses if s.name == agent_mod.AGENT_CONTAINER
        ]
        assert status.image_id == f"{registry.address}/{REGISTRY_PATH}/istio-cni@{image_digest}"
        events = kubepods.pod_events(node_core, agent_mod.AGENT_NAMESPACE, agent.pod.name)
        assert "Successfully pulled image" in events, events
        assert_serves_pods(node_core, real_cluster, workload_ns, "from-oci")
        helm.uninstall(agent_mod.RELEASE, namespace=agent_mod.AGENT_NAMESPACE)
        agent_mod.wait_agent_gone(node_core)

        # From the classic chart repository, as `helm repo add` users and umbrella charts do.
        helm.run("repo", "add", "istio-cni-release", repo_url)
        found = json.loads(helm.run("search", "repo", "istio-cni-release/istio-cni", "-o", "json"))
        assert [(c["name"], c["version"]) for c in found] == [
            ("istio-cni-release/istio-cni", chart_version)
        ]
        install_from(helm, "istio-cni-release/istio-cni", node_dirs(real_cluster))
        agent = agent_mod.ready_agent(node_core, real_cluster)
        pod = node_core.read_namespaced_pod(agent.pod.name, agent_mod.AGENT_NAMESPACE)
        assert pod.spec.containers[0].image == image
        assert_serves_pods(node_core, real_cluster, workload_ns, "from-repo")
        helm.uninstall(agent_mod.RELEASE, namespace=agent_mod.AGENT_NAMESPACE)
        agent_mod.wait_agent_gone(node_core)
