"""The pod server's request logic (agent.podserver.handlers), driven without HTTP."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from agent.errors import ApiLookupError, InvalidAnnotationError, RedirectError
from agent.podserver.requests import CniRequest
from plugin import wire
from tests.podserver.helpers import (
    HandlerRig,
    InMemoryPods,
    ScriptedRedirector,
    StandInDecision,
    build_rig,
    cni_body,
    fields_of,
)


@dataclass(frozen=True)
class AddCase:
    """One ADD: how the world looks, what the reply must be."""

    id: str
    arrange: Callable[[InMemoryPods, ScriptedRedirector], None]
    status: int
    result: str | None = None  # redirected/skipped for 200
    code: int | None = None  # CNI code for errors
    msg_has: tuple[str, ...] = ()
    body: bytes | None = None


def _nothing(pods: InMemoryPods, redirector: ScriptedRedirector) -> None:
    pass


def _skip(reason: str) -> Callable[[InMemoryPods, ScriptedRedirector], None]:
    def arrange(pods: InMemoryPods, redirector: ScriptedRedirector) -> None:
        redirector.decisions["web-0"] = StandInDecision(False, reason)

    return arrange


def _remove_pod(pods: InMemoryPods, redirector: ScriptedRedirector) -> None:
    pods.pods.clear()


def _api_down(pods: InMemoryPods, redirector: ScriptedRedirector) -> None:
    pods.error = ApiLookupError("get pod app/web-0: API server answered 503 Service Unavailable")


def _apply_fails(pods: InMemoryPods, redirector: ScriptedRedirector) -> None:
    redirector.apply_error = RedirectError("apply rules in /var/run/netns/cni-test: exit 4")


def _bad_annotation(pods: InMemoryPods, redirector: ScriptedRedirector) -> None:
    redirector.apply_error = InvalidAnnotationError(
        "annotation traffic.sidecar.istio.io/includeOutboundPorts: 'x' is not a port"
    )


def _decide_crashes(pods: InMemoryPods, redirector: ScriptedRedirector) -> None:
    redirector.decide_error = KeyError("spec")


ADD_CASES = [
    AddCase("sidecar-redirected", _nothing, 200, "redirected"),
    AddCase(
        "excluded-namespace-skipped",
        _skip("namespace app is excluded"),
        200,
        "skipped",
        msg_has=("namespace app is excluded",),
    ),
    AddCase(
        "no-sidecar-skipped",
        _skip("no istio-proxy container"),
        200,
        "skipped",
        msg_has=("no istio-proxy container",),
    ),
    AddCase(
        "pod-missing-try-again",
        _remove_pod,
        503,
        code=11,
        msg_has=("app/web-0", "not found", "try again later"),
    ),
    AddCase(
        "api-down-try-again", _api_down, 503, code=11, msg_has=("app/web-0", "look up pod", "503")
    ),
    AddCase(
        "apply-fails-error",
        _apply_fails,
        500,
        code=999,
        msg_has=("app/web-0", "apply redirect rules", "exit 4"),
    ),
    AddCase(
        "invalid-annotation-error",
        _bad_annotation,
        500,
        code=999,
        msg_has=("app/web-0", "includeOutboundPorts", "'x'"),
    ),
    AddCase(
        "decide-crash-error",
        _decide_crashes,
        500,
        code=999,
        msg_has=("app/web-0", "decide redirect"),
    ),
    AddCase(
        "no-pod-args-skipped",
        _nothing,
        200,
        "skipped",
        msg_has=("no Kubernetes pod",),
        body=cni_body(pod="", namespace=""),
    ),
    AddCase("not-json", _nothing, 400, code=6, msg_has=("not JSON",), body=b"{nope"),
    AddCase("not-an-object", _nothing, 400, code=6, msg_has=("JSON object",), body=b"[1]"),
    AddCase(
        "empty-container-id",
        _nothing,
        400,
        code=4,
        msg_has=("containerId",),
        body=cni_body(container_id=""),
    ),
    AddCase("empty-netns", _nothing, 400, code=4, msg_has=("netns",), body=cni_body(netns="")),
    AddCase("command-mismatch", _nothing, 400, code=6, msg_has=("DEL",), body=cni_body("DEL")),
    AddCase(
        "field-not-string",
        _nothing,
        400,
        code=6,
        msg_has=("podName",),
        body=json.dumps({**json.loads(cni_body()), "podName": 7}).encode(),
    ),
]


@pytest.mark.parametrize("case", ADD_CASES, ids=[c.id for c in ADD_CASES])
def test_add(case: AddCase, rig: HandlerRig) -> None:
    case.arrange(rig.pods, rig.redirector)
    reply = rig.handlers.add(case.body if case.body is not None else cni_body())
    assert reply.status == case.status, reply.body
    text = json.dumps(reply.body)
    for part in case.msg_has:
        assert part in text
    if case.status == 200:
        assert wire.parse_reply(wire.encode(reply.body))["result"] == case.result
    else:
        error = wire.parse_error_reply(wire.encode(reply.body), reply.status)
        assert error["code"] == case.code
        assert error["msg"]
    # Fail closed: rules are applied exactly when the reply says redirected.
    assert bool(rig.redirector.applied) == (case.result == "redirected")
    assert rig.count("add", case.result or "error") == 1


def test_add_applies_in_the_requests_netns_and_remembers_the_sandbox(rig: HandlerRig) -> None:
    reply = rig.handlers.add(cni_body(netns="/proc/4242/ns/net", container_id="abc"))
    assert reply.result == "redirected"
    assert "iptables-nft" in str(reply.body["reason"])
    assert rig.redirector.applied == [("/proc/4242/ns/net", "web-0")]
    sandbox = rig.sandboxes.get("abc")
    assert sandbox is not None and sandbox.redirected and sandbox.netns == "/proc/4242/ns/net"


def test_add_passes_the_pod_uid_to_the_lookup(rig: HandlerRig) -> None:
    assert rig.handlers.add(cni_body(uid="uid-1")).result == "redirected"
    assert rig.pods.lookups[-1] == ("app", "web-0", "uid-1")
    # Same name, other uid: a recreated pod, the sandbox is not for the pod the API knows.
    reply = rig.handlers.add(cni_body(uid="uid-2"))
    assert (reply.status, reply.body["code"]) == (503, 11)
    assert "uid-2" in str(reply.body["msg"])


def test_add_no_pod_args_needs_no_lookup(rig: HandlerRig) -> None:
    rig.handlers.add(cni_body(pod="", namespace=""))
    assert rig.pods.lookups == []


def test_add_logs_result_and_reason(rig: HandlerRig, agent_log: pytest.LogCaptureFixture) -> None:
    rig.redirector.decisions["web-0"] = StandInDecision(False, "istio-init present")
    rig.handlers.add(cni_body(container_id="abc"))
    fields = fields_of(agent_log.records, lambda r: r.getMessage() == "pod skipped")
    assert fields == [
        {
            "command": "ADD",
            "pod": "app/web-0",
            "containerId": "abc",
            "netns": "/var/run/netns/cni-test",
            "reason": "istio-init present",
        }
    ]


CHECK_CASES = [
    # id, rules in place, decision, pod present -> status, result/code
    ("rules-present", True, None, True, 200, "redirected"),
    ("rules-missing", False, None, True, 500, 999),
    ("not-redirected-pod", False, StandInDecision(False, "no sidecar"), True, 200, "skipped"),
    ("pod-missing", True, None, False, 503, 11),
]


@pytest.mark.parametrize(
    ("rules", "decision", "pod_present", "status", "expected"),
    [c[1:] for c in CHECK_CASES],
    ids=[c[0] for c in CHECK_CASES],
)
def test_check(
    rig: HandlerRig,
    rules: bool,
    decision: StandInDecision | None,
    pod_present: bool,
    status: int,
    expected: str | int,
) -> None:
    rig.redirector.rules_in_place = rules
    if decision is not None:
        rig.redirector.decisions["web-0"] = decision
    if not pod_present:
        rig.pods.pods.clear()
    reply = rig.handlers.check(cni_body("CHECK"))
    assert reply.status == status
    if status == 200:
        assert reply.body["result"] == expected
    else:
        assert reply.body["code"] == expected
        assert "app/web-0" in str(reply.body["msg"])
    assert rig.redirector.applied == []  # CHECK never changes the netns


def test_del_removes_state_and_is_idempotent(rig: HandlerRig) -> None:
    rig.handlers.add(cni_body(container_id="abc"))
    assert len(rig.sandboxes) == 1
    first = rig.handlers.delete(cni_body("DEL", container_id="abc", netns=""))
    assert (first.status, first.body["reason"]) == (200, "sandbox state removed")
    assert len(rig.sandboxes) == 0
    again = rig.handlers.delete(cni_body("DEL", container_id="abc", netns=""))
    assert (again.status, again.body["result"]) == (200, "skipped")
    assert rig.count("del", "skipped") == 2


def test_del_needs_no_pod(rig: HandlerRig) -> None:
    rig.pods.error = ApiLookupError("API server down")
    assert rig.handlers.delete(cni_body("DEL")).status == 200
    assert rig.pods.lookups == []


def test_gc_keeps_only_valid_attachments(rig: HandlerRig) -> None:
    for cid in ("a", "b", "c"):
        rig.handlers.add(cni_body(container_id=cid))
    reply = rig.handlers.gc(wire.encode(wire.gc_request([("b", "eth0"), ("c", "net1")])))
    assert reply.status == 200
    assert reply.body["reason"] == "removed state of 2 sandboxes"
    assert rig.sandboxes.get("b") is not None
    assert rig.sandboxes.get("a") is None and rig.sandboxes.get("c") is None  # c: other ifname


@pytest.mark.parametrize(
    "body",
    [
        b"{}",
        b'{"validAttachments": {}}',
        b'{"validAttachments": [{"containerId": 1}]}',
        b"x",
    ],
    ids=["missing", "not-list", "bad-item", "not-json"],
)
def test_gc_rejects_bad_bodies(rig: HandlerRig, body: bytes) -> None:
    rig.handlers.add(cni_body(container_id="a"))
    reply = rig.handlers.gc(body)
    assert (reply.status, reply.body["code"]) == (400, 6)
    assert len(rig.sandboxes) == 1  # nothing dropped on a bad request


def test_status_follows_readiness(rig: HandlerRig) -> None:
    assert (rig.handlers.status().status, rig.handlers.status().body) == (200, {"ready": True})
    rig.not_ready.append("pod cache has not listed this node's pods yet")
    reply = rig.handlers.status()
    assert reply.status == 503
    assert wire.parse_status_reply(wire.encode(reply.body)) == {
        "ready": False,
        "reason": "pod cache has not listed this node's pods yet",
    }


def test_log_writes_plugin_line_with_pod(
    rig: HandlerRig, agent_log: pytest.LogCaptureFixture
) -> None:
    body = wire.encode(
        wire.log_request(
            level="warn",
            msg="agent slow",
            pod_name="web-0",
            pod_namespace="app",
            container_id="abc",
        )
    )
    assert rig.handlers.log(body).status == 200
    [record] = [r for r in agent_log.records if r.name == "agent.plugin"]
    assert (record.levelno, record.getMessage()) == (logging.WARNING, "agent slow")
    assert record.fields == {  # type: ignore[attr-defined]  # set through extra=
        "source": "plugin",
        "pod": "app/web-0",
        "containerId": "abc",
    }


def test_log_rejects_unknown_level(rig: HandlerRig) -> None:
    body = json.dumps(
        {"level": "loud", "msg": "x", "podName": "", "podNamespace": "", "containerId": ""}
    ).encode()
    reply = rig.handlers.log(body)
    assert (reply.status, reply.body["code"]) == (400, 6)
    assert "level" in str(reply.body["msg"])


def test_unexpected_failure_is_an_error_not_a_pass() -> None:
    class Broken(InMemoryPods):
        def get_pod(self, namespace: str, name: str, uid: str | None = None) -> Any:
            return "not a pod"  # a bug somewhere below the handler

    rig = build_rig(Broken(), ScriptedRedirector())
    reply = rig.handlers.add(cni_body())
    assert reply.status >= 500 and reply.body["code"] == 999


def test_latency_is_observed_per_command(rig: HandlerRig) -> None:
    rig.handlers.add(cni_body())
    rig.handlers.check(cni_body("CHECK"))
    for command in ("add", "check"):
        count = rig.registry.get_sample_value(
            "istio_cni_plugin_request_duration_seconds_count", {"command": command}
        )
        assert count == 1


@pytest.mark.parametrize(
    ("prev", "ips"),
    [
        (
            {"cniVersion": "1.0.0", "ips": [{"address": "10.1.0.5/24"}, {"address": "fd00::5/64"}]},
            ("10.1.0.5", "fd00::5"),
        ),
        (
            {"cniVersion": "0.2.0", "ip4": {"ip": "10.1.0.5/24"}, "ip6": {"ip": "fd00::5/64"}},
            ("10.1.0.5", "fd00::5"),
        ),
        ({"cniVersion": "0.1.0", "ip4": {"ip": "10.1.0.5/24"}, "dns": {}}, ("10.1.0.5",)),
        (None, ()),
    ],
    ids=["list-shape", "0.2.0-shape", "0.1.0-one-family", "none"],
)
def test_request_reads_the_pod_addresses_of_every_result_shape(
    prev: dict[str, Any] | None, ips: tuple[str, ...]
) -> None:
    """A list without cniVersion runs at 0.1.0: its prevResult has ip4/ip6, not ips[]."""
    body = json.dumps(
        {
            "command": "ADD",
            "containerId": "c1",
            "netns": "/var/run/netns/x",
            "ifname": "eth0",
            "podName": "p",
            "podNamespace": "default",
            "podUid": "u",
            "cniVersion": "0.2.0",
            "prevResult": prev,
        }
    ).encode()
    assert CniRequest.parse(body, "ADD").ips == ips
