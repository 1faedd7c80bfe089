"""ADD through the handlers with the real decision table (agent.rules.sidecar.pod.decide): the
server redirects exactly the pods the table selects and replies with the table's reason."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.podserver.helpers import InMemoryPods, RealDecisions, build_rig, cni_body, make_pod


def _with(change: Callable[[dict[str, Any]], None], **options: Any) -> dict[str, Any]:
    pod = make_pod(**options)
    change(pod)
    return pod


def _no_change(pod: dict[str, Any]) -> None:
    pass


def _istio_init(pod: dict[str, Any]) -> None:
    pod["spec"]["initContainers"] = [{"name": "istio-init", "image": "proxyv2:1"}]


def _host_network(pod: dict[str, Any]) -> None:
    pod["spec"]["hostNetwork"] = True


def _inject_false_label(pod: dict[str, Any]) -> None:
    pod["metadata"]["labels"] = {"sidecar.istio.io/inject": "false"}


CASES = [
    ("injected-sidecar", _with(_no_change), "redirected", "injected sidecar"),
    (
        "excluded-namespace",
        _with(_no_change, namespace="kube-system"),
        "skipped",
        "namespace kube-system is excluded",
    ),
    ("no-sidecar", _with(_no_change, sidecar=False), "skipped", "no istio-proxy container"),
    (
        "inject-false-annotation",
        _with(_no_change, annotations={"sidecar.istio.io/inject": "false"}),
        "skipped",
        "injection disabled",
    ),
    ("inject-false-label", _with(_inject_false_label), "skipped", "injection disabled"),
    ("istio-init-present", _with(_istio_init), "skipped", "istio-init"),
    ("host-network", _with(_host_network), "skipped", "host network"),
]


@pytest.mark.parametrize(
    ("pod", "result", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_add_follows_the_decision_table(pod: dict[str, Any], result: str, reason: str) -> None:
    redirector = RealDecisions()
    rig = build_rig(InMemoryPods(pod), redirector)
    meta = pod["metadata"]
    reply = rig.handlers.add(cni_body(pod=meta["name"], namespace=meta["namespace"]))
    assert reply.status == 200
    assert reply.body["result"] == result
    assert reason in str(reply.body["reason"])
    assert bool(redirector.applied) == (result == "redirected")
