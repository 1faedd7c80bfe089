"""The agent's settings: one typed, frozen object loaded from the chart's `config.yaml`.

Every key is declared once, here, with its type, default and meaning. The chart's `values.yaml`,
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
from typing import Any, Literal, get_args

import yaml

from agent.ambient.selectors import (
    DEFAULT_ENABLEMENT_SELECTORS,
    EnablementSelector,
    SelectorError,
    parse_enablement_selectors,
)
from agent.errors import ConfigError
from agent.log_levels import LogLevels, parse_log_levels

DEFAULT_CONFIG_PATH = "/etc/istio-cni/config.yaml"
MAX_CONFIG_BYTES = 1 << 20

RepairMode = Literal["repair-in-place", "delete", "label"]
RuleBackend = Literal["auto", "python-iptables", "iptables-legacy", "iptables-nft", "nftables"]
UninstallOnStop = Literal["auto", "always", "never"]


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
    """Retry the pod/namespace lookup of a CNI ADD and fail it when the lookup keeps failing,
    instead of treating the pod as not ambient (ENABLE_AMBIENT_DETECTION_RETRY)."""
    ztunnelSocketPath: str = "/var/run/ztunnel/ztunnel.sock"
    """Unix socket the agent serves for ztunnel (ZDS); same path on the node and in the pod
    (Istio's ZTUNNEL_UDS_ADDRESS)."""
    systemNamespace: str = "istio-system"
    """Namespace of the ztunnel pods (label app=ztunnel), never enrolled (SYSTEM_NAMESPACE)."""
    hostProbeSnatAddress: str = "169.254.7.127"
    """IPv4 address kubelet's probes to ambient pods are SNATed to (HOST_PROBE_SNAT_IP)."""
    hostProbeSnatAddressV6: str = "fd16:9254:7127:1337:ffff:ffff:ffff:ffff"
    """IPv6 address kubelet's probes to ambient pods are SNATed to (HOST_PROBE_SNAT_IPV6)."""


@dataclass(frozen=True)
class Settings:
    """The agent's configuration; field names are the `config.yaml` keys (camelCase)."""

    cniBinDir: str = "/opt/cni/bin"
    """Node path of the CNI bin dir, as the container runtime sees it."""
    cniConfDir: str = "/etc/cni/net.d"
    """Node path of the CNI config dir."""
    cniConfFileName: str = ""
    """Primary config to chain into (chained) or our file's name (standalone); empty = auto."""
    chained: bool = True
    """Chain into the primary conflist (true) or write a standalone config (false)."""
    istioOwnedCNIConfig: bool = False
    """Write a file that sorts first, holding the primary's plugins plus ours."""
    istioOwnedCNIConfigFileName: str = "02-istio-cni.conflist"
    """Name of that file; it must sort before the primary's."""
    logLevel: str = "info"
    """A level (none, panic, fatal, error, warn, info, debug) or Istio's `scope:level,...` list."""
    logAsJson: bool = False
    """Agent and plugin log lines as JSON objects instead of key=value."""
    excludeNamespaces: tuple[str, ...] = ("istio-system", "kube-system")
    """Pods in these namespaces are never redirected."""
    mountedCniBinDir: str = "/host/opt/cni/bin"
    """Where the node's bin dir is mounted in the agent container."""
    mountedCniConfDir: str = "/host/etc/cni/net.d"
    """Where the node's conf dir is mounted in the agent container."""
    pluginSourceDir: str = "/opt/istio-cni/bin"
    """Directory in the image holding the built plugin executables that install copies."""
    cniAgentRunDir: str = "/var/run/istio-cni"
    """Node path of the agent's run dir, holding the plugin's Unix socket (same path in the pod)."""
    hostProcDir: str = "/host/proc"
    """Where the node's /proc is mounted, to find pod network namespaces for repair."""
    mountedNetnsDir: str = "/host/var/run/netns"
    """Where the node's netns dir (runtime-named pod namespaces) is mounted, for repair."""
    metricsPort: int = 15014
    """Port of /healthz, /readyz and /metrics (on the host network)."""
    metricsAddress: str = ""
    """Address that port listens on; empty = every address (probes hit the node IP)."""
    ruleBackend: RuleBackend = "auto"
    """How rules are applied: auto picks what the node already uses, as Istio does."""
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

    @property
    def log_levels(self) -> LogLevels:
        return parse_log_levels(self.logLevel)

    @property
    def socket_path(self) -> str:
        return os.path.join(self.cniAgentRunDir, "pluginevent.sock")


_ABSOLUTE_PATH_KEYS = frozenset(
    {"cniBinDir", "cniConfDir", "mountedCniBinDir", "mountedCniConfDir", "pluginSourceDir",
     "cniAgentRunDir", "hostProcDir", "mountedNetnsDir", "ztunnelSocketPath"}
)
_ADDRESS_KEYS = {"hostProbeSnatAddress": 4, "hostProbeSnatAddressV6": 6}
_NESTED: dict[str, type] = {"RepairSettings": RepairSettings, "AmbientSettings": AmbientSettings}
_FILE_NAME_KEYS = frozenset({"cniConfFileName", "istioOwnedCNIConfigFileName"})


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
    for key in data:
        if key not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigError(f"{source}: unknown key {prefix}{key!s} (known keys: {known})")
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        out[key] = _convert_value(fields[key].type, value, source=source, name=name)
    return out


def _convert_value(type_name: object, value: object, *, source: str, name: str) -> object:
    def wrong(expected: str) -> ConfigError:
        return ConfigError(
            f"{source}: key {name} must be {expected}, got {type(value).__name__} {value!r}"
        )

    nested = _NESTED.get(str(type_name))
    if nested is not None:
        mapping = _as_mapping(value, source=source, where=f"key {name}")
        return nested(**_convert_fields(nested, mapping, source=source, prefix=f"{name}."))
    if type_name == "tuple[EnablementSelector, ...]":
        try:
            return parse_enablement_selectors(value)
        except SelectorError as e:
            raise ConfigError(f"{source}: key {name}{e.path}: {e.message}") from None
    if type_name == "bool":
        if not isinstance(value, bool):
            raise wrong("true or false")
        return value
    if type_name == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong("an integer")
        if name.endswith("Port") and not 1 <= value <= 65535:
            raise wrong("a port number 1-65535")
        if value < 0:
            raise wrong("a non-negative integer")
        return value
    if type_name == "tuple[str, ...]":
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise wrong("a list of strings")
        return tuple(value)
    literal = _LITERALS.get(str(type_name))
    if literal is not None:
        if value not in literal:
            raise wrong("one of " + ", ".join(literal))
        return value
    if type_name == "str":
        if not isinstance(value, str):
            raise wrong("a string")
        leaf = name.rsplit(".", 1)[-1]
        if leaf in _ABSOLUTE_PATH_KEYS and not os.path.isabs(value):
            raise wrong("an absolute path")
        if leaf in _FILE_NAME_KEYS and ("/" in value or value in (".", "..")):
            raise wrong("a file name without '/'")
        family = _ADDRESS_KEYS.get(leaf)
        if family is not None:
            try:
                address = ipaddress.ip_address(value)
            except ValueError:
                address = None
            if address is None or address.version != family:
                raise wrong(f"an IPv{family} address")
        if leaf == "systemNamespace" and not _DNS1123_LABEL.match(value):
            raise wrong("a namespace name")
        if leaf == "logLevel":
            try:
                parse_log_levels(value)
            except ValueError as e:
                raise ConfigError(f"{source}: key {name}: {e}") from None
        return value
    raise AssertionError(f"config field {name} has unsupported type {type_name}")


_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

_LITERALS: dict[str, tuple[str, ...]] = {
    "RepairMode": get_args(RepairMode),
    "RuleBackend": get_args(RuleBackend),
    "UninstallOnStop": get_args(UninstallOnStop),
}
