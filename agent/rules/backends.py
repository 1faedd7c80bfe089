"""Which backend programs a namespace, and the one place that turns that choice into calls.

Backends: python-iptables (in-process, legacy), iptables-legacy and iptables-nft (the
`iptables-restore` binaries run inside the namespace) and nftables (each mode's own native
tables, `nft -f`). `auto` picks as Istio does, per family (IPv4 and IPv6 may differ): legacy when
the namespace it decides in already holds a legacy table of that family, even an empty one, else
nft (decide_family). Istio's sidecar plugin decides in the pod's namespace at each ADD, which
`choose` does with `auto`; Istio's ambient agent decides once in the node's namespace, which
agent.rules.backend_pin does at start and pins for the node's boot (Istio's own look creates an
empty legacy table, so its next start decides otherwise; ours reads the kernel's table list and
creates nothing). Both modes program through `program` and check through `present`; what
differs between them is the rule model, who owns which chains, and the native nftables step,
which they pass in.

Speed (every pod start waits for this): the pod's tables come from a look into its namespace
(agent.netns.look), and the `-save` programs run only where that look saw tables. The model is
built only for the backends that use it.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from agent.errors import RedirectError
from agent.netns import run_command
from agent.netns.look import NetnsLook, look
from agent.rules import backend_iptc, backend_restore
from agent.rules.model import Family, RuleSet
from agent.rules.ownership import OUR_TABLES, Ownership

BACKENDS: Final = ("python-iptables", "iptables-legacy", "iptables-nft", "nftables")
HOST_NETNS = "/proc/self/ns/net"
LEGACY_ONLY: Final[Mapping[Family, str]] = {4: "legacy", 6: "legacy"}
"""The variants python-iptables programs (it reads its rules back through the legacy tools)."""


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
    chosen = choose(netns_path, backend, seen=seen)
    if chosen == "python-iptables":
        backend_iptc.apply(netns_path, model(), owner)
    elif chosen == "nftables":
        native()
    elif isinstance(chosen, FamilyChoice):
        variants = chosen.variants()
        empty = _empty(seen, variants) if seen is not None else ()
        backend_restore.apply(netns_path, model(), variants, empty=empty, owner=owner)
    return chosen if isinstance(chosen, str) else chosen.label


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
    chosen = choose(netns_path, backend, seen=seen)
    if chosen == "nftables":
        return native()
    variants = LEGACY_ONLY if isinstance(chosen, str) else chosen.variants()
    return backend_restore.present(
        netns_path, model(), variants, empty=_empty(seen, variants), owner=owner
    )


def choose_backend(netns_path: str, backend: str, *, seen: NetnsLook | None = None) -> str:
    """The backend `program` uses there, by name (a choice that differs per family names
    both: `ipv4=iptables-legacy,ipv6=iptables-nft`)."""
    chosen = choose(netns_path, backend, seen=seen)
    return chosen if isinstance(chosen, str) else chosen.label


def choose(netns_path: str, backend: str, *, seen: NetnsLook | None = None) -> str | FamilyChoice:
    """python-iptables or nftables by name; an iptables variant per family otherwise.

    `backend` is a name of BACKENDS, `auto`, or a choice per family already made (FamilyChoice's
    label: what `auto` resolved to on the node, pinned for the boot by agent.rules.backend_pin).
    `auto` decides in that namespace as Istio's sidecar plugin does there (decide_family)."""
    if backend in ("python-iptables", "nftables"):
        return backend
    if backend in ("iptables-legacy", "iptables-nft"):
        return FamilyChoice(backend, backend)
    pinned = FamilyChoice.parse(backend)
    if pinned is not None:
        return pinned
    if backend != "auto":
        known = ", ".join(BACKENDS)
        raise RedirectError(f"unknown rule backend {backend!r} (want auto or {known})")
    return detect(netns_path, seen)


def detect(
    netns_path: str, seen: NetnsLook | None = None, *, tools: tuple[bool, bool] | None = None
) -> FamilyChoice:
    """What `auto` chooses in that namespace now, per family (`tools`: whether the legacy and
    the nft tools are installed; None: look on PATH)."""
    tables = _legacy_tables(netns_path, seen)
    legacy, nft = tools or _tools()
    return FamilyChoice(
        decide_family(legacy_tables=tables[4], legacy_tools=legacy, nft_tools=nft),
        decide_family(legacy_tables=tables[6], legacy_tools=legacy, nft_tools=nft),
    )


def decide_family(*, legacy_tables: bool, legacy_tools: bool, nft_tools: bool) -> str:
    """Istio's choice for one family (tools/istio-iptables DetectIptablesVersion): legacy when
    its tools work and the namespace has any legacy table of that family, even an empty one
    (Istio: `<family>-legacy-save` prints 3 lines or more); else nft when its tools work; else
    whichever tools there are."""
    if legacy_tools and legacy_tables:
        return "iptables-legacy"
    if nft_tools:
        return "iptables-nft"
    if legacy_tools:
        return "iptables-legacy"
    raise RedirectError("no iptables tools found (iptables-nft-save, iptables-legacy-save)")


@functools.cache
def _tools() -> tuple[bool, bool]:
    """Whether the legacy and the nft iptables tools are installed (the image's, fixed)."""
    return (
        shutil.which("iptables-legacy-save") is not None,
        shutil.which("iptables-nft-save") is not None,
    )


def _legacy_tables(netns_path: str, seen: NetnsLook | None) -> dict[Family, bool]:
    """Whether the namespace holds any legacy table, per family: from the look (the kernel's
    table list), or where the look could not tell, from `-legacy-save` as Istio reads it."""
    seen = seen or look(netns_path)
    if seen.legacy_tables is not None:
        return {4: bool(seen.legacy_tables[4]), 6: bool(seen.legacy_tables[6])}
    out: dict[Family, bool] = {4: False, 6: False}
    if not _tools()[0]:
        return out
    for fam, tool in ((4, "iptables-legacy-save"), (6, "ip6tables-legacy-save")):
        done = run_command(netns_path, [tool])
        family: Family = 4 if fam == 4 else 6
        out[family] = done.returncode == 0 and (done.stdout + done.stderr).count("\n") >= 3
    return out


@dataclass(frozen=True)
class FamilyChoice:
    """The iptables variant of each family: "iptables-legacy" or "iptables-nft"."""

    ipv4: str
    ipv6: str

    def of(self, family: Family) -> str:
        return self.ipv4 if family == 4 else self.ipv6

    def variants(self) -> dict[Family, str]:
        return {4: _variant(self.ipv4), 6: _variant(self.ipv6)}

    @property
    def label(self) -> str:
        if self.ipv4 == self.ipv6:
            return self.ipv4
        return f"ipv4={self.ipv4},ipv6={self.ipv6}"

    @classmethod
    def parse(cls, text: str) -> FamilyChoice | None:
        """The choice a `label` of two different variants names (None: not such a label)."""
        parts = dict(p.partition("=")[::2] for p in text.split(",")) if "=" in text else {}
        ipv4, ipv6 = parts.get("ipv4"), parts.get("ipv6")
        variants = ("iptables-legacy", "iptables-nft")
        if set(parts) != {"ipv4", "ipv6"} or ipv4 not in variants or ipv6 not in variants:
            return None
        return cls(str(ipv4), str(ipv6))


def _variant(backend: str) -> str:
    return "legacy" if backend == "iptables-legacy" else "nft"


def _empty(seen: NetnsLook, variants: Mapping[Family, str]) -> frozenset[Family]:
    """Families in which the look saw none of our tables: there is nothing of ours to read."""
    families: tuple[Family, ...] = (4, 6)
    return frozenset(f for f in families if seen.tables_absent(variants[f], f, OUR_TABLES))
