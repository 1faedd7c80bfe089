"""Which backend programs a namespace, and the one place that turns that choice into calls.

Backends: python-iptables (in-process, legacy), iptables-legacy and iptables-nft (the
`iptables-restore` binaries run inside the namespace) and nftables (each mode's own native
tables, `nft -f`). `auto` picks as Istio does: legacy when the node (host or pod namespace)
already holds legacy rules, else nft. Both modes program through `program` and check through
`present`; what differs between them is the rule model, who owns which chains, and the native
nftables step, which they pass in.

Speed (every pod start waits for this): the host's answer is read once per process, the pod's
from a look into its namespace (agent.netns.look), and the `-save` programs run only where that
look saw tables. The model is built only for the backends that use it.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable
from typing import Final

from agent.errors import RedirectError
from agent.netns import run_command
from agent.netns.look import NetnsLook, look
from agent.rules import backend_iptc, backend_restore
from agent.rules.model import Family, RuleSet
from agent.rules.ownership import OUR_TABLES, Ownership

BACKENDS: Final = ("python-iptables", "iptables-legacy", "iptables-nft", "nftables")
HOST_NETNS = "/proc/self/ns/net"


def program(
    netns_path: str,
    model: Callable[[], RuleSet | None],
    *,
    backend: str,
    owner: Ownership,
    native: Callable[[], None],
    seen: NetnsLook | None,
) -> str:
    """Replace our rules there with `model()` (None removes them); returns the backend used.
    `native` does the same in the mode's native nftables form. `seen`: a look into that
    namespace taken just before (None: look only if the choice needs it, read every family)."""
    chosen = choose_backend(netns_path, backend, seen=seen)
    if chosen == "python-iptables":
        backend_iptc.apply(netns_path, model(), owner)
    elif chosen == "nftables":
        native()
    else:
        variant = _variant(chosen)
        empty = _empty(seen, variant) if seen is not None else ()
        backend_restore.apply(netns_path, model(), variant, empty=empty, owner=owner)
    return chosen


def present(
    netns_path: str,
    model: Callable[[], RuleSet],
    *,
    backend: str,
    owner: Ownership,
    native: Callable[[], bool],
    seen: NetnsLook,
) -> bool:
    """Are exactly the rules of `model()` ours there? python-iptables' rules are read back
    through iptables-legacy-save (python-iptables cannot print rules)."""
    chosen = choose_backend(netns_path, backend, seen=seen)
    if chosen == "nftables":
        return native()
    variant = "legacy" if chosen == "python-iptables" else _variant(chosen)
    return backend_restore.present(
        netns_path, model(), variant, empty=_empty(seen, variant), owner=owner
    )


def choose_backend(netns_path: str, backend: str, *, seen: NetnsLook | None = None) -> str:
    if backend in BACKENDS:
        return backend
    if backend != "auto":
        known = ", ".join(BACKENDS)
        raise RedirectError(f"unknown rule backend {backend!r} (want auto or {known})")
    if _host_uses_legacy() or _pod_uses_legacy(netns_path, seen):
        return "iptables-legacy"
    return "iptables-nft"


@functools.cache
def _host_uses_legacy() -> bool:
    """The node's own namespace, once per process: the agent runs for the node's lifetime
    and what the node uses is settled before pods start (Istio's agent also looks once)."""
    return _legacy_in_use(HOST_NETNS)


def _pod_uses_legacy(netns_path: str, seen: NetnsLook | None) -> bool:
    loaded = (seen or look(netns_path)).legacy_loaded
    # No legacy table was ever used there (a fresh sandbox): nothing to read.
    return loaded is not False and _legacy_in_use(netns_path)


def _legacy_in_use(netns_path: str) -> bool:
    """Any rule or non-default policy in the legacy tables of that namespace."""
    if shutil.which("iptables-legacy-save") is None:
        return False
    for tool in ("iptables-legacy-save", "ip6tables-legacy-save"):
        done = run_command(netns_path, [tool])
        if done.returncode != 0:
            continue
        for line in done.stdout.splitlines():
            if line.startswith("-A ") or (line.startswith(":") and " DROP " in line):
                return True
    return False


def _variant(backend: str) -> str:
    return "legacy" if backend == "iptables-legacy" else "nft"


def _empty(seen: NetnsLook, variant: str) -> frozenset[Family]:
    """Families in which the look saw none of our tables: there is nothing of ours to read."""
    families: tuple[Family, ...] = (4, 6)
    return frozenset(f for f in families if seen.tables_absent(variant, f, OUR_TABLES))
