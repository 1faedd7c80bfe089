"""Each preset of values-examples/ on the real node laid out as its platform lays a node out
(testbed/platforms.py): the runtime's CNI dirs at the platform's paths, the provider's own
conflist there, its plugins real or named test doubles. The chart installed with the preset, as
a values file and as `--set platform=`, gives a Ready agent whose entry is chained into the
provider's file and whose plugin sits in the platform's bin dir; a meshed pod started by kubelet
is captured, a plain one is not; `helm uninstall` leaves the platform's files as they were.

OpenShift's node runs CRI-O (testbed/crio.py) with Multus's thin plugin as its CNI (both built
from their source by ci/setup-testbed): nothing is chained; Multus runs our standalone config for
pods that name the NetworkAttachmentDefinition istio-cni, as Istio's injector writes it."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client as k8s

from agent.netns import run_in_netns
from testbed import chart as agent_mod
from testbed import crds, kubepods, podnet
from testbed.agent_host import http_get
from testbed.helm import Helm
from testbed.images import Image
from testbed.multus import nad_crd
from testbed.platforms import CILIUM, PLATFORMS, RUNTIME_VARIANTS, Platform
from testbed.realnode import RealCluster
from testbed.wait import wait_for
from tests.node.agent_away import pods_while_agent_away

pytestmark = [pytest.mark.node, pytest.mark.platforms]

PRESETS = Path(__file__).resolve().parents[2] / "values-examples"
OUTSIDE = ("203.0.113.10", 80)  # TEST-NET-3: never routed; the node netns has no route out


@pytest.fixture(scope="module")
def layouts(real_cluster: RealCluster) -> Iterator[RealCluster]:
    """The tests of this module lay the node out as they need; it ends as the test bed's own."""
    try:
        yield real_cluster
    finally:
        real_cluster.relayout(None)


def snapshot(cluster: RealCluster, platform: Platform) -> dict[str, Any]:
    """Every file of the platform's CNI dirs: bytes and mode, or a link's target."""
    out: dict[str, Any] = {}
    dirs = (platform.bin_dir, platform.conf_dir, platform.delegate_conf_dir)
    for node_dir in filter(None, dirs):
        root = cluster.host_path(node_dir)
        for path in sorted(root.rglob("*")):
            key = f"{node_dir}/{path.relative_to(root)}"
            if path.is_symlink():
                out[key] = ("link", str(path.readlink()))
            elif path.is_file():
                out[key] = ("file", path.read_bytes(), path.stat().st_mode)
    return out


def uninstall_leaves_files_as_before(
    cluster: RealCluster,
    platform: Platform,
    helm: Helm,
    core: Any,
    before: dict[str, Any],
    how: str,
) -> None:
    agent_mod.uninstall(helm, core)
    after = snapshot(cluster, platform)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"{how}: helm uninstall left these changed: {changed}"


def image_values(image: Image) -> dict[str, Any]:
    """Only what the test bed needs: its image, never pulled. The paths are the preset's."""
    return {"hub": image.hub, "tag": image.tag, "pullPolicy": "Never", "logLevel": "debug"}


def install_preset(helm: Helm, image: Image, name: str, how: str, **extra: Any) -> None:
    """`-f values-examples/NAME.yaml` or `--set platform=NAME`, and the test bed's image."""
    files = (PRESETS / f"{name}.yaml",) if how == "values file" else ()
    values = {**image_values(image), **({} if files else {"platform": name}), **extra}
    helm.install(
        agent_mod.RELEASE,
        agent_mod.CHART,
        namespace=agent_mod.AGENT_NAMESPACE,
        values_files=files,
        values=values,
    )


def assert_captured(cluster: RealCluster, core: Any, namespace: str, pod: str) -> None:
    """The meshed pod's own connection out reaches its proxy double with the original
    destination; rules are in its netns."""
    line = kubepods.wait_log_line(
        core,
        namespace,
        pod,
        "app",
        lambda s: "proxy-double port=15001" in s,
        "a connection answered by the proxy",
    )
    assert f"original_dst={OUTSIDE[0]}:{OUTSIDE[1]}" in line, line
    app_log = kubepods.logs(core, namespace, pod, "app")
    assert not any(kubepods.escaped(s) for s in app_log.splitlines()), app_log[-2000:]
    view = kubepods.pod_view(core, namespace, pod)
    assert view is not None
    assert podnet.has_istio_rules(cluster.pod_netns(view.uid))


def assert_left_alone(cluster: RealCluster, core: Any, namespace: str, pod: str) -> None:
    line = kubepods.wait_log_line(
        core,
        namespace,
        pod,
        "app",
        lambda s: f"connect {OUTSIDE[0]}:{OUTSIDE[1]}" in s,
        "a connection attempt",
    )
    assert kubepods.escaped(line), line
    assert "proxy-double" not in kubepods.logs(core, namespace, pod, "app")
    view = kubepods.pod_view(core, namespace, pod)
    assert view is not None
    netns = cluster.pod_netns(view.uid)
    assert not podnet.has_istio_rules(netns), podnet.saved_rules(netns)


def assert_closed_on_another_runtime(
    cluster: RealCluster, core: Any, namespace: str, image: str, loop: list[str]
) -> None:
    """The preset's netns dir is another runtime's: a meshed pod is refused (it does not start
    uncaptured) and the agent turns not Ready, naming cniNetnsDir and the runtime's dir."""
    core.create_namespaced_pod(
        namespace, kubepods.pod_manifest("other-runtime", image, app_command=loop, sidecar=True)
    )

    def netns_dir_named() -> str | None:
        code, body = readyz(cluster)
        return body if code == 503 and "\nnetns-dir: " in body else None

    body = wait_for(netns_dir_named, "/readyz to name netns-dir", 60)
    assert "set cniNetnsDir to /var/run/netns" in body, body
    assert "RedirectRefused" in kubepods.pod_events(core, namespace, "other-runtime")
    view = kubepods.pod_view(core, namespace, "other-runtime")
    assert view is not None and view.phase == "Pending", view
    kubepods.delete_and_wait(core, namespace, "other-runtime")


@pytest.mark.parametrize("name", [*sorted(PLATFORMS), *sorted(RUNTIME_VARIANTS)])
def test_preset_on_its_platform(
    name: str,
    layouts: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
) -> None:
    platform = PLATFORMS.get(name) or RUNTIME_VARIANTS[name]
    name = platform.name  # the preset
    cluster = layouts
    cluster.relayout(platform)
    if platform.delegate_conf_dir:
        with crds.applied(node_core.api_client, nad_crd()):
            preset_through_multus(
                cluster, platform, node_helm("4"), node_core, agent_image, workload_ns
            )
        return
    before = snapshot(cluster, platform)
    primary = cluster.host_path(platform.conf_dir) / platform.conflist_name
    primary_types = [p["type"] for p in json.loads(primary.read_text())["plugins"]]
    image = cluster.images["workload"].ref
    loop = ["connect-loop", OUTSIDE[0], str(OUTSIDE[1]), "0.5"]
    helm = node_helm("4")
    for round_, how in enumerate(("values file", "platform value")):
        # Values after a values file win; `--set platform=` replaces those still at their
        # default, which a runtime value may be (minikube on containerd: /var/run/netns).
        runtime_values = dict(platform.runtime_values) if how == "values file" else {}
        install_preset(helm, agent_image, name, how, **runtime_values)
        agent_mod.ready_agent(node_core, cluster, image=agent_image)
        if platform.runtime_values and how == "platform value":
            assert_closed_on_another_runtime(cluster, node_core, workload_ns, image, loop)
            agent_mod.uninstall(helm, node_core)
            continue
        chained = [p["type"] for p in json.loads(primary.read_text())["plugins"]]
        assert chained == [*primary_types, "istio-cni"], f"{how}: {chained}"
        assert (cluster.host_path(platform.bin_dir) / "istio-cni").is_file()

        meshed, plain = f"meshed-{round_}", f"plain-{round_}"
        node_core.create_namespaced_pod(
            workload_ns, kubepods.pod_manifest(meshed, image, app_command=loop, sidecar=True)
        )
        if round_ == 0:
            node_core.create_namespaced_pod(
                workload_ns, kubepods.pod_manifest(plain, image, app_command=loop, sidecar=False)
            )
        kubepods.wait_running(node_core, workload_ns, meshed)
        assert_captured(cluster, node_core, workload_ns, meshed)
        if round_ == 0:
            kubepods.wait_running(node_core, workload_ns, plain)
            assert_left_alone(cluster, node_core, workload_ns, plain)
            kubepods.delete_and_wait(node_core, workload_ns, plain)
        kubepods.delete_and_wait(node_core, workload_ns, meshed)

        uninstall_leaves_files_as_before(cluster, platform, helm, node_core, before, how)


NETWORKS = "k8s.v1.cni.cncf.io/networks"
REPAIRED = "started without traffic redirect"  # the repair Event's message


def multus_delegates(cluster: RealCluster) -> set[str]:
    """Plugin types of the networks in Multus's per-sandbox caches (its cniDir,
    /var/lib/cni/multus: what it ran, kept for DEL)."""
    types = set()
    for cache in filter(Path.is_file, cluster.host_path("/var/lib/cni/multus").glob("*")):
        for delegate in json.loads(cache.read_text()):
            types.add(delegate["Conf"].get("type", ""))
    return types


def repair_event(core: Any, namespace: str, pod: str) -> bool:
    return REPAIRED in kubepods.pod_events(core, namespace, pod)


NAD_GROUP, NAD_VERSION, NAD_PLURAL = "k8s.cni.cncf.io", "v1", "network-attachment-definitions"


def preset_through_multus(
    cluster: RealCluster,
    platform: Platform,
    helm: Helm,
    core: Any,
    agent_image: Image,
    namespace: str,
) -> None:
    """OpenShift: the agent writes a standalone config in Multus's confDir and leaves Multus's
    own file alone; a pod naming `default/istio-cni`, or `istio-cni` in a namespace of
    networkAttachmentNamespaces (as Istio's injector writes it), is captured through Multus, by
    the plugin (no repair Event); a plain pod naming none is left alone. A
    sidecar pod whose annotation is missing never reaches the plugin (Multus runs only what a
    pod names), and fails closed: the agent's repair finds its netns without rules and
    captures it in place (its Event says so)."""
    before = snapshot(cluster, platform)
    multus_conf = cluster.host_path(platform.conf_dir) / platform.conflist_name
    multus_bytes = multus_conf.read_bytes()
    standalone = cluster.host_path(platform.delegate_conf_dir) / "istio-cni.conf"
    nads = k8s.CustomObjectsApi(core.api_client)
    image = cluster.images["workload"].ref
    loop = ["connect-loop", OUTSIDE[0], str(OUTSIDE[1]), "0.5"]
    # Istio's injector names `istio-cni` (the pod's own namespace) unless told otherwise: the
    # second round has the chart put a NetworkAttachmentDefinition in the pods' namespace.
    rounds: tuple[tuple[str, str, dict[str, Any]], ...] = (
        ("values file", "default/istio-cni", {}),
        ("platform value", "istio-cni", {"networkAttachmentNamespaces": [namespace]}),
    )
    for round_, (how, network, extra) in enumerate(rounds):
        install_preset(helm, agent_image, platform.name, how, **extra)
        agent_mod.ready_agent(core, cluster, image=agent_image)
        config = json.loads(standalone.read_text())
        assert (config["name"], config["type"]) == ("istio-cni", "istio-cni"), config
        assert multus_conf.read_bytes() == multus_bytes, f"{how}: Multus's config was changed"
        assert (cluster.host_path(platform.bin_dir) / "istio-cni").is_file()
        for ns in (
            "default",
            agent_mod.AGENT_NAMESPACE,
            *extra.get("networkAttachmentNamespaces", []),
        ):
            nad = cast(
                dict[str, Any],
                nads.get_namespaced_custom_object(
                    NAD_GROUP, NAD_VERSION, ns, NAD_PLURAL, "istio-cni"
                ),
            )
            assert not nad.get("spec", {}).get("config"), nad  # Multus reads istio-cni.conf

        meshed, plain, unnamed = f"meshed-{round_}", f"plain-{round_}", f"no-network-{round_}"
        core.create_namespaced_pod(
            namespace,
            kubepods.pod_manifest(
                meshed,
                image,
                app_command=loop,
                sidecar=True,
                annotations={NETWORKS: network},
            ),
        )
        if round_ == 0:
            for pod, sidecar in ((plain, False), (unnamed, True)):
                core.create_namespaced_pod(
                    namespace, kubepods.pod_manifest(pod, image, app_command=loop, sidecar=sidecar)
                )
        kubepods.wait_running(core, namespace, meshed)
        assert_captured(cluster, core, namespace, meshed)
        assert REPAIRED not in kubepods.pod_events(core, namespace, meshed)
        # Multus keeps the networks it ran for each sandbox (for DEL): ours among them.
        assert "istio-cni" in multus_delegates(cluster), f"{how}: Multus ran no istio-cni"
        if round_ == 0:
            kubepods.wait_running(core, namespace, plain)
            assert_left_alone(cluster, core, namespace, plain)
            kubepods.wait_running(core, namespace, unnamed)
            repaired = functools.partial(repair_event, core, namespace, unnamed)
            wait_for(repaired, "the repair Event of the pod Multus did not run us for", 60)
            # Its connections escape until the repair (Istio's validation init container
            # would hold the app back meanwhile); from then on they reach the proxy.
            line = kubepods.wait_log_line(
                core,
                namespace,
                unnamed,
                "app",
                lambda s: "proxy-double port=15001" in s,
                "a connection answered by the proxy after the repair",
            )
            assert f"original_dst={OUTSIDE[0]}:{OUTSIDE[1]}" in line, line
            view = kubepods.pod_view(core, namespace, unnamed)
            assert view is not None and podnet.has_istio_rules(cluster.pod_netns(view.uid))
            for pod in (plain, unnamed):
                kubepods.delete_and_wait(core, namespace, pod)
        kubepods.delete_and_wait(core, namespace, meshed)

        uninstall_leaves_files_as_before(cluster, platform, helm, core, before, how)


PORT = 15014  # the chart's default metricsPort, in the node's own network namespace


def readyz(cluster: RealCluster) -> tuple[int, str]:
    """GET /readyz on the agent's port from inside the node's network namespace."""
    return run_in_netns(cluster.network.netns_path, lambda: http_get(PORT, "/readyz"))


@pytest.mark.parametrize(
    ("node", "preset", "check", "message"),
    [
        # GKE's runtime runs plugins from /home/kubernetes/bin; its /opt/cni/bin holds none.
        (
            "gke",
            "eks",
            "cni-bin-dir",
            "cniBinDir /opt/cni/bin holds none of the plugins that "
            "/etc/cni/net.d/10-gke-ptp.conflist names (portmap, ptp)",
        ),
        # K3s keeps its CNI config under its data dir; /etc/cni/net.d is empty there.
        (
            "k3s",
            "kind",
            "install",
            "waiting for a primary CNI config (.conf/.conflist/.json) in /host/etc/cni/net.d "
            "(cniConfDir /etc/cni/net.d on the node",
        ),
    ],
    ids=["gke-node-eks-preset", "k3s-node-kind-preset"],
)
def test_a_preset_of_another_platform_keeps_the_agent_not_ready_naming_it(
    node: str,
    preset: str,
    check: str,
    message: str,
    layouts: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
) -> None:
    cluster = layouts
    # The wrong preset's dirs exist on the node, empty (kubelet would make them anyway): the
    # agent writes there, never outside the node's dir.
    wrong, right = PLATFORMS[preset], PLATFORMS[node]
    elsewhere = tuple(
        d for d in (wrong.bin_dir, wrong.conf_dir) if d not in (right.bin_dir, right.conf_dir)
    )
    platform = replace(right, extra_dirs=elsewhere)
    cluster.relayout(platform)
    before = snapshot(cluster, platform)
    helm = node_helm("4")
    install_preset(helm, agent_image, preset, "platform value")

    def not_ready_naming_it() -> str | None:
        try:
            code, body = readyz(cluster)
        except OSError:
            return None  # not listening yet
        return body if code == 503 and f"\n{check}: " in body else None

    body = wait_for(not_ready_naming_it, f"/readyz to name {check}", agent_mod.READY_TIMEOUT)
    assert f"{check}: {message}" in body, body
    assert f"platform preset {preset!r}" in body, body

    # A meshed pod does not start uncaptured: the runtime finds no istio-cni where it looks,
    # or the agent waits for a primary config that never comes and chains nothing.
    image = cluster.images["workload"].ref
    loop = ["connect-loop", OUTSIDE[0], str(OUTSIDE[1]), "0.5"]
    node_core.create_namespaced_pod(
        workload_ns, kubepods.pod_manifest("meshed", image, app_command=loop, sidecar=True)
    )
    if check == "cni-bin-dir":

        def sandbox_failed() -> str | None:
            events = kubepods.pod_events(node_core, workload_ns, "meshed")
            return events if "FailedCreatePodSandBox" in events else None

        events = wait_for(sandbox_failed, "the meshed pod's sandbox to fail", 60)
        assert 'failed to find plugin "istio-cni"' in events, events
        view = kubepods.pod_view(node_core, workload_ns, "meshed")
        assert view is not None and view.phase == "Pending", view
    (pod,) = agent_mod.agent_pods(node_core)
    assert not kubepods.PodView.of(pod).ready
    # The sandbox's DEL fails the same way until the uninstall takes our entry out.
    agent_mod.uninstall(helm, node_core)
    kubepods.delete_and_wait(node_core, workload_ns, "meshed")
    after = snapshot(cluster, platform)
    assert before == after
    for d in elsewhere:
        assert list(cluster.host_path(d).iterdir()) == [], d


def metric(cluster: RealCluster, name: str, labels: str) -> float:
    """A sample of the agent's /metrics (0 when absent)."""
    text = run_in_netns(cluster.network.netns_path, lambda: http_get(PORT, "/metrics"))[1]
    for line in text.splitlines():
        if line.startswith(f"{name}{{{labels}}} "):
            return float(line.split()[-1])
    return 0.0


def rewrite_as_provider(cluster: RealCluster, platform: Platform) -> None:
    """What the provider's installer does at boot: its own file, without our entry, renamed
    into place."""
    path = cluster.host_path(platform.conf_dir) / platform.conflist_name
    tmp = path.with_name(f".{path.name}.provider-tmp")
    tmp.write_text(platform.conflist(cluster.pod_subnet))
    tmp.rename(path)


def has_our_entry(path: Path) -> bool:
    try:
        return "istio-cni" in [p.get("type") for p in json.loads(path.read_text())["plugins"]]
    except (OSError, ValueError):
        return False


@pytest.mark.parametrize("name", ["eks", "iks", "k3s"])
def test_the_primary_rewriting_its_config_while_pods_start(
    name: str,
    layouts: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
) -> None:
    """AWS VPC CNI, Calico and k3s each write their conflist again when their node agent
    starts. Pods created around that rewrite all end up captured (the entry back at once; a pod
    whose sandbox came up in between is repaired)."""
    platform = PLATFORMS[name]
    cluster = layouts
    cluster.relayout(platform)
    helm = node_helm("4")
    install_preset(helm, agent_image, name, "platform value")
    agent_mod.ready_agent(node_core, cluster, image=agent_image)
    primary = cluster.host_path(platform.conf_dir) / platform.conflist_name
    image = cluster.images["workload"].ref
    loop = ["connect-loop", OUTSIDE[0], str(OUTSIDE[1]), "0.5"]
    pods = [f"boot-{i}" for i in range(6)]
    back_after = None
    for i, pod in enumerate(pods):
        node_core.create_namespaced_pod(
            workload_ns, kubepods.pod_manifest(pod, image, app_command=loop, sidecar=True)
        )
        if i == 2:
            rewrite_as_provider(cluster, platform)
            began = time.monotonic()
            wait_for(lambda: has_our_entry(primary), "our entry back in the rewritten file", 10)
            back_after = time.monotonic() - began
        time.sleep(0.3)
    assert back_after is not None and back_after < 2.0, back_after
    for pod in pods:
        view = kubepods.wait_running(node_core, workload_ns, pod)
        netns = cluster.pod_netns(view.uid)

        def captured(path: str = netns) -> bool:
            return podnet.has_istio_rules(path)

        wait_for(captured, f"{pod} captured", 60)
    assert metric(cluster, "istio_cni_install_conflicts_total", f'file="{platform.conflist_name}"')


@pytest.mark.parametrize(
    ("layout", "writer"),
    [
        ("iks", "Calico (install-cni rewrites the conflist"),
        ("cilium", "Cilium (its agent rewrites its CNI config unless cni.exclusive=false)"),
    ],
)
def test_a_primary_rewriting_in_a_loop_gets_an_event_and_no_tight_loop(
    layout: str,
    writer: str,
    layouts: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
) -> None:
    """A writer that takes our entry out as soon as it is back (as Cilium does with
    cni.exclusive): the conflict metric counts it, the agent's pod gets a Warning Event naming
    the likely writer and the setting to change, and past the threshold
    (conflictsPerMinuteWarning: 5) the agent's writes are at least 0.25 s apart instead of
    answering each rewrite at once. Calico's conflist under IKS's preset; Cilium's with the
    chart's defaults (no preset is Cilium's)."""
    platform = CILIUM if layout == "cilium" else PLATFORMS[layout]
    cluster = layouts
    cluster.relayout(platform)
    helm = node_helm("4")
    if layout == "cilium":
        helm.install(
            agent_mod.RELEASE,
            agent_mod.CHART,
            namespace=agent_mod.AGENT_NAMESPACE,
            values=image_values(agent_image),
        )
    else:
        install_preset(helm, agent_image, layout, "platform value")
    agent = agent_mod.ready_agent(node_core, cluster, image=agent_image)
    primary = cluster.host_path(platform.conf_dir) / platform.conflist_name
    heals_before = metric(cluster, "istio_cni_install_heals_total", 'kind="config"')
    rewrites = 0
    deadline = time.monotonic() + 25.0
    while time.monotonic() < deadline:
        if has_our_entry(primary):
            rewrite_as_provider(cluster, platform)
            rewrites += 1
        time.sleep(0.05)
    heals = metric(cluster, "istio_cni_install_heals_total", 'kind="config"') - heals_before
    # 6 at once (the threshold, 5, and the first past it), then at most 4 a second.
    assert 6 <= heals <= 6 + 25 / 0.25, (heals, rewrites)
    conflicts = metric(
        cluster, "istio_cni_install_conflicts_total", f'file="{platform.conflist_name}"'
    )
    assert conflicts >= 6, conflicts
    events = kubepods.pod_events(node_core, agent_mod.AGENT_NAMESPACE, agent.pod.name)
    assert "CNIConfigConflict" in events and writer in events, events
    assert f"{platform.conflist_name} lost istio-cni's entry" in events, events
    # The writer stopped: the entry comes back.
    wait_for(lambda: has_our_entry(primary), "our entry back after the fight", 5)


def test_a_down_agent_on_crio_stops_only_the_meshed_pods(
    layouts: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
) -> None:
    """CRI-O hands the plugin the pod's annotations as containerd does (its
    `io.kubernetes.cri.pod-annotations` runtimeConfig): with the agent away a plain pod starts,
    a meshed one waits and starts captured once it is back (containerd:
    tests/node/test_agent_away.py).

    Then `helm uninstall` with both pods still running: CRI-O tears a sandbox down with the
    config libcni cached at its set-up, which names our plugin, so uninstall keeps the binary
    and the pods are deleted in bounded time instead of staying Terminating on "failed to find
    plugin"."""
    platform = RUNTIME_VARIANTS["minikube-on-crio"]
    layouts.relayout(platform)
    helm = node_helm("4")
    runtime_values = dict(platform.runtime_values)
    install_preset(helm, agent_image, platform.name, "values file", **runtime_values)
    plugin = layouts.host_path(platform.bin_dir) / "istio-cni"
    primary = layouts.host_path(platform.conf_dir) / platform.conflist_name
    uninstalled = False
    try:
        agent_mod.ready_agent(node_core, layouts, image=agent_image)
        run_dir = layouts.host_path("/var/run/istio-cni")  # the chart's cniAgentRunDir
        pods_while_agent_away(layouts, node_core, workload_ns, agent_image, run_dir)
        agent_mod.uninstall(helm, node_core)
        uninstalled = True
        assert "istio-cni" not in [p["type"] for p in json.loads(primary.read_text())["plugins"]]
        assert plugin.is_file(), "uninstall removed the plugin CRI-O still runs at DEL"
        for pod in ("plain", "meshed"):
            kubepods.delete_and_wait(node_core, workload_ns, pod, timeout=45.0)
    finally:
        if not uninstalled:
            agent_mod.uninstall(helm, node_core)
        plugin.unlink(missing_ok=True)  # what the operator does once those pods are gone
