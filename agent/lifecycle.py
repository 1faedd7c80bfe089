"""`istio-cni-agent run`: install, start the services, wait for SIGTERM, stop them, then
uninstall or keep as the stop policy decides. The services are built by agent.wiring;
everything else lives in the modules it calls.

Start-up installs through the install watcher's own handler (`InstallWatcher.reconcile`), the
one place that maps an install's outcome to metrics. `config.yaml` is read once, at start, as
Istio's agent reads its flags: a changed ConfigMap reaches a node only when its pod is replaced,
which the chart makes a rolling update of the DaemonSet (the pod template's `checksum/config`
annotation), so a valid but wrong value stops at `updateStrategy.rollingUpdate.maxUnavailable`
nodes instead of landing on every node at once. The environment (NODE_NAME, POD_NAME,
POD_NAMESPACE) is read once, and one set of API clients serves all.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType

from agent.config import DEFAULT_CONFIG_PATH, Settings, load_settings
from agent.downward import AgentPod
from agent.errors import AgentError, ConfigError, InstallError
from agent.install import stop_policy
from agent.install.commands import make_installer
from agent.install.installer import Installer
from agent.install.watcher import InstallWatcher
from agent.kube import KubeClients, api, build_clients
from agent.logs import setup_logging
from agent.memory import map_large_buffers
from agent.pods.own_daemonset import OwnDaemonSetWatch
from agent.serving.limits import raise_descriptor_limit
from agent.wiring import Service, Uninstalls, build_services

log = logging.getLogger(__name__)


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
    return run(settings)


StopDecider = Callable[[Settings], stop_policy.StopDecision]


def run(settings: Settings, *, decide_on_stop: StopDecider | None = None) -> int:
    """Install, serve until SIGTERM/SIGINT, then uninstall or keep; the process's exit code.

    `decide_on_stop` defaults to asking the API server about our DaemonSet.
    """
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    # The servers' caps decide who is refused, never the descriptor limit (1024 by default).
    raise_descriptor_limit()
    map_large_buffers()  # a fat pod's text goes back to the system once read (agent.memory)
    pod = AgentPod.from_env()
    try:
        node_name = pod.require_node()
        clients = build_clients(settings=settings.kubeApi)
    except ConfigError as e:
        sys.stderr.write(f"istio-cni-agent run: {e}\n")
        return 1
    own = None  # the DaemonSet's watch, for the stop policy's auto mode
    if decide_on_stop is None and settings.uninstallOnStop == "auto":
        own = _watch_own_daemonset(pod, clients)
    try:
        return _serve(
            settings,
            pod=pod,
            node_name=node_name,
            clients=clients,
            stop=stop,
            decide_on_stop=decide_on_stop or _cluster_decider(pod, clients, own),
        )
    finally:
        if own is not None:
            own.stop()
        clients.close()


def _serve(
    settings: Settings,
    *,
    pod: AgentPod,
    node_name: str,
    clients: KubeClients,
    stop: threading.Event,
    decide_on_stop: StopDecider,
) -> int:
    installer = make_installer(settings, pod)
    # Config is read once at start (a change rolls the DaemonSet): the watcher never re-reads it.
    watcher = InstallWatcher(installer)
    first = watcher.reconcile("start")  # the watcher's own handler, run once before serving
    if first.outcome == "failed" and not first.retry:
        sys.stderr.write(f"istio-cni-agent run: install failed: {first.error}\n")
        return 1
    if first.retry:  # as mid-run: not Ready (naming the error), retried until it passes
        log.warning("install failed at start; retrying", extra={"fields": {"error": first.error}})
    if first.outcome == "waiting":
        log.info("not installed yet, watching: %s", first.error)
    built = build_services(
        settings,
        installer,
        node_name=node_name,
        clients=clients,
        watcher=watcher,
    )
    started = _start_all(built.services)
    if started is None:
        return 1
    while not stop.wait(1.0):  # a timed wait: the signal handler runs between waits
        pass
    _stop_all(started)
    return _finish(decide_on_stop(installer.settings), installer, built.uninstallers)


def _cluster_decider(
    pod: AgentPod, clients: KubeClients, own: OwnDaemonSetWatch | None
) -> StopDecider:
    """Ask the API server about our DaemonSet (unless the config forces the answer); what the
    watch of it saw counts when asking fails."""

    def decide(settings: Settings) -> stop_policy.StopDecision:
        return stop_policy.decide_from_cluster(
            settings.uninstallOnStop,
            pod_name=pod.pod_name,
            pod_namespace=pod.pod_namespace,
            node_name=pod.node_name,
            clients=clients,
            timeouts=api.Timeouts(settings.kubeApi),
            watched_gone=own.gone if own is not None else None,
        )

    return decide


def _watch_own_daemonset(pod: AgentPod, clients: KubeClients) -> OwnDaemonSetWatch | None:
    """The watch of the agent's DaemonSet, started (None outside a pod)."""
    if not pod.pod_name or not pod.pod_namespace:
        return None
    own = OwnDaemonSetWatch.for_pod(clients.apps, pod.pod_name, pod.pod_namespace)
    own.start()
    return own


def _start_all(services: Sequence[Service]) -> list[Service] | None:
    """Start in order; on a failure stop those started and return None (the reason on stderr)."""
    started: list[Service] = []
    for service in services:
        try:
            service.start()
        except (OSError, AgentError) as e:
            name = type(service).__name__
            log.error("start failed", extra={"fields": {"service": name, "error": str(e)}})
            sys.stderr.write(f"istio-cni-agent run: cannot start {name}: {e}\n")
            _stop_all(started)
            return None
        started.append(service)
    return started


def _stop_all(services: Sequence[Service]) -> None:
    for service in reversed(services):
        try:
            service.stop()
        except Exception:  # one failing stop must not keep the others running
            log.exception("stopping %s failed", type(service).__name__)


def _finish(
    decision: stop_policy.StopDecision,
    installer: Installer,
    uninstallers: Sequence[Uninstalls] = (),
) -> int:
    log.info(
        "uninstalling" if decision.uninstall else "keeping the plugin and its entry",
        extra={"fields": {"reason": decision.reason}},
    )
    if not decision.uninstall:
        return 0  # ambient pods stay enrolled: the next agent reconciles them
    for service in uninstallers:  # ambient: node-side probe rules and address set
        try:
            service.uninstall()
        except Exception:
            log.exception("uninstall of %s failed", type(service).__name__)
    try:
        removed = installer.uninstall()
    except InstallError as e:
        log.error("uninstall failed", extra={"fields": {"error": str(e)}})
        return 1
    log.info("uninstalled", extra={"fields": {"removed": ",".join(removed) or "nothing"}})
    return 0
