"""A bad value is rejected by `helm install` against the real cluster (Helm 3 and 4) with a message
naming the value, and nothing is created: no release, no object of the chart, no agent on the
node, the node's CNI dirs untouched."""

from __future__ import annotations

from typing import Any

import pytest

from testbed import chart as agent_mod
from testbed.helm import HelmError
from testbed.images import Image
from testbed.realnode import RealCluster
from tests.chart.test_bad_values import names_value

pytestmark = [pytest.mark.node]

BAD = [
    pytest.param({"cniBinDir": "opt/cni/bin"}, "cniBinDir", id="bin-dir-relative"),
    pytest.param({"repair": {"mode": "restart"}}, "repair.mode", id="repair-mode"),
    pytest.param({"pullPolicy": "Sometimes"}, "pullPolicy", id="pull-policy"),
    pytest.param({"metricsPort": 70000}, "metricsPort", id="metrics-port-range"),
]


@pytest.mark.parametrize("major", ["3", "4"])
@pytest.mark.parametrize(("bad", "path"), BAD)
def test_helm_install_rejects_bad_value_and_creates_nothing(
    major: str,
    bad: dict[str, Any],
    path: str,
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
) -> None:
    conflist_before = real_cluster.conflist_path.read_text()
    bins_before = sorted(p.name for p in real_cluster.cni_bin_dir.iterdir())
    helm = node_helm(major)
    values = {**agent_mod.node_values(real_cluster, agent_image), **bad}
    with pytest.raises(HelmError) as failed:
        helm.install(
            agent_mod.RELEASE, agent_mod.CHART, namespace=agent_mod.AGENT_NAMESPACE, values=values
        )
    assert names_value(str(failed.value), path), str(failed.value)

    with pytest.raises(HelmError, match="not found"):
        helm.run("status", agent_mod.RELEASE, "--namespace", agent_mod.AGENT_NAMESPACE)
    selector = f"app.kubernetes.io/instance={agent_mod.RELEASE}"
    apps = real_cluster.apps()
    ns = agent_mod.AGENT_NAMESPACE
    assert not apps.list_namespaced_daemon_set(ns, label_selector=selector).items
    assert not node_core.list_namespaced_config_map(ns, label_selector=selector).items
    assert not node_core.list_namespaced_service_account(ns, label_selector=selector).items
    assert not node_core.list_namespaced_secret(ns, label_selector="owner=helm").items
    assert not agent_mod.agent_pods(node_core)
    assert real_cluster.conflist_path.read_text() == conflist_before
    assert sorted(p.name for p in real_cluster.cni_bin_dir.iterdir()) == bins_before
