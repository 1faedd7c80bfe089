"""The agent's services, built from the settings: the one module that knows every feature.

Started in this order and stopped in reverse: the install watcher, the pod service (the CNI
server and the node's pod cache), ambient (when on), repair (when on), readiness, /healthz
/readyz /metrics, the node taint remover (when on) and the plugin-log forwarder. What each needs is
handed in here: one redirector for the pod server and repair, one netns finder that knows what
each CNI ADD named, one pod cache for the pod server, ambient's watch and repair.

What a service can do besides start and stop is typed (`Uninstalls`), and the wiring lists which
services have it: the lifecycle asks the list, never the services. Readiness is its own service
(agent.readiness), handed the parts it checks here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent import metrics, plugin_log_file
from agent.ambient.enroller import AmbientEnroller
from agent.ambient.mesh import MeshDataplane, NetnsFinder, StatusAnnotator
from agent.ambient.service import AmbientService
from agent.ambient.watch import AmbientWatch
from agent.config import Settings
from agent.downward import AgentPod
from agent.http_server import HttpServer
from agent.install.conflicts import FIGHT_HEAL_INTERVAL
from agent.install.conflist import CONFIG_EXTENSIONS
from agent.install.installer import Installer
from agent.install.watcher import InstallWatcher
from agent.kube import KubeClients, api
from agent.kube.events import EventRecorder
from agent.netns.look import netns_addresses
from agent.node_taint import NodeTaintRemover
from agent.podinput.tokens import Address
from agent.podnetns.cgroup import pod_uid_of_cgroups
from agent.podnetns.finder import PodNetnsFinder
from agent.pods.namespaces import NamespaceCache
from agent.pods.pod_cache import PodCache
from agent.pods.states import PodStates
from agent.podserver.sandboxes import SandboxStore
from agent.podserver.service import PodService
from agent.readiness.build import ReadinessParts, build_readiness
from agent.repair.service import RepairService
from agent.rules.ambient.options import PodRuleOptions
from agent.rules.ambient.overrides import rule_options_for
from agent.rules.backend_pin import node_backend
from agent.rules.compare import RulesDiff
from agent.rules.footprint import ours_present
from agent.rules.sidecar.redirector import RulesRedirector
from agent.serving.node_processes import NodeProcesses
from agent.status.report import StatusReport
from agent.status.server import StatusServer, socket_path


class Service(Protocol):
    """A long-running part: start() returns once running; stop() returns once its threads ended."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Uninstalls(Protocol):
    """A service with something of its own to remove when the agent is uninstalled."""

    def uninstall(self) -> None: ...


@dataclass
class Services:
    """The services in start order, and those of them with each capability."""

    services: list[Service] = field(default_factory=list)
    uninstallers: list[Uninstalls] = field(default_factory=list)


def build_services(
    settings: Settings,
    installer: Installer,
    *,
    node_name: str,
    clients: KubeClients,
    watcher: InstallWatcher | None = None,
) -> Services:
    """The services of the agent: the install watcher (built here unless given), then the node
    services."""
    watcher = watcher or InstallWatcher(installer)
    node = node_services(settings, watcher, node_name=node_name, clients=clients)
    return Services([watcher, *node.services], node.uninstallers)


CONFLICT_EVENT = "CNIConfigConflict"


def conflict_events(events: EventRecorder, pod: AgentPod) -> Callable[[str, str, int], None]:
    """The install watcher's `on_conflict`: a Warning Event on the agent's own pod naming the
    file, the likely other writer and what to change there (see conflicts.py)."""
    involved = {
        "metadata": {"namespace": pod.pod_namespace, "name": pod.pod_name, "uid": pod.pod_uid}
    }

    def record(path: str, culprit: str, fights: int) -> None:
        events.record(
            involved,
            reason=CONFLICT_EVENT,
            message=(
                f"{os.path.basename(path)} lost istio-cni's "
                f"{'entry' if path.endswith(CONFIG_EXTENSIONS) else 'plugin build'} {fights} "
                f"times in the last minute: another writer keeps rewriting it, likely "
                f"{culprit}. The agent puts it back, at most once every {FIGHT_HEAL_INTERVAL} s "
                "while this lasts; stop the other writer rewriting the file"
            ),
        )

    return record


def node_services(
    settings: Settings, watcher: InstallWatcher, *, node_name: str, clients: KubeClients
) -> Services:
    """Every service after the watcher: built from `settings`, rebuilt on a config change."""
    # One redirector: the pod server and repair decide and program pods the same way.
    redirector = RulesRedirector(
        exclude_namespaces=settings.excludeNamespaces, backend=settings.ruleBackend
    )
    # Pods' netns by identity: the runtime's word at ADD, else the pod's processes' cgroups.
    sandboxes = SandboxStore()
    find_netns = PodNetnsFinder(
        proc_dir=settings.hostProcDir,
        netns_dir=settings.mountedNetnsDir,
        read_addresses=netns_addresses,
        recorded=sandboxes.netns_of,
    )
    ambient = (
        AmbientParts(settings, node_name=node_name, core=clients.core, find_netns=find_netns)
        if settings.ambient.enabled
        else None
    )
    readiness = build_readiness(
        settings, watcher, redirector, node_name=node_name, core=clients.core
    )
    states = PodStates()  # what each ADD and repair did, for `istio-cni-agent status`
    timeouts = api.Timeouts(settings.kubeApi)
    events = EventRecorder(clients.core, node_name=node_name, timeouts=timeouts)
    watcher.on_conflict = conflict_events(events, AgentPod.from_env())
    pods = PodService(
        settings,
        node_name,
        lambda: clients,
        install_ready=watcher.ready,
        redirector=redirector,
        ambient=ambient.enroller if ambient else None,
        sandboxes=sandboxes,
        on_add_netns=readiness.netns_dir.saw_add,
        states=states,
        events=events,
        ztunnel_seconds=ambient.ztunnel.request_timeout if ambient else 0.0,
    )
    built = Services([events, pods])
    readiness.watch_pods(pods)
    if ambient is not None:
        # After the pod service (its pod cache feeds the watch); ready once ZDS listens.
        zds = ambient.service(pods.pods)
        built.services.append(zds)
        built.uninstallers.append(zds)  # the node-side probe rules and address set
        readiness.watch_ambient(zds, settings.ambient.ztunnelSocketPath)
    if settings.repair.enabled:
        built.services.append(
            _repair_service(settings, node_name, pods, clients, redirector, find_netns, states)
        )
    built.services.append(
        _status_server(settings, node_name, pods, redirector, find_netns, states, ambient)
    )
    built.services += _readiness_and_after(
        settings, readiness, node_name=node_name, clients=clients
    )
    return built


def _readiness_and_after(
    settings: Settings, readiness: ReadinessParts, *, node_name: str, clients: KubeClients
) -> list[Service]:
    """Readiness (after the parts it checks: its first round runs as it starts), the HTTP
    server that reports it, the node taint that follows it, and the plugin-log forwarder."""
    services: list[Service] = [
        readiness.service(),
        HttpServer(
            port=settings.metricsPort,
            host=settings.metricsAddress,
            readiness=readiness.service().failing,
            liveness=readiness.liveness,
            # kubelet's probes told from hostNetwork pods' by the node's /proc
            node=NodeProcesses(settings.hostProcDir, pod_uid_of_cgroups),
        ),
    ]
    if settings.removeNotReadyTaint:
        # Ready as /readyz reports it: every readiness check passes.
        services.append(
            NodeTaintRemover(
                clients.core,
                node_name,
                is_ready=readiness.service().ready,
                timeouts=api.Timeouts(settings.kubeApi),
            )
        )
    services.append(plugin_log_file.Forwarding(settings.cniAgentRunDir))  # an absent agent's
    return services


def _repair_service(
    settings: Settings,
    node_name: str,
    pods: PodService,
    clients: KubeClients,
    redirector: RulesRedirector,
    find_netns: PodNetnsFinder,
    states: PodStates,
) -> RepairService:
    return RepairService(
        settings=settings,
        node_name=node_name,
        pods=pods.pods,
        core=clients.core,
        should_redirect=lambda pod: redirector.decide(pod).redirect,
        redirect=lambda pod, netns: redirector.apply(netns, pod),
        rules_in_place=lambda pod, netns: redirector.present(netns, pod),
        ours_present=ours_present,
        find_netns=find_netns,
        states=states,
    )


def _status_server(
    settings: Settings,
    node_name: str,
    pods: PodService,
    redirector: RulesRedirector,
    find_netns: PodNetnsFinder,
    states: PodStates,
    ambient: AmbientParts | None,
) -> StatusServer:
    """The read-only status socket: the pod cache, the outcomes noted, ambient's record, and a
    comparison of a pod's rules with what the pod server or ambient would program now."""

    def decide(pod: Mapping[str, Any]) -> tuple[bool, str]:
        decision = redirector.decide(pod)
        return decision.redirect, decision.reason

    def compare(pod: Mapping[str, Any], netns: str, is_ambient: bool) -> RulesDiff:
        if is_ambient and ambient is not None:
            return ambient.pod_rules.compare(netns, ambient.options_for(pod))
        return redirector.compare(netns, pod)

    report = StatusReport(
        node_name=node_name,
        pods=pods.pods,
        states=states,
        decide=decide,
        find_netns=find_netns,
        compare=compare,
        ambient_state=(lambda uid: str(ambient.mesh.state(uid))) if ambient else None,
        add_latency=pods.metrics.recent_adds.summary,
    )
    return StatusServer(socket_path(settings.cniAgentRunDir), report)


class AmbientParts:
    """The real parts of ambient mode for one node, built from the settings; `enroller` goes to
    the pod server (CNI ADD/DEL), `service(pod_cache)` into the lifecycle."""

    def __init__(
        self,
        settings: Settings,
        *,
        node_name: str,
        core: Any,
        host_netns: str = "/proc/self/ns/net",
        find_netns: NetnsFinder | None = None,
    ) -> None:
        """`find_netns`: running pods' netns by identity (default: by their processes' cgroups
        only; the lifecycle's also knows what each CNI ADD named)."""
        # Imported here: only an agent with ambient on needs them (and their kernel modules).
        from agent.ambient.zds import ZdsServer
        from agent.rules.ambient.apply import HostProbeRules, InpodRules

        amb = settings.ambient
        self.settings = settings
        timeouts = api.Timeouts(settings.kubeApi)
        self.namespaces = NamespaceCache(core, node_name, timeouts=timeouts)
        self.ztunnel = ZdsServer(amb.ztunnelSocketPath)
        base = PodRuleOptions(
            ipv6=amb.ipv6,
            redirect_dns=amb.dnsCapture,
            probe_snat=Address(amb.hostProbeSnatAddress),
            probe_snat_v6=Address(amb.hostProbeSnatAddressV6),
        )
        # Istio's ambient agent decides the variant once, in the node's namespace: pinned per boot.
        backend = node_backend(settings.ruleBackend, settings.cniAgentRunDir)
        self.pod_rules = InpodRules(backend=backend)
        self.options_for = rule_options_for(base)
        """A pod's in-pod rule options (also for `istio-cni-agent status POD`)."""
        self.mesh = MeshDataplane(
            pod_rules=self.pod_rules,
            host_rules=HostProbeRules(
                host_netns,
                ipv6=amb.ipv6,
                probe_snat=amb.hostProbeSnatAddress,
                probe_snat_v6=amb.hostProbeSnatAddressV6,
                backend=backend,
                proc_dir=settings.hostProcDir,  # nftables: kubelet's UID, from the node's /proc
            ),
            ztunnel=self.ztunnel,
            annotator=StatusAnnotator(core, timeouts),
            find_netns=find_netns
            or PodNetnsFinder(
                proc_dir=settings.hostProcDir,
                netns_dir=settings.mountedNetnsDir,
                read_addresses=netns_addresses,
            ),
            options_for=self.options_for,
        )
        self.enroller = AmbientEnroller(
            namespaces=self.namespaces,
            mesh=self.mesh,
            selectors=amb.enablementSelectors,
            exclude_namespaces=settings.excludeNamespaces,
            system_namespace=amb.systemNamespace,
            detection_retry=amb.enableAmbientDetectionRetry,
            fail_open=amb.failOpenOnDetectionError,
        )

    def service(self, pods: PodCache) -> AmbientService:
        amb = self.settings.ambient
        watch = AmbientWatch(
            pods=pods,
            namespaces=self.namespaces,
            mesh=self.mesh,
            selectors=amb.enablementSelectors,
            exclude_namespaces=self.settings.excludeNamespaces,
            system_namespace=amb.systemNamespace,
            on_event=lambda kind: metrics.RECONCILE_EVENTS.labels(type=kind).inc(),
        )
        return AmbientService(
            settings=amb,
            pods=pods,
            namespaces=self.namespaces,
            mesh=self.mesh,
            ztunnel=self.ztunnel,
            watch=watch,
            exclude_namespaces=self.settings.excludeNamespaces,
        )
