"""Pure functions on CNI network configs: which file the runtime uses, and our entry in it.

Configs are kept as parsed JSON objects (dicts keep the file's key order), so every other
plugin's content and key order survive a round trip. Output is `json.dumps(indent=2)` plus a
newline, in the input's key order: equal as JSON to what Istio writes (Istio sorts the keys).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from agent.errors import InstallError
from agent.install.entry import PLUGIN_TYPE

CONFIG_EXTENSIONS = (".conf", ".conflist", ".json")
"""What libcni (kubelet/containerd/CRI-O) reads from the conf dir, in sorted file-name order."""
MAX_CONFIG_BYTES = 1 << 20
"""A CNI config larger than this is refused: no real one comes near it."""
WRAPPED_LIST_NAME = "k8s-pod-network"
"""Name of a list made from a single-plugin .conf that had no name of its own."""

Config = dict[str, Any]


def _reject_constant(value: str) -> None:
    raise ValueError(f"{value} is not valid JSON")


def parse(data: bytes, *, source: str) -> Config:
    """Parse a config file's bytes into an object, or raise naming the file and the problem."""
    if len(data) > MAX_CONFIG_BYTES:
        raise InstallError(f"{source}: CNI config larger than {MAX_CONFIG_BYTES} bytes")
    try:
        value = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError) as e:
        raise InstallError(f"{source}: not valid JSON: {e}") from e
    if not isinstance(value, dict):
        raise InstallError(f"{source}: CNI config must be a JSON object, got {_kind(value)}")
    return value


def _kind(value: object) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "a number" if isinstance(value, int | float) else "null"
    )


def is_single(config: Mapping[str, Any]) -> bool:
    """A single-plugin network config (.conf) has a top-level `type`; a list has `plugins`."""
    return "type" in config


def validate(config: Mapping[str, Any], *, source: str) -> None:
    """Check what the runtime and our insertion rely on; raise naming the file and the field."""
    if not config:
        raise InstallError(f"{source}: CNI config is an empty object (no type, no plugins)")
    for key in ("name", "cniVersion"):
        if key in config and not isinstance(config[key], str):
            raise InstallError(f"{source}: {key} must be a string, got {_kind(config[key])}")
    if is_single(config):
        if not isinstance(config["type"], str) or not config["type"]:
            raise InstallError(f"{source}: type must be a non-empty string")
        return
    if "plugins" not in config:
        raise InstallError(f"{source}: CNI config has neither type (.conf) nor plugins (.conflist)")
    plugins = config["plugins"]
    if not isinstance(plugins, list):
        raise InstallError(f"{source}: plugins must be a list, got {_kind(plugins)}")
    if not plugins:
        raise InstallError(f"{source}: plugins is an empty list")
    for i, plugin in enumerate(plugins):
        if not isinstance(plugin, dict):
            raise InstallError(f"{source}: plugins[{i}] must be an object, got {_kind(plugin)}")
        if not isinstance(plugin.get("type"), str) or not plugin["type"]:
            raise InstallError(f"{source}: plugins[{i}].type must be a non-empty string")


def load(data: bytes, *, source: str) -> Config:
    config = parse(data, source=source)
    validate(config, source=source)
    return config


def runtime_loadable(name: str, data: bytes) -> bool:
    """Whether libcni would use this file: .conflist needs a list, .conf/.json a `type`."""
    try:
        config = parse(data, source=name)
        validate(config, source=name)
    except InstallError:
        return False
    if name.endswith(".conflist"):
        return not is_single(config) and isinstance(config.get("name"), str)
    return is_single(config)


def candidate_names(names: Iterable[str]) -> list[str]:
    """Config files the runtime considers, in the order it considers them."""
    return sorted(n for n in names if os.path.splitext(n)[1] in CONFIG_EXTENSIONS)


def select_primary(
    names: Iterable[str], read: Callable[[str], bytes | None], *, exclude: Collection[str] = ()
) -> str | None:
    """The file the runtime would pick: the first loadable one in sorted order (None: none yet)."""
    for name in candidate_names(names):
        if name in exclude:
            continue
        data = read(name)
        if data is not None and runtime_loadable(name, data):
            return name
    return None


def resolve_named(names: Collection[str], wanted: str) -> str | None:
    """`cniConfFileName` as Istio resolves it: x.conf missing -> x.conflist, and back."""
    if wanted in names:
        return wanted
    stem, ext = os.path.splitext(wanted)
    other = {".conf": ".conflist", ".conflist": ".conf"}.get(ext)
    if other is not None and stem + other in names:
        return stem + other
    return None


def list_file_name(name: str) -> str:
    """Where a config that became a list must live: a .conf/.json list would not load."""
    stem, ext = os.path.splitext(name)
    return stem + ".conflist" if ext in (".conf", ".json") else name


def is_ours(plugin: object) -> bool:
    return isinstance(plugin, dict) and plugin.get("type") == PLUGIN_TYPE


def as_list(config: Mapping[str, Any]) -> Config:
    """A list config: a single .conf becomes a list keeping its name and cniVersion.

    The network name matters beyond cosmetics: host-local IPAM keys its leases by it, so a
    renamed network would hand out addresses already in use.
    """
    if not is_single(config):
        return copy.deepcopy(dict(config))
    plugin = {k: copy.deepcopy(v) for k, v in config.items() if k != "cniVersion"}
    wrapped: Config = {}
    if "cniVersion" in config:
        wrapped["cniVersion"] = config["cniVersion"]
    wrapped["name"] = config.get("name", WRAPPED_LIST_NAME)
    wrapped["plugins"] = [plugin]
    return wrapped


def insert(
    existing: Mapping[str, Any], entry: Mapping[str, Any], *, source: str = "CNI config"
) -> Config:
    """`existing` as a list, every istio-cni entry removed, ours appended last."""
    if not isinstance(existing, Mapping):
        raise InstallError(f"{source}: CNI config must be a JSON object, got {_kind(existing)}")
    validate(existing, source=source)
    if not isinstance(entry, Mapping) or entry.get("type") != PLUGIN_TYPE:
        raise InstallError(f"plugin entry must be an object of type {PLUGIN_TYPE}")
    result = remove(as_list(existing))
    ours = {k: copy.deepcopy(v) for k, v in entry.items() if k != "cniVersion"}
    result["plugins"].append(ours)
    return result


def remove(config: Mapping[str, Any]) -> Config:
    """The list without any istio-cni entry (other plugins untouched, in order)."""
    result = copy.deepcopy(dict(config))
    result["plugins"] = [p for p in result["plugins"] if not is_ours(p)]
    return result


def count_ours(config: Mapping[str, Any]) -> int:
    plugins = config.get("plugins")
    return sum(1 for p in plugins if is_ours(p)) if isinstance(plugins, list) else 0


def has_entry(config: Mapping[str, Any], entry: Mapping[str, Any]) -> bool:
    """Our entry is there, exactly once, last, and as we would write it."""
    plugins = config.get("plugins")
    if not isinstance(plugins, list) or not plugins:
        return False
    ours = {k: v for k, v in entry.items() if k != "cniVersion"}
    return count_ours(config) == 1 and plugins[-1] == ours


def dumps(config: Mapping[str, Any]) -> bytes:
    return (json.dumps(config, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
