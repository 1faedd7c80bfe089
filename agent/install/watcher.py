"""Keep the plugin and our entry in place: watch the bin dir and the conf dir, and re-install when
something else removes or changes what we put there.

Start-up runs through the same handler as a change (`reconcile`, the one place that maps an
install's outcome to metrics); `istio-cni-agent run` calls it once before starting the other
services, so a permanent failure at start ends the process. The agent's own config is read once at
start (a change rolls the DaemonSet), so it is not watched here. Events on paths still exactly as
we left them (same content hash) are our own writes and ignored; bursts are grouped (watchfiles
debounce); the watch is re-armed when a watched directory is replaced, and everything is re-checked
at a steady interval in case an event was missed. A node out of inotify instances or watches gets
checked every second instead (polling). The verdict `ready()` reports ages out: a loop that stopped
checking is not trusted.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

import watchfiles

from agent import metrics
from agent.background import BackgroundLoop
from agent.errors import InstallError, TransientInstallError
from agent.install.atomic import is_temp_name
from agent.install.binaries import is_support_dir
from agent.install.conflicts import (
    PLUGIN_CULPRIT,
    ConflictTracker,
    likely_culprit,
    plugin_types,
)
from agent.install.installer import Installer
from agent.install.mounts import detached_dir, node_io_failed
from agent.install.waiting import POLL_SECONDS, WATCH_ERRORS, dir_identity

log = logging.getLogger(__name__)
# watchfiles logs every batch of changes at info: our own writes would flood the log.
logging.getLogger("watchfiles").setLevel(logging.WARNING)


@dataclass(frozen=True)
class WatchTiming:
    step_ms: int = 20
    """Quiet time that ends a burst of events."""
    debounce_ms: int = 200
    """Longest a burst is grouped before we act (a writer that never stops still gets healed)."""
    recheck_seconds: float = 5.0
    """Full check at this interval even without events (a missed event, a replaced mount)."""
    waiting_log_seconds: float = 30.0
    """Interval of the "waiting for a primary CNI config" log line."""
    poll_seconds: float = POLL_SECONDS
    """Full check at this interval while the dirs cannot be watched (inotify exhausted)."""
    rewatch_seconds: float = 30.0
    """While polling, watching is tried again at this interval."""

    @property
    def stale_seconds(self) -> float:
        """A verdict older than this is not the watcher's word any more: a check is due every
        recheck_seconds, so a loop that has not checked for twice as long is stuck or gone."""
        return 2 * self.recheck_seconds + 2.0


Outcome = Literal["in_place", "installed", "waiting", "failed"]


@dataclass(frozen=True)
class Reconciled:
    """What one reconcile found and did."""

    outcome: Outcome
    """in_place: nothing to do; installed: (re)written; waiting: no primary CNI config yet;
    failed: install failed (`error` says why)."""
    error: str = ""
    retry: bool = False
    """failed, but the same install may succeed later: the node's I/O failed (disk full, EIO)."""


class InstallWatcher:
    """Service: install at start, then keep installed until stopped. Ready while in place."""

    def __init__(
        self,
        installer: Installer,
        *,
        timing: WatchTiming | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`on_conflict(path, culprit, fights)` (set by the node services: an Event on the
        agent's pod) is called when another writer keeps removing our entry, at most once a
        minute per file."""
        self.installer = installer
        self.on_conflict: Callable[[str, str, int], None] | None = None
        self._reconciled = False
        self.timing = timing or WatchTiming()
        self.conflicts = ConflictTracker(installer.settings.conflictsPerMinuteWarning)
        # A turn waits recheck_seconds at most (the watch yields on that timeout; polling waits
        # less), then reconciles: local file reads and writes, a binary copied at the longest.
        self._loop = BackgroundLoop(
            "install-watcher", self.run, heartbeat=4 * self.timing.recheck_seconds + 60.0
        )
        self._ready = False
        self._last_wait_log = -1e9
        self._last_error = ""
        self._was_ready = False
        self._clock = clock
        self._checked_at = -1e18
        self._polling = False
        self.heals = 0

    # -- service ----------------------------------------------------------------------------

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()

    def ready(self) -> bool:
        """The last check found everything in place, and it is recent (see stale_seconds)."""
        if self._ready and self._age() > self.timing.stale_seconds:
            metrics.INSTALL_READY.set(0)
            return False
        return self._ready

    def problems(self) -> list[str]:
        """Why not ready: a stale verdict, then what is not in place (for readiness)."""
        out = []
        if (age := self._age()) > self.timing.stale_seconds:
            out.append(
                f"the install watcher last checked {age:.0f} s ago (one is due every "
                f"{self.timing.recheck_seconds:g} s): its loop is stuck or has ended"
            )
        if detached := detached_dir(self.installer.settings):
            return [*out, detached]
        found = self.installer.problems()
        if self._last_error and self._last_error not in found:
            found.append(f"the last install failed: {self._last_error}")
        return out + found

    def detached(self) -> str | None:
        """Why a mounted CNI dir is a deleted one (mounts.py): also the agent's liveness."""
        return detached_dir(self.installer.settings)

    def _age(self) -> float:
        return self._clock() - self._checked_at

    # -- loop -------------------------------------------------------------------------------

    def run(self, iterations: int | None = None) -> None:
        """Reconcile now (unless start-up already did), then on every relevant change until
        stopped (or `iterations` events)."""
        if not self._reconciled:
            self._guarded(lambda: self.reconcile("start"))
        count = 0
        stop = self._loop.stopping
        while not stop.is_set():
            self._loop.beat()
            dirs = self._watched_dirs()
            identity = dir_identity(dirs)
            if not dirs:
                stop.wait(self.timing.recheck_seconds)
                self._guarded(lambda: self.reconcile("recheck"))
                continue
            try:
                # Parents too: a watch follows its directory's inode, so only the parent sees
                # the directory being replaced (a rename over it, a delete and re-create).
                parents = [
                    p for p in dict.fromkeys(os.path.dirname(d) for d in dirs) if p not in dirs
                ]
                for changes in watchfiles.watch(
                    *dirs,
                    *parents,
                    watch_filter=self._wanted,
                    recursive=False,
                    step=self.timing.step_ms,
                    debounce=self.timing.debounce_ms,
                    stop_event=stop,
                    rust_timeout=int(self.timing.recheck_seconds * 1000),
                    yield_on_timeout=True,
                    raise_interrupt=False,
                ):
                    self._loop.beat()
                    self._watching()
                    self._guarded(functools.partial(self._on_changes, changes))
                    count += 1
                    if iterations is not None and count >= iterations:
                        return
                    if self._watched_dirs() != dirs or dir_identity(dirs) != identity:
                        log.info("a watched directory appeared or was replaced; re-arming")
                        # Files may have landed in the new directory before its watch exists.
                        self._guarded(lambda: self.reconcile("re-armed"))
                        break
            except WATCH_ERRORS as e:
                self._poll(e)

    def _poll(self, error: BaseException) -> None:
        """Watching failed (the node is out of inotify instances or watches: ENOSPC, EMFILE):
        check everything every poll_seconds instead, and try watching again after
        rewatch_seconds."""
        if not self._polling:
            self._polling = True
            log.warning(
                "cannot watch the CNI dirs; checking them every %g s instead",
                self.timing.poll_seconds,
                extra={"fields": {"error": str(error)}},
            )
        stop = self._loop.stopping
        until = time.monotonic() + self.timing.rewatch_seconds
        while time.monotonic() < until and not stop.wait(self.timing.poll_seconds):
            self._loop.beat()
            self._guarded(self._poll_once)

    def _poll_once(self) -> None:
        self.reconcile("poll")

    def _watching(self) -> None:
        if self._polling:
            self._polling = False
            log.info("watching the CNI dirs again")

    def _on_changes(self, changes: set[tuple[watchfiles.Change, str]]) -> None:
        relevant = self._relevant([p for _, p in changes])
        # A stream of our own writes' events must not starve the periodic check either.
        if relevant or not changes or self._age() >= self.timing.recheck_seconds:
            self.reconcile(relevant[0] if relevant else "recheck")

    def _guarded(self, step: Callable[[], object]) -> None:
        """One failed round must not end the watch: log it, report not ready, go on."""
        try:
            step()
        except Exception:
            log.exception("install check failed unexpectedly")
            self._set_ready(False)

    def _watched_dirs(self) -> list[str]:
        s = self.installer.settings
        dirs = [s.mountedCniBinDir, s.mountedCniConfDir]
        return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]

    def _watched_dirs_abs(self) -> set[str]:
        s = self.installer.settings
        return {os.path.abspath(s.mountedCniBinDir), os.path.abspath(s.mountedCniConfDir)}

    def _wanted(self, change: watchfiles.Change, path: str) -> bool:
        """watchfiles filter: only names that can matter to us wake the loop."""
        s = self.installer.settings
        if os.path.abspath(path) in self._watched_dirs_abs():
            return True  # a watched directory itself changed: re-arm
        directory, name = os.path.split(os.path.abspath(path))
        if is_temp_name(name):
            return False
        if directory == os.path.abspath(s.mountedCniBinDir):
            return name == "istio-cni" or is_support_dir(name) or self._is_source_name(name)
        return directory == os.path.abspath(s.mountedCniConfDir)

    def _relevant(self, paths: Iterable[str]) -> list[str]:
        """Paths in the watched dirs whose change was not our own write."""
        conf_dir = os.path.abspath(self.installer.settings.mountedCniConfDir)
        bin_dir = os.path.abspath(self.installer.settings.mountedCniBinDir)
        out = []
        for path in paths:
            directory = os.path.dirname(os.path.abspath(path))
            if directory in (conf_dir, bin_dir) and not self.installer.ledger.is_own_state(path):
                out.append(path)
        return out

    def _is_source_name(self, name: str) -> bool:
        return os.path.exists(os.path.join(self.installer.settings.pluginSourceDir, name))

    # -- one reconcile ----------------------------------------------------------------------

    def reconcile(self, reason: str) -> Reconciled:
        """Check; when something is missing or different, install and count the heal. An
        OSError no step turned into an InstallError (a read of the plugin's source failing with
        EIO, say) fails this round like one."""
        self._reconciled = True
        try:
            return self._reconcile(reason)
        except OSError as e:
            self._set_ready(False)
            self._last_error = f"install check failed: {e}"
            log.error("install failed", extra={"fields": {"error": str(e), "cause": reason}})
            return Reconciled("failed", self._last_error, retry=node_io_failed(e))

    def _reconcile(self, reason: str) -> Reconciled:
        detached = detached_dir(self.installer.settings)
        if detached is not None:
            self._set_ready(False)
            if detached != self._last_error:
                log.error(
                    "CNI dir gone from under the agent", extra={"fields": {"error": detached}}
                )
            self._last_error = detached
            return Reconciled("failed", detached)
        problems = self.installer.problems()
        if not problems:
            self._set_ready(True)
            return Reconciled("in_place")
        self._set_ready(False)
        hold = self.conflicts.hold_off()
        if hold > 0:
            # Another writer answers our writes with its own: heal, but not in a tight loop.
            log.info(
                "holding the heal off: another writer keeps rewriting the CNI config",
                extra={"fields": {"seconds": round(hold, 1)}},
            )
            if self._loop.stopping.wait(hold):
                return Reconciled("waiting", "stopping")
            problems = self.installer.problems()
            if not problems:
                self._set_ready(True)
                return Reconciled("in_place")
        try:
            report = self.installer.install()
        except TransientInstallError as e:
            metrics.INSTALLS.labels(result="waiting").inc()
            self._log_waiting(str(e))
            return Reconciled("waiting", str(e))
        except InstallError as e:
            metrics.INSTALLS.labels(result="failure").inc()
            if str(e) != self._last_error:
                log.error("install failed", extra={"fields": {"error": str(e), "cause": reason}})
            self._last_error = str(e)
            return Reconciled("failed", str(e), retry=node_io_failed(e))
        self._last_error = ""
        metrics.INSTALLS.labels(result="success").inc()
        if self._was_ready and report.changed:  # a first install is not a heal
            self._count_heal(report.changed, problems, reason)
        self._set_ready(not self.installer.problems())
        return Reconciled("installed")

    def _set_ready(self, ready: bool) -> None:
        self._was_ready = self._was_ready or ready
        if ready != self._ready:
            log.info("install ready" if ready else "install not ready")
            if ready:
                metrics.INSTALL_READY_SINCE.set_to_current_time()
        self._ready = ready
        self._checked_at = self._clock()
        metrics.INSTALL_READY.set(1 if ready else 0)

    def _log_waiting(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last_wait_log >= self.timing.waiting_log_seconds:
            self._last_wait_log = now
            log.info(message, extra={"fields": {"dir": self.installer.conf_dir}})

    def _count_heal(self, changed: list[str], problems: list[str], reason: str) -> None:
        self.heals += 1
        conf_dir = os.path.abspath(self.installer.conf_dir)
        for path in changed:
            in_conf = os.path.dirname(os.path.abspath(path)) == conf_dir
            metrics.HEALS.labels(kind="config" if in_conf else "binary").inc()
            if os.path.isfile(path):
                self._count_conflict(path, in_conf)
        log.info(
            "healed",
            extra={
                "fields": {
                    "changed": ",".join(changed),
                    "problems": "; ".join(problems),
                    "cause": reason,
                }
            },
        )

    def _count_conflict(self, path: str, in_conf: bool) -> None:
        metrics.CONFLICTS.labels(file=os.path.basename(path)).inc()
        fights = self.conflicts.record(path)
        if fights is None:
            return
        if in_conf:
            types = plugin_types(self.installer.read(os.path.basename(path)))
            culprit = likely_culprit(path, types)
        else:
            culprit = PLUGIN_CULPRIT
        log.warning(
            "another writer keeps removing our CNI config entry; still healing"
            if in_conf
            else "another writer keeps replacing our plugin; still healing, held off",
            extra={
                "fields": {"file": path, "fights_last_minute": fights, "likely_culprit": culprit}
            },
        )
        if self.on_conflict is not None:
            self.on_conflict(path, culprit, fights)
