"""What the node's conf dir should look like: a pure plan from a snapshot of the dir.

`plan_config` decides which file holds our entry and its exact content; the installer executes
the plan and `check` compares it with the disk, so "check" never changes anything.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.config import Settings
from agent.errors import InstallError, TransientInstallError
from agent.install import conflist

DEFAULT_STANDALONE_NAME = "YYY-istio-cni.conf"
"""Standalone file: sorts after the network's own config, so it never takes the primary's place."""

Reader = Callable[[str], bytes | None]
Dangling = Callable[[str], str | None]
"""The target of a symlink that cannot be followed here (None: no such link)."""


def _no_link(name: str) -> str | None:
    return None


@dataclass(frozen=True)
class ConfigPlan:
    target: str
    """File name (in the conf dir) that must hold `config`."""
    config: dict[str, Any]
    """Its content."""
    convert_from: str | None = None
    """A single-plugin .conf/.json that becomes `target` (a .conflist) and must go away."""
    primary: str | None = None
    """The primary config we chain into (None in standalone mode)."""
    warnings: tuple[str, ...] = field(default=())


def standalone_name(settings: Settings) -> str:
    return settings.cniConfFileName or DEFAULT_STANDALONE_NAME


def standalone_config(name: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """Our entry as its own network; a .conflist name needs the list form to load."""
    if not name.endswith(".conflist"):
        return dict(entry)
    plugin = {k: v for k, v in entry.items() if k != "cniVersion"}
    return {"cniVersion": entry["cniVersion"], "name": plugin["name"], "plugins": [plugin]}


def preset_words(settings: Settings) -> str:
    """How the node paths came to be, for a message saying one looks wrong."""
    if settings.platform:
        return f"platform preset {settings.platform!r}"
    return "no platform preset set"


def find_primary(
    settings: Settings, names: Collection[str], read: Reader, dangling: Dangling = _no_link
) -> str:
    """The primary config's file name, as the runtime (or cniConfFileName) picks it."""
    exclude = {settings.istioOwnedCNIConfigFileName} if settings.istioOwnedCNIConfig else set()
    candidates = [n for n in names if n not in exclude]
    if settings.cniConfFileName:
        found = conflist.resolve_named(
            [n for n in candidates if not is_owned_copy(n, names, read)],
            settings.cniConfFileName,
        )
        if found is None:
            raise TransientInstallError(
                f"waiting for primary CNI config {settings.cniConfFileName} "
                f"(cniConfFileName) in {settings.mountedCniConfDir} (cniConfDir "
                f"{settings.cniConfDir} on the node, {preset_words(settings)})"
            )
        return found
    found = conflist.select_primary(
        candidates,
        _skip_owned_copies(names, read),
        dangling=dangling,
        directory=settings.mountedCniConfDir,
    )
    if found is None:
        raise TransientInstallError(
            f"waiting for a primary CNI config (.conf/.conflist/.json) in "
            f"{settings.mountedCniConfDir} (cniConfDir {settings.cniConfDir} on the node, "
            f"{preset_words(settings)})"
        )
    return found


def _skip_owned_copies(names: Collection[str], read: Reader) -> Reader:
    """`read`, with every Istio-owned copy absent: a frozen copy of a primary is never one."""

    def reader(name: str) -> bytes | None:
        return None if is_owned_copy(name, names, read) else read(name)

    return reader


UNMARKED_COPY_NAME = "02-istio-cni.conflist"
"""The owned copy's default name (Istio's too), where copies were written before they carried
conflist.OWNED_COPY_KEY."""


def is_owned_copy(name: str, names: Collection[str], read: Reader) -> bool:
    """Whether `name` is an Istio-owned copy of a primary: marked as one, or an unmarked copy
    at the default name (an earlier version's, or Istio's): a list ending in an istio-cni entry
    whose network is the one of the file the runtime would load after it."""
    data = read(name)
    if conflist.is_owned_copy(name, data):
        return True
    if name != UNMARKED_COPY_NAME or data is None:
        return False
    config = _load_or_none(name, read) or {}
    plugins = config.get("plugins")
    if not isinstance(plugins, list) or not plugins or not conflist.is_ours(plugins[-1]):
        return False
    for other in conflist.candidate_names(names):
        if other <= name or (other_data := read(other)) is None:
            continue
        if conflist.runtime_loadable(other, other_data):
            following = _load_or_none(other, read)
            return following is not None and following.get("name") == config.get("name")
    return False


def stale_owned_copies(settings: Settings, names: Collection[str], read: Reader) -> list[str]:
    """Istio-owned copies the settings no longer name: istioOwnedCNIConfig turned off, or its
    file name changed. The runtime would load such a frozen copy instead of the primary (when it
    sorts first), and after uninstall it would stay, so they are removed."""
    keep = settings.istioOwnedCNIConfigFileName if _owned_copy_wanted(settings) else None
    return [
        name
        for name in conflist.candidate_names(names)
        if name != keep and is_owned_copy(name, names, read)
    ]


def _owned_copy_wanted(settings: Settings) -> bool:
    return settings.chained and settings.istioOwnedCNIConfig


def plan_config(
    settings: Settings,
    entry: Mapping[str, Any],
    names: Collection[str],
    read: Reader,
    dangling: Dangling = _no_link,
) -> ConfigPlan:
    """Where our entry goes and what that file must contain. Raises InstallError on bad input."""
    if not settings.chained:
        return _standalone_plan(settings, entry, names, read)
    primary = find_primary(settings, names, read, dangling)
    source = os.path.join(settings.mountedCniConfDir, primary)
    data = read(primary)
    if data is None:
        if (target := dangling(primary)) is not None:
            raise InstallError(conflist.dangling_message(source, target))
        raise TransientInstallError(f"{source}: primary CNI config vanished while reading it")
    if (why := conflist.uneditable(primary, data)) is not None:
        raise InstallError(f"{source}: cannot chain into this CNI config: {why}")
    existing = conflist.load(data, source=source)
    merged = conflist.insert(existing, entry, source=source)
    if settings.istioOwnedCNIConfig:
        owned = settings.istioOwnedCNIConfigFileName
        return ConfigPlan(
            target=owned,
            config=conflist.with_owned_copy_of(conflist.without_converted_from(merged), primary),
            primary=primary,
            warnings=tuple(_sorted_before(owned, names, read)),
        )
    target = conflist.list_file_name(primary)
    if target == primary:
        return ConfigPlan(target=target, config=merged, primary=primary)
    if target in names and not _made_by_us_from(target, primary, read):
        raise InstallError(
            f"{source}: chaining turns it into a list, which must be named {target}, but "
            f"{os.path.join(settings.mountedCniConfDir, target)} already exists; remove one "
            "or name the primary with cniConfFileName"
        )
    # A list we made from this .conf before is replaced: the .conf is newer (its CNI wrote it
    # again) and the runtime reads it first.
    config = conflist.with_converted_from(merged, primary, data.decode("utf-8"))
    return ConfigPlan(target=target, config=config, convert_from=primary, primary=primary)


def _made_by_us_from(target: str, conf: str, read: Reader) -> bool:
    """Whether `target` is a list we made from `conf` (it names `conf` as its origin)."""
    config = _load_or_none(target, read)
    found = conflist.converted_from(config, target) if config is not None else None
    return found is not None and found[0] == conf


def _standalone_plan(
    settings: Settings, entry: Mapping[str, Any], names: Collection[str], read: Reader
) -> ConfigPlan:
    """Our own network config; refused over a file that holds anything but our entry, with a
    warning when it would sort before the node's network (a runtime would take it for the pod
    network, and pods would start without one)."""
    name = standalone_name(settings)
    data = read(name)
    if data is not None:
        try:
            existing = conflist.parse(data, source=name)
        except InstallError:
            existing = None
        if existing is None or not conflist.only_ours(existing):
            path = os.path.join(settings.mountedCniConfDir, name)
            raise InstallError(
                f"{path}: cniConfFileName names an existing CNI config that is not ours; with "
                "chained: false the agent writes a network config of its own under that name. "
                "Choose a file name that does not exist (default: " + DEFAULT_STANDALONE_NAME + ")"
            )
    shadowed = [
        other
        for other in conflist.candidate_names(names)
        if other > name
        and (data := read(other)) is not None
        and conflist.runtime_loadable(other, data)
    ]
    warnings = tuple(
        f"{name} sorts before {other}: a runtime that takes the first config would use istio-cni "
        "as the pod network (chained: false needs a cniConfFileName that sorts last)"
        for other in shadowed[:1]
    )
    return ConfigPlan(target=name, config=standalone_config(name, entry), warnings=warnings)


def _sorted_before(owned: str, names: Collection[str], read: Reader) -> list[str]:
    out = []
    for name in conflist.candidate_names(names):
        if name >= owned:
            break
        data = read(name)
        if data is not None and conflist.runtime_loadable(name, data):
            out.append(f"{name} sorts before {owned}: the runtime uses it instead of ours")
    return out


@dataclass(frozen=True)
class Interrupted:
    """A .conf to .conflist conversion a kill stopped half-way, and the step that finishes it."""

    conf: str
    """The single-plugin .conf/.json."""
    conflist: str
    """The .conflist it becomes."""
    finish: str
    """'unlink': the .conflist is complete, the .conf must go (this version's order);
    'rename': the .conf holds our list, rename it (a former version wrote the list there)."""


def interrupted_conversions(names: Collection[str], read: Reader) -> list[Interrupted]:
    """Conversions a kill left half-done: the .conflist holding exactly the .conf's plugins plus
    ours beside the .conf, or (former versions) our list inside a .conf."""
    out = []
    for name in conflist.candidate_names(names):
        target = conflist.list_file_name(name)
        if target == name:
            continue
        config = _load_or_none(name, read)
        if config is None:
            continue
        if target not in names:
            if not conflist.is_single(config) and conflist.count_ours(config) > 0:
                out.append(Interrupted(name, target, "rename"))
            continue
        converted = _load_or_none(target, read)
        if (
            conflist.is_single(config)
            and converted is not None
            and not conflist.is_single(converted)
            and conflist.count_ours(converted) == 1
            and conflist.remove(conflist.without_converted_from(converted))
            == conflist.remove(conflist.as_list(config))
        ):
            out.append(Interrupted(name, target, "unlink"))
    return out


def _load_or_none(name: str, read: Reader) -> dict[str, Any] | None:
    data = read(name)
    if data is None:
        return None
    try:
        return conflist.load(data, source=name)
    except InstallError:
        return None
