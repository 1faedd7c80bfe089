"""Meshed pods created on the real node every second (or every `interval`) while something
changes under them (the CNI agent is replaced, upgraded, restarted): each pod, once Running, is
checked to hold Istio's rules in its network namespace (it started captured) and then deleted,
so the node holds a few churn pods at a time however long the change takes.

    with Churn(core, cluster, namespace, image) as churn:
        ...                        # the change
    churn.report                   # every pod's outcome, once all were Running (or timed out)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from testbed import kubepods, podnet

INTERVAL = 1.0
"""One new pod a second."""
SETTLE_TIMEOUT = 180.0
"""How long the pods created last may take to run once creating stops."""
PHASE_CONDITIONS = {"PodScheduled": "scheduled", "PodReadyToStartContainers": "sandbox"}
"""The pod conditions that split a start: bound by the scheduler, then kubelet's sandbox made
with its network set up by the CNI chain (ours in it), then the containers."""


@dataclass
class ChurnPod:
    name: str
    created: float
    running: float | None = None
    captured: bool | None = None
    node: str | None = None
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds from the pod's creation to each PHASE_CONDITIONS condition turning True, as the
    API server stamps them (whole seconds), read when it is first seen Running: where a slow
    start went."""


@dataclass
class ChurnReport:
    pods: list[ChurnPod] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def uncaptured(self) -> list[str]:
        return [p.name for p in self.pods if p.captured is False]

    @property
    def never_ran(self) -> list[str]:
        return [p.name for p in self.pods if p.running is None]

    def created_between(self, start: float, end: float) -> list[ChurnPod]:
        return [p for p in self.pods if start <= p.created < end]

    def summary(self) -> str:
        waits = sorted(p.running - p.created for p in self.pods if p.running is not None)
        longest = f"{waits[-1]:.1f}s" if waits else "-"
        return (
            f"{len(self.pods)} churn pods: {len(waits)} ran, {len(self.uncaptured)} uncaptured, "
            f"{len(self.never_ran)} never ran; longest create-to-Running {longest}"
        )


def start_phases(item: Any) -> dict[str, float]:
    """A pod's PHASE_CONDITIONS that are True, as seconds after its creation timestamp."""
    created = item.metadata.creation_timestamp
    found = {}
    for condition in item.status.conditions or []:
        phase = PHASE_CONDITIONS.get(condition.type)
        if phase and condition.status == "True" and created and condition.last_transition_time:
            found[phase] = (condition.last_transition_time - created).total_seconds()
    return found


class PodNetns(Protocol):
    """Where a pod's netns is: a RealCluster, or several nodes (testbed/nodes.py)."""

    def pod_netns(self, pod_uid: str) -> str: ...


class Churn:
    """A creator thread (one pod a second, sidecar by default) and a checker thread (each
    Running pod's capture checked, then the pod deleted). With `nodes`, the pods go to those
    nodes in turn (a nodeSelector on the hostname label: the scheduler still checks taints and
    cordons)."""

    def __init__(
        self,
        core: Any,
        cluster: PodNetns,
        namespace: str,
        image: str,
        nodes: Sequence[str] = (),
        interval: float = INTERVAL,
        settle_timeout: float = SETTLE_TIMEOUT,
        init_containers: Sequence[dict[str, Any]] = (),
        *,
        prefix: str = "churn",
        sidecar: bool = True,
        app_command: Sequence[str] = ("sleep",),
        captured: Callable[[Any], bool | None] | None = None,
        proxy_image: str | None = None,
        node_app_command: Callable[[str], Sequence[str]] | None = None,
    ) -> None:
        """`init_containers`: before each pod's app (istio-validation, as Istio injects it).
        `captured`: the API's Running pod -> is its traffic captured, None while it cannot
        tell yet (asked again next round, the pod kept); by default Istio's rules read in its
        netns. Pods are named `prefix`-N."""
        self.core = core
        self.init_containers = list(init_containers)
        self.prefix = prefix
        self.sidecar = sidecar
        self.app_command = list(app_command)
        self.proxy_image = proxy_image
        self.node_app_command = node_app_command
        self.captured = captured or self._has_istio_rules
        self.interval = interval
        self.settle_timeout = settle_timeout
        self.cluster = cluster
        self.namespace = namespace
        self.image = image
        self.nodes = list(nodes)
        self.report = ChurnReport()
        self._by_name: dict[str, ChurnPod] = {}
        self._lock = threading.Lock()
        self._creating = threading.Event()
        self._checking = threading.Event()
        self._threads = [
            threading.Thread(target=self._create_loop, name="churn-create", daemon=True),
            threading.Thread(target=self._check_loop, name="churn-check", daemon=True),
        ]

    def __enter__(self) -> Churn:
        self._creating.set()
        self._checking.set()
        for t in self._threads:
            t.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._creating.clear()
        self._threads[0].join()
        try:
            if exc is None:
                kubepods.wait_for(
                    self._all_ran,
                    "every churn pod to run",
                    self.settle_timeout,
                    on_timeout=self._stuck,
                )
        finally:  # the checker stops even when some pod never ran
            self._checking.clear()
            self._threads[1].join()

    def _all_ran(self) -> bool:
        with self._lock:
            return all(p.captured is not None for p in self._by_name.values())

    def _stuck(self) -> str:
        with self._lock:
            stuck = [p.name for p in self._by_name.values() if p.captured is None]
        hints = [f"{n}:\n{kubepods.pod_events(self.core, self.namespace, n)}" for n in stuck[:3]]
        return f"{len(stuck)} churn pods never ran: {stuck}\n" + "\n".join(hints)

    def _create_loop(self) -> None:
        index = 0
        while self._creating.is_set():
            began = time.monotonic()
            name = f"{self.prefix}-{index}"
            node = self.nodes[index % len(self.nodes)] if self.nodes else None
            command = self.app_command
            if node is not None and self.node_app_command is not None:
                command = list(self.node_app_command(node))
            manifest = kubepods.pod_manifest(
                name, self.image, app_command=command, sidecar=self.sidecar,
                init_containers=self.init_containers or None, proxy_image=self.proxy_image,
            )  # fmt: skip
            if node is not None:
                manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
            try:
                self.core.create_namespaced_pod(self.namespace, manifest)
            except ApiException as e:
                self.report.errors.append(f"create {name}: {e.status} {e.reason}")
            except Exception as e:  # the API server unreachable: the next pod is tried
                self.report.errors.append(f"create {name}: {type(e).__name__}: {e}")
            else:
                pod = ChurnPod(name, time.monotonic(), node=node)
                with self._lock:
                    self._by_name[name] = pod
                    self.report.pods.append(pod)
            index += 1
            time.sleep(max(0.0, self.interval - (time.monotonic() - began)))

    def _check_loop(self) -> None:
        while self._checking.is_set():
            try:
                self._check_once()
            except Exception as e:  # a failed round is reported; the next one runs
                self.report.errors.append(f"check: {type(e).__name__}: {e}")
            time.sleep(0.3)

    def _check_once(self) -> None:
        for item in self.core.list_namespaced_pod(self.namespace).items:
            with self._lock:
                pod = self._by_name.get(item.metadata.name)
            if pod is None or pod.captured is not None or item.status.phase != "Running":
                continue
            seen = time.monotonic()
            captured = self.captured(item)
            pod.node = item.spec.node_name
            if pod.running is None:
                pod.running = seen
                pod.phases = start_phases(item)
            if captured is None:
                continue
            pod.captured = captured
            self.core.delete_namespaced_pod(pod.name, self.namespace, grace_period_seconds=0)

    def _has_istio_rules(self, item: Any) -> bool:
        return podnet.has_istio_rules(self.cluster.pod_netns(item.metadata.uid))
