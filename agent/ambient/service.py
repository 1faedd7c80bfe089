"""AmbientService: the ambient half of the agent as one lifecycle service (Istio's nodeagent
Server.Start / Stop):

    start: namespace cache ─► (pod and namespace caches synced) ─► reconcile the pods claimed
           enrolled or selected (netns found by identity; enrolled when it holds our rules; host
           probe set synced, rules re-checked) ─► ZDS server ─► watch
    stop:  watch, namespace cache, ZDS server; pods stay enrolled (a restart keeps them captured)
    uninstall: also the node-side probe rules and address set (Istio's Stop without skipCleanup)

Start-up runs in its own thread: the caches may take a while, and the other services (the CNI
server among them) must not wait for it; readiness waits for it instead. It has a heartbeat
(agent.liveness, `ambient-start`): beaten at each wait for the caches and at each step of the
reconcile (one pod, the netns scan, the host rules), so a start-up busy with many pods stays
live while one stuck in a step past START_HEARTBEAT fails /healthz naming it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping
from typing import Any

from agent.ambient.dataplane import ZtunnelLink
from agent.ambient.enrollment import (
    is_terminated,
    is_ztunnel_pod,
    redirection_state,
    should_enroll,
)
from agent.ambient.mesh import (
    MeshDataplane,
    ReconcileReport,
)
from agent.ambient.watch import AmbientWatch
from agent.background import BackgroundLoop
from agent.config import AmbientSettings
from agent.liveness import LIVENESS, Liveness
from agent.netns import COMMAND_TIMEOUT_SECONDS

log = logging.getLogger(__name__)

STEP_PROGRAMS = 16
"""The most programs one reconcile step runs one after another: a pod's rules read (the rule
tables and `ip rule`/`ip route` for each family) and, with reconcileIptablesOnStartup, read again
and written (agent.ambient.reconcile); the host rules' steps run fewer."""
START_HEARTBEAT = STEP_PROGRAMS * COMMAND_TIMEOUT_SECONDS + 60.0
"""The start-up task's heartbeat bound: one step's programs, each within its timeout, and a
minute for the rest (a netns scan of the node's processes, the caches' reads)."""


class AmbientService:
    """start/stop/ready/uninstall for the lifecycle."""

    def __init__(
        self,
        *,
        settings: AmbientSettings,
        pods: Any,
        namespaces: Any,
        mesh: MeshDataplane,
        ztunnel: ZtunnelLink,
        watch: AmbientWatch,
        start_pod_cache: bool = False,
        exclude_namespaces: Collection[str] = (),
        liveness: Liveness = LIVENESS,
        heartbeat: float = START_HEARTBEAT,
    ) -> None:
        """`pods` is the node's pod cache (started by the pod service unless
        `start_pod_cache`); `namespaces` the namespace cache, started here; `liveness`: where
        the start-up task is judged, `heartbeat` its bound."""
        self._settings = settings
        self._pods = pods
        self._namespaces = namespaces
        self.mesh = mesh
        self._ztunnel = ztunnel
        self.watch = watch
        self._start_pod_cache = start_pod_cache
        self._exclude = tuple(exclude_namespaces)
        self._started = threading.Event()
        self._loop = BackgroundLoop(
            "ambient-start",
            self._start_up,
            one_shot=True,
            liveness=liveness,
            heartbeat=heartbeat,
        )
        self.reconciled: ReconcileReport | None = None
        pods.add_listener(watch.on_pod)
        namespaces.add_listener(watch.on_namespace)

    def start(self) -> None:
        if self._start_pod_cache:
            self._pods.start()
        self._loop.start()

    def _start_up(self) -> None:
        if not self._wait_for(self._pods.ready):
            return
        # The namespace cache's first list enqueues every pod: the watch must find them cached.
        self._namespaces.start()
        if not self._wait_for(self._namespaces.ready):
            return
        candidates = [p for p in self._pods.list_pods() if self._checked_candidate(p)]
        try:
            self.reconciled = self.mesh.reconcile(
                candidates,
                reapply_rules=self._settings.reconcileIptablesOnStartup,
                beat=self._loop.beat,
            )
        except Exception:  # Istio goes on: pods are re-examined by the watch
            log.exception("ambient reconcile on start-up failed")
        if self._loop.stopping.is_set():
            return
        self._ztunnel.start()
        self.watch.start()
        self._started.set()
        log.info("ambient ready", extra={"fields": {"socket": self._settings.ztunnelSocketPath}})

    def _checked_candidate(self, pod: Mapping[str, Any]) -> bool:
        """One pod's failure cannot stop start-up: a pod that cannot be judged is a candidate
        (fail closed: reconcile keeps it enrolled exactly when its netns holds our rules)."""
        try:
            return self._candidate(pod)
        except Exception as e:
            log.error(
                "cannot tell whether the pod may be enrolled; reconciled as if it were",
                exc_info=e,
                extra={"fields": {"pod": _ref(pod)}},
            )
            return True

    def _candidate(self, pod: Mapping[str, Any]) -> bool:
        """May have been enrolled by a previous agent: claimed so (Istio's
        GetActiveAmbientPodSnapshot reads the annotation), or selected now. Which of them
        are enrolled, the node tells (mesh.reconcile)."""
        amb = self._settings
        if is_terminated(pod) or is_ztunnel_pod(pod, amb.systemNamespace):
            return False
        if redirection_state(pod) != "none":
            return True
        ns = str((pod.get("metadata") or {}).get("namespace") or "")
        return should_enroll(
            pod,
            self._namespaces.cached_namespace(ns),
            amb.enablementSelectors,
            exclude_namespaces=self._exclude,
            system_namespace=amb.systemNamespace,
        ).enroll

    def _wait_for(self, ready: Callable[[], bool]) -> bool:
        while not ready():
            self._loop.beat()
            if self._loop.stopping.wait(0.1):
                return False
        self._loop.beat()
        return True

    def stop(self) -> None:
        self._loop.stop()
        if self._started.is_set():
            self.watch.stop()
            self._ztunnel.stop()
            self._started.clear()
        self._namespaces.stop()
        if self._start_pod_cache:
            self._pods.stop()

    def ready(self) -> bool:
        """Started up, and the ZDS server is listening on ztunnel's socket."""
        return self._started.is_set() and self._ztunnel.ready()

    def uninstall(self) -> None:
        """The agent is going away for good: remove the node-side rules and address set."""
        self.mesh.remove_host_rules()


def _ref(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    return f"{meta.get('namespace')}/{meta.get('name')}"
