"""The agent's settings: one typed, frozen object loaded from the chart's `config.yaml`.

Every key is declared once, here, with its type, default and meaning; a check beyond the type
(absolute path, port, address, ...) is named in the field's metadata, and the loader derives how
to convert and check each key from those two. The chart's `values.yaml`,
`values.schema.json` and ConfigMap template name the same keys; `tests/chart` loads the rendered
ConfigMap through `load_settings` so the two cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, assert_never, get_args, get_origin, get_type_hints

import yaml

from agent import constants
from agent.errors import ConfigError, SelectorError
from agent.label_selectors import (
    DEFAULT_ENABLEMENT_SELECTORS,
    EnablementSelector,
    parse_enablement_selectors,
)
from agent.log_levels import LogLevels, parse_log_levels

DEFAULT_CONFIG_PATH = "/etc/istio-cni/config.yaml"
MAX_CONFIG_BYTES = 1 << 20

RepairMode = Literal["repair-in-place", "delete", "label"]
RuleBackend = Literal["auto", "python-iptables", "iptables-legacy", "iptables-nft", "nftables"]
UninstallOnStop = Literal["auto", "always", "never"]

Check = Literal[
    "abs_path", "file_name", "port", "ipv4", "ipv6", "address", "namespace", "log_level", "positive"
]
"""A check beyond the field's type, named in the field's metadata (`{"check": ...}`)."""
ABS_PATH: Mapping[str, Check] = {"check": "abs_path"}
FILE_NAME: Mapping[str, Check] = {"check": "file_name"}
PORT: Mapping[str, Check] = {"check": "port"}
IPV4: Mapping[str, Check] = {"check": "ipv4"}
IPV6: Mapping[str, Check] = {"check": "ipv6"}
ADDRESS: Mapping[str, Check] = {"check": "address"}
NAMESPACE: Mapping[str, Check] = {"check": "namespace"}
LOG_LEVEL: Mapping[str, Check] = {"check": "log_level"}
POSITIVE: Mapping[str, Check] = {"check": "positive"}


@dataclass(frozen=True)
class RepairSettings:
    """What the agent does with pods that started before the plugin was in place."""

    enabled: bool = True
    """Look for broken pods on this node at all."""
    mode: RepairMode = "repair-in-place"
    """repair-in-place: program the pod's netns; delete: delete the pod; label: mark it."""
    labelKey: str = "cni.istio.io/uninitialized"
    """Label set on a broken pod in `label` mode."""
    labelValue: str = "true"
    """Value of that label."""
    initContainerName: str = "istio-validation"
    """Init container whose failure marks a pod as started without redirect."""
    initContainerExitCode: int = 126
    """Exit code of that container's failure (istio-validation's); 0 = any non-zero exit."""
    initContainerTerminationMessage: str = ""
    """When set, that failure must also have left this termination message."""


@dataclass(frozen=True)
class KubeApiSettings:
    """How long the agent's calls to the Kubernetes API may take to answer, in seconds, by kind
    of call (agent.kube.api adds the time to connect: 2 s where a CNI ADD waits, else 5 s), and
    how fast it may make them."""

    lookupTimeoutSeconds: int = field(default=5, metadata=POSITIVE)
    """GET of a pod or namespace that a CNI ADD waits for (not in the caches yet)."""
    updateTimeoutSeconds: int = field(default=10, metadata=POSITIVE)
    """Ambient's status annotation of a pod."""
    listTimeoutSeconds: int = field(default=60, metadata=POSITIVE)
    """The pod and namespace caches' full list."""
    nodeTimeoutSeconds: int = field(default=15, metadata=POSITIVE)
    """Reading this node and patching the not-ready taint away."""
    stopTimeoutSeconds: int = field(default=5, metadata=POSITIVE)
    """Each question of the stop policy at SIGTERM (the agent's pod, its DaemonSet, the node)."""
    readinessTimeoutSeconds: int = field(default=3, metadata=POSITIVE)
    """The readiness `api` check's list of this node's pods, until the pod cache has listed."""
    qps: int = field(default=5, metadata=POSITIVE)
    """Calls per second the agent makes at most, over time (client-go's token bucket; its
    default): a call waits for its turn, as long as its timeout allows."""
    burst: int = field(default=10, metadata=POSITIVE)
    """Calls the agent may make at once before `qps` applies (client-go's default)."""


@dataclass(frozen=True)
class AmbientSettings:
    """Ambient mode: pods selected here are redirected to the node's ztunnel (Istio's AMBIENT_*).

    Istio's `ambient.shareHostNetworkNamespace` has no counterpart: this agent always runs on the
    host network. Istio's `ambient.configDir` is not read by Istio's CNI agent either.
    """

    enabled: bool = False
    """Run the ambient node agent (Istio's AMBIENT_ENABLED); off, ambient pods are left alone."""
    enablementSelectors: tuple[EnablementSelector, ...] = DEFAULT_ENABLEMENT_SELECTORS
    """A pod is ambient when one entry's podSelector matches its labels and namespaceSelector
    its namespace's (Istio's AMBIENT_ENABLEMENT_SELECTOR); empty selector = everything."""
    dnsCapture: bool = True
    """Redirect the pods' DNS (port 53) to ztunnel's DNS proxy (AMBIENT_DNS_CAPTURE)."""
    ipv6: bool = True
    """Also program IPv6 rules in ambient pods (AMBIENT_IPV6)."""
    reconcileIptablesOnStartup: bool = True
    """On start, rewrite rules of already enrolled pods that differ from the expected ones
    (AMBIENT_RECONCILE_POD_RULES_ON_STARTUP)."""
    enableAmbientDetectionRetry: bool = False
    """Retry the namespace lookup of a CNI ADD (ENABLE_AMBIENT_DETECTION_RETRY); off, one try.
    Either way a lookup that fails fails the ADD (retried by the runtime) unless
    `failOpenOnDetectionError`."""
    failOpenOnDetectionError: bool = False
    """When the ADD cannot tell whether a pod is ambient (its namespace cannot be read), start
    it as not ambient instead of failing the ADD: Istio's behaviour without the retry. A pod
    that should be captured may then run uncaptured."""
    ztunnelSocketPath: str = field(default="/var/run/ztunnel/ztunnel.sock", metadata=ABS_PATH)
    """Unix socket the agent serves for ztunnel (ZDS); same path on the node and in the pod
    (Istio's ZTUNNEL_UDS_ADDRESS)."""
    systemNamespace: str = field(default="istio-system", metadata=NAMESPACE)
    """Namespace of the ztunnel pods (label app=ztunnel), never enrolled (SYSTEM_NAMESPACE)."""
    hostProbeSnatAddress: str = field(default=constants.HOST_PROBE_SNAT_V4, metadata=IPV4)
    """IPv4 address kubelet's probes to ambient pods are SNATed to (HOST_PROBE_SNAT_IP)."""
    hostProbeSnatAddressV6: str = field(default=constants.HOST_PROBE_SNAT_V6, metadata=IPV6)
    """IPv6 address kubelet's probes to ambient pods are SNATed to (HOST_PROBE_SNAT_IPV6)."""


@dataclass(frozen=True)
class Settings:
    """The agent's configuration; field names are the `config.yaml` keys (camelCase)."""

    cniBinDir: str = field(default="/opt/cni/bin", metadata=ABS_PATH)
    """Node path of the CNI bin dir, as the container runtime sees it."""
    platform: str = ""
    """The chart's platform preset (`platform`), named where a node path looks wrong."""
    cniConfDir: str = field(default="/etc/cni/net.d", metadata=ABS_PATH)
    """Node path of the CNI config dir."""
    cniConfFileName: str = field(default="", metadata=FILE_NAME)
    """Primary config to chain into (chained: the node's file, never deleted) or our own file's
    name (standalone: refused if a foreign file has it); empty = pick as the runtime does."""
    chained: bool = True
    """Chain into the primary conflist (true) or write a standalone config (false)."""
    istioOwnedCNIConfig: bool = False
    """Write a file that sorts first, holding the primary's plugins plus ours."""
    istioOwnedCNIConfigFileName: str = field(default="02-istio-cni.conflist", metadata=FILE_NAME)
    """Name of that file; it must sort before the primary's."""
    logLevel: str = field(default="info", metadata=LOG_LEVEL)
    """A level (none, panic, fatal, error, warn, info, debug) or Istio's `scope:level,...` list."""
    logAsJson: bool = False
    """Agent and plugin log lines as JSON objects instead of key=value."""
    excludeNamespaces: tuple[str, ...] = ("istio-system", "kube-system")
    """Pods in these namespaces are never redirected."""
    mountedCniBinDir: str = field(default="/host/opt/cni/bin", metadata=ABS_PATH)
    """Where the node's bin dir is mounted in the agent container."""
    mountedCniConfDir: str = field(default="/host/etc/cni/net.d", metadata=ABS_PATH)
    """Where the node's conf dir is mounted in the agent container."""
    pluginSourceDir: str = field(default="/opt/istio-cni/bin", metadata=ABS_PATH)
    """Directory in the image holding the built plugin executables that install copies."""
    cniAgentRunDir: str = field(default="/var/run/istio-cni", metadata=ABS_PATH)
    """Node path of the agent's run dir, holding the plugin's Unix socket (same path in the pod)."""
    hostProcDir: str = field(default="/host/proc", metadata=ABS_PATH)
    """Where the node's /proc is mounted, to find pod network namespaces for repair."""
    mountedNetnsDir: str = field(default="/host/var/run/netns", metadata=ABS_PATH)
    """Where the node's netns dir (runtime-named pod namespaces) is mounted, for repair."""
    mountedCniCacheDir: str = field(default="/host/var/lib/cni", metadata=ABS_PATH)
    """Where the node's libcni cache dir is mounted (read-only): uninstall keeps the plugin while
    a sandbox its runtime will tear down with a cached config still names it."""
    cniNetnsDir: str = field(default="/var/run/netns", metadata=ABS_PATH)
    """Node path of that dir, mounted at the same path (the runtime names namespaces by it):
    readiness checks that it holds the runtime's pod namespaces."""
    metricsPort: int = field(default=15014, metadata=PORT)
    """Port of /healthz, /readyz and /metrics (on the host network)."""
    metricsAddress: str = field(default="", metadata=ADDRESS)
    """Address that port listens on: one IPv4 or IPv6 address of the node (127.0.0.1: the node
    itself only); empty = every address (kubelet's probes and Prometheus reach the node IP)."""
    ruleBackend: RuleBackend = "auto"
    """How rules are applied: auto decides as Istio does, per family (agent.rules.backends);
    ambient's choice is kept for the node's boot (agent.rules.backend_pin)."""
    uninstallOnStop: UninstallOnStop = "auto"
    """On SIGTERM: auto uninstalls only when the DaemonSet is going away."""
    conflictsPerMinuteWarning: int = 5
    """Heals a minute of one file past which another writer is reported as fighting us."""
    cniConfGroupRead: bool = False
    """Config files we create are 0640 instead of 0600 (Istio's CNI_CONF_GROUP_READ)."""
    removeNotReadyTaint: bool = False
    """Once ready, remove the taint `cni.istio.io/not-ready` from this node."""
    daemonSetName: str = ""
    """Name of the agent DaemonSet: its pods (`<name>-xxxxx`) in the agent's namespace pass the
    plugin without the agent, which is not there yet when one of them starts."""
    repair: RepairSettings = field(default_factory=RepairSettings)
    """Handling of pods that started before the plugin was in place."""
    ambient: AmbientSettings = field(default_factory=AmbientSettings)
    """Ambient mode (redirection to ztunnel)."""
    kubeApi: KubeApiSettings = field(default_factory=KubeApiSettings)
    """Timeouts of the calls to the Kubernetes API."""

    @property
    def log_levels(self) -> LogLevels:
        return parse_log_levels(self.logLevel)

    @property
    def socket_path(self) -> str:
        return os.path.join(self.cniAgentRunDir, constants.SOCKET_NAME)


def load_settings(path: str = DEFAULT_CONFIG_PATH) -> Settings:
    """Read, default and validate `config.yaml`; a missing file means all defaults."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        if path == DEFAULT_CONFIG_PATH:
            return Settings()
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config file: {e.strerror}") from e
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: config file larger than {MAX_CONFIG_BYTES} bytes")
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    return settings_from_mapping(data if data is not None else {}, source=path)


def settings_from_mapping(data: object, *, source: str) -> Settings:
    """Build Settings from parsed YAML, naming `source` and the key in every error."""
    top = _as_mapping(data, source=source, where="top level")
    values = _convert_fields(Settings, top, source=source, prefix="")
    return Settings(**values)


def _as_mapping(data: object, *, source: str, where: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: {where} must be a mapping, got {type(data).__name__}")
    return data


def _convert_fields(
    cls: type, data: Mapping[str, Any], *, source: str, prefix: str
) -> dict[str, Any]:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    types = get_type_hints(cls)
    for key in data:
        if key not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigError(f"{source}: unknown key {prefix}{key!s} (known keys: {known})")
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        converted = _convert_value(types[key], value, source=source, name=name)
        check: Check | None = fields[key].metadata.get("check")
        if check is not None:
            _check(check, converted, source=source, name=name)
        out[key] = converted
    return out


def _wrong(source: str, name: str, value: object, expected: str) -> ConfigError:
    return ConfigError(
        f"{source}: key {name} must be {expected}, got {type(value).__name__} {value!r}"
    )


def _convert_value(kind: Any, value: object, *, source: str, name: str) -> object:
    """`value` as the field's type `kind` (a resolved annotation), or ConfigError."""

    def wrong(expected: str) -> ConfigError:
        return _wrong(source, name, value, expected)

    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        mapping = _as_mapping(value, source=source, where=f"key {name}")
        return kind(**_convert_fields(kind, mapping, source=source, prefix=f"{name}."))
    if kind == tuple[EnablementSelector, ...]:
        try:
            return parse_enablement_selectors(value)
        except SelectorError as e:
            raise ConfigError(f"{source}: key {name}{e.path}: {e.message}") from None
    if get_origin(kind) is Literal:
        allowed = get_args(kind)
        if value not in allowed:
            raise wrong("one of " + ", ".join(allowed))
        return value
    if kind is bool:
        if not isinstance(value, bool):
            raise wrong("true or false")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong("an integer")
        if value < 0:  # every count, limit and port of ours
            raise wrong("a non-negative integer")
        return value
    if kind == tuple[str, ...]:
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise wrong("a list of strings")
        return tuple(value)
    if kind is str:
        if not isinstance(value, str):
            raise wrong("a string")
        return value
    raise AssertionError(f"config field {name} has unsupported type {kind}")


def _check(check: Check, value: Any, *, source: str, name: str) -> None:
    """The field's metadata check on its converted value."""

    def wrong(expected: str) -> ConfigError:
        return _wrong(source, name, value, expected)

    match check:
        case "abs_path":
            if not os.path.isabs(value):
                raise wrong("an absolute path")
        case "file_name":
            if "/" in value or value in (".", ".."):
                raise wrong("a file name without '/'")
        case "port":
            if not 1 <= value <= 65535:
                raise wrong("a port number 1-65535")
        case "ipv4" | "ipv6":
            family = 4 if check == "ipv4" else 6
            try:
                address = ipaddress.ip_address(value)
            except ValueError:
                address = None
            if address is None or address.version != family:
                raise wrong(f"an IPv{family} address")
        case "address":
            try:
                ipaddress.ip_address(value or "0.0.0.0")
            except ValueError:
                raise wrong("an IP address, or empty for every address") from None
        case "namespace":
            if not _DNS1123_LABEL.match(value):
                raise wrong("a namespace name")
        case "positive":
            if value < 1:
                raise wrong("a positive integer")
        case "log_level":
            try:
                parse_log_levels(value)
            except ValueError as e:
                raise ConfigError(f"{source}: key {name}: {e}") from None
        case _:
            assert_never(check)


_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
