"""The redirect operations the pod server runs for a pod, composed from agent.rules."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from agent.errors import RedirectError
from agent.rules import apply as rules_apply
from agent.rules import pod as rules_pod
from agent.rules.config import CaptureConfig
from agent.rules.probe import NetnsProbe


class RulesRedirector:
    """decide / apply / present for one pod, with the node's settings."""

    def __init__(self, *, exclude_namespaces: Collection[str], backend: str) -> None:
        self._exclude = tuple(exclude_namespaces)
        self._backend = backend

    def decide(self, pod: Mapping[str, Any]) -> rules_pod.Decision:
        return rules_pod.decide(pod, exclude_namespaces=self._exclude)

    def apply(self, netns: str, pod: Mapping[str, Any]) -> str:
        probe = self._probe(netns)
        config = self._config(netns, pod, probe)
        try:
            return rules_apply.apply_rules(netns, config, backend=self._backend, probe=probe)
        except RedirectError:
            raise
        except Exception as e:
            raise RedirectError(f"apply rules in {netns} (backend {self._backend}): {e}") from e

    def present(self, netns: str, pod: Mapping[str, Any]) -> bool:
        probe = self._probe(netns)
        config = self._config(netns, pod, probe)
        return rules_apply.rules_present(netns, config, backend=self._backend, probe=probe)

    @staticmethod
    def _probe(netns: str) -> NetnsProbe:
        """One look into the netns serves the host facts and the apply (each pod start waits)."""
        try:
            return rules_apply.probe(netns)
        except RedirectError:
            raise
        except Exception as e:
            raise RedirectError(f"look into netns {netns}: {e}") from e

    @staticmethod
    def _config(netns: str, pod: Mapping[str, Any], probe: NetnsProbe) -> CaptureConfig:
        try:
            ipv6, dns_servers = rules_apply.host_facts(netns, probe=probe)
        except Exception as e:
            raise RedirectError(f"read host facts (ipv6, DNS) of netns {netns}: {e}") from e
        # InvalidAnnotationError names the annotation and its value: let it through as is.
        return rules_pod.capture_config_for_pod(pod, ipv6=ipv6, dns_servers=dns_servers)
