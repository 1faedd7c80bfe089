"""Istio's own node agent and ours on the same real node, one after the other: the same seeded
random sidecar pods (tests/differential/pods.py: annotations, proxy env and ids, TPROXY, DNS
capture, native sidecars, pods Istio skips) started by kubelet under Istio's DaemonSet
(testbed/istio_agent.py) and then under ours, and every pod's rules compared pod by pod: with
iptables (`iptables-save` of both families and both variants, counters stripped) and with native
nftables (Istio's `global.nativeNftables`, our `ruleBackend: nftables`; `nft list ruleset`). A
pod that one agent lets start and the other does not is a difference too. Our uninstall leaves
the node's CNI config as it found it; what Istio's leaves is printed. In ambient mode, one run
also compares the ZDS streams the agents send the ztunnel double for seeded pods through faults
(tests/node/zds_scenario.py), but for the differences ALLOWED_ZDS_DIFFERENCES names.
On containerd 2, the node laid out as kind's (tests/node/conftest.py on_containerd2)."""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testbed import chart as agent_mod
from testbed import images, istio_agent, kubepods, podnet
from testbed.images import Image
from testbed.realnode import RealCluster
from testbed.ztunnel_double import ZtunnelDouble, api_identity, kept_connected
from tests.differential.ambient_pods import NAMESPACES, random_pods
from tests.differential.pods import random_pod
from tests.node.zds_scenario import Scenario, kill_pods, netns_namer

pytestmark = [pytest.mark.node, pytest.mark.migration, pytest.mark.usefixtures("on_containerd2")]

PODS = 32
START_TIMEOUT = 240.0


def manifest(name: str, spec: dict[str, Any], image: str) -> dict[str, Any]:
    """A pod of the random spec, runnable here: the app and the proxy double in the workload
    image, the spec's annotations, labels, proxy env, args and security context kept."""
    pod = kubepods.pod_manifest(
        name,
        image,
        app_command=["sleep"],
        sidecar=False,
        annotations=spec["annotations"],
        labels=spec["labels"],
    )
    pod["spec"]["containers"] = [_runnable(c, image) for c in spec["containers"]]
    inits = [_runnable(c, image) for c in spec.get("init_containers", [])]
    if inits:
        pod["spec"]["initContainers"] = inits
    return pod


def _runnable(container: dict[str, Any], image: str) -> dict[str, Any]:
    """The container of the workload image doing its part; what the agents read of it (name,
    env, args, security context, ports, restart policy) as the spec has it."""
    out = {k: v for k, v in container.items() if k != "image"}
    out["image"] = image
    out["imagePullPolicy"] = "Never"
    if container["name"] == "istio-proxy":
        # `sh -c` takes the spec's args as its own $0..., so the proxy's args stay in the
        # manifest (the agents read them) without reaching the double.
        out["command"] = ["/bin/sh", "-c", f"exec {' '.join(kubepods.PROXY)}", "istio-proxy"]
    elif container["name"] == "istio-init":
        out["command"] = ["/bin/true"]
    else:
        out["command"] = [*kubepods.APP, "sleep"]
    return out


@dataclass(frozen=True)
class Backend:
    """One rule backend on both sides: each chart's values for it, how a pod's rules are listed,
    and what in Istio's listing shows a pod captured."""

    istio_values: dict[str, Any]
    our_values: dict[str, Any]
    listing: Callable[[str], str]
    captured_by: str


BACKENDS = {
    "iptables": Backend({}, {}, podnet.saved_tables, "ISTIO_OUTPUT"),
    "nftables": Backend(
        {"global": {"nativeNftables": True}},
        {"ruleBackend": "nftables"},
        podnet.nft_ruleset,
        "chain istio-output",
    ),
}


def start_all(
    core: Any,
    cluster: RealCluster,
    namespace: str,
    specs: list[dict[str, Any]],
    image: str,
    prefix: str,
    listing: Callable[[str], str],
) -> list[str]:
    """Create every pod at once (named `<prefix>-<index>`: Events outlive pods, so each batch
    has its own names); each pod's outcome: its rules once Running, or "refused" once kubelet
    reports its sandbox failed (the agent refused the ADD; kubelet would retry forever)."""
    names = [f"{prefix}-{i}" for i in range(len(specs))]
    for name, spec in zip(names, specs, strict=True):
        core.create_namespaced_pod(namespace, manifest(name, spec, image))
    outcomes: dict[str, str] = {}

    def settled() -> bool:
        for name in names:
            if name in outcomes:
                continue
            view = kubepods.pod_view(core, namespace, name)
            if view is not None and view.phase == "Running":
                outcomes[name] = listing(cluster.pod_netns(view.uid))
            elif "FailedCreatePodSandBox" in kubepods.pod_events(core, namespace, name):
                outcomes[name] = "refused: the sandbox failed"
        return len(outcomes) == len(names)

    kubepods.wait_for(
        settled,
        f"{len(names)} pods Running or refused",
        START_TIMEOUT,
        interval=1.0,
        on_timeout=lambda: f"unsettled: {sorted(set(names) - set(outcomes))}",
    )
    return [outcomes[name] for name in names]


def istio_vs_ours(theirs: str, ours: str) -> str:
    """A pod's outcome under each agent, as a unified diff."""
    diff = difflib.unified_diff(
        theirs.splitlines(), ours.splitlines(), "istio", "ours", lineterm=""
    )
    return "\n".join(diff)


def delete_all(core: Any, namespace: str) -> None:
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    kubepods.wait_for(
        lambda: not core.list_namespaced_pod(namespace).items, "the pods to be gone", 120
    )


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_the_same_pods_get_the_same_rules_under_istios_agent_and_ours(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
    backend: str,
) -> None:
    rules = BACKENDS[backend]
    seed = int(os.environ.get("ISTIO_CNI_DIFF_SEED") or random.SystemRandom().randrange(2**32))
    print(f"node differential seed={seed} (replay: ISTIO_CNI_DIFF_SEED={seed})")
    rng = random.Random(seed)
    specs = [random_pod(rng) for _ in range(PODS)]
    image = real_cluster.images["workload"].ref
    istio_image = images.image("install-cni")
    real_cluster.import_image(istio_image)
    helm = node_helm("4")
    before = real_cluster.conflist_path.read_bytes()
    conf_dir = real_cluster.host_path(real_cluster.node_dirs.cni_conf)
    conf_files = {p.name for p in conf_dir.iterdir()}

    began = time.monotonic()
    istio_agent.install(
        helm, real_cluster, node_core, istio_image, repair={"enabled": False}, **rules.istio_values
    )
    installed = json.loads(real_cluster.conflist_path.read_text())
    assert [p["type"] for p in installed["plugins"]][-1] == "istio-cni", installed
    theirs = start_all(node_core, real_cluster, workload_ns, specs, image, "istio", rules.listing)
    delete_all(node_core, workload_ns)
    istio_agent.uninstall(helm, node_core)
    istio_left = sorted(p.name for p in conf_dir.iterdir())
    istio_conflist = real_cluster.conflist_path.read_bytes()
    left_diff = difflib.unified_diff(
        before.decode().splitlines(), istio_conflist.decode().splitlines(), lineterm=""
    )
    print(f"after Istio's uninstall: conf dir {istio_left}; conflist:", *left_diff, sep="\n")
    real_cluster.conflist_path.write_bytes(before)
    for leftover in set(istio_left) - conf_files:
        (conf_dir / leftover).unlink()
    agent_mod.install(helm, real_cluster, node_core, agent_image, **rules.our_values)
    ours = start_all(node_core, real_cluster, workload_ns, specs, image, "ours", rules.listing)
    delete_all(node_core, workload_ns)
    agent_mod.uninstall(helm, node_core)
    print(f"{PODS} pods under each agent in {time.monotonic() - began:.0f}s")

    failures = []
    for i, spec in enumerate(specs):
        if theirs[i] != ours[i]:
            failures.append(f"pod {i} {json.dumps(spec)}\n" + istio_vs_ours(theirs[i], ours[i]))
    captured = sum(rules.captured_by in listed for listed in theirs)
    started = sum(not listed.startswith("refused") for listed in theirs)
    print(f"Istio's agent: {started} started, {captured} captured")
    assert captured >= PODS // 3, "most random pods must be ones Istio captures"
    assert not failures, f"{len(failures)} of {PODS} pods differ (seed {seed}):\n" + failures[0]
    assert real_cluster.conflist_path.read_bytes() == before


ZDS_SOCKET = Path("/var/run/ztunnel/ztunnel.sock")
"""Istio's agent serves ZDS at this fixed node path (its chart has no value for it)."""
AMBIENT_PODS: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    # name: (annotations, labels), all in a namespace labelled for ambient
    "plain": ({}, {}),
    "bypass-inbound": ({"ambient.istio.io/bypass-inbound-capture": "true"}, {}),
    "opted-out": ({}, {"istio.io/dataplane-mode": "none"}),
    "sidecar": ({"sidecar.istio.io/status": kubepods.SIDECAR_STATUS}, {}),
    "waypoint": ({}, {"gateway.istio.io/managed": "istio.io-mesh-controller"}),
}
# With iptables, both sides use iptables-nft, forced: left to detect, the two pick differently
# when the node's namespace holds a legacy table with no rule in it (Istio's agent takes any
# legacy table for legacy in use, ours a rule or a non-default policy); see README.
FORCE_NFT_ISTIO = {"env": {"FORCE_IPTABLES_BINARY": "nft"}}
FORCE_NFT_OURS = {"ruleBackend": "iptables-nft"}
AMBIENT_BACKENDS: dict[str, tuple[bool, dict[str, Any], dict[str, Any], Callable[[str], str]]] = {
    # name: (dnsCapture, Istio's values, ours, listing)
    "iptables-dns": (True, FORCE_NFT_ISTIO, FORCE_NFT_OURS, podnet.saved_tables),
    "iptables-nodns": (False, FORCE_NFT_ISTIO, FORCE_NFT_OURS, podnet.saved_tables),
    "nftables": (
        True,
        {"global": {"nativeNftables": True}},
        {"ruleBackend": "nftables"},
        podnet.nft_ruleset,
    ),
}


def in_ztunnel(uid: str) -> Callable[[ZtunnelDouble], bool]:
    return lambda z: uid in z.workloads()


def ambient_outcomes(
    core: Any,
    cluster: RealCluster,
    namespace: str,
    image: str,
    prefix: str,
    listing: Callable[[str], str],
    zds: Callable[[ZtunnelDouble], list[str]] | None = None,
) -> tuple[dict[str, str], list[str]]:
    """With a ztunnel double connected to the agent's ZDS socket: each pod's in-pod rules, its
    redirection annotation, and whether ztunnel was handed the pod; then, with `zds`, what it
    returns (the ZDS stream of its scenario, on the same connection)."""
    out = {}
    stream: list[str] = []
    namer = netns_namer(cluster)
    with ZtunnelDouble(str(ZDS_SOCKET), identity=api_identity(core), netns_name=namer) as ztunnel:
        ztunnel.connect()
        ztunnel.wait_for("the agent's first snapshot", lambda z: z.snapshots >= 1)
        with kept_connected(ztunnel) as reconnected:
            for name, (annotations, labels) in AMBIENT_PODS.items():
                pod = kubepods.pod_manifest(
                    f"{prefix}-{name}",
                    image,
                    app_command=["sleep"],
                    sidecar=False,
                    annotations=annotations,
                    labels=labels,
                )
                core.create_namespaced_pod(namespace, pod)
            for name in AMBIENT_PODS:
                view = kubepods.wait_running(core, namespace, f"{prefix}-{name}", ready=False)
                meta = core.read_namespaced_pod(view.name, namespace).metadata
                redirection = (meta.annotations or {}).get("ambient.istio.io/redirection", "-")
                # The agent hands a pod to ztunnel after its ADD returned: wait for it a moment.
                if redirection == "enabled":
                    ztunnel.wait_for(f"{view.name} in ztunnel", in_ztunnel(view.uid))
                handed = view.uid in ztunnel.workloads()
                out[name] = f"redirection={redirection} ztunnel={handed}\n" + listing(
                    cluster.pod_netns(view.uid)
                )
            delete_all(core, namespace)
        if reconnected:  # shown when the test fails: the agent ended the connection meanwhile
            print(f"the ztunnel double reconnected {len(reconnected)} times while pods started")
        if zds is not None:
            stream = zds(ztunnel)
    return out, stream


ZDS_BACKEND = "iptables-dns"
"""The backend whose run also compares the ZDS streams (tests/node/zds_scenario.py): what
ztunnel is told does not depend on the rule backend, so one run of it is enough."""
ZDS_PODS = 32
ALLOWED_ZDS_DIFFERENCES: dict[str, tuple[str, str]] = {
    # reason (README, "What differs between Istio's node agent and this one"): (a pattern of
    # the line Istio's stream has, of the line ours has instead), each matching a whole line
    # ("" for no line); where both name a pod, it is the same pod.
    "the test bed: Istio's agent sees a stand-in /proc (testbed/istio_procfs.py), so after a"
    " restart it finds no pod's netns and keeps each pod (KeepWorkload); ours finds each"
    " pod's netns and adds it again": (r"keep \S+", r"add \S+ info=\(.*\) fds=1 netns=own"),
}


@pytest.mark.parametrize("backend", list(AMBIENT_BACKENDS))
def test_ambient_pods_get_the_same_rules_under_istios_agent_and_ours(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
    backend: str,
) -> None:
    dns, istio_values, our_values, listing = AMBIENT_BACKENDS[backend]
    node_core.patch_namespace(
        workload_ns, {"metadata": {"labels": {"istio.io/dataplane-mode": "ambient"}}}
    )
    image = real_cluster.images["workload"].ref
    istio_image = images.image("install-cni")
    real_cluster.import_image(istio_image)
    helm = node_helm("3")  # Helm 4 takes a post-renderer only as a plugin
    before = real_cluster.conflist_path.read_bytes()
    assert not ZDS_SOCKET.exists(), f"{ZDS_SOCKET} exists before the test"
    with contextlib.ExitStack() as stack:
        scenario = None
        if backend == ZDS_BACKEND:
            seed = int(
                os.environ.get("ISTIO_CNI_DIFF_SEED") or random.SystemRandom().randrange(2**32)
            )
            print(f"ZDS differential seed={seed} (replay: ISTIO_CNI_DIFF_SEED={seed})")
            namespaces = {
                key: stack.enter_context(kubepods.pod_namespace(node_core, f"zds-{key}"))
                for key in NAMESPACES
            }
            pods = random_pods(random.Random(seed), ZDS_PODS)
            scenario = Scenario(node_core, real_cluster, image, namespaces, pods)
            scenario.prepare()

        def zds(restart_agent: Callable[[], None]) -> Callable[[ZtunnelDouble], list[str]] | None:
            if scenario is None:
                return None
            return lambda ztunnel: scenario.run(ztunnel, restart_agent)

        def restart_istio() -> None:
            kill_pods(node_core, istio_agent.NAMESPACE, istio_agent.SELECTOR)
            istio_agent.ready_pod(node_core, real_cluster, istio_image)

        def restart_ours() -> None:
            kill_pods(node_core, agent_mod.AGENT_NAMESPACE, agent_mod.AGENT_SELECTOR)
            agent_mod.ready_agent(node_core, real_cluster, image=agent_image)

        try:
            # This machine lets nobody, root included, open /proc/1/ns/net; Istio's agent
            # reaches the node's namespace that way unless it runs in it (ours always does).
            ambient = {"enabled": True, "dnsCapture": dns}
            istio_agent.install(
                helm,
                real_cluster,
                node_core,
                istio_image,
                repair={"enabled": False},
                ambient={**ambient, "shareHostNetworkNamespace": True},
                **istio_values,
            )
            theirs, their_stream = ambient_outcomes(
                node_core, real_cluster, workload_ns, image, "istio", listing, zds(restart_istio)
            )
            istio_agent.uninstall(helm, node_core)
            real_cluster.conflist_path.write_bytes(before)
            ZDS_SOCKET.unlink(missing_ok=True)
            agent_mod.install(
                helm,
                real_cluster,
                node_core,
                agent_image,
                ambient={**ambient, "ztunnelSocketPath": str(ZDS_SOCKET)},
                **our_values,
            )
            ours, our_stream = ambient_outcomes(
                node_core, real_cluster, workload_ns, image, "ours", listing, zds(restart_ours)
            )
            agent_mod.uninstall(helm, node_core)
        finally:
            ZDS_SOCKET.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                ZDS_SOCKET.parent.rmdir()

    print(json.dumps({n: o.splitlines()[0] for n, o in theirs.items()}))
    assert theirs["plain"].startswith("redirection=enabled ztunnel=True"), theirs["plain"]
    assert "istio" in theirs["plain"].split("\n", 1)[1].lower(), (
        "no in-pod rules from Istio's agent"
    )
    failures = []
    for name in AMBIENT_PODS:
        if theirs[name] != ours[name]:
            failures.append(f"pod {name}:\n" + istio_vs_ours(theirs[name], ours[name]))
    assert not failures, "\n".join(failures)
    assert real_cluster.conflist_path.read_bytes() == before
    if scenario is not None:
        print("Istio's agent's ZDS stream:", *their_stream, sep="\n")
        assert_same_streams(their_stream, our_stream)


def assert_same_streams(theirs: list[str], ours: list[str]) -> None:
    """Istio's stream and ours line for line, but for the allowed differences."""
    assert any(line.startswith("  add ") for line in theirs), "Istio's agent added no pod"
    matcher = difflib.SequenceMatcher(a=theirs, b=ours, autojunk=False)
    unexplained = []
    for op, a0, a1, b0, b1 in matcher.get_opcodes():
        if op == "equal":
            continue
        only_theirs, only_ours = theirs[a0:a1], ours[b0:b1]
        for k in range(max(len(only_theirs), len(only_ours))):
            pair = (
                only_theirs[k].strip() if k < len(only_theirs) else "",
                only_ours[k].strip() if k < len(only_ours) else "",
            )
            if not allowed(*pair):
                unexplained.append(pair)
    assert not unexplained, (
        "the ZDS streams differ (Istio's, ours):\n"
        + "\n".join(f"  {t!r}\n  {o!r}" for t, o in unexplained)
        + "\n"
        + istio_vs_ours("\n".join(theirs), "\n".join(ours))
    )


def allowed(theirs: str, ours: str) -> bool:
    def pod(line: str) -> str:
        return line.split()[1] if len(line.split()) > 1 else ""

    if theirs and ours and pod(theirs) != pod(ours):
        return False
    return any(
        re.fullmatch(t, theirs) and re.fullmatch(o, ours)
        for t, o in ALLOWED_ZDS_DIFFERENCES.values()
    )
