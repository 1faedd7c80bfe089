"""A live node moved from Istio's own node agent to ours and back, while a meshed pod is created
every second (testbed/churn.py), by the procedure README "Migrating from Istio's CNI on a live
cluster" gives (testbed/migration.py).

Checked: no churn pod ever starts without Istio's rules in its namespace, every one runs in
the end (none stuck in ContainerCreating), pods running from before keep their rules
byte-for-byte, and the conflist each survivor leaves equals the one it writes on a fresh node.
Also: installing ours under the default release name beside Istio's release fails before
anything changes, naming the object both charts would own.

On containerd 2, the node laid out as kind's (tests/node/conftest.py on_containerd2): both agents
chain into kindnet's conflist.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from testbed import chart as agent_mod
from testbed import images, istio_agent, kubepods, nodetaint, podnet
from testbed.churn import Churn
from testbed.helm import Helm, HelmError
from testbed.images import Image
from testbed.migration import ISTIO_VALUES, OUR_VALUES, TAINT, istio_to_ours, ours_to_istio
from testbed.realnode import RealCluster

pytestmark = [pytest.mark.node, pytest.mark.migration, pytest.mark.usefixtures("on_containerd2")]

STEADY = 2
"""Pods started before the first move, checked after the last."""
UNDER_EACH = 8.0
"""Seconds of churn with each agent serving, between the moves."""


def conflist(cluster: RealCluster) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(cluster.conflist_path.read_text())
    return parsed


def test_istio_to_ours_and_back_under_pod_churn(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
) -> None:
    image = real_cluster.images["workload"].ref
    istio_image = images.image("install-cni")
    real_cluster.import_image(istio_image)
    helm = node_helm("3")
    node = real_cluster.node_name
    before = real_cluster.conflist_path.read_bytes()

    try:
        istio_agent.install(helm, real_cluster, node_core, istio_image, **ISTIO_VALUES)
        istio_fresh = conflist(real_cluster)
        steady = {}
        for i in range(STEADY):
            name = f"steady-{i}"
            node_core.create_namespaced_pod(
                workload_ns, kubepods.pod_manifest(name, image, app_command=["sleep"], sidecar=True)
            )
            view = kubepods.wait_running(node_core, workload_ns, name)
            steady[name] = (view.uid, podnet.saved_tables(real_cluster.pod_netns(view.uid)))
            assert "ISTIO_OUTPUT" in steady[name][1], steady[name][1]

        with Churn(node_core, real_cluster, workload_ns, image) as churn:
            time.sleep(UNDER_EACH)
            to_ours = istio_to_ours(helm, real_cluster, node_core, agent_image)
            ours_after = conflist(real_cluster)
            time.sleep(UNDER_EACH)
            back = ours_to_istio(helm, real_cluster, node_core, istio_image)
            istio_after = conflist(real_cluster)
            time.sleep(UNDER_EACH)
        report = churn.report
        print(report.summary())
        for what, (start, end) in (("to ours", to_ours), ("back to Istio's", back)):
            gap = report.created_between(start, end)
            waits = [p.running - p.created for p in gap if p.running is not None]
            print(
                f"move {what}: node tainted {end - start:.1f}s; {len(gap)} pods created meanwhile, "
                f"the longest waited {max(waits, default=0):.1f}s to run"
            )

        assert not report.errors, report.errors
        assert not report.uncaptured, f"started without Istio's rules: {report.uncaptured}"
        assert not report.never_ran, report.never_ran
        assert len(report.pods) >= 3 * UNDER_EACH, report.summary()
        assert {p.node for p in report.pods} == {node}
        # Each start split where it went (the soak's report relies on it): the API stamps the
        # scheduler's bind and the sandbox kubelet made, the CNI chain's network set up in it.
        split = [p.name for p in report.pods if {"scheduled", "sandbox"} <= p.phases.keys()]
        assert len(split) == len(report.pods), [(p.name, p.phases) for p in report.pods]
        for start, end in (to_ours, back):
            assert report.created_between(start, end), "no pod was created during a move"

        for name, (uid, rules) in steady.items():
            now = kubepods.pod_view(node_core, workload_ns, name)
            assert now is not None and now.uid == uid and now.phase == "Running", now
            assert all(c["restarts"] == 0 for c in now.containers.values()), now
            assert podnet.saved_tables(real_cluster.pod_netns(uid)) == rules, name

        assert istio_after == istio_fresh, "Istio's conflist after taking the node back"

        # Ours beside Istio's release, under the default release name: Helm refuses, naming the
        # object, before it creates anything.
        conflist_now = real_cluster.conflist_path.read_bytes()
        with pytest.raises(HelmError) as refused:
            helm.install(
                agent_mod.RELEASE,
                agent_mod.CHART,
                namespace=agent_mod.AGENT_NAMESPACE,
                values=agent_mod.node_values(real_cluster, agent_image),
            )
        message = str(refused.value)
        print("installing ours beside Istio's release:", message.strip().splitlines()[-1])
        assert "exists and cannot be imported into the current release" in message, message
        assert '"istio-cni"' in message, message
        ours = f"app.kubernetes.io/instance={agent_mod.RELEASE}"  # Istio's pods have no instance
        assert not node_core.list_namespaced_pod(
            agent_mod.AGENT_NAMESPACE, label_selector=f"{agent_mod.AGENT_SELECTOR},{ours}"
        ).items
        assert "not found" in helm_status(helm, agent_mod.RELEASE, agent_mod.AGENT_NAMESPACE)
        assert real_cluster.conflist_path.read_bytes() == conflist_now

        # What ours writes on a fresh node (the same values) is what it left after taking over.
        istio_agent.uninstall(helm, node_core)
        real_cluster.conflist_path.write_bytes(before)
        agent_mod.install(helm, real_cluster, node_core, agent_image, **OUR_VALUES)
        assert conflist(real_cluster) == ours_after
        agent_mod.uninstall(helm, node_core)
        assert real_cluster.conflist_path.read_bytes() == before
    finally:
        nodetaint.remove(node_core, node, TAINT)


def helm_status(helm: Helm, release: str, namespace: str) -> str:
    try:
        return helm.run("status", release, "--namespace", namespace)
    except HelmError as e:
        return str(e)
