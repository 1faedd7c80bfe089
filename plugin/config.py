"""The network configuration on stdin: the CNI fields and our entry's fields, checked once.

Our entry (written by the installer): plugin_log_level, log_as_json, cni_agent_run_dir,
exclude_namespaces, pod_namespace and agent_pod_prefix (the agent's own pods: that namespace, the
DaemonSet's name prefix), optional agent_timeout_seconds. `pod_name` (one agent pod by name) is
what entries of earlier versions carry, still honoured. Other fields (ipam, dns, capabilities, a
runtime's extras) are ignored.

For a pod started while the agent is unreachable (plugin/plain.py): `ambient_enabled` (Istio's
field; None when absent or not a boolean) and the pod's annotations the runtime hands in
`runtimeConfig` (kept as given, any type: judged only when the agent does not answer).
"""

from __future__ import annotations

from plugin import fastjson
from plugin.errors import CniError
from plugin.versions import SUPPORTED, UNVERSIONED
from plugin.wire import DECODING_FAILURE, INCOMPATIBLE_VERSION, INVALID_CONFIG

TYPE_CHECKING = False  # not typing's: importing typing costs ~10 ms of start-up
if TYPE_CHECKING:
    from typing import Any

DEFAULT_RUN_DIR = "/var/run/istio-cni"
DEFAULT_TIMEOUT = 10.0
LOG_LEVELS = ("none", "panic", "fatal", "error", "warn", "info", "debug")
# Names (network, container id): [a-zA-Z0-9][a-zA-Z0-9_.-]*, checked without `re` (start-up).
_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_NAME_CHARS = _ALNUM | frozenset("_.-")
POD_ANNOTATIONS = "io.kubernetes.cri.pod-annotations"
"""The capability our entry declares: libcni hands the pod's annotations as runtimeConfig[it]."""
_ATTACHMENT_KEYS = ("cni.dev/valid-attachments", "cni.dev/attachments")


def is_name(text: str) -> bool:
    """Does `text` match [a-zA-Z0-9][a-zA-Z0-9_.-]* (the CNI spec's name rule)?"""
    return bool(text) and text[0] in _ALNUM and all(c in _NAME_CHARS for c in text)


class NetConf:
    """The checked configuration of one invocation (read-only by convention)."""

    __slots__ = (
        "agent_pod_prefix",
        "agent_run_dir",
        "agent_timeout",
        "ambient_enabled",
        "cni_version",
        "exclude_namespaces",
        "log_as_json",
        "log_level",
        "name",
        "pod_annotations",
        "pod_name",
        "pod_namespace",
        "prev_result",
        "type",
        "valid_attachments",
    )

    def __init__(
        self,
        *,
        cni_version: str,
        name: str,
        type: str,
        prev_result: dict[str, Any] | None = None,
        log_level: str = "info",
        log_as_json: bool = False,
        agent_run_dir: str = DEFAULT_RUN_DIR,
        exclude_namespaces: tuple[str, ...] = (),
        pod_namespace: str = "",
        pod_name: str = "",
        agent_pod_prefix: str = "",
        agent_timeout: float = DEFAULT_TIMEOUT,
        valid_attachments: list[tuple[str, str]] | None = None,
        ambient_enabled: bool | None = None,
        pod_annotations: object = None,
    ) -> None:
        self.cni_version = cni_version
        self.name = name
        self.type = type
        self.prev_result = prev_result
        self.log_level = log_level
        self.log_as_json = log_as_json
        self.agent_run_dir = agent_run_dir
        self.exclude_namespaces = exclude_namespaces
        self.pod_namespace = pod_namespace
        self.pod_name = pod_name
        self.agent_pod_prefix = agent_pod_prefix
        self.agent_timeout = agent_timeout
        self.valid_attachments = valid_attachments
        self.ambient_enabled = ambient_enabled
        self.pod_annotations = pod_annotations


def decode(stdin: bytes) -> dict[str, Any]:
    """The JSON object on stdin (CNI code 6 when it is not one)."""
    try:
        obj = fastjson.loads(stdin)
    except (ValueError, UnicodeDecodeError) as e:
        raise CniError(DECODING_FAILURE, "network config on stdin is not JSON", str(e)) from e
    if not isinstance(obj, dict):
        raise CniError(
            DECODING_FAILURE, f"network config must be a JSON object, got {type(obj).__name__}"
        )
    return obj


def parse(stdin: bytes, *, command: str) -> NetConf:
    """Check the config for `command`; CniError names the field at fault."""
    raw = decode(stdin)
    version = _string(raw, "cniVersion", "") or UNVERSIONED
    if version not in SUPPORTED:
        raise CniError(
            INCOMPATIBLE_VERSION,
            f"incompatible CNI version {version!r}",
            f"supported versions: {', '.join(SUPPORTED)}",
        )
    name = _string(raw, "name")
    if not is_name(name):
        raise CniError(
            INVALID_CONFIG,
            f"invalid network name {name!r}",
            "letters, digits, '_', '.' and '-', starting with a letter or digit",
        )
    prev = raw.get("prevResult")
    if prev is not None and not isinstance(prev, dict):
        raise CniError(INVALID_CONFIG, "field 'prevResult' must be an object")
    return NetConf(
        cni_version=version,
        name=name,
        type=_string(raw, "type"),
        prev_result=prev,
        log_level=_level(raw),
        log_as_json=_bool(raw, "log_as_json"),
        agent_run_dir=_run_dir(raw),
        exclude_namespaces=_namespaces(raw),
        pod_namespace=_string(raw, "pod_namespace", ""),
        pod_name=_string(raw, "pod_name", ""),
        agent_pod_prefix=_string(raw, "agent_pod_prefix", ""),
        agent_timeout=_timeout(raw),
        valid_attachments=_attachments(raw) if command == "GC" else None,
        ambient_enabled=_maybe_bool(raw, "ambient_enabled"),
        pod_annotations=_runtime_config(raw).get(POD_ANNOTATIONS),
    )


def _string(raw: dict[str, Any], field: str, default: str | None = None) -> str:
    value = raw.get(field)
    if value is None and default is not None:
        return default
    if not isinstance(value, str) or (default is None and not value):
        what = "missing" if value is None else "must be a non-empty string"
        raise CniError(INVALID_CONFIG, f"network config field {field!r} {what}")
    return value


def _bool(raw: dict[str, Any], field: str) -> bool:
    value = raw.get(field, False)
    if not isinstance(value, bool):
        raise CniError(INVALID_CONFIG, f"network config field {field!r} must be true or false")
    return value


def _maybe_bool(raw: dict[str, Any], field: str) -> bool | None:
    value = raw.get(field)
    return value if isinstance(value, bool) else None


def _runtime_config(raw: dict[str, Any]) -> dict[str, Any]:
    value = raw.get("runtimeConfig")
    return value if isinstance(value, dict) else {}


def _level(raw: dict[str, Any]) -> str:
    level = _string(raw, "plugin_log_level", "info")
    if level not in LOG_LEVELS:
        raise CniError(
            INVALID_CONFIG,
            f"network config field 'plugin_log_level' {level!r} is not one of "
            f"{', '.join(LOG_LEVELS)}",
        )
    return level


def _run_dir(raw: dict[str, Any]) -> str:
    run_dir = _string(raw, "cni_agent_run_dir", DEFAULT_RUN_DIR)
    if not run_dir.startswith("/"):
        raise CniError(
            INVALID_CONFIG, f"network config field 'cni_agent_run_dir' {run_dir!r} is not absolute"
        )
    return run_dir


def _namespaces(raw: dict[str, Any]) -> tuple[str, ...]:
    value = raw.get("exclude_namespaces")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CniError(
            INVALID_CONFIG, "network config field 'exclude_namespaces' must be a list of strings"
        )
    return tuple(value)


def _timeout(raw: dict[str, Any]) -> float:
    value = raw.get("agent_timeout_seconds")
    if value is None:
        return DEFAULT_TIMEOUT
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 300:
        raise CniError(
            INVALID_CONFIG,
            "network config field 'agent_timeout_seconds' must be "
            f"a number of seconds in (0, 300], got {value!r}",
        )
    return float(value)


def _attachments(raw: dict[str, Any]) -> list[tuple[str, str]]:
    field = next((k for k in _ATTACHMENT_KEYS if k in raw), _ATTACHMENT_KEYS[0])
    value = raw.get(field)
    if not isinstance(value, list):
        raise CniError(INVALID_CONFIG, f"GC needs network config field {field!r} (a list)")
    pairs = []
    for n, item in enumerate(value):
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("containerID"), str)
            or not isinstance(item.get("ifname"), str)
        ):
            raise CniError(
                INVALID_CONFIG, f"{field}[{n}] must be an object with string containerID and ifname"
            )
        pairs.append((item["containerID"], item["ifname"]))
    return pairs
