"""A values file written for Istio's istio-cni chart installs ours on a real node with the same
effect: `cni.*` keys, Istio's repair flags and per-scope log level, `env` entries Istio's agent
reads, `global.logAsJson`. The agent pod carries the label istiod's untaint controller watches and
the scrape annotations; its log (and the plugin's lines forwarded into it) are JSON; a sidecar pod
started by kubelet is captured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed import chart as agent_mod
from testbed import kubepods
from testbed.images import Image
from testbed.realnode import RealCluster

pytestmark = [pytest.mark.node]

OUTSIDE = ("203.0.113.10", 80)  # TEST-NET-3: never routed; the node netns has no route out


def istio_values(cluster: RealCluster, image: Image) -> dict[str, Any]:
    """What an Istio user writes: everything under `cni:`, Istio's names only."""
    return {
        "cni": {
            "hub": image.hub,
            "tag": image.tag,
            "pullPolicy": "Never",
            "cniBinDir": str(cluster.cni_bin_dir),
            "cniConfDir": str(cluster.cni_conf_dir),
            "cniNetnsDir": str(cluster.netns_dir),
            "logging": {"level": "default:info,cni-plugin:debug"},
            "repair": {"repairPods": False, "deletePods": True},
            "env": {
                "CNI_AGENT_RUN_DIR": str(cluster.agent_run_dir),
                "EXCLUDE_NAMESPACES": "kube-system,istio-system",
            },
        },
        "global": {"logAsJson": True},
    }


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of an agent log parsed as one JSON object; a line that is not one fails."""
    out = []
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            raise AssertionError(f"not a JSON log line: {line!r}") from None
        assert isinstance(obj, dict) and {"time", "level", "msg"} <= obj.keys(), line
        out.append(obj)
    return out


def test_istio_values_file_installs_and_captures(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
    tmp_path: Path,
) -> None:
    values_file = tmp_path / "istio-values.yaml"
    values_file.write_text(yaml.safe_dump(istio_values(real_cluster, agent_image)))
    helm = node_helm("3")
    helm.install(
        agent_mod.RELEASE,
        agent_mod.CHART,
        namespace=agent_mod.AGENT_NAMESPACE,
        values_files=(values_file,),
    )
    agent = agent_mod.ready_agent(node_core, real_cluster, image=agent_image)

    # Istio's operational contracts on the agent pod.
    pod = node_core.read_namespaced_pod(agent.pod.name, agent_mod.AGENT_NAMESPACE)
    assert pod.metadata.labels["k8s-app"] == "istio-cni-node"
    annotations = pod.metadata.annotations
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert annotations["prometheus.io/port"] == str(pod.spec.containers[0].ports[0].container_port)

    # Istio's keys reached the agent: delete mode, the plugin's scope at debug, JSON.
    config = yaml.safe_load(
        node_core.read_namespaced_config_map(agent_mod.RELEASE, agent_mod.AGENT_NAMESPACE).data[
            "config.yaml"
        ]
    )
    assert config["repair"]["mode"] == "delete"
    assert config["cniAgentRunDir"] == str(real_cluster.agent_run_dir)
    assert config["excludeNamespaces"] == ["kube-system", "istio-system"]
    entry = agent_mod.conflist(real_cluster)["plugins"][-1]
    assert entry["type"] == "istio-cni" and entry["plugin_log_level"] == "debug"
    assert entry["log_as_json"] is True and "pod_name" not in entry
    assert agent.pod.name.startswith(entry["agent_pod_prefix"])

    # A sidecar pod is captured: its app's connections out reach the proxy's 15001.
    image = real_cluster.images["workload"].ref
    node_core.create_namespaced_pod(
        workload_ns,
        kubepods.pod_manifest(
            "meshed",
            image,
            app_command=["connect-loop", OUTSIDE[0], str(OUTSIDE[1]), "0.5"],
            sidecar=True,
        ),
    )
    kubepods.wait_running(node_core, workload_ns, "meshed")
    line = kubepods.wait_log_line(
        node_core,
        workload_ns,
        "meshed",
        "app",
        lambda s: "proxy-double port=15001" in s,
        "a connection answered by the proxy",
    )
    assert f"original_dst={OUTSIDE[0]}:{OUTSIDE[1]}" in line, line

    # Every agent line is JSON, the plugin's forwarded lines (debug: its scope's level) too.
    def plugin_lines() -> list[dict[str, Any]]:
        return [
            o
            for o in json_lines(agent.logs(node_core))
            if o.get("source") == "plugin" and o.get("pod") == f"{workload_ns}/meshed"
        ]

    found = kubepods.wait_for(
        plugin_lines,
        "the plugin's lines for the pod in the agent log",
        30,
        on_timeout=lambda: agent.logs(node_core)[-3000:],
    )
    assert any(o["level"] == "debug" for o in found), found
