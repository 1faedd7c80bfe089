"""An ambient pod's rule options: the node-wide ones with the pod's own overrides.

Istio's getPodLevelTrafficOverrides: `ambient.istio.io/bypass-inbound-capture`,
`ambient.istio.io/dns-capture` and `istio.io/reroute-virtual-interfaces`, read through
agent.podinput as every pod value is. Kept apart from the dataplane so that `rules --ambient
pod --pod FILE` computes them without loading the Kubernetes client.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from agent.podinput import pod as podinput
from agent.rules.ambient.options import PodRuleOptions

OptionsFor = Callable[[Mapping[str, Any]], PodRuleOptions]


def rule_options_for(base: PodRuleOptions) -> OptionsFor:
    """Istio's getPodLevelTrafficOverrides over the node-wide options, the pod's values read
    through agent.podinput (a refused value raises InvalidPodInputError naming it)."""

    def options(pod: Mapping[str, Any]) -> PodRuleOptions:
        got = podinput.ambient_input(pod)
        dns = got.dns_capture
        return PodRuleOptions(
            ipv6=base.ipv6,
            redirect_dns=base.redirect_dns,
            dns_proxy=None if dns is None else ("enabled" if dns else "disabled"),
            ingress=got.bypass_inbound,
            virtual_interfaces=got.virtual_interfaces,
            probe_snat=base.probe_snat,
            probe_snat_v6=base.probe_snat_v6,
        )

    return options
