"""A sidecar pod's redirect as the pod server and repair run it: decide, then look into its
netns once, decide IPv6 and apply (or check) the rules (agent.rules.sidecar.apply)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from agent import metrics
from agent.errors import RedirectError
from agent.netns import look as netns_look
from agent.netns.look import NetnsLook
from agent.rules import backends
from agent.rules.compare import RulesDiff
from agent.rules.sidecar import apply as sidecar_apply
from agent.rules.sidecar import pod as pod_rules
from agent.rules.sidecar.capture import CaptureConfig


class RulesRedirector:
    """decide / apply / present for one pod, with the node's settings."""

    def __init__(self, *, exclude_namespaces: Collection[str], backend: str) -> None:
        self._exclude = tuple(exclude_namespaces)
        self._backend = backend

    def decide(self, pod: Mapping[str, Any]) -> pod_rules.Decision:
        return pod_rules.decide(pod, exclude_namespaces=self._exclude)

    def apply(self, netns: str, pod: Mapping[str, Any]) -> str:
        look = self._look(netns)
        config = self._config(pod, look)
        try:
            return sidecar_apply.apply_rules(netns, config, backend=self._backend, seen=look)
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
        return sidecar_apply.rules_present(netns, config, backend=self._backend, seen=look)

    def compare(self, netns: str, pod: Mapping[str, Any]) -> RulesDiff:
        """The pod's rules there against what this agent would program for it now (none for
        a pod it skips); InvalidPodInputError when the pod's values are refused."""
        look = self._look(netns)
        config = self._config(pod, look) if self.decide(pod).redirect else None
        return sidecar_apply.rules_diff(netns, config, backend=self._backend, seen=look)

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
        ipv6 = pod_rules.ipv6_for_pod(pod, look.addresses)
        # InvalidPodInputError names the input and an excerpt of its value: let it through.
        pod_rules.pod_ips(pod)  # not read here, but a pod whose IPs are not IPs is refused
        return pod_rules.capture_config_for_pod(pod, ipv6=ipv6)
