"""Install once, check, uninstall: the plugin binaries and our entry in the node's CNI config.

Install writes the binaries before the config (an entry must never name a missing plugin) and
records each change in an undo log; uninstall removes the config entry before the binaries, from
that log plus whatever of ours it finds on disk (a fresh `uninstall` process has no log), runs
every step even when one fails, and reports all failures together (the binaries stay while a
pod sandbox will still run the plugin at its teardown: teardown_users.py).

File modes, as Istio's install does: a config file of ours (the standalone config, the
Istio-owned conflist) is 0600, or 0640 with cniConfGroupRead (Istio's CNI_CONF_GROUP_READ), and
a changed mode is put back like changed content; the node's primary config we chain into keeps
the mode it has when we write it (also a .conf we turn into a .conflist, and on uninstall).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.config import Settings
from agent.errors import ChangedUnderUs, InstallError, TransientInstallError
from agent.install import conflist, edits, owned
from agent.install.atomic import (
    FileId,
    atomic_rename,
    atomic_write,
    current_id,
    dangling_target,
    file_id,
    remove_file,
    remove_stale_temps,
)
from agent.install.bin_dir_check import bin_dir_problem
from agent.install.binaries import binary_problems, install_binaries, uninstall_binaries
from agent.install.entry import plugin_entry, standalone_entry
from agent.install.ledger import WriteLedger
from agent.install.plan import (
    ConfigPlan,
    Interrupted,
    interrupted_conversions,
    plan_config,
)
from agent.install.takeover import remove_istio_leftovers
from agent.install.teardown_users import plugin_needed_at_teardown

log = logging.getLogger(__name__)

CONF_MODE = 0o600
"""Mode of a config file of ours (Istio's CNIConfModeDefault)."""
CONF_MODE_GROUP_READ = 0o640
"""Its mode with cniConfGroupRead (Istio's CNIConfModeGroupRead)."""


def own_file_mode(settings: Settings) -> int:
    """The mode of every file we create on the node that is not an executable."""
    return CONF_MODE_GROUP_READ if settings.cniConfGroupRead else CONF_MODE


@dataclass
class InstallReport:
    config_path: str
    changed: list[str] = field(default_factory=list)
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class UndoStep:
    kind: str
    """'entry': remove our entry from a list; 'file': remove a file of ours; 'binaries'."""
    path: str


class Installer:
    """Puts the plugin and its entry on the node for one Settings; keeps an undo log."""

    def __init__(
        self,
        settings: Settings,
        *,
        pod_name: str,
        pod_namespace: str,
        ledger: WriteLedger | None = None,
    ) -> None:
        self.pod_name = pod_name
        self.pod_namespace = pod_namespace
        self.ledger = ledger or WriteLedger()
        self.undo: dict[UndoStep, None] = {}
        self._seen: dict[str, FileId] = {}
        self.reconfigure(settings)

    def reconfigure(self, settings: Settings) -> None:
        """Use new settings from now on (a changed config file); the undo log is kept."""
        self.settings = settings
        self.conf_dir = settings.mountedCniConfDir
        self.bin_dir = settings.mountedCniBinDir
        make = plugin_entry if settings.chained else standalone_entry
        self.entry = make(settings, pod_name=self.pod_name, pod_namespace=self.pod_namespace)
        self.file_mode = own_file_mode(settings)
        self.owns_file = not settings.chained or settings.istioOwnedCNIConfig
        """The file holding our entry is ours (mode file_mode), not the node's primary."""
        self.deletes_file = settings.chained and settings.istioOwnedCNIConfig
        """Uninstall deletes the file whatever else it holds: the Istio-owned copy of the
        primary. Any other file loses only our entry (and goes when nothing else is left)."""

    # -- reading the conf dir -------------------------------------------------------------

    def _path(self, name: str) -> str:
        return os.path.join(self.conf_dir, name)

    def _names(self) -> list[str]:
        try:
            return os.listdir(self.conf_dir)
        except FileNotFoundError:
            raise TransientInstallError(f"CNI conf dir {self.conf_dir} does not exist") from None
        except OSError as e:
            raise InstallError(f"read CNI conf dir {self.conf_dir}: {e.strerror}") from e

    def read(self, name: str) -> bytes | None:
        """A config file's bytes (at most one past the size limit), None when absent or no file."""
        path = self._path(name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except (FileNotFoundError, IsADirectoryError):
            return None
        except OSError as e:
            raise InstallError(f"read CNI config {path}: {e.strerror}") from e
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None
            self._seen[name] = file_id(st)
            with os.fdopen(fd, "rb", closefd=False) as f:
                return f.read(conflist.MAX_CONFIG_BYTES + 1)
        except OSError as e:
            raise InstallError(f"read CNI config {path}: {e.strerror}") from e
        finally:
            os.close(fd)

    def plan(self) -> ConfigPlan:
        names, dangling = self._names(), lambda name: dangling_target(self._path(name))
        return plan_config(self.settings, self.entry, names, self.read, dangling)

    # -- install ----------------------------------------------------------------------------

    def install(self) -> InstallReport:
        """Make binaries and config right; TransientInstallError while the primary is missing."""
        binaries = install_binaries(
            self.settings.pluginSourceDir, self.bin_dir, self.ledger, file_mode=self.file_mode
        )
        self.undo[UndoStep("binaries", self.bin_dir)] = None
        self._clean_conf_dir()
        removed = owned.remove_stale(self.settings, self._names(), self.read, self._delete_owned)
        plan = self.plan()
        for warning in plan.warnings:
            log.warning(warning, extra={"fields": {"dir": self.conf_dir}})
        changed = binaries.written + removed + self._apply(plan)
        # Only once our entry has replaced Istio's: until then its plugin may still need it.
        changed += remove_istio_leftovers(self.settings.cniAgentRunDir, self.conf_dir)
        kind = "file" if self.deletes_file else "entry"
        self.undo[UndoStep(kind, self._path(plan.target))] = None
        return InstallReport(self._path(plan.target), changed, plan.warnings)

    def _clean_conf_dir(self) -> None:
        try:
            remove_stale_temps(self.conf_dir)
        except FileNotFoundError:
            return
        except OSError as e:
            raise InstallError(f"clean up CNI conf dir {self.conf_dir}: {e.strerror}") from e
        for step in interrupted_conversions(self._names(), self.read):
            self._finish(step)

    def _delete_owned(self, path: str) -> list[str]:
        return owned.delete(path, self._seen.get(os.path.basename(path)), self.ledger)

    def _finish(self, step: Interrupted) -> None:
        """Complete a conversion a kill stopped: every runtime reads the .conf until then."""
        src, dst = self._path(step.conf), self._path(step.conflist)
        log.info(
            "finishing an interrupted .conf to .conflist conversion",
            extra={"fields": {"from": src, "to": dst, "step": step.finish}},
        )
        if step.finish == "rename":
            self._guard(atomic_rename, src, dst)
        else:
            self._guard(remove_file, src)
        self.ledger.record_removed(src)

    def _refuse_symlink(self, path: str) -> None:
        if os.path.islink(path):
            raise InstallError(
                f"{path}: is a symlink, expected a regular file (it points to "
                f"{os.readlink(path)}); refusing to replace it "
                "(set cniConfFileName to the file it points to, or replace the link by a file)"
            )

    def _guard(self, fn: Callable[..., object], path: str, *args: Any) -> None:
        try:
            fn(path, *args)
        except OSError as e:
            raise InstallError(f"write CNI config {path}: {e.strerror}") from e

    def _apply(self, plan: ConfigPlan) -> list[str]:
        target = self._path(plan.target)
        self._refuse_symlink(target)
        if plan.convert_from is not None:
            return self._convert(plan.convert_from, target, conflist.dumps(plan.config))
        expect = self._seen.get(plan.target) if plan.target == plan.primary else None
        current = self.read(plan.target)
        data = edits.edited(current, plan.config)
        own = self.owns_file
        if current is not None and self._equal(current, plan.config):
            if not own or self._mode_of(target) == self.file_mode:
                self.ledger.record_written(target, current, mode=self.file_mode if own else None)
                return []
            log.info(
                "CNI config of ours has another mode; putting ours back",
                extra={
                    "fields": {
                        "path": target,
                        "mode": f"{self._mode_of(target):04o}",
                        "want": f"{self.file_mode:04o}",
                    }
                },
            )
            data = current  # same content: only the mode changes
        self._write(target, data, expect=expect, own=own)
        log.info("wrote CNI config", extra={"fields": {"path": target, "primary": plan.primary}})
        return [target]

    def _convert(self, name: str, target: str, data: bytes) -> list[str]:
        """x.conf (one plugin) becomes x.conflist (the list with ours): the complete .conflist
        first, then the .conf goes. In between both exist and every runtime still loads the
        untouched x.conf (it sorts first and is valid), so no instant shows a file a runtime
        rejects; a .conf holding a list, the former order's middle state, fails containerd's
        whole config load. A kill in between is finished by the next install or uninstall
        (plan.interrupted_conversions). The .conflist gets the .conf's mode."""
        src = self._path(name)
        self._refuse_symlink(src)
        try:
            atomic_write(target, data, mode=self.file_mode, keep_mode=False, like=src)
        except OSError as e:
            raise InstallError(f"write CNI config {target}: {e.strerror}") from e
        self.ledger.record_written(target, data)
        if current_id(src) != self._seen.get(name):
            # The .conf changed since we read it: ours would drop that change. Take ours back
            # (runtimes still read the .conf) and merge again.
            self._guard(remove_file, target)
            self.ledger.record_removed(target)
            raise TransientInstallError(
                f"{src} changed while we turned it into a list; converting again"
            )
        self._guard(remove_file, src)
        self.ledger.record_removed(src)
        log.info("converted CNI config to a list", extra={"fields": {"from": src, "to": target}})
        return [src, target]

    def _write(self, path: str, data: bytes, *, expect: FileId | None, own: bool = False) -> None:
        """Our own file gets exactly file_mode; another file (the node's primary config) keeps
        the mode it has at the rename (file_mode only should it have vanished)."""
        try:
            atomic_write(path, data, mode=self.file_mode, keep_mode=not own, expect=expect)
        except ChangedUnderUs:
            raise TransientInstallError(
                f"{path} changed while we merged our entry into it; merging again"
            ) from None
        except OSError as e:
            raise InstallError(f"write CNI config {path}: {e.strerror}") from e
        self.ledger.record_written(path, data, mode=self.file_mode if own else None)

    @staticmethod
    def _mode_of(path: str) -> int:
        try:
            return stat.S_IMODE(os.lstat(path).st_mode)
        except FileNotFoundError:
            return -1

    @staticmethod
    def _equal(data: bytes, config: dict[str, Any]) -> bool:
        try:
            return edits.canonical(conflist.parse(data, source="")) == edits.canonical(config)
        except InstallError:
            return False

    # -- check ------------------------------------------------------------------------------

    def problems(self) -> list[str]:
        """What is not in place (empty: binary and entry are there and valid). Changes nothing."""
        try:
            out = binary_problems(
                self.settings.pluginSourceDir, self.bin_dir, self.ledger, file_mode=self.file_mode
            )
        except InstallError as e:
            out = [str(e)]
        try:
            plan = self.plan()
        except InstallError as e:
            return [*out, str(e)]
        if plan.convert_from is not None:
            return [*out, f"{self._path(plan.convert_from)}: our entry is not chained in"]
        current = self.read(plan.target)
        if current is None or not self._equal(current, plan.config):
            out.append(f"{self._path(plan.target)}: our entry is missing or not as written")
        elif self.owns_file and (mode := self._mode_of(self._path(plan.target))) != self.file_mode:
            out.append(f"{self._path(plan.target)}: mode {mode:04o}, want {self.file_mode:04o}")
        out += owned.stale_problems(self.settings, self._names(), self.read)
        return out

    def bin_dir_problem(self) -> str | None:
        """Whether cniBinDir looks like another dir than the runtime's (bin_dir_check.py)."""
        return bin_dir_problem(self.settings, self.plan, self.read, self.bin_dir)

    # -- uninstall --------------------------------------------------------------------------

    def uninstall(self) -> list[str]:
        """Remove everything of ours; returns what was removed, raises with every failure."""
        errors = self._clean_for_uninstall()
        steps = list(self.undo)
        for step in self._discover():
            if step not in self.undo:
                steps.append(step)
        steps.sort(key=lambda s: s.kind == "binaries")
        done: list[str] = []
        for step in steps:
            try:
                done.extend(self._undo_step(step))
            except (InstallError, OSError) as e:
                errors.append(f"{step.kind} {step.path}: {e}")
        if errors:
            raise InstallError("uninstall failed: " + "; ".join(errors))
        self.undo.clear()
        return done

    def _clean_for_uninstall(self) -> list[str]:
        """Temps a killed install left in the conf dir, and conversions it left half-done."""
        errors: list[str] = []
        try:
            remove_stale_temps(self.conf_dir)
            for step in interrupted_conversions(self._names(), self.read):
                self._finish(step)
        except FileNotFoundError:
            pass
        except (InstallError, OSError) as e:
            errors.append(f"clean up {self.conf_dir}: {e}")
        return errors

    def _discover(self) -> list[UndoStep]:
        """Every file that may hold our entry. Only the Istio-owned copy of the primary is
        deleted whole; cniConfFileName names the node's primary in chained mode, never ours."""
        steps = []
        try:
            names = self._names()
        except InstallError:
            names = []
        own_files = {self.settings.istioOwnedCNIConfigFileName} if self.deletes_file else set()
        own_files |= set(owned.all_copies(names, self.read))
        extra = [self.settings.cniConfFileName] if self.settings.cniConfFileName else []
        for name in sorted(set(conflist.candidate_names(names)) | set(extra) | own_files):
            if name not in names:
                continue
            steps.append(UndoStep("file" if name in own_files else "entry", self._path(name)))
        steps.append(UndoStep("binaries", self.bin_dir))
        return steps

    def _undo_step(self, step: UndoStep) -> list[str]:
        for _ in range(4):
            try:
                return self._undo_once(step)
            except TransientInstallError:
                continue  # another writer changed the file meanwhile: read it again
        return self._undo_once(step)

    def _undo_once(self, step: UndoStep) -> list[str]:
        if step.kind == "binaries":
            if plugin_needed_at_teardown(self.settings, step.path):
                return []
            removed, errors = uninstall_binaries(
                self.settings.pluginSourceDir, step.path, self.ledger
            )
            if errors:
                raise InstallError("; ".join(errors))
            return removed
        name = os.path.basename(step.path)
        data = self.read(name)
        if data is None:
            return []
        try:
            config = conflist.parse(data, source=step.path)
        except InstallError:
            if step in self.undo:
                raise  # we wrote it and can no longer read it: say so
            return []  # a file we never touched and cannot parse is not ours to judge
        origin = None if conflist.is_single(config) else conflist.converted_from(config, name)
        if origin is not None:
            return self._give_back_conf(step.path, config, *origin)
        if not conflist.is_ours_anywhere(config):
            return []
        self._refuse_symlink(step.path)
        if conflist.owned_copy_of(config) is not None:
            return self._delete_owned(step.path)
        if step.kind == "file" or conflist.only_ours(config):
            return self._delete(step.path)
        self._write(step.path, edits.without_entries(data, config), expect=self._seen.get(name))
        return [step.path]

    def _delete(self, path: str) -> list[str]:
        with contextlib.suppress(FileNotFoundError):
            self._guard(remove_file, path)
        self.ledger.record_removed(path)
        return [path]

    def _give_back_conf(self, path: str, config: dict[str, Any], conf: str, text: str) -> list[str]:
        """Uninstall of a list we made from a .conf: the .conf comes back byte for byte (first,
        so a runtime always finds one of the two), then our list goes. A .conf already there
        (its CNI wrote it again) stays as it is; a list whose other plugins someone changed
        keeps their change, without our entry and our note."""
        self._refuse_symlink(path)
        conf_path = self._path(conf)
        rest = conflist.remove(conflist.without_converted_from(config))
        try:
            original = conflist.load(text.encode("utf-8"), source=conf_path)
        except InstallError:
            original = None
        if os.path.lexists(conf_path):
            return self._delete(path)
        if original is None or edits.canonical(rest) != edits.canonical(
            conflist.remove(conflist.as_list(original))
        ):
            if not rest["plugins"]:
                return self._delete(path)
            self._write(path, conflist.dumps(rest), expect=self._seen.get(os.path.basename(path)))
            return [path]
        data = text.encode("utf-8")
        try:
            atomic_write(conf_path, data, mode=0o644, keep_mode=False, like=path)
        except OSError as e:
            raise InstallError(f"write CNI config {conf_path}: {e.strerror}") from e
        self.ledger.record_written(conf_path, data)
        log.info(
            "gave the CNI config back its original .conf",
            extra={"fields": {"from": path, "to": conf_path}},
        )
        return [conf_path, *self._delete(path)]
