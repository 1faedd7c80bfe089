"""A node that reboots with meshed pods on it (testbed/reboot.py), on containerd 2 in kind's layout:
every process of the node killed at once, its volatile dirs emptied, the pods' network namespaces
gone; the node starts again and the agent's pod starts only after kubelet has begun recreating
the other pods. Every meshed pod comes back captured (sidecar) or enrolled with ztunnel
(ambient) from its app's first connection, which the app makes at its first instant
(`connect-loop`): no line of its new container's log is a connection that left the pod.

Cases: the node's conflist kept (our entry in it) or lost (the primary's installer rewrote its
file at boot, without our entry), and the plugin binary kept or lost (gone from the bin dir).
With the conflist kept the plugin (or the runtime, its binary lost) refuses every meshed pod's
sandbox until the agent is back. With it lost, our entry chained into the primary's file
(the chart's default) is gone and the pods start without the plugin. A sidecar pod, injected as
Istio injects it with the CNI on, fails at istio-validation until the agent's repair programs
it, so its app never runs uncaptured. An ambient pod has no such gate: it runs unenrolled until
the agent's start-up enrolment reaches it, a known gap this module shows (strict xfail) and the
chart's NOTES name; the Istio-owned copy (`istioOwnedCNIConfig`, a file of its own that the
runtime loads first) survives the primary's rewrite and closes it.

After the reboot ztunnel is a new process that holds nothing, and the agent, started anew,
finds the pods annotated enrolled whose namespaces are gone: it sends KeepWorkload for them in
its first snapshot (as Istio's agent does for a pod whose netns it cannot find), which the
ztunnel double counts as a violation. Only that violation is let through here, named.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from testbed import chart as agent_mod
from testbed import images, kubepods, podnet
from testbed.images import Image
from testbed.platforms import RUNTIME_VARIANTS
from testbed.realnode import RealCluster
from testbed.reboot import RebootTimes, node_reboot
from testbed.ztunnel_double import OUTBOUND_PORT, ZtunnelDouble, api_identity
from tests.node.test_ambient import ambient_chains, set_mode_label
from tests.node.test_platforms import install_preset, rewrite_as_provider

pytestmark = [pytest.mark.node, pytest.mark.reboot]

OUTSIDE = ("203.0.113.10", 80)  # TEST-NET-3: never routed; the node netns has no route out
LOOP = ["connect-loop", OUTSIDE[0], str(OUTSIDE[1]), "0.5"]
PLATFORM = RUNTIME_VARIANTS["kind-on-containerd2"]
PODS = ("web-0", "web-1")
OWNED = "02-istio-cni.conflist"  # the chart's istioOwnedCNIConfigFileName


@pytest.fixture(scope="module")
def kind_node(real_cluster: RealCluster) -> Iterator[RealCluster]:
    """One layout for the module's tests (kind on containerd 2); the test bed's own at the end."""
    try:
        # istio-validation's image (pilot-agent), before the layout so that its runtime gets it
        real_cluster.import_image(images.image("proxy"))
        real_cluster.relayout(PLATFORM)
        yield real_cluster
    finally:
        real_cluster.relayout(None)


@pytest.fixture
def agent_image_back(kind_node: RealCluster, agent_image: Image) -> Iterator[None]:
    """Whatever the reboot left undone, the agent's image is in the runtime afterwards."""
    yield
    if agent_image.ref not in kind_node.runtime_images():
        kind_node.cri.import_image(agent_image.archive)  # type: ignore[union-attr]


@dataclass(frozen=True)
class FirstConnections:
    """A recreated pod's new app container, as its log tells: wall times of its first line, its
    first captured connection, and every connection that left the pod."""

    pod: str
    first: float
    captured: float
    escaped: tuple[float, ...]

    def window(self) -> float:
        """How long the pod ran uncaptured: its first escaped connection to its first captured
        one after it (0 with none)."""
        return max(self.captured - self.escaped[0], 0.0) if self.escaped else 0.0


def captured_line(mode: str, line: str) -> bool:
    """A connection that stayed in the pod: answered by its proxy or ztunnel stand-in, or
    refused at once (redirected to a port nothing listens on yet)."""
    if "connect " not in line:
        return False
    answered = "proxy-double port=15001" if mode == "sidecar" else "ztunnel-double|"
    return answered in line or "Connection refused" in line


def containing(text: str) -> Callable[[str], bool]:
    return lambda line: text in line


def timed_lines(core: Any, namespace: str, pod: str) -> list[tuple[float, str]]:
    text = str(core.read_namespaced_pod_log(pod, namespace, container="app", timestamps=True))
    out = []
    for raw in text.splitlines():
        stamp, _, line = raw.partition(" ")
        # RFC 3339 with nanoseconds: microseconds are enough here.
        when = datetime.fromisoformat(stamp[:26].rstrip("Z") + "+00:00").timestamp()
        out.append((when, line))
    return out


def app_container_id(core: Any, namespace: str, pod: str) -> str | None:
    status = core.read_namespaced_pod(pod, namespace).status
    for c in status.container_statuses or []:
        if c.name == "app" and c.state and c.state.running:
            return str(c.container_id)
    return None


def first_connections(
    core: Any, namespace: str, pod: str, mode: str, old_container: str
) -> FirstConnections:
    """Once the pod's new app container runs and logged a captured connection."""
    kubepods.wait_for(
        lambda: app_container_id(core, namespace, pod) not in (None, old_container),
        f"{pod}'s app container started anew",
        150,
        interval=0.5,
        on_timeout=lambda: kubepods.pod_events(core, namespace, pod),
    )

    def captured() -> list[tuple[float, str]] | None:
        lines = timed_lines(core, namespace, pod)
        return lines if any(captured_line(mode, s) for _, s in lines) else None

    lines: list[tuple[float, str]] = kubepods.wait_for(
        captured,
        f"a captured connection of {pod}'s new container",
        60,
        interval=0.5,
        on_timeout=lambda: kubepods.logs(core, namespace, pod, "app")[-2000:],
    )
    connects = [(t, s) for t, s in lines if "connect " in s]
    return FirstConnections(
        pod,
        connects[0][0],
        next(t for t, s in connects if captured_line(mode, s)),
        tuple(t for t, s in connects if kubepods.escaped(s)),
    )


class RanUncaptured(AssertionError):
    """A recreated pod's connection left it before it was captured."""


KEEP_UNHELD = "KeepWorkload {uid}: a pod this ztunnel does not hold"


@contextlib.contextmanager
def ztunnel_for(mode: str, socket: Path, core: Any) -> Iterator[ZtunnelDouble | None]:
    """The ztunnel double for ambient; at the end every violation it saw fails the test but
    KeepWorkload of a pod the restarted ztunnel does not hold (the module's doc)."""
    if mode != "ambient":
        yield None
        return
    ztunnel = ZtunnelDouble(str(socket), identity=api_identity(core), strict=False)
    try:
        yield ztunnel
    finally:
        ztunnel.close()
    pods = [p.metadata.uid for p in core.list_pod_for_all_namespaces().items]
    allowed = {KEEP_UNHELD.format(uid=uid) for uid in pods}
    other = [v for v in ztunnel.violations if v not in allowed]
    assert not other, f"the agent sent what ztunnel would not take: {other}"


def reconnect(ztunnel: ZtunnelDouble, timeout: float = 120.0) -> None:
    """ztunnel restarted with the node: it connects once the agent serves its socket again."""
    deadline = time.monotonic() + timeout
    ztunnel.disconnect()
    while True:
        try:
            ztunnel.restart()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def boot_changes(cluster: RealCluster, conflist: str, binary: str) -> Callable[[], None]:
    def at_boot() -> None:
        if conflist == "lost":  # the primary's installer writes its own file, ours not in it
            rewrite_as_provider(cluster, PLATFORM)
        if binary == "lost":
            (cluster.host_path(PLATFORM.bin_dir) / "istio-cni").unlink()

    return at_boot


GAP = pytest.mark.xfail(
    raises=RanUncaptured,
    strict=True,
    reason="the primary rewrote its conflist at boot without our chained entry: ambient pods "
    "start without the plugin and run unenrolled until the agent is back",
)
CASES = [
    pytest.param(
        mode,
        conflist,
        binary,
        config,
        id=f"{mode}-conflist-{conflist}-binary-{binary}-{config}",
        marks=[GAP] if (mode, conflist, config) == ("ambient", "lost", "chained") else [],
    )
    for mode, conflist, binary, config in (
        ("sidecar", "kept", "kept", "chained"),
        ("ambient", "kept", "kept", "chained"),
        ("sidecar", "kept", "lost", "chained"),
        ("ambient", "kept", "lost", "chained"),
        ("sidecar", "lost", "kept", "owned"),
        ("ambient", "lost", "lost", "owned"),
        ("sidecar", "lost", "kept", "chained"),
        ("ambient", "lost", "kept", "chained"),
    )
]


@pytest.mark.parametrize(("mode", "conflist", "binary", "config"), CASES)
def test_meshed_pods_come_back_captured_after_a_reboot(
    mode: str,
    conflist: str,
    binary: str,
    config: str,
    kind_node: RealCluster,
    ztunnel_socket: Path,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    agent_image_back: None,
    workload_ns: str,
) -> None:
    cluster = kind_node
    extra: dict[str, Any] = {"istioOwnedCNIConfig": config == "owned"}
    if mode == "ambient":
        set_mode_label(node_core, workload_ns, "ambient")
        extra["ambient"] = {"enabled": True, "ztunnelSocketPath": str(ztunnel_socket)}
    install_preset(node_helm("4"), agent_image, PLATFORM.name, "platform value", **extra)
    agent_mod.ready_agent(node_core, cluster, image=agent_image)
    conf_dir = cluster.host_path(PLATFORM.conf_dir)
    loaded = conf_dir / (OWNED if config == "owned" else PLATFORM.conflist_name)
    with ztunnel_for(mode, ztunnel_socket, node_core) as ztunnel:
        if ztunnel is not None:
            ztunnel.connect()
            ztunnel.wait_for("the agent's first snapshot", lambda z: z.snapshots >= 1)
        image = cluster.images["workload"].ref
        # A sidecar pod as Istio's injector writes it with the CNI on: istio-validation first.
        inits = [kubepods.validation_container(cluster.images["proxy"].ref)]
        for pod in PODS:
            manifest = kubepods.pod_manifest(
                pod,
                image,
                app_command=LOOP,
                sidecar=mode == "sidecar",
                init_containers=inits if mode == "sidecar" else None,
            )
            node_core.create_namespaced_pod(workload_ns, manifest)
        old = {}
        for pod in PODS:
            kubepods.wait_running(node_core, workload_ns, pod)
            old[pod] = app_container_id(node_core, workload_ns, pod)
        chained = [p["type"] for p in json.loads(loaded.read_text())["plugins"]]
        assert chained[-1] == "istio-cni", chained

        times = node_reboot(
            cluster,
            node_core,
            agent_image=agent_image,
            at_boot=boot_changes(cluster, conflist, binary),
        )
        if ztunnel is not None:
            reconnect(ztunnel)
        results = [
            first_connections(node_core, workload_ns, pod, mode, str(old[pod])) for pod in PODS
        ]
        agent_mod.ready_agent(node_core, cluster, image=agent_image)
        report(f"{mode}-conflist-{conflist}-binary-{binary}-{config}", times, results)
        for pod in PODS:
            view = kubepods.wait_running(node_core, workload_ns, pod)
            netns = cluster.pod_netns(view.uid)
            if ztunnel is None:
                assert podnet.has_istio_rules(netns), podnet.saved_rules(netns)
            else:
                assert ambient_chains(netns), podnet.saved_rules(netns)
                answer = f"ztunnel-double|{view.uid}|{OUTBOUND_PORT}"
                line = kubepods.wait_log_line(
                    node_core, workload_ns, pod, "app", containing(answer), "ztunnel's answer"
                )
                assert f"connect {OUTSIDE[0]}:{OUTSIDE[1]}" in line, line
                workload = ztunnel.workloads().get(view.uid)
                assert workload is not None, f"{pod} not enrolled anew: {ztunnel.requests}"
                assert workload.netns_inode == os.stat(netns).st_ino
        for result in results:
            if result.escaped:
                raise RanUncaptured(f"{result.pod} ran uncaptured: {result}")
            assert result.first == result.captured, result
        assert [p["type"] for p in json.loads(loaded.read_text())["plugins"]][-1] == "istio-cni"


def report(case: str, times: RebootTimes, results: list[FirstConnections]) -> None:
    """The numbers of the case, on stdout (`pytest -s`, or the captured output of a failure)."""
    start = times.kubelet_started
    line = {
        "case": case,
        "pods_recreated": len(results),
        "agent_image_back_s": round((times.agent_image_back or start) - start, 1),
        "first_captured_s": {r.pod: round(r.captured - start, 1) for r in results},
        "first_connection_s": {r.pod: round(r.first - start, 1) for r in results},
        "uncaptured_window_s": {r.pod: round(r.window(), 1) for r in results},
        "escaped_connections": {r.pod: len(r.escaped) for r in results},
    }
    print(f"reboot-measure {json.dumps(line)}")
