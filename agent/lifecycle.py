"""`istio-cni-agent run`: install, start the services, wait for SIGTERM, stop them, then
uninstall or keep as the stop policy decides. Everything else lives in the modules it calls."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Protocol

from agent import metrics, plugin_log_file
from agent.ambient.watch_service import AmbientParts
from agent.config import DEFAULT_CONFIG_PATH, Settings, load_settings
from agent.errors import AgentError, ConfigError, InstallError, TransientInstallError
from agent.http_server import HttpServer
from agent.install import stop_policy
from agent.install.commands import make_installer
from agent.install.installer import Installer
from agent.install.watcher import InstallWatcher
from agent.kube import KubeClients, build_clients
from agent.logs import setup_logging
from agent.node_taint import NodeTaintRemover
from agent.podserver.redirect import RulesRedirector
from agent.podserver.service import PodService
from agent.repair.addresses import netns_addresses
from agent.repair.service import RepairService

log = logging.getLogger(__name__)


class Service(Protocol):
    """A long-running part: start() returns once running; stop() returns once its threads ended.
    A service that gates readiness also has `ready() -> bool`."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


def build_services(
    settings: Settings, installer: Installer, *, config_path: str, node_name: str,
    clients: KubeClients,
) -> list[Service]:
    """The services of the agent, started in this order and stopped in reverse."""
    watcher = InstallWatcher(installer, config_path=config_path)
    ambient = (AmbientParts(settings, node_name=node_name, core=clients.core)
               if settings.ambient.enabled else None)
    pods = PodService(settings, node_name, lambda: clients, install_ready=watcher.ready,
                      ambient=ambient.enroller if ambient else None)
    services: list[Service] = [watcher, pods]
    if ambient is not None:
        # After the pod service (its pod cache feeds the watch); ready once ZDS listens.
        services.append(ambient.service(pods.pods))
    if settings.repair.enabled:
        services.append(_repair_service(settings, node_name, pods, clients))
    checks = [(type(s).__name__, _ready_of(s)) for s in services if hasattr(s, "ready")]
    services.append(HttpServer(port=settings.metricsPort, host=settings.metricsAddress,
                               checks=checks))
    if settings.removeNotReadyTaint:
        # Ready as /readyz reports it: every check passes (plugin and config in place, socket).
        services.append(NodeTaintRemover(
            clients.core, node_name, is_ready=lambda: all(check() for _, check in checks)))
    return services


def _repair_service(
    settings: Settings, node_name: str, pods: PodService, clients: KubeClients
) -> RepairService:
    redirector = RulesRedirector(exclude_namespaces=settings.excludeNamespaces,
                                 backend=settings.ruleBackend)
    return RepairService(
        settings=settings,
        node_name=node_name,
        pods=pods.pods,
        core=clients.core,
        should_redirect=lambda pod: redirector.decide(pod).redirect,
        redirect=lambda pod, netns: redirector.apply(netns, pod),
        rules_in_place=lambda pod, netns: redirector.present(netns, pod),
        read_addresses=netns_addresses,
    )


def node_name_from_env() -> str:
    """The node this agent serves, from the downward API (`spec.nodeName`)."""
    name = os.environ.get("NODE_NAME", "")
    if not name:
        raise ConfigError("environment variable NODE_NAME is not set: the DaemonSet sets it "
                          "from the downward API (fieldRef spec.nodeName)")
    return name


def _ready_of(service: Service) -> Callable[[], bool]:
    ready: Callable[[], bool] = service.ready  # type: ignore[attr-defined]
    return ready


def main(command: str, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"istio-cni-agent {command}")
    parser.add_argument("--config", default=DEFAULT_CONFIG_PATH, help="agent config.yaml")
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.config)
    except AgentError as e:
        sys.stderr.write(f"istio-cni-agent {command}: {e}\n")
        return 1
    setup_logging(settings.log_levels, as_json=settings.logAsJson)
    return run(settings, config_path=args.config)


StopDecider = Callable[[Settings], stop_policy.StopDecision]


def decide_from_cluster(settings: Settings) -> stop_policy.StopDecision:
    """Ask the API server about our DaemonSet (unless the config forces the answer)."""
    return stop_policy.decide_from_cluster(
        settings.uninstallOnStop, pod_name=os.environ.get("POD_NAME", ""),
        pod_namespace=os.environ.get("POD_NAMESPACE", ""),
        node_name=os.environ.get("NODE_NAME", ""))


def run(
    settings: Settings, *, config_path: str, decide_on_stop: StopDecider = decide_from_cluster
) -> int:
    """Install, serve until SIGTERM/SIGINT, then uninstall or keep; the process's exit code."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        node_name = node_name_from_env()
        clients = build_clients()
    except ConfigError as e:
        sys.stderr.write(f"istio-cni-agent run: {e}\n")
        return 1
    installer = make_installer(settings)
    try:
        installer.install()
    except TransientInstallError as e:
        metrics.INSTALLS.labels(result="waiting").inc()
        log.info("not installed yet, watching: %s", e)
    except InstallError as e:
        metrics.INSTALLS.labels(result="failure").inc()
        log.error("install failed at start", extra={"fields": {"error": str(e)}})
        sys.stderr.write(f"istio-cni-agent run: install failed: {e}\n")
        return 1
    else:
        metrics.INSTALLS.labels(result="success").inc()  # the start-up run counts too
    services = build_services(settings, installer, config_path=config_path,
                              node_name=node_name, clients=clients)
    started: list[Service] = []
    try:
        for service in services:
            service.start()
            started.append(service)
    except (OSError, AgentError) as e:
        log.error("start failed", extra={"fields": {"service": type(service).__name__,
                                                    "error": str(e)}})
        sys.stderr.write(f"istio-cni-agent run: cannot start {type(service).__name__}: {e}\n")
        _stop_all(started)
        return 1
    plugin_log_file.start_forwarding(settings.cniAgentRunDir, stop)  # lines of an absent agent
    while not stop.wait(1.0):
        pass
    _stop_all(started)
    return _finish(decide_on_stop(installer.settings), installer, started)


def _stop_all(services: Sequence[Service]) -> None:
    for service in reversed(services):
        try:
            service.stop()
        except Exception:  # one failing stop must not keep the others running
            log.exception("stopping %s failed", type(service).__name__)


def _finish(
    decision: stop_policy.StopDecision, installer: Installer, services: Sequence[Service] = ()
) -> int:
    log.info("uninstalling" if decision.uninstall else "keeping the plugin and its entry",
             extra={"fields": {"reason": decision.reason}})
    if not decision.uninstall:
        return 0  # ambient pods stay enrolled: the next agent reconciles them
    for service in services:
        uninstall = getattr(service, "uninstall", None)
        if uninstall is not None:  # ambient: node-side probe rules and address set
            try:
                uninstall()
            except Exception:
                log.exception("uninstall of %s failed", type(service).__name__)
    try:
        removed = installer.uninstall()
    except InstallError as e:
        log.error("uninstall failed", extra={"fields": {"error": str(e)}})
        return 1
    log.info("uninstalled", extra={"fields": {"removed": ",".join(removed) or "nothing"}})
    return 0
