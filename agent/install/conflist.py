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
from agent.install import libcni
from agent.install.entry import PLUGIN_TYPE

CONFIG_EXTENSIONS = (".conf", ".conflist", ".json")
"""What libcni (kubelet/containerd/CRI-O) reads from the conf dir, in sorted file-name order."""
MAX_CONFIG_BYTES = 1 << 20
"""A CNI config larger than this is refused: no real one comes near it."""
WRAPPED_LIST_NAME = "k8s-pod-network"
"""Name of a list made from a single-plugin .conf that had no name of its own."""
CONVERTED_CNI_VERSION = "0.3.1"
"""cniVersion of a list made from a .conf with none, or with one older than lists (0.1.0, 0.2.0):
the first version with lists and chaining, which every plugin that can be chained speaks (and
what Istio writes). Absent, libcni would hand "" (0.1.0) to every plugin of the list."""
LIST_SINCE = (0, 3, 0)
CONVERTED_FROM_KEY = "istioCniConvertedFrom"
"""Top-level key of a list we made from a .conf: the .conf's name and exact text, so uninstall
gives the node its .conf back byte for byte. libcni ignores unknown top-level keys of a list,
and no plugin sees them (each gets only its own object plus name, cniVersion, prevResult)."""
OWNED_COPY_KEY = "istioCniOwnedCopyOf"
"""Top-level key of the Istio-owned copy of the primary (istioOwnedCNIConfig): the name of the
primary it copies. It marks the file as ours whole, whatever name the settings give it now, so a
copy the settings no longer name (the option turned off, its file name changed) is never taken
for the primary and is removed. libcni ignores it as it ignores CONVERTED_FROM_KEY."""

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


def libcni_rejects(name: str, data: bytes) -> str | None:
    """Why libcni would not load this file (None: it would): agent.install.libcni."""
    return libcni.rejects(name, data)


def runtime_loadable(name: str, data: bytes) -> bool:
    """Whether libcni would use this file (libcni_rejects)."""
    return libcni_rejects(name, data) is None


def uneditable(name: str, data: bytes) -> str | None:
    """Why the agent cannot chain into a file libcni loads (None: it can)."""
    if len(data) > MAX_CONFIG_BYTES:
        return f"it is larger than {MAX_CONFIG_BYTES} bytes"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return (
            f"it holds bytes that are not UTF-8 (at offset {e.start}; libcni reads them as U+FFFD)"
        )
    try:
        config = parse(data, source=name)
        dumps(config)
    except UnicodeEncodeError:
        return "it holds a lone UTF-16 surrogate escape such as \\ud800 (libcni reads it as U+FFFD)"
    except InstallError as e:
        return str(e)
    if name.endswith(".conflist") and "type" in config:
        return "it is a .conflist with a top-level type (libcni ignores that key)"
    return None


def extension(name: str) -> str:
    """The name's extension as Go's filepath.Ext (libcni's ConfFiles) reads it: from the last
    dot, also in a name that starts with one (".conflist" is a .conflist to libcni)."""
    dot = name.rfind(".")
    return name[dot:] if dot >= 0 else ""


def candidate_names(names: Iterable[str]) -> list[str]:
    """Config files the runtime considers, in the order it considers them (libcni: sorted by
    the names' bytes)."""
    return sorted((n for n in names if extension(n) in CONFIG_EXTENSIONS), key=os.fsencode)


def select_primary(
    names: Iterable[str],
    read: Callable[[str], bytes | None],
    *,
    exclude: Collection[str] = (),
    dangling: Callable[[str], str | None] = lambda name: None,
    directory: str = "",
) -> str | None:
    """The file the runtime would pick: the first one libcni loads, in sorted order (None: none
    yet). Where the agent cannot tell or cannot edit that file (`dangling`: the target of a
    symlink that cannot be followed here), InstallError naming it: chaining into a later file
    would leave the runtime's choice without our entry."""
    for name in candidate_names(names):
        if name in exclude:
            continue
        path = os.path.join(directory, name)
        data = read(name)
        if data is None:
            if (target := dangling(name)) is not None:
                raise InstallError(dangling_message(path, target))
            continue
        if len(data) <= MAX_CONFIG_BYTES and libcni_rejects(name, data) is not None:
            continue  # the runtime skips it too
        why = uneditable(name, data)
        if why is not None:
            raise InstallError(
                f"{path}: the runtime may load this file, but {why}; refusing to chain into "
                "another file (fix or remove it, or name the primary with cniConfFileName)"
            )
        return name
    return None


def dangling_message(path: str, target: str) -> str:
    return (
        f"{path}: is a symlink to {target}, which cannot be followed in this container (a "
        "node path outside the mounted conf dir?); the runtime follows it on the node and may "
        "load that file: refusing to chain into another file (replace the link by the file)"
    )


def resolve_named(names: Collection[str], wanted: str) -> str | None:
    """`cniConfFileName` as Istio resolves it: x.conf missing -> x.conflist, and back."""
    if wanted in names:
        return wanted
    ext = extension(wanted)
    stem = wanted[: len(wanted) - len(ext)]
    other = {".conf": ".conflist", ".conflist": ".conf"}.get(ext)
    if other is not None and stem + other in names:
        return stem + other
    return None


def list_file_name(name: str) -> str:
    """Where a config that became a list must live: a .conf/.json list would not load."""
    ext = extension(name)
    return name[: len(name) - len(ext)] + ".conflist" if ext in (".conf", ".json") else name


def is_ours(plugin: object) -> bool:
    return isinstance(plugin, dict) and plugin.get("type") == PLUGIN_TYPE


def list_version(config: Mapping[str, Any]) -> str:
    """The cniVersion a list made from this single-plugin config carries: its own, unless it has
    none or one from before lists existed (then CONVERTED_CNI_VERSION)."""
    version = config.get("cniVersion")
    if not isinstance(version, str) or not version:
        return CONVERTED_CNI_VERSION
    try:
        parts = tuple(int(p) for p in version.split("."))
    except ValueError:
        return version  # not ours to judge: the runtime reports it as it did for the .conf
    return CONVERTED_CNI_VERSION if parts < LIST_SINCE else version


def as_list(config: Mapping[str, Any]) -> Config:
    """A list config: a single .conf becomes a list keeping its name, with `list_version`.

    The network name matters beyond cosmetics: host-local IPAM keys its leases by it, so a
    renamed network would hand out addresses already in use.
    """
    if not is_single(config):
        return copy.deepcopy(dict(config))
    plugin = {k: copy.deepcopy(v) for k, v in config.items() if k != "cniVersion"}
    return {
        "cniVersion": list_version(config),
        "name": config.get("name", WRAPPED_LIST_NAME),
        "plugins": [plugin],
    }


def only_ours(config: Mapping[str, Any]) -> bool:
    """A config holding nothing but istio-cni: ours alone, or a list of only our entries."""
    if is_single(config):
        return is_ours(config)
    plugins = config.get("plugins")
    return isinstance(plugins, list) and all(is_ours(p) for p in plugins)


def converted_from(config: Mapping[str, Any], list_name: str) -> tuple[str, str] | None:
    """(name, text) of the .conf this list was made from, when it carries them and they name a
    file that becomes `list_name`; None for any other list."""
    stash = config.get(CONVERTED_FROM_KEY)
    if not isinstance(stash, Mapping):
        return None
    name, text = stash.get("file"), stash.get("content")
    if not isinstance(name, str) or not isinstance(text, str):
        return None
    if os.path.basename(name) != name or name == list_name or list_file_name(name) != list_name:
        return None
    return name, text


def with_converted_from(config: Mapping[str, Any], name: str, text: str) -> Config:
    return {**config, CONVERTED_FROM_KEY: {"file": name, "content": text}}


def without_converted_from(config: Mapping[str, Any]) -> Config:
    return {k: v for k, v in config.items() if k != CONVERTED_FROM_KEY}


def with_owned_copy_of(config: Mapping[str, Any], primary: str) -> Config:
    return {**config, OWNED_COPY_KEY: primary}


def owned_copy_of(config: Mapping[str, Any]) -> str | None:
    """The primary this list is the Istio-owned copy of (None: not such a copy)."""
    value = config.get(OWNED_COPY_KEY)
    return value if isinstance(value, str) and not is_single(config) else None


def is_owned_copy(name: str, data: bytes | None) -> bool:
    """Whether the file `name` holding `data` is an Istio-owned copy (a .conflist we marked)."""
    if data is None or not name.endswith(".conflist") or len(data) > MAX_CONFIG_BYTES:
        return False
    try:
        config = parse(data, source=name)
    except InstallError:
        return False
    return owned_copy_of(config) is not None


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


def is_ours_anywhere(config: Mapping[str, Any]) -> bool:
    """Our plugin, as the whole config or as one of its list's plugins."""
    return is_ours(config) or count_ours(config) > 0


def has_entry(config: Mapping[str, Any], entry: Mapping[str, Any]) -> bool:
    """Our entry is there, exactly once, last, and as we would write it."""
    plugins = config.get("plugins")
    if not isinstance(plugins, list) or not plugins:
        return False
    ours = {k: v for k, v in entry.items() if k != "cniVersion"}
    return count_ours(config) == 1 and plugins[-1] == ours


def dumps(config: Mapping[str, Any]) -> bytes:
    return (json.dumps(config, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
