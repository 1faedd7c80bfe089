"""What the agent answers to each plugin request, free of HTTP: a request body in, a Reply out.

ADD:   look up the pod (cache, else GET) -> decide -> apply the pod's rules in its netns.
CHECK: the same lookup and decision -> are the rules in place?
DEL, GC: forget the sandboxes that are gone (the rules die with the netns).

Fail closed: when the pod cannot be looked up or its rules cannot be applied the reply is a CNI
error, so the runtime fails the sandbox and retries; it never starts the pod uncaptured.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from agent.errors import retry_later
from agent.logs import LEVELS, PLUGIN_LOGGER
from agent.netns.look import ident as netns_ident
from agent.pods import states
from agent.pods.states import PodStates
from agent.podserver.metrics import PluginMetrics, Trace, boottime
from agent.podserver.requests import (
    FAILURE_REPLY,
    CniRequest,
    Refused,
    Reply,
    bad,
    failure,
    ok,
)
from agent.podserver.sandboxes import Sandbox, SandboxStore
from plugin import wire

log = logging.getLogger(__name__)
plugin_log = logging.getLogger(PLUGIN_LOGGER)


MAX_LOG_MESSAGE = 4096
MAX_LOG_FIELDS = 32


STEP_REASONS = {
    "look up pod": "lookup_failed",
    "decide redirect": "decision_failed",
    "apply redirect rules": "apply_failed",
    "ambient detection": "ambient_detection_failed",
    "ambient enrollment": "ambient_enrollment_failed",
}


REFUSED_EVENT = "RedirectRefused"
SIDECAR_REFUSALS = ("decision_failed", "apply_failed", "internal_error")
"""Refusals of a looked-up pod on the sidecar path, which get a Warning Event on the pod
(ambient's refusals show in its `ambient.istio.io/redirection` annotation)."""


class EventSink(Protocol):
    """Rate-limited pod Events (agent.kube.events.EventRecorder)."""

    def record(self, pod: Mapping[str, Any], *, reason: str, message: str) -> None: ...


class PodSource(Protocol):
    """Where pods come from (the pod cache in the agent)."""

    def get_pod(
        self, namespace: str, name: str, uid: str | None = None
    ) -> Mapping[str, Any] | None:
        """The pod as API JSON; None when it does not exist; raises when the lookup failed."""
        ...


class Decision(Protocol):
    @property
    def redirect(self) -> bool: ...

    @property
    def reason(self) -> str: ...


class AmbientVerdict(Protocol):
    @property
    def enroll(self) -> bool: ...

    @property
    def reason(self) -> str: ...


class Ambient(Protocol):
    """Ambient enrollment (agent.ambient.enroller.AmbientEnroller)."""

    def decide(self, pod: Mapping[str, Any]) -> AmbientVerdict: ...

    def enroll(
        self, pod: Mapping[str, Any], netns: str, *, sandbox: str, ips: tuple[str, ...]
    ) -> str: ...

    def release(self, pod: Mapping[str, Any], *, sandbox: str) -> None: ...


class Redirector(Protocol):
    """The redirect operations on one pod (agent.rules.sidecar.redirector.RulesRedirector)."""

    def decide(self, pod: Mapping[str, Any]) -> Decision: ...

    def apply(self, netns: str, pod: Mapping[str, Any]) -> str:
        """Program the pod's rules in `netns`; returns the backend used."""
        ...

    def present(self, netns: str, pod: Mapping[str, Any]) -> bool: ...


def _with_ips(pod: Mapping[str, Any], ips: tuple[str, ...]) -> dict[str, Any]:
    """The pod with the request's IPs as its status IPs, when the API has none yet."""
    out = dict(pod)
    status = dict(pod.get("status") or {})
    if ips and not status.get("podIPs") and not status.get("podIP"):
        status["podIPs"] = [{"ip": ip} for ip in ips]
        status["podIP"] = ips[0]
        out["status"] = status
    return out


def _sandbox_pod(sandbox: Sandbox) -> dict[str, Any]:
    """The pod as far as a release needs it (name, uid, IPs)."""
    return {
        "metadata": {"name": sandbox.name, "namespace": sandbox.namespace, "uid": sandbox.uid},
        "status": {"podIPs": [{"ip": ip} for ip in sandbox.ips]},
    }


class PodHandlers:
    """The request handlers; every dependency passed in so tests drive them directly."""

    def __init__(
        self,
        *,
        pods: PodSource,
        redirector: Redirector,
        sandboxes: SandboxStore,
        readiness: Callable[[], str | None],
        metrics: PluginMetrics | None = None,
        ambient: Ambient | None = None,
        on_add_netns: Callable[[str], None] | None = None,
        states: PodStates | None = None,
        events: EventSink | None = None,
        clock: Callable[[], float] = boottime,
    ) -> None:
        """`readiness` returns None when the agent is ready, else the reason it is not;
        `ambient` is set when ambient mode is on; `on_add_netns` sees the netns path of every
        ADD (readiness learns from it where the runtime keeps namespaces); `states` keeps each
        ADD's outcome (`istio-cni-agent status`); `events` gets a Warning on a refused pod;
        `clock` is CLOCK_BOOTTIME, on which the plugin reports its start."""
        self._clock = clock
        self._states = states
        self._events = events
        self._on_add_netns = on_add_netns
        self._ambient = ambient
        self._pods = pods
        self._redirector = redirector
        self._sandboxes = sandboxes
        self._readiness = readiness
        self._metrics = metrics

    def add(self, body: bytes) -> Reply:
        return self._run("add", self._add, body)

    def check(self, body: bytes) -> Reply:
        return self._run("check", self._check, body)

    def delete(self, body: bytes) -> Reply:
        return self._run("del", self._delete, body)

    def gc(self, body: bytes) -> Reply:
        return self._run("gc", self._gc, body)

    def _run(self, command: str, handler: Callable[[bytes, Trace], Reply], body: bytes) -> Reply:
        started = time.monotonic()
        reason = "internal_error"
        trace = Trace()
        try:
            reply = handler(body, trace)
        except Refused as refused:
            reply, reason = refused.reply, refused.reason
        except Exception as e:  # a bug must still fail the sandbox, not pass it
            log.exception("plugin request failed", extra={"fields": {"command": command}})
            status, code = FAILURE_REPLY[False]
            reply = failure(status, code, f"{command}: internal error in the agent", str(e))
        if self._metrics is not None:
            seconds = time.monotonic() - started
            self._metrics.answered(command, reply, reason, trace, seconds, now=self._clock())
        return reply

    def _add(self, body: bytes, trace: Trace) -> Reply:
        req = CniRequest.parse(body, "ADD")
        trace.started_at = req.started_at
        if self._on_add_netns is not None:
            self._on_add_netns(req.netns)
        if not req.has_pod:
            trace.mode = "none"
            return ok(wire.RESULT_SKIPPED, "no Kubernetes pod arguments")
        try:
            pod = self._lookup(req)
        except Refused as refused:
            self._note(req, {}, states.REFUSED, str(refused.reply.body.get("msg", "")))
            raise
        try:
            return self._add_pod(req, pod, trace)
        except Exception as e:
            self._refused(req, pod, e)
            raise

    def _add_pod(self, req: CniRequest, pod: Mapping[str, Any], trace: Trace) -> Reply:
        if self._ambient is not None:
            verdict = self._ambient_verdict(req, pod)
            if verdict.enroll:
                trace.mode = "ambient"
                return self._ambient_add(req, pod, verdict.reason)
        decision = self._decide(req, pod)
        trace.mode = "sidecar" if decision.redirect else "none"
        if not decision.redirect:
            self._remember(req, pod, redirected=False)
            self._log_result(req, "skipped", decision.reason)
            self._note(req, pod, states.SKIPPED, decision.reason)
            return ok(wire.RESULT_SKIPPED, decision.reason)
        try:
            backend = self._redirector.apply(req.netns, pod)
        except Exception as e:
            raise self._failed(req, "apply redirect rules", e) from e
        self._remember(req, pod, redirected=True)
        reason = f"{decision.reason}; rules applied with {backend}"
        self._log_result(req, "redirected", reason)
        self._note(req, pod, states.CAPTURED, reason)
        return ok(wire.RESULT_REDIRECTED, reason)

    def _note(self, req: CniRequest, pod: Mapping[str, Any], state: str, reason: str) -> None:
        if self._states is not None:
            uid = str((pod.get("metadata") or {}).get("uid") or req.pod_uid)
            self._states.note(
                namespace=req.pod_namespace,
                name=req.pod_name,
                uid=uid,
                kind=states.ADD,
                state=state,
                reason=reason,
            )

    def _refused(self, req: CniRequest, pod: Mapping[str, Any], error: Exception) -> None:
        """Note a refusal; a sidecar pod's gets a Warning Event (rate-limited by the sink)."""
        reason = error.reason if isinstance(error, Refused) else "internal_error"
        msg = str(error.reply.body.get("msg", "")) if isinstance(error, Refused) else str(error)
        self._note(req, pod, states.REFUSED, msg)
        if self._events is not None and reason in SIDECAR_REFUSALS:
            self._events.record(
                pod,
                reason=REFUSED_EVENT,
                message="this node's istio-cni agent refused the pod's network set-up (CNI "
                f"ADD), so it does not start uncaptured; the runtime retries: {msg}",
            )

    def _ambient_verdict(self, req: CniRequest, pod: Mapping[str, Any]) -> AmbientVerdict:
        assert self._ambient is not None
        try:
            return self._ambient.decide(pod)
        except Exception as e:  # the namespace unreadable: retry later (AmbientLookupError)
            raise self._failed(req, "ambient detection", e) from e

    def _ambient_add(self, req: CniRequest, pod: Mapping[str, Any], reason: str) -> Reply:
        """Fail closed: a pod ambient must capture starts only once captured and in ztunnel."""
        assert self._ambient is not None
        pod = _with_ips(pod, req.ips)
        try:  # the probe set gets the CNI result's IPs (a re-created sandbox's new IP)
            done = self._ambient.enroll(pod, req.netns, sandbox=req.container_id, ips=req.ips)
        except Exception as e:  # ztunnel has not taken it yet: retry later (ZtunnelPending)
            raise self._failed(req, "ambient enrollment", e) from e
        uid = str((pod.get("metadata") or {}).get("uid") or req.pod_uid)  # K8S_POD_UID is optional
        self._sandboxes.put(
            Sandbox(
                req.container_id,
                req.ifname,
                req.pod_namespace,
                req.pod_name,
                uid,
                req.netns,
                True,
                ambient=True,
                ips=req.ips,
                netns_id=netns_ident(req.netns),
            )
        )
        self._log_result(req, "redirected", f"{reason}; {done}")
        self._note(req, pod, states.CAPTURED, f"{reason}; {done}")
        return ok(wire.RESULT_REDIRECTED, f"{reason}; {done}")

    def _check(self, body: bytes, trace: Trace) -> Reply:
        req = CniRequest.parse(body, "CHECK")
        trace.started_at = req.started_at
        if not req.has_pod:
            return ok(wire.RESULT_SKIPPED, "no Kubernetes pod arguments")
        pod = self._lookup(req)
        decision = self._decide(req, pod)
        if not decision.redirect:
            return ok(wire.RESULT_SKIPPED, decision.reason)
        try:
            present = self._redirector.present(req.netns, pod)
        except Exception as e:
            raise self._failed(req, "check redirect rules", e) from e
        if not present:
            msg = f"pod {req.pod_ref}: redirect rules missing in netns {req.netns}"
            log.error("check failed", extra={"fields": self._fields(req)})
            return failure(*FAILURE_REPLY[False], msg)
        return ok(wire.RESULT_REDIRECTED, "rules present")

    def _delete(self, body: bytes, trace: Trace) -> Reply:
        req = CniRequest.parse(body, "DEL")
        trace.started_at = req.started_at
        removed = self._sandboxes.remove(req.container_id)
        reason = "sandbox state removed" if removed else "no state kept for sandbox"
        if removed is not None and removed.ambient and self._ambient is not None:
            try:
                self._ambient.release(_sandbox_pod(removed), sandbox=removed.container_id)
            except Exception as e:  # the watch's delete event releases it again
                log.warning(
                    "ambient release on DEL failed",
                    extra={"fields": {**self._fields(req), "error": str(e)}},
                )
            else:
                reason += "; released from ambient"
        log.debug("del", extra={"fields": {**self._fields(req), "reason": reason}})
        return ok(wire.RESULT_SKIPPED, reason)

    def _gc(self, body: bytes, trace: Trace) -> Reply:
        try:
            data = wire.parse_gc_request(body)
        except wire.WireError as e:
            raise bad(wire.DECODING_FAILURE, str(e)) from e
        valid = [(a["containerId"], a["ifname"]) for a in data["validAttachments"]]
        dropped = self._sandboxes.keep_only(valid)
        if dropped:
            log.info(
                "gc dropped sandboxes",
                extra={
                    "fields": {
                        "count": len(dropped),
                        "containerIds": ",".join(s.container_id for s in dropped),
                    }
                },
            )
        return ok(wire.RESULT_SKIPPED, f"removed state of {len(dropped)} sandboxes")

    def status(self) -> Reply:
        reason = self._readiness()
        if reason is None:
            return Reply(200, wire.status_reply(True))
        return Reply(503, wire.status_reply(False, reason))

    def log(self, body: bytes) -> Reply:
        """Write a plugin log line into the agent's log, with the pod it is about."""
        try:
            data = wire.parse_log_request(body)
        except wire.WireError as e:
            return failure(400, wire.DECODING_FAILURE, str(e))
        fields = {
            "source": "plugin",
            "pod": f"{data['podNamespace']}/{data['podName']}",
            "containerId": data["containerId"],
        }
        for k, v in list(data.get("fields", {}).items())[:MAX_LOG_FIELDS]:
            fields.setdefault(k[:64], v[:MAX_LOG_MESSAGE])  # ours first: a line cannot spoof them
        level = LEVELS.get(data["level"], logging.INFO)
        plugin_log.log(level, "%s", data["msg"][:MAX_LOG_MESSAGE], extra={"fields": fields})
        return ok(wire.RESULT_SKIPPED, "logged")

    def _lookup(self, req: CniRequest) -> Mapping[str, Any]:
        try:
            pod = self._pods.get_pod(req.pod_namespace, req.pod_name, req.pod_uid or None)
        except Exception as e:
            # Whatever failed, it was the lookup: the API server may answer later.
            raise self._failed(req, "look up pod", e, retry=True) from e
        if pod is None:
            msg = f"pod {req.pod_ref}: look up pod: not found in the API server"
            if req.pod_uid:
                msg += f" with uid {req.pod_uid}"
            log.warning("pod not found", extra={"fields": self._fields(req)})
            reply = failure(*FAILURE_REPLY[True], msg + "; try again later")
            raise Refused(reply, "pod_not_found")
        return pod

    def _decide(self, req: CniRequest, pod: Mapping[str, Any]) -> Decision:
        try:
            return self._redirector.decide(pod)
        except Exception as e:
            raise self._failed(req, "decide redirect", e) from e

    def _failed(
        self,
        req: CniRequest,
        step: str,
        error: Exception,
        *,
        retry: bool | None = None,
    ) -> Refused:
        """`retry`: the step's own answer; None: the error's (agent.errors.retry_later)."""
        status, code = FAILURE_REPLY[retry_later(error) if retry is None else retry]
        msg = f"pod {req.pod_ref}: {step} failed: {error}"
        log.error("%s failed", step, extra={"fields": {**self._fields(req), "error": str(error)}})
        return Refused(
            failure(status, code, msg, f"{type(error).__name__}: {error}"),
            STEP_REASONS.get(step, "internal_error"),
        )

    def _remember(self, req: CniRequest, pod: Mapping[str, Any], *, redirected: bool) -> None:
        """The runtime's word on which netns is this pod's: later looks go by it, not by IP."""
        uid = req.pod_uid or str((pod.get("metadata") or {}).get("uid") or "")
        self._sandboxes.put(
            Sandbox(
                req.container_id,
                req.ifname,
                req.pod_namespace,
                req.pod_name,
                uid,
                req.netns,
                redirected,
                netns_id=netns_ident(req.netns),
            )
        )

    def _log_result(self, req: CniRequest, result: str, reason: str) -> None:
        log.info("pod %s", result, extra={"fields": {**self._fields(req), "reason": reason}})

    @staticmethod
    def _fields(req: CniRequest) -> dict[str, str]:
        return {
            "command": req.command,
            "pod": req.pod_ref,
            "containerId": req.container_id,
            "netns": req.netns,
        }
