"""What `istio-cni-agent status` is told: the node's pods with their state, or one pod's rules.

The list joins the node's pod cache with what the agent did (agent.pods.states: each ADD's and
repair's outcome) and ambient's own record (enrolled, acknowledged by ztunnel). A pod the agent
holds no record of gets what the agent would decide for it now. One pod's detail compares the
rules in its network namespace (found by its identity, agent.podnetns) with what the agent
would program now (agent.rules.compare), naming each missing or extra rule.

Every string a pod controls (names, reasons quoting its annotations, rules in its namespace) is
made one escaped line of bounded length here, and the number of pods and rules is bounded: the
reply is read by a person at a terminal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from agent.excerpt import bounded
from agent.pods import states

MAX_PODS = 2000
MAX_RULES = 500
MAX_TEXT = 512
MAX_NAME = 253

STATE_CAPTURED = states.CAPTURED
STATE_SKIPPED = states.SKIPPED
STATE_UNKNOWN = "not-seen"
STATE_AMBIENT = "ambient-enrolled"

AddLatency = Callable[[], Mapping[str, float | int | None]]
"""The recent ADDs' {windowSeconds, count, p50Seconds, p99Seconds}
(agent.metrics.RecentDurations.summary)."""
AmbientState = Callable[[str], str]
"""uid -> `enabled` (enrolled, ztunnel acknowledged), `pending` (enrolled, ztunnel has not
acknowledged it), anything else: not enrolled (agent.ambient.enrollment.RedirectionState)."""


class PodLister(Protocol):
    def list_pods(self) -> Sequence[Mapping[str, Any]]: ...

    def ready(self) -> bool: ...


class Diff(Protocol):
    @property
    def backend(self) -> str: ...

    @property
    def missing(self) -> tuple[str, ...]: ...

    @property
    def extra(self) -> tuple[str, ...]: ...

    @property
    def reordered(self) -> tuple[str, ...]: ...


Compare = Callable[[Mapping[str, Any], str, bool], Diff]
"""(pod, its netns path, ambient?) -> the rules there against what the agent would program."""
Decide = Callable[[Mapping[str, Any]], tuple[bool, str]]
"""pod -> (would capture it?, why), as the pod server decides now."""
FindNetns = Callable[[Sequence[Mapping[str, Any]]], Mapping[str, str]]


def text(value: object, limit: int = MAX_TEXT) -> str:
    return bounded(str(value), limit, escape_backslash=True)


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


class StatusReport:
    """Builds the replies from the parts the wiring hands in."""

    def __init__(
        self,
        *,
        node_name: str,
        pods: PodLister,
        states: states.PodStates,
        decide: Decide,
        find_netns: FindNetns,
        compare: Compare,
        ambient_state: AmbientState | None = None,
        add_latency: AddLatency | None = None,
    ) -> None:
        self._add_latency = add_latency
        self._node = node_name
        self._pods = pods
        self._states = states
        self._decide = decide
        self._find_netns = find_netns
        self._compare = compare
        self._ambient_state = ambient_state

    def listing(self) -> dict[str, Any]:
        pods = list(self._pods.list_pods())
        self._states.forget_except({str(_meta(p).get("uid")) for p in pods})
        pods.sort(key=lambda p: (str(_meta(p).get("namespace")), str(_meta(p).get("name"))))
        return {
            "node": text(self._node, MAX_NAME),
            "cacheSynced": self._pods.ready(),
            "pods": [self.entry(p) for p in pods[:MAX_PODS]],
            "omitted": max(0, len(pods) - MAX_PODS),
            "addLatency": self._recent_adds(),
        }

    def _recent_adds(self) -> dict[str, float | int | None] | None:
        """The node's recent CNI ADDs as the agent answered them: how many, p50 and p99."""
        if self._add_latency is None:
            return None
        summary = self._add_latency()
        return {k: summary.get(k) for k in ("windowSeconds", "count", "p50Seconds", "p99Seconds")}

    def entry(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        meta = _meta(pod)
        ns, name, uid = (str(meta.get(k) or "") for k in ("namespace", "name", "uid"))
        out: dict[str, Any] = {
            "namespace": text(ns, MAX_NAME),
            "name": text(name, MAX_NAME),
            "uid": text(uid, 64),
        }
        ambient = self._ambient_state(uid) if self._ambient_state is not None else ""
        if ambient in ("enabled", "pending"):
            out["state"] = STATE_AMBIENT
            out["ztunnel"] = "acked" if ambient == "enabled" else "pending"
            out["reason"] = (
                "in-pod rules programmed; ztunnel acknowledged the pod"
                if ambient == "enabled"
                else "in-pod rules programmed; ztunnel has not acknowledged the pod yet"
            )
            return out
        record = self._states.get(uid, ns, name)
        if record is not None and record.outcomes:
            latest = max(record.outcomes.values(), key=lambda o: o.at)
            out["state"], out["reason"], out["at"] = latest.state, text(latest.reason), latest.at
            return out
        out.update(self._unseen(pod))
        return out

    def _unseen(self, pod: Mapping[str, Any]) -> dict[str, str]:
        try:
            capture, why = self._decide(pod)
        except Exception as e:  # a refused value: what the ADD would answer
            return {"state": states.REFUSED, "reason": text(f"would refuse it: {e}")}
        if not capture:
            return {"state": STATE_SKIPPED, "reason": text(why)}
        return {
            "state": STATE_UNKNOWN,
            "reason": "no ADD of it reached this agent (it started before this agent, or "
            "without the plugin); `status NAMESPACE/POD` compares its rules",
        }

    def detail(self, namespace: str, name: str) -> tuple[int, dict[str, Any]]:
        """(HTTP status, reply): 404 when the pod is not on this node."""
        pod = next(
            (
                p
                for p in self._pods.list_pods()
                if (_meta(p).get("namespace"), _meta(p).get("name")) == (namespace, name)
            ),
            None,
        )
        if pod is None:
            return 404, {"error": text(f"pod {namespace}/{name} is not on node {self._node}")}
        out: dict[str, Any] = {"node": text(self._node, MAX_NAME), "pod": self.entry(pod)}
        if out["pod"]["state"] == STATE_SKIPPED and _host_network(pod):
            out["rules"] = None
            return 200, out
        uid = str(_meta(pod).get("uid") or "")
        try:
            netns = self._find_netns([pod]).get(uid)
        except Exception as e:
            return 200, {**out, "error": text(f"find the pod's network namespace: {e}")}
        if netns is None:
            return 200, {**out, "error": "the pod's network namespace was not found on the node"}
        out["netns"] = text(netns)
        try:
            diff = self._compare(pod, netns, out["pod"]["state"] == STATE_AMBIENT)
        except Exception as e:
            return 200, {**out, "error": text(f"compare rules: {e}")}
        out["rules"] = {
            "backend": text(diff.backend, 64),
            "missing": _lines(diff.missing),
            "extra": _lines(diff.extra),
            "reordered": _lines(diff.reordered),
            "omitted": sum(max(0, len(x) - MAX_RULES) for x in (diff.missing, diff.extra)),
        }
        return 200, out


def _lines(lines: Sequence[str]) -> list[str]:
    return [text(line, 1024) for line in lines[:MAX_RULES]]


def _host_network(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec")
    return isinstance(spec, Mapping) and spec.get("hostNetwork") is True
