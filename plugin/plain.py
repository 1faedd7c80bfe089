"""Can an ADD (or CHECK) pass a pod without the agent? Only a plain pod of a sidecar-only install.

With the agent unreachable, failing every ADD turns an agent outage into a node outage; only the
pods the agent would capture need it. The agent (ambient off) captures a pod only when it carries
`sidecar.istio.io/status`, which Istio's injector writes, and the runtime hands the plugin the
pod's annotations when our entry declares the capability `io.kubernetes.cri.pod-annotations`
(containerd: `runtimeConfig` on stdin). So a pod passes without the agent when:
ambient is off in the entry (`ambient_enabled: false`, said, not defaulted), the runtime handed
the annotations, they are well formed (string keys and values, within Kubernetes' 256 KiB), and
no key mentions `istio` (sidecar.istio.io/*, traffic.sidecar.istio.io/*, ambient.istio.io/*,
istio.io/*, proxy.istio.io/*: wider than the agent's rule, on purpose). Anything else cannot be
judged here and fails closed, as before.

Runs only when the agent did not answer: nothing of it is on the path of a healthy node.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: importing typing costs ~10 ms of start-up
if TYPE_CHECKING:
    from plugin.config import NetConf

MAX_ANNOTATIONS_BYTES = 256 * 1024
"""Kubernetes' limit on a pod's annotations (keys and values); more is no pod's: not judged."""
MARKER = "istio"
"""Any annotation key holding this (any case) may mean the pod is meshed."""


def plain_pod(conf: NetConf) -> str | None:
    """Why the pod may start without the agent, or None when it must wait for it."""
    if conf.ambient_enabled is not False:
        return None  # ambient on (or not said): pods are enrolled by label, which we never see
    annotations = conf.pod_annotations
    if type(annotations) is not dict:  # not handed (old runtime, capability not declared) or odd
        return None
    size = 0
    for key, value in annotations.items():
        if type(key) is not str or type(value) is not str:
            return None
        size += len(key) + len(value)
        if size > MAX_ANNOTATIONS_BYTES or MARKER in key.lower():
            return None
    return f"sidecar-only install and none of the pod's {len(annotations)} annotations is Istio's"
