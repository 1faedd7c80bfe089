"""Several nodes (testbed/nodes.py): three kubelet + containerd nodes laid out as kind's, pod
subnets routed between them, the chart installed once with kind's preset so the DaemonSet runs
on all three. A meshed pod's traffic crosses nodes captured at both ends (also through a real
Envoy at each end, and back); `helm upgrade` rolls
the agent one node at a time while pods start on every node, none uncaptured and none failing
for good; a valid but wrong value stops that rollout at its first node (not Ready there, the
other nodes' agents untouched and capturing) until `helm rollback` restores it; a node drained
and deleted leaves the others' agents alone, and a node joining with
the `cni.istio.io/not-ready` taint gets an agent that lifts it before any meshed pod lands."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from testbed import chart as agent_mod
from testbed import diagnose, images, kubepods, kubewatch, podnet, wait
from testbed.churn import Churn
from testbed.envoy_legs import Mesh, assert_meshed_to_meshed
from testbed.helm import Helm
from testbed.nodes import Nodes
from testbed.parts import MissingPartError
from testbed.process import PartFailedError
from tests.node.conftest import helm_by_major

pytestmark = pytest.mark.scale

PRESET = Path(__file__).resolve().parents[2] / "values-examples" / "kind.yaml"
NOT_READY_TAINT = "cni.istio.io/not-ready"
APP_PORT = 8080
ROLLOUT_TIMEOUT = 240.0
PODGC_TIMEOUT = 180.0
"""kube-controller-manager's pod GC deletes a deleted Node's pods once it has been missing for
its 40 s quarantine, checked on a 20 s period: 40-60 s on an idle machine; three times that for a
loaded one (the CI machine runs the tiers on 2 cores)."""
DAEMONSET_SYNC_TIMEOUT = 60.0
"""The DaemonSet controller syncs at once on its pod's deletion; the rest is the machine's load."""


@dataclass
class Cluster:
    nodes: Nodes
    helm: Helm
    image: images.Image
    core: Any
    names: list[str] = field(default_factory=list)

    def values(self, **extra: Any) -> dict[str, Any]:
        """kind's preset with the test bed's image (never pulled), as one values dict (Helm's
        upgrade here takes the whole set)."""
        preset = yaml.safe_load(PRESET.read_text()) or {}
        return {
            **preset,
            "hub": self.image.hub,
            "tag": self.image.tag,
            "pullPolicy": "Never",
            "logLevel": "debug",
            "removeNotReadyTaint": True,
            **extra,
        }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("nodes")
    stack = contextlib.ExitStack()
    try:
        nodes = Nodes(workdir, count=3)
        helm = Helm(binary=helm_by_major("4"), home=workdir / "helm")
    except MissingPartError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        nodes.start()
        stack.enter_context(wait.diagnostics(diagnose.for_cluster(nodes.first)))
        helm.kubeconfig = nodes.kubeconfig
        image = nodes.first.images["istio-cni"]
        made = Cluster(nodes, helm, image, nodes.core())
        made.names = [n.node_name for n in nodes.members]
        helm.install(
            agent_mod.RELEASE,
            agent_mod.CHART,
            namespace=agent_mod.AGENT_NAMESPACE,
            values=made.values(),
        )
        for node in nodes.members:
            agent_mod.ready_agent(made.core, node, image=image)
        yield made
    except (PartFailedError, MissingPartError) as e:
        pytest.fail(str(e), pytrace=False)
    finally:
        stack.close()
        nodes.stop()


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    with kubepods.pod_namespace(cluster.core, "nodes") as name:
        yield name


def on_node(manifest: dict[str, Any], node: str) -> dict[str, Any]:
    manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return manifest


def agent_pods_by_node(core: Any) -> dict[str, Any]:
    """node -> its agent pod (the newest, should two overlap while one terminates)."""
    found: dict[str, Any] = {}
    for pod in agent_mod.agent_pods(core):
        node = pod.spec.node_name
        if node and (
            node not in found
            or pod.metadata.creation_timestamp > found[node].metadata.creation_timestamp
        ):
            found[node] = pod
    return found


def ready(pod: Any) -> bool:
    conditions = {c.type: c.status for c in pod.status.conditions or []}
    return (
        pod.metadata.deletion_timestamp is None
        and pod.status.phase == "Running"
        and conditions.get("Ready") == "True"
    )


class Availability(threading.Thread):
    """Samples, every 0.2 s, how many of `names` have no Ready agent pod; keeps the maximum."""

    def __init__(self, core: Any, names: list[str]) -> None:
        super().__init__(name="agent-availability", daemon=True)
        self.core, self.names = core, names
        self.done = threading.Event()
        self.max_unavailable = 0
        self.samples = 0
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.done.wait(0.2):
            try:
                by_node = agent_pods_by_node(self.core)
            except Exception as e:  # an API hiccup is reported, not fatal to the sampling
                self.errors.append(f"{type(e).__name__}: {e}")
                continue
            down = [n for n in self.names if n not in by_node or not ready(by_node[n])]
            self.max_unavailable = max(self.max_unavailable, len(down))
            self.samples += 1

    @contextlib.contextmanager
    def watching(self) -> Iterator[Availability]:
        self.start()
        try:
            yield self
        finally:
            self.done.set()
            self.join()


def test_a_meshed_pod_reaches_a_pod_on_another_node_captured_at_both_ends(
    cluster: Cluster, namespace: str
) -> None:
    first, second = cluster.names[0], cluster.names[1]
    image = cluster.nodes.first.images["workload"].ref
    core = cluster.core
    core.create_namespaced_pod(
        namespace,
        on_node(
            kubepods.pod_manifest("server", image, app_command=["sleep"], sidecar=True), second
        ),
    )
    server = kubepods.wait_running(core, namespace, "server")
    assert server.node == second and server.ip
    loop = ["connect-loop", server.ip, str(APP_PORT), "0.5"]
    for name, sidecar, command in (("client", True, loop), ("plain", False, ["sleep"])):
        manifest = kubepods.pod_manifest(name, image, app_command=command, sidecar=sidecar)
        core.create_namespaced_pod(namespace, on_node(manifest, first))
    client = kubepods.wait_running(core, namespace, "client")
    plain = kubepods.wait_running(core, namespace, "plain")
    assert client.node == plain.node == first

    # Outbound, on the first node: the meshed client's connection to the server's address on
    # the other node is its proxy's, with the server as the original destination.
    line = kubepods.wait_log_line(
        core,
        namespace,
        "client",
        "istio-proxy",
        lambda s: f"port=15001 peer={client.ip}:" in s,
        "the client's connection at its proxy",
    )
    assert f"original_dst={server.ip}:{APP_PORT}" in line, line

    # Inbound, on the second node: a connection from the first node's plain pod crosses the
    # fabric with its own source address and is its proxy's, the server the original destination.
    answer = podnet.connect(cluster.nodes.pod_netns(plain.uid), server.ip, APP_PORT)
    assert answer.startswith("proxy-double port=15006"), answer
    assert f"peer={plain.ip}:" in answer, answer
    assert f"original_dst={server.ip}:{APP_PORT}" in answer, answer
    # The plain pod is untouched: no rule of ours in its netns.
    assert not podnet.has_istio_rules(cluster.nodes.pod_netns(plain.uid))


@pytest.mark.dataplane
def test_a_meshed_pod_calls_a_meshed_pod_on_another_node_through_both_envoys(
    cluster: Cluster, namespace: str
) -> None:
    """The same call with a real Envoy as both pods' sidecar: the client's Envoy on the first
    node forwards it to the server's address on the second, the server's Envoy takes it there
    and hands it to its app from 127.0.0.6, and the app's answer comes back the same way."""
    first, second = cluster.names[0], cluster.names[1]
    members = {node.node_name: node for node in cluster.nodes.members}
    try:
        proxy_image = images.image("envoy")
    except MissingPartError as e:
        pytest.fail(str(e), pytrace=False)
    for name in (first, second):
        members[name].import_image(proxy_image)
    workload, proxy = cluster.nodes.first.images["workload"].ref, proxy_image.ref
    core = cluster.core
    server_pod = kubepods.pod_manifest(
        "server", workload, app_command=["serve", str(APP_PORT)], sidecar=True, proxy_image=proxy
    )
    core.create_namespaced_pod(namespace, on_node(server_pod, second))
    server = kubepods.wait_running(core, namespace, "server")
    assert server.node == second and server.ip
    loop = ["connect-loop", server.ip, str(APP_PORT), "1"]
    client_pod = kubepods.pod_manifest(
        "client", workload, app_command=loop, sidecar=True, proxy_image=proxy
    )
    core.create_namespaced_pod(namespace, on_node(client_pod, first))
    client = kubepods.wait_running(core, namespace, "client")
    assert client.node == first and client.ip
    mesh = Mesh(core, namespace, {"client": client.ip, "server": server.ip})

    # Across the fabric: the client Envoy on the first node, the server's on the second.
    assert_meshed_to_meshed(mesh, "client", "server", APP_PORT)


def test_upgrade_rolls_one_node_at_a_time_while_pods_start_on_every_node(
    cluster: Cluster, namespace: str
) -> None:
    core = cluster.core
    before = {node: pod.metadata.uid for node, pod in agent_pods_by_node(core).items()}
    assert sorted(before) == sorted(cluster.names), before
    image = cluster.nodes.first.images["workload"].ref

    def rolled() -> bool:
        now = agent_pods_by_node(core)
        return all(
            n in now and now[n].metadata.uid != before[n] and ready(now[n]) for n in cluster.names
        )

    watch = Availability(core, cluster.names)
    with (
        Churn(core, cluster.nodes, namespace, image, nodes=cluster.names) as churn,
        watch.watching(),
    ):
        time.sleep(3)  # pods start on every node before the rollout too
        cluster.helm.upgrade(
            agent_mod.RELEASE,
            agent_mod.CHART,
            namespace=agent_mod.AGENT_NAMESPACE,
            values=cluster.values(podAnnotations={"rollout": "2"}),
        )
        kubepods.wait_for(rolled, "the agent rolled to every node", ROLLOUT_TIMEOUT)
        time.sleep(3)  # and after it
    report = churn.report
    assert not report.errors, report.errors
    assert not report.uncaptured, f"started without redirect: {report.uncaptured}"
    assert not report.never_ran, report.never_ran
    placed = {p.node for p in report.pods}
    assert placed == set(cluster.names), f"churn pods ran on {placed}: {report.summary()}"
    assert len(report.pods) >= 3 * len(cluster.names), report.summary()
    # maxUnavailable: 1 held throughout, and the rollout was seen (one node at a time down).
    assert watch.samples > 20 and not watch.errors, (watch.samples, watch.errors[:3])
    assert watch.max_unavailable == 1, f"{watch.max_unavailable} nodes without a Ready agent"


BAD_CONF_DIR = "/etc/cni/net.d/typo"
"""Valid by the schema (an absolute path) and wrong: kubelet makes the dir (DirectoryOrCreate),
below each node's own conf dir, and the agent waits there for a primary CNI config that never
comes, not Ready."""
HOLD_SECONDS = 30.0
"""How long the rollout is watched standing at its first node."""


def revision_hash(pod: Any) -> str:
    return str((pod.metadata.labels or {}).get("controller-revision-hash", ""))


def test_a_bad_value_stops_the_rollout_at_the_first_node_and_rollback_restores_it(
    cluster: Cluster, namespace: str
) -> None:
    core, nodes = cluster.core, cluster.nodes
    ns = agent_mod.AGENT_NAMESPACE
    before = agent_pods_by_node(core)
    assert sorted(before) == sorted(cluster.names), before
    assert all(ready(p) for p in before.values()), {n: ready(p) for n, p in before.items()}
    old_hash = {revision_hash(p) for p in before.values()}
    assert len(old_hash) == 1 and "" not in old_hash, old_hash
    current = json.loads(
        cluster.helm.run("get", "values", agent_mod.RELEASE, "-n", ns, "-o", "json")
    )
    image = nodes.first.images["workload"].ref
    timeline: dict[str, float] = {}
    rolled_back = False

    def changed() -> list[str]:
        now = agent_pods_by_node(core)
        return [n for n in cluster.names if now[n].metadata.uid != before[n].metadata.uid]

    def restored() -> bool:
        now = agent_pods_by_node(core)
        return all(
            n in now and ready(now[n]) and revision_hash(now[n]) in old_hash for n in cluster.names
        )

    watch = Availability(core, cluster.names)
    try:
        with watch.watching():
            start = time.monotonic()
            cluster.helm.upgrade(
                agent_mod.RELEASE,
                agent_mod.CHART,
                namespace=ns,
                values={**current, "cniConfDir": BAD_CONF_DIR},
            )
            timeline["upgraded"] = time.monotonic() - start

            def first_not_ready() -> str | None:
                moved = changed()
                if not moved:
                    return None
                pod = agent_pods_by_node(core)[moved[0]]
                return moved[0] if pod.status.phase == "Running" and not ready(pod) else None

            first = kubepods.wait_for(first_not_ready, "a new agent Running, not Ready", 120)
            timeline["first node's new agent Running, not Ready"] = time.monotonic() - start
            untouched = [n for n in cluster.names if n != first]

            # The rollout stands: only the first node changed, its agent not Ready; the others
            # keep their pods (same UID, Ready, the old template) while pods start there captured.
            held = time.monotonic()
            for node in untouched:
                core.create_namespaced_pod(
                    namespace,
                    on_node(
                        kubepods.pod_manifest(
                            f"during-{node}", image, app_command=["sleep"], sidecar=True
                        ),
                        node,
                    ),
                )
            while time.monotonic() - held < HOLD_SECONDS:
                now = agent_pods_by_node(core)
                assert changed() == [first], {n: p.metadata.name for n, p in now.items()}
                assert not ready(now[first]), now[first].status
                assert revision_hash(now[first]) not in old_hash, now[first].metadata.labels
                for node in untouched:
                    pod = now[node]
                    assert ready(pod) and revision_hash(pod) in old_hash, (node, pod.status)
                    assert all(c.restart_count == 0 for c in pod.status.container_statuses)
                time.sleep(1)
            timeline["others unchanged, watched for"] = time.monotonic() - held
            for node in untouched:
                pod = kubepods.wait_running(core, namespace, f"during-{node}")
                assert pod.node == node
                assert podnet.has_istio_rules(nodes.pod_netns(pod.uid)), node
            status = nodes.first.apps().read_namespaced_daemon_set(agent_mod.RELEASE, ns).status
            assert status.updated_number_scheduled == 1, status

            rollback = time.monotonic()
            cluster.helm.run("rollback", agent_mod.RELEASE, "0", "--namespace", ns)
            rolled_back = True

            kubepods.wait_for(restored, "every agent Ready on the old template", ROLLOUT_TIMEOUT)
            timeline["rollback to all Ready"] = time.monotonic() - rollback
        after = agent_pods_by_node(core)
        for node in untouched:  # never restarted, through the upgrade and the rollback
            assert after[node].metadata.uid == before[node].metadata.uid, node
        assert after[first].metadata.uid != before[first].metadata.uid
        assert watch.samples > 20 and not watch.errors, (watch.samples, watch.errors[:3])
        assert watch.max_unavailable == 1, f"{watch.max_unavailable} nodes without a Ready agent"
        print("\nbad value rollout: " + ", ".join(f"{k} {v:.1f} s" for k, v in timeline.items()))
    finally:
        if not rolled_back:  # the next tests start from every agent Ready
            with contextlib.suppress(Exception):
                cluster.helm.run("rollback", agent_mod.RELEASE, "0", "--namespace", ns)
                kubepods.wait_for(restored, "every agent Ready again", ROLLOUT_TIMEOUT)
        for member in nodes.members:
            shutil.rmtree(member.host_path(BAD_CONF_DIR), ignore_errors=True)


@pytest.fixture
def spread(cluster: Cluster, namespace: str) -> Iterator[str]:
    """The name of a Deployment the test makes in `namespace`; deleted (with its pods) at the
    end, before the namespace's pods are waited away."""
    try:
        yield "spread"
    finally:
        with contextlib.suppress(ApiException):
            cluster.nodes.first.apps().delete_namespaced_deployment(
                "spread", namespace, propagation_policy="Foreground"
            )


def removed_taint_at(agent_log: str) -> datetime | None:
    """When the agent's log says it removed the not-ready taint (NoSchedule), else None."""
    for line in agent_log.splitlines():
        if "removed the not-ready taint" in line and "NoSchedule" in line:
            stamp = re.search(r"time=(\S+)", line)
            if stamp:
                return datetime.fromisoformat(stamp.group(1).replace("Z", "+00:00"))
    return None


def test_a_node_drained_and_deleted_then_a_node_joining(
    cluster: Cluster, namespace: str, spread: str
) -> None:
    core, nodes = cluster.core, cluster.nodes
    apps = nodes.first.apps()
    image = nodes.first.images["workload"].ref
    # One meshed replica per node (required anti-affinity): the drained node's replica has
    # nowhere to go until a node joins.
    pod = kubepods.pod_manifest("spread", image, app_command=["sleep"], sidecar=True)
    pod["spec"]["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app": "spread"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    template = {
        "metadata": {"labels": {"app": "spread"}, "annotations": pod["metadata"]["annotations"]},
        "spec": pod["spec"],
    }
    apps.create_namespaced_deployment(
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": spread},
            "spec": {
                "replicas": len(nodes.members),
                "selector": {"matchLabels": {"app": "spread"}},
                "template": template,
            },
        },
    )

    def replicas() -> list[Any]:
        return list(core.list_namespaced_pod(namespace, label_selector="app=spread").items)

    def running_on(count: int) -> dict[str, Any] | None:
        pods = [p for p in replicas() if p.metadata.deletion_timestamp is None]
        up = {p.spec.node_name: p for p in pods if p.status.phase == "Running"}
        return up if len(up) == count else None

    placed = kubepods.wait_for(lambda: running_on(3), "one replica Running per node", 180)
    for node, pod in placed.items():
        assert podnet.has_istio_rules(nodes.pod_netns(pod.metadata.uid)), f"replica on {node}"

    leaving = nodes.members[-1]
    stays = [n.node_name for n in nodes.members if n is not leaving]
    agents_before = agent_pods_by_node(core)
    gone_agent = agents_before[leaving.node_name].metadata.uid
    nodes.remove(leaving)

    # The DaemonSet controller has no handler for a Node's deletion: its status is recomputed
    # only once something else wakes it, here the pod GC force-deleting the agent pod bound to
    # the gone Node (after its 40 s quarantine, on a 20 s period). So the pod's end comes first.
    kubewatch.watch_until(
        core.list_namespaced_pod,
        lambda pods: gone_agent not in {p.metadata.uid for p in pods},
        "the deleted node's agent pod collected by the pod GC",
        PODGC_TIMEOUT,
        namespace=agent_mod.AGENT_NAMESPACE,
        label_selector=agent_mod.AGENT_SELECTOR,
    )

    def on_the_rest(sets: list[Any]) -> bool:
        status = sets[0].status if sets else None
        return status is not None and (
            status.desired_number_scheduled == len(stays) == status.number_ready
        )

    kubewatch.watch_until(
        apps.list_namespaced_daemon_set,
        on_the_rest,
        f"the DaemonSet {len(stays)}/{len(stays)} on the remaining nodes",
        DAEMONSET_SYNC_TIMEOUT,
        namespace=agent_mod.AGENT_NAMESPACE,
        field_selector=f"metadata.name={agent_mod.RELEASE}",
    )
    after = agent_pods_by_node(core)
    assert set(after) == set(stays), sorted(after)
    for node in stays:  # their agents untouched: the same pods, never restarted
        pod = after[node]
        assert pod.metadata.uid == agents_before[node].metadata.uid, node
        assert ready(pod) and all(c.restart_count == 0 for c in pod.status.container_statuses)
    pending = [p for p in replicas() if p.spec.node_name is None]
    assert len(pending) == 1, [(p.metadata.name, p.spec.node_name) for p in replicas()]

    # A node joins, tainted until its CNI is in place: its agent starts, lifts the taint, and
    # only then does the pending replica land there, captured.
    joining = nodes.add(register_taints=(f"{NOT_READY_TAINT}=true:NoSchedule",))
    agent = agent_mod.ready_agent(core, joining, image=cluster.image)

    def untainted() -> bool:
        taints = core.read_node(joining.node_name).spec.taints or []
        return not any(t.key == NOT_READY_TAINT for t in taints)

    kubepods.wait_for(untainted, f"the agent to lift {NOT_READY_TAINT}", 60)
    landed = kubepods.wait_for(lambda: running_on(3), "the pending replica Running", 180)
    replica = landed[joining.node_name]
    assert podnet.has_istio_rules(nodes.pod_netns(replica.metadata.uid))
    # The node registered with the taint, and the agent lifted it (once its plugin and config
    # were in place, what its /readyz reports); the replica was scheduled after that.
    removed = removed_taint_at(agent.logs(core))
    assert removed is not None, agent.logs(core)[-3000:]
    scheduled = next(c for c in replica.status.conditions if c.type == "PodScheduled")
    assert scheduled.last_transition_time >= removed.replace(microsecond=0), (
        f"the replica was scheduled onto the new node at {scheduled.last_transition_time}, "
        f"before its agent removed the taint at {removed}"
    )
    events = kubepods.pod_events(core, namespace, replica.metadata.name)
    assert "RedirectRepaired" not in events and "without traffic redirect" not in events, events
