"""The DaemonSet's agents, node by node, as the API server shows them: which node should have
one and has it, its image, whether it is Ready and, when not, why: its container's state, the
failing readiness checks its /readyz names (read through the API server's pod proxy), or the
kubelet's probe events."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.check.cluster import ReadError
from agent.check.facts import AGENT_CONTAINER, Facts, seg
from agent.check.scheduling import Excluded, excluded, target_node

DEFAULT_PORT = 15014
"""The chart's `metricsPort`, where /readyz is served."""


@dataclass
class NodeAgent:
    node: str
    node_ready: bool
    excluded: Excluded | None = None
    pod: Mapping[str, Any] | None = None
    ready: bool = False
    image: str = ""
    why: list[str] = field(default_factory=list)
    """Why the pod is not Ready (empty when it is)."""
    failing: dict[str, str] | None = None
    """The readiness checks /readyz names as failing; None when /readyz could not be read."""

    @property
    def pod_name(self) -> str:
        meta = (self.pod or {}).get("metadata") or {}
        return f"{meta.get('namespace')}/{meta.get('name')}"


def survey(facts: Facts, ds: Mapping[str, Any]) -> list[NodeAgent]:
    meta = ds["metadata"]
    key = ("survey", meta["namespace"], meta["name"])
    found: list[NodeAgent] = facts.once(key, lambda: _survey(facts, ds))
    return found


def _survey(facts: Facts, ds: Mapping[str, Any]) -> list[NodeAgent]:
    spec = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
    pods: dict[str, Mapping[str, Any]] = {}
    for pod in facts.pods_of(ds):
        if not (pod.get("metadata") or {}).get("deletionTimestamp"):
            pods.setdefault(target_node(pod), pod)
    agents = []
    for node in facts.nodes():
        name = str(node["metadata"]["name"])
        agent = NodeAgent(name, _node_ready(node), excluded(spec, node), pods.get(name))
        if agent.pod is not None:
            _describe(facts, agent, agent.pod)
        agents.append(agent)
    return agents


def _node_ready(node: Mapping[str, Any]) -> bool:
    return _condition(node, "Ready").get("status") == "True"


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return {}


def _container(pod: Mapping[str, Any], section: str, key: str) -> Mapping[str, Any]:
    for c in (pod.get(section) or {}).get(key) or []:
        if c.get("name") == AGENT_CONTAINER:
            return dict(c)
    return {}


def _describe(facts: Facts, agent: NodeAgent, pod: Mapping[str, Any]) -> None:
    agent.image = str(_container(pod, "spec", "containers").get("image") or "")
    agent.ready = _condition(pod, "Ready").get("status") == "True"
    if agent.ready:
        return
    if not (pod.get("spec") or {}).get("nodeName"):
        scheduled = _condition(pod, "PodScheduled")
        agent.why.append(f"not scheduled: {scheduled.get('message') or 'waiting for a node'}")
        return
    state = _container(pod, "status", "containerStatuses")
    waiting = (state.get("state") or {}).get("waiting") or {}
    if waiting:
        agent.why.append(f"{waiting.get('reason')}: {waiting.get('message') or ''}".rstrip(": "))
        last = (state.get("lastState") or {}).get("terminated") or {}
        if last:
            agent.why.append(
                f"last exit {last.get('exitCode')} ({last.get('reason')}): "
                f"{(last.get('message') or '').strip()[:300]}".rstrip(": ")
            )
        return
    if not state.get("started", bool((state.get("state") or {}).get("running"))):
        agent.why.append(f"phase {(pod.get('status') or {}).get('phase') or 'unknown'}")
        return
    agent.failing = read_readyz(facts, pod)
    if agent.failing:
        agent.why.extend(f"readiness check {n} fails: {w}" for n, w in agent.failing.items())
    else:
        agent.why.append(_probe_events(facts, pod) or _condition(pod, "Ready").get("message", ""))


def metrics_port(pod: Mapping[str, Any]) -> int:
    container = _container(pod, "spec", "containers")
    port = ((container.get("readinessProbe") or {}).get("httpGet") or {}).get("port")
    if isinstance(port, int):
        return port
    for p in container.get("ports") or []:
        if p.get("name") == (port or "metrics") and p.get("containerPort"):
            return int(p["containerPort"])
    return DEFAULT_PORT


def read_readyz(facts: Facts, pod: Mapping[str, Any]) -> dict[str, str] | None:
    """The failing checks /readyz names (`not ready: a, b` then `a: why` lines), through the
    API server's pod proxy (needs `pods/proxy` get); None when it could not be read."""
    unreadable: list[str] = facts.once(("readyz-unreadable",), list)
    if unreadable:  # one pod's /readyz was out of reach: the others' are too (same path)
        return None
    meta = pod["metadata"]
    path = (
        f"/api/v1/namespaces/{seg(meta['namespace'])}/pods/"
        f"{seg(meta['name'])}:{metrics_port(pod)}/proxy/readyz"
    )
    try:
        status, body = facts.cluster.proxy_text(path)
    except ReadError:
        status, body = 0, ""
    if status == 200:
        return {}
    lines = body.splitlines()
    if status != 503 or not lines or not lines[0].startswith("not ready:"):
        unreadable.append(f"{status} {body[:200]}")
        return None
    failing: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, why = line.partition(": ")
        if sep and name and " " not in name:
            failing[name] = why
    return failing


def _probe_events(facts: Facts, pod: Mapping[str, Any]) -> str:
    """The kubelet's last `Unhealthy` event of the pod's readiness probe (its message holds the
    HTTP status, not /readyz's body)."""
    meta = pod["metadata"]
    events = facts.events(
        f"involvedObject.kind=Pod,involvedObject.name={meta['name']},reason=Unhealthy",
        meta["namespace"],
    )
    events = [e for e in events if "Readiness probe" in str(e.get("message", ""))]
    if not events:
        return ""
    last = max(events, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    return f"{last.get('message')} ({last.get('count') or 1} times)"
