"""Ambient mode on the real node: the chart with `ambient.enabled` runs the agent's ZDS server on
the node; a ztunnel TEST DOUBLE (testbed/ztunnel_double.py, ztunnel itself cannot run here) in
this test process connects to that socket as ztunnel would. A pod that kubelet starts in a
namespace labelled `istio.io/dataplane-mode=ambient` is enrolled by the CNI ADD: Running, annotated
`ambient.istio.io/redirection: enabled` (read through the API), handed to the double with a
descriptor of its own network namespace, its outbound connections landing on the double's 15001
listener inside the pod, and kubelet's probes reaching the app itself (the node's probe SNAT to
169.254.7.127, which the in-pod rules let through). A pod of a plain namespace is left alone.
Removing the namespace's label releases the running pod (annotation, in-pod chains, ztunnel's
workload all gone, its connections no longer captured); labelling it again enrolls it live (the
agent finds the running pod's netns on the node)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed import chart as agent_mod
from testbed import kubepods, podnet
from testbed.images import Image
from testbed.realnode import RealCluster
from testbed.ztunnel_double import OUTBOUND_PORT, ZtunnelDouble, api_identity

pytestmark = [pytest.mark.node]

OUTSIDE = ("203.0.113.10", 80)  # TEST-NET-3: never routed; the node netns has no route out
APP_PORT = 8080
MODE_LABEL = "istio.io/dataplane-mode"
ANNOTATION = "ambient.istio.io/redirection"
PROBE_SNAT = "169.254.7.127"  # the chart's default ambient.hostProbeSnatAddress
AMBIENT_CHAINS = (":ISTIO_OUTPUT ", ":ISTIO_PRERT ")


@pytest.fixture
def plain_ns(node_core: Any, workload_ns: str) -> Iterator[str]:
    """A second namespace, never labelled; removed with its pods at the end."""
    with kubepods.pod_namespace(node_core, "plain") as name:
        yield name


def probed_pod(name: str, image: str) -> dict[str, Any]:
    """`app` serves APP_PORT behind kubelet's TCP readiness and liveness probes; `client`
    connects to OUTSIDE every half second and logs what answered."""
    manifest = kubepods.pod_manifest(
        name, image, app_command=["serve", str(APP_PORT)], sidecar=False
    )
    probe = {"tcpSocket": {"port": APP_PORT}, "periodSeconds": 1, "failureThreshold": 3}
    app = manifest["spec"]["containers"][0]
    app["readinessProbe"] = probe
    app["livenessProbe"] = {**probe, "initialDelaySeconds": 1}
    manifest["spec"]["containers"].append(
        kubepods.container(
            "client", image, [*kubepods.APP, "connect-loop", OUTSIDE[0], str(OUTSIDE[1]), "0.5"]
        )
    )
    return manifest


def annotation(core: Any, namespace: str, name: str) -> str | None:
    pod = core.read_namespaced_pod(name, namespace)
    value: str | None = (pod.metadata.annotations or {}).get(ANNOTATION)
    return value


def ambient_chains(netns: str) -> list[str]:
    """Ambient's in-pod chains declared in the netns (either iptables flavour)."""
    saved = podnet.saved_rules(netns)
    return [line for line in saved.splitlines() if line.startswith(AMBIENT_CHAINS)]


def set_mode_label(core: Any, namespace: str, value: str | None) -> None:
    core.patch_namespace(namespace, {"metadata": {"labels": {MODE_LABEL: value}}})


def assert_a_pod_enrolled_with_ztunnel(
    cluster: RealCluster, core: Any, namespace: str, ztunnel_socket: Path
) -> None:
    """With the agent installed for ambient on `ztunnel_socket` and `namespace` labelled: a
    ztunnel stand-in connected there gets the agent's first snapshot, then a pod `web`
    connecting to OUTSIDE from its first instant is annotated, handed to ztunnel with its own
    netns, has ambient's chains, and its connection is answered by the stand-in."""
    loop = ["connect-loop", OUTSIDE[0], str(OUTSIDE[1]), "0.5"]
    with ZtunnelDouble(str(ztunnel_socket), identity=api_identity(core)) as ztunnel:
        ztunnel.connect()
        ztunnel.wait_for("the agent's first (empty) snapshot", lambda z: z.snapshots >= 1)
        image = cluster.images["workload"].ref
        core.create_namespaced_pod(
            namespace, kubepods.pod_manifest("web", image, app_command=loop, sidecar=False)
        )
        pod = kubepods.wait_running(core, namespace, "web")
        netns = cluster.pod_netns(pod.uid)
        assert annotation(core, namespace, "web") == "enabled"
        workload = ztunnel.workloads().get(pod.uid)
        assert workload is not None, ztunnel.requests
        assert workload.netns_inode == os.stat(netns).st_ino
        assert ambient_chains(netns), podnet.saved_rules(netns)
        line = kubepods.wait_log_line(
            core,
            namespace,
            "web",
            "app",
            lambda s: f"ztunnel-double|{pod.uid}|{OUTBOUND_PORT}" in s,
            "a connection answered by the ztunnel double",
        )
        assert f"connect {OUTSIDE[0]}:{OUTSIDE[1]}" in line, line


def wait_client_line(
    core: Any, namespace: str, pod: str, match: Callable[[str], bool], what: str, *, after: int = 0
) -> str:
    """The first line of the pod's client log, from line `after` on, that matches."""

    def check() -> str | None:
        lines = kubepods.logs(core, namespace, pod, "client").splitlines()[after:]
        return next((s for s in lines if match(s)), None)

    line = kubepods.wait_for(
        check,
        f"{what} in the log of {namespace}/{pod}/client",
        60,
        interval=0.5,
        on_timeout=lambda: kubepods.logs(core, namespace, pod, "client")[-2000:],
    )
    assert line is not None
    return str(line)


def test_ambient_pod_enrolled_captured_probed_and_released(
    real_cluster: RealCluster,
    ztunnel_socket: Path,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
    plain_ns: str,
) -> None:
    # ztunnel_socket comes first: its clean-up runs after the release is uninstalled.
    set_mode_label(node_core, workload_ns, "ambient")
    agent = agent_mod.install(
        node_helm("4"),
        real_cluster,
        node_core,
        agent_image,
        ambient={"enabled": True, "ztunnelSocketPath": str(ztunnel_socket)},
    )
    # The agent is Ready only once its ZDS server listens: the socket is there on the node.
    assert ztunnel_socket.is_socket(), f"no ZDS socket at {ztunnel_socket} on the node"

    with ZtunnelDouble(str(ztunnel_socket), identity=api_identity(node_core)) as ztunnel:
        ztunnel.connect()
        ztunnel.wait_for("the agent's first (empty) snapshot", lambda z: z.snapshots >= 1)
        assert ztunnel.workloads() == {}

        image = real_cluster.images["workload"].ref
        for ns in (workload_ns, plain_ns):
            node_core.create_namespaced_pod(ns, probed_pod("web", image))
        # Ready: kubelet's readiness probe passed (for the ambient pod, through the probe SNAT).
        meshed = kubepods.wait_running(node_core, workload_ns, "web")
        plain = kubepods.wait_running(node_core, plain_ns, "web")
        assert meshed.node == plain.node == real_cluster.node_name and meshed.ip and plain.ip
        meshed_netns = real_cluster.pod_netns(meshed.uid)
        plain_netns = real_cluster.pod_netns(plain.uid)

        # Enrolled by the CNI ADD: annotation through the API, ztunnel got the pod's own netns.
        assert annotation(node_core, workload_ns, "web") == "enabled"
        workload = ztunnel.workloads().get(meshed.uid)
        assert workload is not None, ztunnel.requests
        assert ("add", meshed.uid, True) in ztunnel.requests  # AddWorkload with a descriptor
        assert (workload.name, workload.namespace) == ("web", workload_ns)
        assert workload.netns_inode == os.stat(meshed_netns).st_ino, (
            "the descriptor the double got is not the pod's network namespace"
        )
        assert ambient_chains(meshed_netns), podnet.saved_rules(meshed_netns)

        # Outbound: the client's connections to an outside address land on the double's 15001
        # in the pod, with their original destination.
        line = wait_client_line(
            node_core,
            workload_ns,
            "web",
            lambda s: f"ztunnel-double|{meshed.uid}|{OUTBOUND_PORT}" in s,
            "a connection answered by the ztunnel double",
        )
        assert f"connect {OUTSIDE[0]}:{OUTSIDE[1]}" in line, line
        client_log = kubepods.logs(node_core, workload_ns, "web", "client").splitlines()
        assert not any(kubepods.escaped(s) for s in client_log), client_log[-20:]
        outbound = [a for a in workload.accepted if a.port == OUTBOUND_PORT]
        assert outbound and all(
            a.original_dst == f"{OUTSIDE[0]}:{OUTSIDE[1]}" and a.peer.startswith(f"{meshed.ip}:")
            for a in outbound
        ), workload.accepted

        # kubelet's probes reach the app itself, SNATed to the probe address, not ztunnel.
        kubepods.wait_log_line(
            node_core,
            workload_ns,
            "web",
            "app",
            lambda s: f"app port={APP_PORT} peer={PROBE_SNAT}:" in s,
            "a kubelet probe from the probe SNAT address",
        )
        app_log = kubepods.logs(node_core, workload_ns, "web", "app").splitlines()
        probes = [s.split("peer=")[1].rsplit(":", 1)[0] for s in app_log if "peer=" in s]
        assert set(probes) == {PROBE_SNAT}, probes  # every probe came through the SNAT
        assert not [a for a in workload.accepted if a.port != OUTBOUND_PORT], workload.accepted
        pod = node_core.read_namespaced_pod("web", workload_ns)
        assert all(c.restart_count == 0 for c in pod.status.container_statuses), (
            "the liveness probe failed on the enrolled pod"
        )

        # The plain namespace's pod: not annotated, not in ztunnel, no rules, traffic uncaptured.
        assert annotation(node_core, plain_ns, "web") is None
        assert plain.uid not in ztunnel.workloads()
        assert not any(uid == plain.uid for _, uid, _ in ztunnel.requests)
        assert not ambient_chains(plain_netns), podnet.saved_rules(plain_netns)
        line = wait_client_line(
            node_core,
            plain_ns,
            "web",
            lambda s: f"connect {OUTSIDE[0]}:{OUTSIDE[1]}" in s,
            "a connection attempt",
        )
        assert kubepods.escaped(line) and "unreachable" in line, line

        # `istio-cni-agent status`: the enrolled pod, acknowledged by ztunnel; its in-pod rules
        # as the agent would program them.
        code, text = agent_mod.agent_status(real_cluster, agent)
        row = next(line.split() for line in text.splitlines() if line.startswith(workload_ns))
        assert row[1:4] == ["web", "ambient-enrolled", "acked"], text
        code, text = agent_mod.agent_status(real_cluster, agent, f"{workload_ns}/web")
        assert code == 0 and "as this agent would program them now" in text, text

        # Label removed: the running pod is released, live.
        logged = len(kubepods.logs(node_core, workload_ns, "web", "client").splitlines())
        set_mode_label(node_core, workload_ns, None)
        kubepods.wait_for(
            lambda: annotation(node_core, workload_ns, "web") is None,
            "the redirection annotation removed",
            30,
            on_timeout=lambda: agent.logs(node_core)[-3000:],
        )
        ztunnel.wait_for("DelWorkload of the pod", lambda z: meshed.uid not in z.workloads())
        assert ("del", meshed.uid, False) in ztunnel.requests
        assert not ambient_chains(meshed_netns), podnet.saved_rules(meshed_netns)
        line = wait_client_line(
            node_core,
            workload_ns,
            "web",
            kubepods.escaped,
            "a connection no longer captured",
            after=logged,
        )
        assert "unreachable" in line, line

        # Labelled again: the running pod is enrolled live (its netns found on the node).
        set_mode_label(node_core, workload_ns, "ambient")
        kubepods.wait_for(
            lambda: annotation(node_core, workload_ns, "web") == "enabled",
            "the pod enrolled again",
            30,
            on_timeout=lambda: agent.logs(node_core)[-3000:],
        )
        again = ztunnel.wait_for(
            "AddWorkload of the running pod", lambda z: z.workloads().get(meshed.uid)
        )
        assert again is not None and again.netns_inode == os.stat(meshed_netns).st_ino
        assert ambient_chains(meshed_netns)
        pod = node_core.read_namespaced_pod("web", workload_ns)
        assert pod.status.phase == "Running"
        assert all(c.restart_count == 0 for c in pod.status.container_statuses)
        print(
            f"ztunnel double: {len(ztunnel.requests)} requests "
            f"{[kind for kind, _, _ in ztunnel.requests]}; {len(outbound)}+ outbound "
            f"connections captured; {len(probes)} probe connections SNATed"
        )
