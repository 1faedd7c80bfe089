"""The ZDS part of the ambient differential (tests/node/test_istio_node_agent.py): seeded random
ambient pods (tests/differential/ambient_pods.py) started under one agent with the ztunnel
double connected, then faults, each applied the same way whichever agent runs: the terminating
pods deleted (kept terminating), ztunnel restarted, the agent's pod killed (the double
reconnects to its successor), one pod's sandbox killed (kubelet makes a new one), a new pod's
enrollment failing after ztunnel took it (tests/node/zds_faults.py: the host probe set full for
one pod, the `enabled` annotation refused for another, each lifted once the pod's sandbox
failed), every pod deleted. After each step, once the stream is quiet, its new part normalized
(ambient_pods.normalized) under a `== step` line."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from testbed import kubepods
from testbed.containerd import Containerd
from testbed.realnode import RealCluster
from testbed.ztunnel_double import ZtunnelDouble
from tests.differential.ambient_pods import (
    NAMESPACES,
    SERVICE_ACCOUNTS,
    AmbientPod,
    manifest,
    normalized,
)
from tests.node.zds_faults import (
    FAULT_LABEL,
    IPSET_ERR_HASH_FULL,
    REDIRECTION,
    REFUSAL,
    annotation_refused,
    probe_set,
    probe_set_full,
)

QUIET = 2.0
"""Seconds without a new message: the agent is done with the step."""
SETTLE_TIMEOUT = 180.0


def netns_namer(
    cluster: RealCluster, sandboxes: SandboxNetns | None = None
) -> Callable[[int], str]:
    """fd -> the name of the runtime's netns file of that namespace ("" if none is); with
    `sandboxes`, the sandbox its address belongs to is noted as it comes (SandboxNetns)."""

    def name(fd: int) -> str:
        inode = os.fstat(fd).st_ino
        for path in cluster.netns_dir.iterdir():
            try:
                if path.stat().st_ino == inode:
                    if sandboxes is not None:
                        sandboxes.note_address(path.name, fd)
                    return path.name
            except OSError:
                continue
        return ""

    return name


FAILED_SANDBOX = re.compile(r'failed to setup network for sandbox "([0-9a-f]+)"')


@dataclass
class SandboxNetns:
    """netns file name -> uid of the pod whose sandbox it is: from containerd's sandbox
    containers, which outlive their sandbox while kubelet keeps them; and, for a sandbox whose
    CNI ADD failed (containerd makes its container only after the ADD), from the sandbox that
    host-local gave the namespace's address to (`ipam_dir`, read while the ADD runs: the agent
    waits for ztunnel's ack) and kubelet's FailedCreatePodSandBox Event naming that sandbox."""

    cri: Containerd
    ipam_dir: Path | None = None
    owners: dict[str, str] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    addressed: dict[str, str] = field(default_factory=dict)
    """netns name -> id of the sandbox its eth0 address was allocated to."""
    failed: dict[str, str] = field(default_factory=dict)
    """sandbox id -> uid of the pod whose sandbox it was (its ADD failed)."""

    def refresh(self) -> None:
        kind = 'labels."io.cri-containerd.kind"==sandbox'
        for sandbox in set(self.cri.ctr("containers", "ls", "-q", kind).stdout.split()) - self.seen:
            done = self.cri.ctr("containers", "info", sandbox, check=False)
            if done.returncode != 0:
                continue  # removed since it was listed (kubelet's garbage collection)
            info = json.loads(done.stdout)
            self.seen.add(sandbox)
            for ns in info["Spec"]["linux"].get("namespaces", []):
                if ns["type"] == "network" and ns.get("path"):
                    self.owners[Path(ns["path"]).name] = info["Labels"]["io.kubernetes.pod.uid"]

    def note_address(self, name: str, fd: int) -> None:
        """Which sandbox host-local allocated the eth0 address of the netns at `fd` to."""
        if self.ipam_dir is None or name in self.addressed:
            return
        shown = subprocess.run(
            ["nsenter", f"--net=/proc/{os.getpid()}/fd/{fd}", "ip", "-4", "-o", "addr", "show"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        for address in re.findall(r"\binet (\S+)/", shown):
            with contextlib.suppress(OSError):
                allocation = (self.ipam_dir / address).read_text().split()
                if allocation:
                    self.addressed[name] = allocation[0]

    def note_failures(self, core: Any, namespaces: Iterable[str]) -> None:
        for namespace in namespaces:
            found = core.list_namespaced_event(
                namespace, field_selector="reason=FailedCreatePodSandBox"
            )
            for event in found.items:
                for sandbox in FAILED_SANDBOX.findall(event.message or ""):
                    self.failed[sandbox] = event.involved_object.uid

    def owner(self, name: str) -> str | None:
        return self.owners.get(name) or self.failed.get(self.addressed.get(name, ""))


@dataclass
class Scenario:
    """The pods and namespaces, the same for both agents (so names match between runs)."""

    core: Any
    cluster: RealCluster
    image: str
    namespaces: dict[str, str]
    """key (ambient_pods.NAMESPACES) -> the namespace made for it."""
    pods: list[AmbientPod]

    def prepare(self) -> None:
        """Each namespace's labels and service accounts."""
        for key, namespace in self.namespaces.items():
            labels = NAMESPACES[key]
            if labels:
                self.core.patch_namespace(namespace, {"metadata": {"labels": labels}})
            for account in SERVICE_ACCOUNTS:
                if account != "default":
                    body = {"metadata": {"name": account}, "automountServiceAccountToken": False}
                    self.core.create_namespaced_service_account(namespace, body)

    def run(self, ztunnel: ZtunnelDouble, restart_agent: Callable[[], None]) -> list[str]:
        lines: list[str] = []
        pod_of: dict[str, str] = {}
        keys = {ns: key for key, ns in self.namespaces.items()}
        sandboxes = SandboxNetns(self.cluster.cri, self.cluster.ipam_dir)  # type: ignore[arg-type]
        ztunnel.netns_name = netns_namer(self.cluster, sandboxes)
        mark = 0
        quiet(ztunnel)  # the messages about pods from before
        start = len(ztunnel.stream)

        def step(title: str, outcome: Callable[[], list[str]] = list) -> None:
            """`outcome`: lines of what the step left, read once the stream is quiet."""
            nonlocal start, mark
            mark = len(lines)
            quiet(ztunnel)
            pod_of.update(self.uids())
            sandboxes.refresh()
            sandboxes.note_failures(self.core, self.namespaces.values())
            end = len(ztunnel.stream)
            lines.append(f"== {title}")
            lines.extend(normalized(ztunnel.stream[start:end], pod_of, keys, sandboxes.owner))
            lines.extend(outcome())
            start = end
            print(*lines[mark:], sep="\n")  # shown when the test fails, the double's checks too

        self.create_all()
        step("pods created")
        for pod in self.of_kind("terminating"):
            self.core.delete_namespaced_pod(pod.name, self.namespaces[pod.namespace])
        step("terminating pods deleted (kept terminating)")
        snapshots = ztunnel.snapshots
        ztunnel.restart()
        ztunnel.wait_for("a snapshot after the restart", lambda z: z.snapshots > snapshots, 30)
        step("ztunnel restarted")
        snapshots = ztunnel.snapshots
        restart_agent()
        reconnect(ztunnel)
        ztunnel.wait_for("the new agent's snapshot", lambda z: z.snapshots > snapshots, 30)
        step("the agent's pod killed, its successor Ready")
        self.recreate_sandbox()
        step("a sandbox killed, kubelet made a new one")
        began = time.monotonic()
        faulted = self.failed_enrollments()
        step(
            "a pod's probe IP refused (the set full), another's annotation refused; lifted",
            lambda: [self.outcome(pod) for pod in faulted],
        )
        print(f"the enrollment faults took {time.monotonic() - began:.1f}s")
        for namespace in self.namespaces.values():
            self.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        self.wait_gone()
        step("every pod deleted")
        return lines

    def of_kind(self, kind: str) -> list[AmbientPod]:
        return [p for p in self.pods if p.kind == kind]

    def uids(self) -> dict[str, str]:
        out = {}
        for namespace in self.namespaces.values():
            for pod in self.core.list_namespaced_pod(namespace).items:
                out[pod.metadata.uid] = f"{namespace}/{pod.metadata.name}"
        return out

    def create_all(self) -> None:
        """Every pod at once, then each Running (or Succeeded: the completed ones)."""
        app = [*kubepods.APP, "sleep"]

        def create(pod: AmbientPod) -> None:
            body = manifest(pod, self.image, app, kubepods.PROXY)
            self.core.create_namespaced_pod(self.namespaces[pod.namespace], body)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, self.pods))
        want = {p.name: "Succeeded" if p.kind == "completed" else "Running" for p in self.pods}
        phases: dict[str, str] = {}

        def settled() -> bool:
            for namespace in self.namespaces.values():
                for pod in self.core.list_namespaced_pod(namespace).items:
                    phases[pod.metadata.name] = pod.status.phase
            return all(phases.get(name) == phase for name, phase in want.items())

        kubepods.wait_for(
            settled,
            f"{len(self.pods)} pods Running (the completed ones Succeeded)",
            SETTLE_TIMEOUT,
            interval=1.0,
            on_timeout=lambda: "\n".join(
                f"{n}: {phases.get(n)}, want {w}" for n, w in want.items() if phases.get(n) != w
            ),
        )

    def failed_enrollments(self) -> list[AmbientPod]:
        """Two pods, each created while a step of its enrollment after ztunnel's (the probe
        set, then the annotation) fails; each fault lifted once the pod's first sandbox failed,
        the second fault applied meanwhile (kubelet retries a sandbox some 10 s later)."""
        full = AmbientPod("f1-probe-set-full", "mesh-a", "default", "plain")
        refused = AmbientPod("f2-annotation-refused", "mesh-a", "default", "plain")
        namespace = self.namespaces["mesh-a"]
        admission = k8s.AdmissionregistrationV1Api(self.core.api_client)
        with probe_set_full(self.cluster.network.netns_path):
            self.create(full)
            self.wait_sandbox_failed(full, str(IPSET_ERR_HASH_FULL))
        with annotation_refused(admission, self.core, namespace, self.image):
            self.create(refused, FAULT_LABEL)
            self.wait_sandbox_failed(refused, REFUSAL)
        for pod in (full, refused):
            kubepods.wait_running(self.core, namespace, pod.name, SETTLE_TIMEOUT, ready=False)
        return [full, refused]

    def create(self, pod: AmbientPod, labels: dict[str, str] | None = None) -> None:
        body = manifest(pod, self.image, [*kubepods.APP, "sleep"], kubepods.PROXY)
        body["metadata"]["labels"].update(labels or {})
        self.core.create_namespaced_pod(self.namespaces[pod.namespace], body)

    def wait_sandbox_failed(self, pod: AmbientPod, cause: str) -> None:
        """Until kubelet reports the pod's sandbox failed (the Event of this pod: the names are
        the same under both agents, and Events outlive pods), naming `cause`: the fault, not
        something else, failed it."""
        namespace = self.namespaces[pod.namespace]
        uid = self.core.read_namespaced_pod(pod.name, namespace).metadata.uid
        selector = f"involvedObject.uid={uid},reason=FailedCreatePodSandBox"
        events = kubepods.wait_for(
            lambda: self.core.list_namespaced_event(namespace, field_selector=selector).items,
            f"{namespace}/{pod.name}'s sandbox failed",
            60,
            interval=0.2,
        )
        print(f"{pod.name}: {events[0].message}")
        assert cause in events[0].message, f"{pod.name}'s sandbox failed, not for {cause!r}"

    def outcome(self, pod: AmbientPod) -> str:
        """`  state <pod> redirection=<annotation> probe-set=<yes|no>`: what the agent left."""
        found = self.core.read_namespaced_pod(pod.name, self.namespaces[pod.namespace])
        redirection = (found.metadata.annotations or {}).get(REDIRECTION, "-")
        held = probe_set(self.cluster.network.netns_path).get(found.status.pod_ip)
        in_set = "yes" if held == found.metadata.uid else "no" if held is None else "other pod"
        return f"  state {pod.namespace}/{pod.name} redirection={redirection} probe-set={in_set}"

    def recreate_sandbox(self) -> None:
        """Kill the sandbox (pause) process of the first plain pod in an ambient namespace:
        kubelet tears the sandbox down and makes a new one, with a new netns."""
        pod = next(p for p in self.of_kind("plain") if NAMESPACES[p.namespace])
        namespace = self.namespaces[pod.namespace]
        uid = self.core.read_namespaced_pod(pod.name, namespace).metadata.uid
        pid = self.cluster.cri.sandbox_pid(uid)
        assert pid is not None, f"no sandbox of {namespace}/{pod.name}"
        os.kill(pid, signal.SIGKILL)

        def renewed() -> bool:
            view = kubepods.pod_view(self.core, namespace, pod.name)
            new = self.cluster.cri.sandbox_pid(uid)
            return bool(view and view.phase == "Running" and new not in (None, pid))

        kubepods.wait_for(renewed, f"{namespace}/{pod.name} in a new sandbox", 90, interval=0.5)

    def wait_gone(self) -> None:
        kubepods.wait_for(
            lambda: (
                not any(self.core.list_namespaced_pod(ns).items for ns in self.namespaces.values())
            ),
            "the scenario's pods to be gone",
            120,
        )


def quiet(ztunnel: ZtunnelDouble, timeout: float = 60.0) -> None:
    """Until QUIET seconds pass without a new message."""
    deadline = time.monotonic() + timeout
    seen = -1
    while len(ztunnel.stream) != seen:
        assert time.monotonic() < deadline, "the agent's ZDS stream never went quiet"
        seen = len(ztunnel.stream)
        time.sleep(QUIET)


def reconnect(ztunnel: ZtunnelDouble, timeout: float = 60.0) -> None:
    """Connect to the agent's new socket once it accepts (ztunnel retries the same way)."""
    ztunnel.wait_disconnected(30)
    deadline = time.monotonic() + timeout
    while True:
        try:
            ztunnel.connect()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def kill_pods(core: Any, namespace: str, selector: str) -> None:
    """Delete the agent's pods at once (grace 0), and wait until they are gone."""
    names = [
        p.metadata.name for p in core.list_namespaced_pod(namespace, label_selector=selector).items
    ]
    for name in names:
        try:
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        except ApiException as e:
            if e.status != 404:
                raise
    kubepods.wait_for(
        lambda: (
            not {
                p.metadata.name
                for p in core.list_namespaced_pod(namespace, label_selector=selector).items
            }
            & set(names)
        ),
        f"the agent pods {names} gone",
        90,
    )
