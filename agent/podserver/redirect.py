"""The redirect operations the pod server runs for a pod, composed from agent.rules."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from agent import metrics
from agent.errors import RedirectError
from agent.netns import look as netns_look
from agent.netns.look import NetnsLook
from agent.rules import backends
from agent.rules.sidecar import apply as rules_apply
from agent.rules.sidecar import pod as rules_pod
from agent.rules.sidecar.capture import CaptureConfig


class RulesRedirector:
    """decide / apply / present for one pod, with the node's settings."""

    def __init__(self, *, exclude_namespaces: Collection[str], backend: str) -> None:
        self._exclude = tuple(exclude_namespaces)
        self._backend = backend

    def decide(self, pod: Mapping[str, Any]) -> rules_pod.Decision:
        return rules_pod.decide(pod, exclude_namespaces=self._exclude)

    def apply(self, netns: str, pod: Mapping[str, Any]) -> str:
        look = self._look(netns)
        config = self._config(pod, look)
        try:
            return rules_apply.apply_rules(netns, config, backend=self._backend, seen=look)
        except Exception as e:
            metrics.RULES_APPLY_FAILURES.labels(backend=self._chosen(netns, look)).inc()
            if isinstance(e, RedirectError):
                raise
            raise RedirectError(f"apply rules in {netns} (backend {self._backend}): {e}") from e

    def _chosen(self, netns: str, look: NetnsLook) -> str:
        """The backend an apply used (the metric's label): a bounded name, `auto` if unknown."""
        try:
            return backends.choose_backend(netns, self._backend, seen=look)
        except Exception:  # an unknown configured backend, a namespace gone meanwhile
            return "auto"

    def present(self, netns: str, pod: Mapping[str, Any]) -> bool:
        look = self._look(netns)
        config = self._config(pod, look)
        return rules_apply.rules_present(netns, config, backend=self._backend, seen=look)

    @staticmethod
    def _look(netns: str) -> NetnsLook:
        """One look into the netns serves the IPv6 decision and the apply (each pod start
        waits)."""
        try:
            return netns_look.look(netns)
        except RedirectError:
            raise
        except Exception as e:
            raise RedirectError(f"look into netns {netns}: {e}") from e

    @staticmethod
    def _config(pod: Mapping[str, Any], look: NetnsLook) -> CaptureConfig:
        # Istio's plugin: IPv6 rules from the pod's addresses and its ISTIO_DUAL_STACK; with DNS
        # capture it takes all port-53 traffic, so the resolvers are not read.
        ipv6 = rules_pod.ipv6_for_pod(pod, look.addresses)
        # InvalidPodInputError names the input and an excerpt of its value: let it through.
        rules_pod.pod_ips(pod)  # not read here, but a pod whose IPs are not IPs is refused
        return rules_pod.capture_config_for_pod(pod, ipv6=ipv6)
