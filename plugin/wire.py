"""Plugin <-> agent wire format: the paths, JSON bodies and limits both sides share.

Standard library only. The agent imports this module (and nothing else from `plugin`), so both
sides build and check the same bodies; the plugin's HTTP/1.1 client framing lives apart in
`plugin.framing`. Requests go over HTTP/1.1 on the agent's Unix socket:

    POST /v1/cni/add | /v1/cni/check | /v1/cni/del   CniRequest
    POST /v1/cni/gc                                   GcRequest
    GET  /v1/status                                   -> StatusReply (200 ready, 503 not ready)
    POST /v1/log                                      LogRequest
    <run dir>/istio-cni.log[.1]                       plugin lines the agent did not take (JSON
                                                      per line; written by plugin/log.py, read by
                                                      agent/plugin_log_file.py)
    200 Reply {"result": "redirected"|"skipped", "reason"}; 4xx/5xx ErrorReply {code, msg, details}

The TypedDicts below exist for type checkers only: importing `typing` at run time costs the
plugin ~10 ms of start-up on every pod sandbox. Import them under `TYPE_CHECKING`.
"""

from __future__ import annotations

from plugin import fastjson

TYPE_CHECKING = False  # not typing's: importing typing costs ~10 ms of start-up
if TYPE_CHECKING:
    from typing import Any, NotRequired, TypedDict

    class CniRequest(TypedDict):
        command: str
        containerId: str
        netns: str
        ifname: str
        podName: str
        podNamespace: str
        podUid: str
        cniVersion: str
        prevResult: dict[str, Any] | None
        startedAt: NotRequired[float]

    class Attachment(TypedDict):
        containerId: str
        ifname: str

    class GcRequest(TypedDict):
        validAttachments: list[Attachment]

    class LogRequest(TypedDict):
        level: str
        msg: str
        podName: str
        podNamespace: str
        containerId: str
        fields: NotRequired[dict[str, str]]

    class Reply(TypedDict):
        result: str
        reason: str

    class ErrorReply(TypedDict):
        code: int
        msg: str
        details: str

    class StatusReply(TypedDict):
        ready: bool
        reason: NotRequired[str]


# CNI error codes (the CNI specification's well-known ones; 999 is libcni's "unknown error"):
# the plugin fails commands with them, the agent's error replies carry them.
INCOMPATIBLE_VERSION = 1
UNSUPPORTED_FIELD = 2
UNKNOWN_CONTAINER = 3
INVALID_ENV = 4
IO_FAILURE = 5
DECODING_FAILURE = 6
INVALID_CONFIG = 7
TRY_AGAIN_LATER = 11
NOT_AVAILABLE = 50
"""STATUS (1.1): the plugin cannot service ADD requests."""
INTERNAL = 999

SOCKET_NAME = "pluginevent.sock"
LOG_FILE_NAME = "istio-cni.log"
"""The plugin's fallback log in the run dir (Istio's plugin writes a rolling log of that name)."""
LOG_FILE_ROTATED = LOG_FILE_NAME + ".1"
PATH_ADD = "/v1/cni/add"
PATH_CHECK = "/v1/cni/check"
PATH_DEL = "/v1/cni/del"
PATH_GC = "/v1/cni/gc"
PATH_STATUS = "/v1/status"
PATH_LOG = "/v1/log"
COMMAND_PATHS = {"ADD": PATH_ADD, "CHECK": PATH_CHECK, "DEL": PATH_DEL}
RESULT_REDIRECTED = "redirected"
RESULT_SKIPPED = "skipped"
LOG_LEVELS = ("debug", "info", "warn", "error")
MAX_BODY = 1 << 20
"""The plugin reads at most this many bytes of a reply body (a runaway agent cannot exhaust it)."""

_CNI_FIELDS = ("containerId", "netns", "ifname", "podName", "podNamespace", "podUid", "cniVersion")
_LOG_FIELDS = ("level", "msg", "podName", "podNamespace", "containerId")


class WireError(ValueError):
    """A message that does not follow the wire format; the text names the field at fault."""


def socket_path(run_dir: str) -> str:
    """The agent's socket inside `cni_agent_run_dir`."""
    return run_dir.rstrip("/") + "/" + SOCKET_NAME


def encode(obj: object) -> bytes:
    """Compact UTF-8 JSON, the only body encoding on the wire."""
    return fastjson.dumps_compact(obj).encode()


def decode_object(body: bytes, what: str) -> dict[str, Any]:
    """The JSON object in `body`, or WireError naming `what` could not be read."""
    try:
        obj = fastjson.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise WireError(f"{what}: not JSON: {e}") from e
    if not isinstance(obj, dict):
        raise WireError(f"{what}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _strings(obj: dict[str, Any], fields: tuple[str, ...], what: str) -> None:
    for field in fields:
        if not isinstance(obj.get(field), str):
            raise WireError(f"{what}: field {field!r} must be a string")


def cni_request(
    *,
    command: str,
    container_id: str,
    netns: str,
    ifname: str,
    pod_name: str,
    pod_namespace: str,
    pod_uid: str,
    cni_version: str,
    prev_result: dict[str, Any] | None,
    started_at: float | None = None,
) -> CniRequest:
    """The body of POST /v1/cni/{add,check,del}. `started_at`: when the plugin process started,
    in seconds of CLOCK_BOOTTIME (the agent, on the same node and clock, measures the whole exec
    up to its answer from it; an agent of an earlier version ignores the field)."""
    body: CniRequest = {
        "command": command,
        "containerId": container_id,
        "netns": netns,
        "ifname": ifname,
        "podName": pod_name,
        "podNamespace": pod_namespace,
        "podUid": pod_uid,
        "cniVersion": cni_version,
        "prevResult": prev_result,
    }
    if started_at is not None:
        body["startedAt"] = started_at
    return body


def parse_cni_request(body: bytes, *, command: str | None = None) -> CniRequest:
    """Check an ADD/CHECK/DEL body; `command`, when given, must match the one in the body."""
    obj = decode_object(body, "CNI request")
    if obj.get("command") not in COMMAND_PATHS:
        raise WireError(f"CNI request: field 'command' must be one of {sorted(COMMAND_PATHS)}")
    if command is not None and obj["command"] != command:
        raise WireError(f"CNI request: command {obj['command']!r} sent to the {command} path")
    _strings(obj, _CNI_FIELDS, "CNI request")
    prev = obj.get("prevResult")
    if prev is not None and not isinstance(prev, dict):
        raise WireError("CNI request: field 'prevResult' must be an object or null")
    obj.setdefault("prevResult", None)
    return obj  # type: ignore[return-value]  # checked field by field above


def gc_request(valid_attachments: list[tuple[str, str]]) -> GcRequest:
    """The body of POST /v1/cni/gc from (containerId, ifname) pairs."""
    return {"validAttachments": [{"containerId": c, "ifname": i} for c, i in valid_attachments]}


def parse_gc_request(body: bytes) -> GcRequest:
    obj = decode_object(body, "GC request")
    items = obj.get("validAttachments")
    if not isinstance(items, list):
        raise WireError("GC request: field 'validAttachments' must be a list")
    for n, item in enumerate(items):
        if not isinstance(item, dict):
            raise WireError(f"GC request: validAttachments[{n}] must be an object")
        _strings(item, ("containerId", "ifname"), f"GC request: validAttachments[{n}]")
    return obj  # type: ignore[return-value]  # checked above


def log_request(
    *,
    level: str,
    msg: str,
    pod_name: str,
    pod_namespace: str,
    container_id: str,
    fields: dict[str, str] | None = None,
) -> LogRequest:
    """The body of POST /v1/log: one plugin log line for the agent's log, with the line's own
    fields apart from its message (an agent of an earlier version ignores them)."""
    body: LogRequest = {
        "level": level,
        "msg": msg,
        "podName": pod_name,
        "podNamespace": pod_namespace,
        "containerId": container_id,
    }
    if fields:
        body["fields"] = fields
    return body


def parse_log_request(body: bytes) -> LogRequest:
    obj = decode_object(body, "log request")
    _strings(obj, _LOG_FIELDS, "log request")
    if obj["level"] not in LOG_LEVELS:
        raise WireError(f"log request: field 'level' must be one of {list(LOG_LEVELS)}")
    fields = obj.get("fields", {})
    if not isinstance(fields, dict) or not all(isinstance(v, str) for v in fields.values()):
        raise WireError("log request: field 'fields' must be an object of strings")
    return obj  # type: ignore[return-value]  # checked above


def reply(result: str, reason: str) -> Reply:
    """The agent's 200 body for ADD/CHECK/DEL/GC."""
    return {"result": result, "reason": reason}


def parse_reply(body: bytes) -> Reply:
    obj = decode_object(body, "agent reply")
    if obj.get("result") not in (RESULT_REDIRECTED, RESULT_SKIPPED):
        raise WireError("agent reply: field 'result' must be 'redirected' or 'skipped'")
    if not isinstance(obj.get("reason", ""), str):
        raise WireError("agent reply: field 'reason' must be a string")
    obj.setdefault("reason", "")
    return obj  # type: ignore[return-value]  # checked above


def error_reply(code: int, msg: str, details: str = "") -> ErrorReply:
    """The agent's 4xx/5xx body; `code` is a CNI error code the plugin passes on."""
    return {"code": code, "msg": msg, "details": details}


def parse_error_reply(body: bytes, status: int) -> ErrorReply:
    """Lenient: whatever the agent (or something in its place) sent becomes an ErrorReply."""
    try:
        obj = decode_object(body, "agent error reply")
    except WireError:
        text = body[:512].decode("utf-8", "replace").strip()
        return error_reply(999, f"agent answered HTTP {status}", text)
    code = obj.get("code")
    if isinstance(code, bool) or not isinstance(code, int) or code <= 0:
        code = 999
    msg = obj.get("msg")
    details = obj.get("details")
    return error_reply(
        code,
        msg if isinstance(msg, str) and msg else f"agent answered HTTP {status}",
        details if isinstance(details, str) else "",
    )


def status_reply(ready: bool, reason: str = "") -> StatusReply:
    return {"ready": ready, "reason": reason} if reason else {"ready": ready}


def parse_status_reply(body: bytes) -> StatusReply:
    obj = decode_object(body, "status reply")
    if not isinstance(obj.get("ready"), bool):
        raise WireError("status reply: field 'ready' must be a boolean")
    if not isinstance(obj.get("reason", ""), str):
        raise WireError("status reply: field 'reason' must be a string")
    return obj  # type: ignore[return-value]  # checked above
