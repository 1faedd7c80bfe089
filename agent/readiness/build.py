"""The agent's readiness checks, assembled from its parts (agent.wiring builds one per set of
settings). In order, each with the period it is re-run at:

    cni-dirs    2 s    the watcher's detached (also liveness: /healthz fails with it)
    install     2 s    checks.install_check
    pod-socket  2 s    checks.socket_check
    api         2 s    checks.api_check
    netns-dir   10 s   netns_dir.NetnsDirCheck (and at once after an ADD naming an unseen netns)
    cni-bin-dir 10 s   Installer.bin_dir_problem (install/bin_dir_check.py)
    rules       30 s   scratch.RulesCheck
    ambient     2 s    checks.ambient_check (ambient mode only)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from agent.config import Settings
from agent.kube import api
from agent.readiness import checks
from agent.readiness.netns_dir import NetnsDirCheck
from agent.readiness.scratch import Rules, RulesCheck
from agent.readiness.service import Check, Readiness

NETNS_DIR_PERIOD = 10.0
RULES_PERIOD = 30.0


class Watcher(Protocol):
    """The install watcher (agent.install.watcher.InstallWatcher)."""

    def ready(self) -> bool: ...

    def problems(self) -> list[str]: ...

    def detached(self) -> str | None: ...

    @property
    def installer(self) -> Any: ...


class PodsView(Protocol):
    """The pod service's cache (agent.pods.pod_cache.PodCache)."""

    def ready(self) -> bool: ...

    def list_pods(self) -> list[Mapping[str, Any]]: ...


class ReadinessParts:
    """The checks as the parts they look at are built; `service()` once all are known."""

    def __init__(
        self, settings: Settings, watcher: Watcher, rules: Rules, *, node_name: str, core: Any
    ) -> None:
        self._node_name = node_name
        self._core = core
        self._timeouts = api.Timeouts(settings.kubeApi)
        self._pods: PodsView | None = None
        self.netns_dir = NetnsDirCheck(
            netns_dir=settings.cniNetnsDir, proc_dir=settings.hostProcDir, pod_uids=self._pod_uids
        )
        self.rules = RulesCheck(rules, backend=settings.ruleBackend)
        installer = watcher.installer
        self.cni_dirs = Check("cni-dirs", watcher.detached)
        """Also the agent's liveness: a deleted mounted dir needs a new container."""
        self._checks = [
            self.cni_dirs,
            Check("install", checks.install_check(watcher.ready, watcher.problems)),
            Check("pod-socket", checks.socket_check(settings.socket_path)),
        ]
        self._late = [
            Check("netns-dir", self.netns_dir, NETNS_DIR_PERIOD),
            Check("cni-bin-dir", installer.bin_dir_problem, NETNS_DIR_PERIOD),
            Check("rules", self.rules, RULES_PERIOD),
        ]
        self._service: Readiness | None = None

    def watch_pods(self, pods: Any) -> None:
        """The pod service: its cache gives `api` and the node's pods for `netns-dir`."""
        assert self._service is None, "checks are added before service() is first asked for"
        self._pods = pods.pods
        self._checks.append(
            Check(
                "api",
                checks.api_check(pods.pods.ready, self._core, self._node_name, self._timeouts),
            )
        )

    def watch_ambient(self, service: Any, socket_path: str) -> None:
        assert self._service is None, "checks are added before service() is first asked for"
        self._late.append(Check("ambient", checks.ambient_check(service.ready, socket_path)))

    def liveness(self) -> list[tuple[str, str]]:
        """(check, why) of what needs a new container (for /healthz), checked now."""
        why = self.cni_dirs.run()
        return [(self.cni_dirs.name, why)] if why else []

    def service(self) -> Readiness:
        if self._service is None:
            self._service = Readiness([*self._checks, *self._late], held=[self.rules])
        return self._service

    def _pod_uids(self) -> set[str]:
        if self._pods is None or not self._pods.ready():
            return set()
        return {uid for pod in self._pods.list_pods() if (uid := _own_netns_uid(pod))}


def _own_netns_uid(pod: Mapping[str, Any]) -> str:
    """The pod's UID when it has a network namespace of its own (not hostNetwork)."""
    if (pod.get("spec") or {}).get("hostNetwork") is True:
        return ""
    return str((pod.get("metadata") or {}).get("uid") or "")


def build_readiness(
    settings: Settings, watcher: Watcher, rules: Rules, *, node_name: str, core: Any
) -> ReadinessParts:
    return ReadinessParts(settings, watcher, rules, node_name=node_name, core=core)


__all__ = ["ReadinessParts", "build_readiness"]
