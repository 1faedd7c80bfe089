"""Rolling the DaemonSet to an agent whose rendering differs, with `repair.mode: delete` and meshed
pods running on the real node: no pod is deleted, and each pod's difference is reported once (a
`RedirectRulesDiffer` Event, one log line), however many repair rounds go by.

The new agent is a TEST BUILD (tests/node/extra_rule, `ci/build-test-image`): the release image
plus a module that renders one extra rule for sidecar pods, as another release would; the
product has no knob for it. With repair acting on rules that merely differ from its rendering,
such a roll would delete every meshed pod of the node."""

from __future__ import annotations

import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from testbed import chart as agent_mod
from testbed import images, kubepods, podnet
from testbed.images import Image
from testbed.realnode import RealCluster

pytestmark = [pytest.mark.node, pytest.mark.hostile]

PODS = 3
REASON = "RedirectRulesDiffer"
DIFFER_LINE = "pod's redirect rules differ from this agent's rendering; left alone"
REPAIR_ROUNDS = 15.0  # three rounds of the agent's 5 s repair loop
OUTSIDE = "203.0.113.10"


@pytest.fixture(scope="module")
def extra_rule_image(agent_image: Image) -> Image:
    try:
        return images.build_test_image(Path(__file__).parent / "extra_rule", "extra-rule")
    except RuntimeError as e:
        pytest.fail(str(e), pytrace=False)


def rules(netns: str) -> list[str]:
    """The namespace's rules without comments and packet counters (they change by themselves)."""
    return [
        re.sub(r"\[\d+:\d+\]", "", line)
        for line in podnet.saved_rules(netns).splitlines()
        if not line.startswith("#")
    ]


def differ_events(core: Any, ns: str) -> Counter[str]:
    """Pod UID -> how many RedirectRulesDiffer Events it has (their count field included)."""
    found: Counter[str] = Counter()
    for event in core.list_namespaced_event(ns).items:
        if event.reason == REASON:
            found[event.involved_object.uid] += event.count or 1
    return found


def test_a_rendering_that_differs_deletes_nothing_and_is_reported_once(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    extra_rule_image: Image,
    workload_ns: str,
) -> None:
    real_cluster.import_image(extra_rule_image)
    helm = node_helm("4")
    values = {"repair": {"mode": "delete"}}
    agent_mod.install(helm, real_cluster, node_core, agent_image, **values)
    pods = []
    for i in range(PODS):
        name = f"meshed-{i}"
        node_core.create_namespaced_pod(
            workload_ns,
            kubepods.pod_manifest(
                name,
                real_cluster.images["workload"].ref,
                app_command=["connect-loop", OUTSIDE, "80", "1"],
                sidecar=True,
            ),
        )
        pods.append(kubepods.wait_running(node_core, workload_ns, name))
    netns = {p.uid: real_cluster.pod_netns(p.uid) for p in pods}
    rules_before = {uid: rules(path) for uid, path in netns.items()}
    assert all(podnet.has_istio_rules(path) for path in netns.values())

    helm.upgrade(
        agent_mod.RELEASE,
        agent_mod.CHART,
        namespace=agent_mod.AGENT_NAMESPACE,
        values=agent_mod.node_values(real_cluster, extra_rule_image, **values),
    )
    new = agent_mod.ready_agent(node_core, real_cluster, image=extra_rule_image)
    kubepods.wait_for(
        lambda: set(differ_events(node_core, workload_ns)) == set(netns),
        "a RedirectRulesDiffer Event on every meshed pod",
        60,
        on_timeout=lambda: new.logs(node_core)[-3000:],
    )
    time.sleep(REPAIR_ROUNDS)  # more rounds: nothing more is done or said

    assert differ_events(node_core, workload_ns) == dict.fromkeys(netns, 1)
    for pod in pods:
        now = node_core.read_namespaced_pod(pod.name, workload_ns)
        assert now.metadata.uid == pod.uid and now.metadata.deletion_timestamp is None, pod.name
        assert now.status.phase == "Running"
    assert {uid: rules(path) for uid, path in netns.items()} == rules_before
    logs = new.logs(node_core).splitlines()
    said = [line for line in logs if DIFFER_LINE in line]
    assert len(said) == PODS, said
    acted = [line for line in logs if "started without traffic redirect" in line]
    assert not acted, acted
