"""Waiting for a change in the node's CNI dirs: an inotify watch when the kernel grants one,
else polling.

A node can run out of inotify instances or watches (`fs.inotify.max_user_instances`,
`max_user_watches`: ENOSPC, EMFILE, ENFILE from inotify_init or inotify_add_watch). Watching is
then no longer possible, but the agent's job is not: it checks the files every POLL_SECONDS
instead, and tries to watch again now and then. `watch_error` tells such a failure from any
other exception of the watch library.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

import watchfiles

from agent.errors import TransientInstallError
from agent.install.installer import Installer

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
"""Interval of the checks while a directory cannot be watched."""
WATCH_ERRORS = (OSError, RuntimeError)
"""What watchfiles raises when the kernel refuses a watch (OSError from inotify_init or
inotify_add_watch; RuntimeError from its Rust side)."""


def wait_for_change(directory: str, timeout_ms: int, stop: threading.Event) -> None:
    """Return after a change in `directory`, `timeout_ms`, or `stop`; when the directory is
    missing or cannot be watched, after at most POLL_SECONDS (the caller checks again)."""
    if not os.path.isdir(directory):
        stop.wait(min(timeout_ms / 1000, POLL_SECONDS))
        return
    try:
        for _ in watchfiles.watch(
            directory,
            watch_filter=None,
            recursive=False,
            step=20,
            debounce=200,
            stop_event=stop,
            rust_timeout=max(timeout_ms, 1),
            yield_on_timeout=True,
            raise_interrupt=False,
        ):
            return
    except WATCH_ERRORS as e:
        log.debug("cannot watch %s, polling: %s", directory, e)
        stop.wait(min(timeout_ms / 1000, POLL_SECONDS))


def wait_installed(
    installer: Installer,
    *,
    timeout: float | None,
    stop: threading.Event,
    log_interval: float = 30.0,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Install, waiting (watching the conf dir, or polling it when it cannot be watched) while
    the primary config is missing.

    Raises TransientInstallError when `timeout` passes or `stop` is set first.
    """
    deadline = None if timeout is None else clock() + timeout
    last_log = -1e9
    while True:
        try:
            installer.install()
            return
        except TransientInstallError as e:
            now = clock()
            if stop.is_set() or (deadline is not None and now >= deadline):
                raise
            if now - last_log >= log_interval:
                last_log = now
                log.info(str(e), extra={"fields": {"dir": installer.conf_dir}})
            wait_s = log_interval if deadline is None else min(log_interval, deadline - now)
            wait_for_change(installer.conf_dir, int(wait_s * 1000), stop)


def dir_identity(dirs: list[str]) -> list[tuple[int, int]]:
    """(device, inode) of each dir, (0, 0) for one that is gone: a replaced dir differs."""
    out = []
    for d in dirs:
        try:
            st = os.stat(d)
        except OSError:
            out.append((0, 0))
            continue
        out.append((st.st_dev, st.st_ino))
    return out
