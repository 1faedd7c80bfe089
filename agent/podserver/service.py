"""PodService: the pod cache and the plugin's socket server, started and stopped together."""

from __future__ import annotations

import logging
from collections.abc import Callable

from agent.config import Settings
from agent.kube import KubeClients, api
from agent.pods.pod_cache import PodCache
from agent.pods.slim import PodFields
from agent.pods.states import PodStates
from agent.podserver.handlers import Ambient, EventSink, PodHandlers, Redirector
from agent.podserver.metrics import PluginMetrics, default_metrics
from agent.podserver.sandboxes import SandboxStore
from agent.podserver.server import PodServer, work_bound
from agent.rules.sidecar.redirector import RulesRedirector

log = logging.getLogger(__name__)


class PodService:
    """Serves the plugin's requests for pods on `node_name` (start/stop/ready for the lifecycle)."""

    def __init__(
        self,
        settings: Settings,
        node_name: str,
        kube_client_factory: Callable[[], KubeClients],
        install_ready: Callable[[], bool],
        *,
        redirector: Redirector | None = None,
        metrics: PluginMetrics | None = None,
        cache: PodCache | None = None,
        ambient: Ambient | None = None,
        sandboxes: SandboxStore | None = None,
        on_add_netns: Callable[[str], None] | None = None,
        states: PodStates | None = None,
        events: EventSink | None = None,
        ztunnel_seconds: float = 0.0,
    ) -> None:
        """`redirector`, `metrics` and `cache` default to the real ones; tests pass their own.
        `ambient` (ambient mode on) enrolls the pods ambient selects on CNI ADD. `sandboxes`:
        where each ADD's pod UID and netns are kept (shared with whoever finds pods' netns).
        `on_add_netns`: sees each ADD's netns path (the readiness check of cniNetnsDir).
        `states`, `events`: each ADD's outcome noted, a refusal's Event (PodHandlers).
        `ztunnel_seconds`: how long an ambient ADD waits for ztunnel's ack (its workers' bound).

        The clients from `kube_client_factory` are not closed here: they may be shared.
        """
        self._install_ready = install_ready
        self.sandboxes = sandboxes if sandboxes is not None else SandboxStore()
        """The sandboxes of the ADDs answered: pod UID -> the netns the runtime named."""
        self.pods = cache or PodCache(
            kube_client_factory().core,
            node_name,
            fields=PodFields.of(settings),
            timeouts=api.Timeouts(settings.kubeApi),
        )
        """The node's pod cache; repair and ambient read it too (what they read of a pod, the
        settings say: PodFields)."""
        if states is not None:
            self.pods.add_listener(states.on_pod)  # a deleted pod's outcomes go with it
        if redirector is None:
            redirector = RulesRedirector(
                exclude_namespaces=settings.excludeNamespaces, backend=settings.ruleBackend
            )
        self.metrics = metrics or default_metrics()
        """The requests' metrics, with the recent ADDs' durations `istio-cni-agent status` shows."""
        self.handlers = PodHandlers(
            pods=self.pods,
            redirector=redirector,
            sandboxes=self.sandboxes,
            readiness=self.not_ready_reason,
            metrics=self.metrics,
            ambient=ambient,
            on_add_netns=on_add_netns,
            states=states,
            events=events,
        )
        bound = work_bound(api.Timeouts(settings.kubeApi), ztunnel_seconds)
        self._server = PodServer(settings.socket_path, self.handlers, work_bound=bound)

    def start(self) -> None:
        # The cache first: requests before its first list fall back to a GET.
        self.pods.start()
        try:
            self._server.start()
        except BaseException:
            self.pods.stop()
            raise

    def stop(self) -> None:
        self._server.stop()
        self.pods.stop()

    def ready(self) -> bool:
        # /readyz: the plugin's requests are answered. An API server that is slow to list does
        # not make the agent unready: lookups fall back to a GET, and a failure there is a
        # retryable CNI error (the plugin's STATUS reports the cache state instead).
        return self._server.listening()

    def not_ready_reason(self) -> str | None:
        """None when the plugin may be told the agent is ready (GET /v1/status), else why not."""
        if not self._install_ready():
            return "CNI plugin and its config entry are not installed yet"
        if not self.pods.ready():
            return "pod cache has not listed this node's pods yet"
        return None
