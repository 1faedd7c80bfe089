"""Whether libcni (v1.3.0: containerd's go-cni, CRI-O's ocicni, kubelet's loaders) loads a CNI
config file, judged as libcni judges it; checked against libcni itself in tests/install.

The file's bytes go through Go's JSON decoder: bytes that are not UTF-8 and lone surrogate
escapes become U+FFFD, there is no size limit, the last of duplicate keys wins. A `.conflist` is
read into a map (`ConfListFromBytes`): a string `name`, a string `cniVersion` if any, `cniVersions`
a list of versions, `disableCheck`/`disableGC`/`loadOnlyInlinedPlugins` booleans or the words
true/false, and a non-empty `plugins` list; any other top-level key (a stray `type`) is ignored.
Each plugin, and a `.conf`/`.json` file whole, is read into libcni's PluginConf struct: keys match
its fields without regard to case (the last match wins), each matched value must have the field's
type, and `type` must end up non-empty.

Not modelled: plugin configs libcni adds from a subdirectory named after the network.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

Pairs = list[tuple[str, Any]]
"""A JSON object as its key/value pairs in file order (Go's decoder sees every duplicate)."""

_VERSION_PART = re.compile(r"[+-]?[0-9]+")
_BOOLEAN_KEYS = ("disableCheck", "disableGC", "loadOnlyInlinedPlugins")


class _Object:
    """A decoded JSON object that keeps its pairs."""

    def __init__(self, pairs: Pairs) -> None:
        self.pairs = pairs

    def last(self, key: str) -> Any:
        """The value of `key` as Go's map decoding keeps it (the last duplicate), or _ABSENT."""
        found: Any = _ABSENT
        for k, v in self.pairs:
            if k == key:
                found = v
        return found


_ABSENT = object()


def decode(data: bytes) -> Any:
    """The file's JSON as Go decodes it, objects as _Object; ValueError when Go refuses it."""

    def constant(value: str) -> None:
        raise ValueError(f"{value} is not valid JSON")

    try:
        return json.loads(
            data.decode("utf-8", errors="replace"),
            object_pairs_hook=_Object,
            parse_constant=constant,
        )
    except RecursionError:
        raise ValueError("nested too deeply") from None


def rejects(name: str, data: bytes) -> str | None:
    """Why libcni would not load the file `name` holding `data` (None: it would)."""
    try:
        value = decode(data)
    except ValueError as e:
        return f"not valid JSON: {e}"
    if name.endswith(".conflist"):
        return _list_rejects(value)
    return _plugin_rejects(value)


def _list_rejects(value: Any) -> str | None:
    if value is None:
        return "a list without a string name"
    if not isinstance(value, _Object):
        return "a CNI config must be a JSON object"
    if not isinstance(value.last("name"), str):
        return "a list without a string name"
    version = value.last("cniVersion")
    if version is not _ABSENT and not isinstance(version, str):
        return "cniVersion must be a string"
    if (why := _versions_rejects(value.last("cniVersions"), version)) is not None:
        return why
    inline_only = False
    for key in _BOOLEAN_KEYS:
        flag = value.last(key)
        if flag is _ABSENT:
            continue
        if isinstance(flag, str) and flag.lower() in ("true", "false"):
            flag = flag.lower() == "true"
        if not isinstance(flag, bool):
            return f"{key} must be a boolean or the word true or false"
        inline_only = inline_only or (key == "loadOnlyInlinedPlugins" and flag)
    plugins = value.last("plugins")
    if plugins is _ABSENT:
        return "a list without plugins"
    if not isinstance(plugins, list):
        return "plugins must be a list"
    if not plugins:
        return "plugins is an empty list"
    for i, plugin in enumerate(plugins):
        if (why := _plugin_rejects(plugin)) is not None:
            return f"plugins[{i}]: {why}"
    return None


def _versions_rejects(versions: Any, version: Any) -> str | None:
    if versions is _ABSENT:
        return None
    if not isinstance(versions, list):
        return "cniVersions must be a list"
    for i, v in enumerate(versions):
        if not isinstance(v, str) or not _valid_version(v):
            return f"cniVersions[{i}] is not a version"
    if isinstance(version, str) and version and not _valid_version(version):
        return "cniVersion is not a version"
    return None


def _valid_version(text: str) -> bool:
    """libcni's ParseVersion: up to three dot-separated integers ("" is 0.1.0)."""
    if text == "":
        return True
    parts = text.split(".")
    return len(parts) <= 3 and all(_VERSION_PART.fullmatch(p) for p in parts)


def _string(v: Any) -> bool:
    return v is None or isinstance(v, str)


def _strings(v: Any) -> bool:
    return v is None or (isinstance(v, list) and all(_string(x) for x in v))


def _struct(fields: dict[str, Callable[[Any], bool]]) -> Callable[[Any], bool]:
    def check(v: Any) -> bool:
        if v is None:
            return True
        return isinstance(v, _Object) and _fields_rejects(v, fields) is None

    return check


def _bools(v: Any) -> bool:
    return v is None or (
        isinstance(v, _Object) and all(x is None or isinstance(x, bool) for _, x in v.pairs)
    )


def _any_object(v: Any) -> bool:
    return v is None or isinstance(v, _Object)


def _attachments(v: Any) -> bool:
    item = _struct({"containerID": _string, "ifname": _string})
    return v is None or (isinstance(v, list) and all(item(x) for x in v))


PLUGIN_FIELDS: dict[str, Callable[[Any], bool]] = {
    "cniVersion": _string,
    "name": _string,
    "type": _string,
    "capabilities": _bools,
    "ipam": _struct({"type": _string}),
    "dns": _struct(
        {"nameservers": _strings, "domain": _string, "search": _strings, "options": _strings}
    ),
    "prevResult": _any_object,
    "cni.dev/valid-attachments": _attachments,
}
"""libcni's PluginConf: each field's JSON name and the values its Go type takes."""


def _fold_equal(a: str, b: str) -> bool:
    """Go's key matching: equal under simple case folding."""
    pairs = zip(a, b, strict=False)
    return len(a) == len(b) and all(
        x == y or x.lower() == y.lower() or x.upper() == y.upper() for x, y in pairs
    )


def _fields_rejects(obj: _Object, fields: dict[str, Callable[[Any], bool]]) -> str | None:
    for key, value in obj.pairs:
        field = next((f for f in fields if f == key), None) or next(
            (f for f in fields if _fold_equal(f, key)), None
        )
        if field is not None and not fields[field](value):
            return f"{key}: not the type libcni reads it as"
    return None


def plugin_type(obj: _Object) -> Any:
    """The `type` libcni ends up with: the last key matching it without regard to case."""
    found = None
    for key, value in obj.pairs:
        if _fold_equal("type", key):
            found = value
    return found


def _plugin_rejects(value: Any) -> str | None:
    if value is not None and not isinstance(value, _Object):
        return "a CNI config must be a JSON object"
    if value is None:
        return "network type not found"
    if (why := _fields_rejects(value, PLUGIN_FIELDS)) is not None:
        return why
    if not plugin_type(value):
        return "network type not found"
    return None
