"""Whether the node's CNI dirs this container sees are still the node's.

The agent sees the node's conf and bin dirs through hostPath mounts, bound when the container
starts to the directories then at those node paths. A CNI reinstall that deletes a dir and
creates it again (`rm -rf /etc/cni/net.d; mkdir ...`) leaves the mount on the deleted directory:
the agent sees it empty, forever, while the runtime reads the new one, which never gets our
entry. Nothing inside the container can bind the new directory; a new container can (kubelet
binds the hostPath again). So a deleted mounted dir (its link count is 0: a live directory has
at least 2) makes the agent neither Ready nor live: its liveness probe fails and kubelet
restarts the container. And which failures of those dirs pass by themselves (disk full, EIO):
those are retried, at start as later, never ending the agent.
"""

from __future__ import annotations

import errno
import os

from agent.config import Settings

CONTAINERD_STOPS_WATCHING = (
    "; containerd 2.x stops watching a conf dir that is removed and loads no later change to "
    "it until it restarts: restart containerd on this node too, or pods may start without "
    "this entry (the repair loop then programs them)"
)


def detached_dir(settings: Settings) -> str | None:
    """Why a mounted CNI dir is no longer the node's (None: both are, or are not there yet)."""
    for kind, mounted, node_path in (
        ("conf", settings.mountedCniConfDir, settings.cniConfDir),
        ("bin", settings.mountedCniBinDir, settings.cniBinDir),
    ):
        try:
            links = os.stat(mounted).st_nlink
        except OSError:
            continue  # missing: the installer waits for it and says so
        if links == 0:
            return (
                f"the CNI {kind} dir {mounted} (node path {node_path}) was deleted on the node "
                "(a CNI reinstall recreating it?): this container still sees the deleted "
                "directory, not the one the runtime reads; restart the container so it mounts "
                "the new one" + (CONTAINERD_STOPS_WATCHING if kind == "conf" else "")
            )
    return None


NODE_IO_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.ENOMEM, errno.EAGAIN, errno.EBUSY, errno.ESTALE}
)
"""Errors of the node's filesystem that pass (space freed, a device back): retried, never fatal."""


def node_io_failed(error: BaseException) -> bool:
    """Whether `error` (or what caused it) is one of NODE_IO_ERRNOS."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in NODE_IO_ERRNOS:
            return True
        seen = seen.__cause__
    return False
