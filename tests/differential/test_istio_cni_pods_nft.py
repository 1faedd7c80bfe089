"""Pod-level differential, native nftables: Istio's `istio-cni` plugin with `native_nftables`
on (the key its installer writes when its chart says `global.nativeNftables`) against our agent
installed from the chart with `ruleBackend: nftables`, for the same random sidecar pods as the
iptables variant (test_istio_cni_pods.py). Each namespace's whole `nft list ruleset` must be
equal, so tables either side adds outside Istio's three `inet istio-proxy-*` tables count too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import podnet
from testbed.cni import CniNode
from testbed.helm import Helm
from testbed.node import NodePods
from tests.differential.test_istio_cni_pods import compare_pods
from tests.e2e.harness import ChartOnNode
from tests.integration.conftest import MeshNode, running_mesh_node

pytestmark = pytest.mark.differential


@pytest.fixture
def nft_mesh_node(
    chart_on_node: ChartOnNode,
    helm_releases: Any,
    helm_binaries: dict[str, Path],
    cni_node: CniNode,
    node_pods: NodePods,
) -> Iterator[MeshNode]:
    """The integration tier's mesh node, the chart installed with `ruleBackend: nftables`."""
    helm: Helm = helm_releases(helm_binaries[max(helm_binaries)])
    with running_mesh_node(
        chart_on_node, helm, cni_node, node_pods, ruleBackend="nftables"
    ) as node:
        assert "ruleBackend: nftables" in node.installed.config_yaml(chart_on_node.core)
        yield node


def test_random_pods_get_istios_nftables(
    nft_mesh_node: MeshNode, make_identity: Any, tmp_path: Path
) -> None:
    compare_pods(
        nft_mesh_node,
        make_identity,
        tmp_path,
        listing=podnet.nft_ruleset,
        captured_by="chain istio-output",
        native_nftables=True,
    )
