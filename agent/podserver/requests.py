"""The pod server's vocabulary: a CNI request as the plugin sends it, and the replies to it.

A reply is an HTTP status and the wire protocol's JSON body (plugin.wire); a failed step's
status and CNI code come from FAILURE_REPLY, by the error's retry-or-give-up axis; `Refused`
ends a request early with its reply.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agent.errors import AgentError
from agent.excerpt import bounded
from plugin import wire

FAILURE_REPLY: dict[bool, tuple[int, int]] = {
    True: (503, wire.TRY_AGAIN_LATER),  # retry later: the runtime tries the sandbox again
    False: (500, wire.INTERNAL),  # give up: the sandbox fails
}
"""A failed step's HTTP status and CNI code, by its error's retry-or-give-up axis
(agent.errors.retry_later): the one place a failure becomes a CNI code."""


@dataclass(frozen=True)
class Reply:
    """An HTTP status and the JSON body of the wire protocol."""

    status: int
    body: Mapping[str, object]

    @property
    def result(self) -> str:
        """redirected, skipped, error (the metric's label)."""
        return str(self.body.get("result", "error"))


MAX_REPLY_TEXT = 1024
"""A reply's message or details: one escaped line at most this long (the runtime shows it to
the pod's owner as an event; the agent's log has the whole story)."""


def ok(result: str, reason: str) -> Reply:
    return Reply(200, wire.reply(result, bounded(reason, MAX_REPLY_TEXT)))


def failure(status: int, code: int, msg: str, details: str = "") -> Reply:
    return Reply(
        status,
        wire.error_reply(
            code, bounded(msg, MAX_REPLY_TEXT), bounded(details, MAX_REPLY_TEXT) if details else ""
        ),
    )


class Refused(AgentError):
    """Ends a request early with `reply`; `reason` labels istio_cni_pods_refused_total."""

    def __init__(self, reply: Reply, reason: str = "internal_error") -> None:
        super().__init__(reply.body.get("msg", ""))
        self.reply = reply
        self.reason = reason


# The step that failed, as the refusal reason of agent.podserver.metrics.REFUSAL_REASONS.


def bad(code: int, msg: str) -> Refused:
    """A request the agent cannot read: 400 with the CNI code of what is wrong with it."""
    return Refused(failure(400, code, msg), "bad_request")


@dataclass(frozen=True)
class CniRequest:
    """The body of /v1/cni/add, /check and /del."""

    command: str
    container_id: str
    netns: str
    ifname: str
    pod_name: str
    pod_namespace: str
    pod_uid: str
    ips: tuple[str, ...] = ()
    """Addresses of the prevResult (the pod's IPs before the API server knows them)."""
    started_at: object = None
    """The plugin process's start as it reports it (wire `startedAt`), unchecked: only
    agent.podserver.metrics.exec_seconds reads it, and believes it only within bounds."""

    @property
    def pod_ref(self) -> str:
        return f"{self.pod_namespace}/{self.pod_name}"

    @property
    def has_pod(self) -> bool:
        return bool(self.pod_name and self.pod_namespace)

    @classmethod
    def parse(cls, body: bytes, command: str) -> CniRequest:
        try:
            data = wire.parse_cni_request(body, command=command)
        except wire.WireError as e:
            raise bad(wire.DECODING_FAILURE, f"{command} request: {e}") from e
        if not data["containerId"]:
            raise bad(wire.INVALID_ENV, f"{command} request: containerId is empty")
        if command in ("ADD", "CHECK") and not data["netns"]:
            raise bad(wire.INVALID_ENV, f"{command} request: netns is empty")
        return cls(
            command,
            data["containerId"],
            data["netns"],
            data["ifname"],
            data["podName"],
            data["podNamespace"],
            data["podUid"],
            _result_ips(data.get("prevResult")),
            data.get("startedAt"),
        )


def _result_ips(result: object) -> tuple[str, ...]:
    """The addresses (CIDR without the prefix length) of a CNI result: `ips[].address`, or
    `ip4.ip` and `ip6.ip` in a 0.1.0/0.2.0 result."""
    if not isinstance(result, Mapping):
        return ()
    ips = result.get("ips")
    if not isinstance(ips, list):
        legacy = (result.get(family) for family in ("ip4", "ip6"))
        ips = [{"address": c.get("ip")} for c in legacy if isinstance(c, Mapping)]
    return tuple(
        str(e["address"]).split("/")[0]
        for e in ips
        if isinstance(e, Mapping) and isinstance(e.get("address"), str)
    )
