"""Which pod sandboxes on this node will still exec our plugin at their CNI DEL.

Some runtimes do not run DEL with the node's current config but with the config cached when the
sandbox was set up: CRI-O reads libcni's cache (<cache>/results/<network>-<sandbox>-<ifname>, the
config base64 in "config"), and Multus replays the delegates it cached (<cache>/multus/...). For
those sandboxes, removing our entry from the conf dir changes nothing: their DEL still names
`istio-cni`, and with the binary gone it fails ("failed to find plugin") and kubelet retries it
without end, leaving the pod Terminating. So uninstall keeps the binary while such a sandbox
exists. containerd also writes libcni's cache but runs DEL with the current config, so its
entries hold nothing back; CRI-O is recognised by its process on the node.

Every file here is the runtime's, read only, size-capped; one we cannot read or parse is skipped
(it is not ours to judge, and a wrong "no" only repeats today's failure for that one pod).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

from agent.config import Settings

log = logging.getLogger(__name__)

PLUGIN_TYPE = "istio-cni"
MAX_CACHE_FILE = 1 << 20
"""A cache entry is a few KiB; a bigger file is not one (and is not read into memory)."""
CACHED_CONFIG_RUNTIMES = frozenset({"crio"})
"""Runtimes (process names) that run DEL with the config libcni cached at ADD."""


def plugin_needed_at_teardown(settings: Settings, bin_dir: str) -> bool:
    """Whether uninstall must keep the plugin in bin_dir (and says so in the log)."""
    users = sandboxes_needing_plugin(settings.mountedCniCacheDir, settings.hostProcDir)
    if not users:
        return False
    log.warning(
        "kept the plugin binaries: pod sandboxes on this node run it again at their teardown "
        "(their runtime replays the CNI config cached at set-up); delete them once those pods "
        "are gone, or run `istio-cni-agent uninstall` again then",
        extra={"fields": {"bin_dir": bin_dir, "sandboxes": len(users), "first": users[0]}},
    )
    return True


def sandboxes_needing_plugin(cache_dir: str, proc_dir: str) -> list[str]:
    """Cache files (paths) of sandboxes whose DEL will exec our plugin; sorted."""
    found = [p for p in _files(os.path.join(cache_dir, "multus")) if _names_us(_read_json(p))]
    if _runtime_reads_cached_config(proc_dir):
        for path in _files(os.path.join(cache_dir, "results")):
            entry = _read_json(path)
            if isinstance(entry, dict) and _names_us(_decoded_config(entry.get("config"))):
                found.append(path)
    return sorted(found)


def _runtime_reads_cached_config(proc_dir: str) -> bool:
    try:
        pids = [n for n in os.listdir(proc_dir) if n.isdigit()]
    except OSError:
        return True  # cannot tell: keeping an inert file beats pods stuck Terminating
    for pid in pids:
        try:
            with open(os.path.join(proc_dir, pid, "comm"), "rb") as f:
                comm = f.read(64).strip().decode("utf-8", "replace")
        except OSError:
            continue  # the process ended meanwhile
        if comm in CACHED_CONFIG_RUNTIMES:
            return True
    return False


def _files(directory: str) -> Iterator[str]:
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_file(follow_symlinks=False):
                yield entry.path
        except OSError:
            continue


def _read_json(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CACHE_FILE + 1)
    except OSError:
        return None
    if len(data) > MAX_CACHE_FILE:
        log.debug("skipped an oversized CNI cache file", extra={"fields": {"path": path}})
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def _decoded_config(value: Any) -> Any:
    if not isinstance(value, str):
        return None
    try:
        return json.loads(base64.b64decode(value, validate=True))
    except (binascii.Error, ValueError, RecursionError):
        return None


def _names_us(doc: Any) -> bool:
    """Whether any object in doc (a conflist, a conf, Multus's delegates) has our type."""
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("type") == PLUGIN_TYPE:
                return True
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False
