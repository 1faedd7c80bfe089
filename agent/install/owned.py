"""Istio-owned copies of the primary (istioOwnedCNIConfig) that the settings no longer name.

A copy carries conflist.OWNED_COPY_KEY, so it is known as ours whatever its name (one written
before copies were marked, at the default name, by plan.is_owned_copy): after the
option is turned off or its file name changed, the copy is never taken for the primary
(plan.find_primary), install removes it, readiness names it until then, and uninstall removes
every copy. Each is removed only while it is the very file judged ours (remove_if_unchanged).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection

from agent.config import Settings
from agent.errors import InstallError, TransientInstallError
from agent.install import conflist
from agent.install.atomic import FileId, remove_if_unchanged
from agent.install.ledger import WriteLedger
from agent.install.plan import Reader, is_owned_copy, stale_owned_copies

log = logging.getLogger(__name__)


def stale(settings: Settings, names: Collection[str], read: Reader) -> list[str]:
    """stale_owned_copies, never a symlink: a link is not a copy we wrote."""
    directory = settings.mountedCniConfDir
    found = stale_owned_copies(settings, names, read)
    return [name for name in found if not os.path.islink(os.path.join(directory, name))]


def stale_problems(settings: Settings, names: Collection[str], read: Reader) -> list[str]:
    return [
        f"{os.path.join(settings.mountedCniConfDir, name)}: an Istio-owned copy of the primary "
        "the settings no longer name (the runtime may load it instead of the primary); to be "
        "removed"
        for name in stale(settings, names, read)
    ]


def remove_stale(
    settings: Settings,
    names: Collection[str],
    read: Reader,
    delete: Callable[[str], list[str]],
) -> list[str]:
    """Remove each stale copy through `delete` (a path); the paths removed."""
    removed = []
    for name in stale(settings, names, read):
        path = os.path.join(settings.mountedCniConfDir, name)
        log.info(
            "removing an Istio-owned copy of the primary CNI config the settings no longer "
            "name (istioOwnedCNIConfig off, or istioOwnedCNIConfigFileName changed)",
            extra={"fields": {"path": path}},
        )
        removed += delete(path)
    return removed


def all_copies(names: Collection[str], read: Reader) -> list[str]:
    """Every Istio-owned copy in the conf dir, whatever the settings name (a file that cannot
    be read is not judged here: uninstall's entry step reports it)."""
    out = []
    for name in conflist.candidate_names(names):
        try:
            if is_owned_copy(name, names, read):
                out.append(name)
        except InstallError:
            continue
    return out


def delete(path: str, judged: FileId | None, ledger: WriteLedger) -> list[str]:
    """Remove a file judged ours by its content (`judged`: its id when read), unless another
    file took its place since."""
    try:
        gone = remove_if_unchanged(path, judged)
    except OSError as e:
        raise InstallError(f"remove CNI config {path}: {e.strerror}") from e
    if not gone:
        raise TransientInstallError(f"{path} changed while we removed it; judging it again")
    ledger.record_removed(path)
    return [path]
