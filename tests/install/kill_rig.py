"""Kill `istio-cni-agent install` / `uninstall` at any instant and judge what the node is left with.

Shared by tests/install/test_kill_anywhere.py (the `stress` tier: a random sample plus every exact
point) and bench/kill_anywhere.py (>= 1000 random trials). One trial: a fresh node (the CNI conf
dir holding one of the 29 real providers' configs or Istio's test .conf without cniVersion, a bin
dir holding a foreign plugin), a scenario
(what is already on the node, which command runs), the command run as a child process of this one
(forked after imports, then `agent.cli.main(["install" | "uninstall", ...])`: the console script's
code path without the interpreter's start-up, so a sleep before SIGKILL lands inside the command),
killed by SIGKILL after a random delay or right before its Nth file operation
(tests/install/kill_hook.py). Then, on what the kill left:

- every config file a runtime lists (.conf/.conflist/.json) loads as libcni loads it (checked here
  independently of the agent's own parser: a .conflist needs a non-empty `plugins` list of typed
  objects, a .conf/.json a non-empty `type`), since containerd fails its whole load on one bad file;
- the config the runtime picks (the first in name order) holds the provider's plugins intact and
  in order, its name and cniVersion kept (a list made from a .conf has one: its own, or 0.3.1),
  and at most one istio-cni entry in the whole dir;
- a foreign config and the foreign plugin are byte-for-byte untouched;
- bin/istio-cni, when present, is byte-equal to one of the builds (never half-written), and a
  support dir present under its hashed name is complete;
- when the picked config names istio-cni, the plugin runs: `CNI_COMMAND=VERSION` answers;
- the next install converges (problems() empty, exactly one entry, last; the new build; no temp
  and no support dir left) and a fresh uninstall gives the provider's file back byte for byte
  (a .conf made a list included) and leaves nothing of ours.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.config import Settings
from agent.install import conflist
from agent.install.binaries import tree_digest
from agent.install.installer import Installer
from tests.install import kill_hook

TESTDATA = pathlib.Path(__file__).resolve().parents[1] / "testdata"
REAL_WORLD = TESTDATA / "istio-conformance" / "real-world"
SOURCES = {p.name: p for p in REAL_WORLD.iterdir() if p.suffix in (".conf", ".conflist")}
SOURCES["minikube-no-version.conf"] = TESTDATA / "istio-install-test" / "pre" / "minikube_cni.conf"
"""The 29 real providers' configs, and Istio's test .conf without cniVersion."""
PROVIDERS = sorted(SOURCES)

SCENARIOS = (
    "install",
    "upgrade",
    "upgrade-support-dir",
    "uninstall",
    "uninstall-support-dir",
    "leftover-entry",
    "extra-config",
    "named-install",
    "named-uninstall",
)
"""install: a node with only the provider's config. upgrade: an older single-file build installed
(other entry content). upgrade-support-dir: a former two-part build installed (a launcher that
execs its runtime from istio-cni-<hash>.d). uninstall / uninstall-support-dir: uninstall of this
build / of the former two-part build. leftover-entry: a stale istio-cni entry in the middle of
the provider's list and an old binary. extra-config: an unrelated config sorting after the
provider's, which must stay untouched. named-install / named-uninstall: install, and uninstall
of an install, with cniConfFileName naming the provider's file."""

POD = ("istio-cni-node-x", "istio-system")
FOREIGN_PLUGIN = b"#!/bin/sh\n# the provider's own plugin: never ours to touch\nexit 0\n"
EXTRA_CONFIG = {
    "cniVersion": "0.4.0",
    "name": "extra",
    "plugins": [{"type": "macvlan", "master": "eth9", "ipam": {"type": "dhcp"}}],
}
STALE_ENTRY = {"type": "istio-cni", "log_level": "debug", "stale": "from a former install"}
VERSION_JSON = '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}'
OLD_PLUGIN = f"#!/bin/sh\n# former single-file build\necho '{VERSION_JSON}'\n"
SUPPORT_DIR = "istio-cni-0f1e2d3c4b5a6978.d"
OLD_LAUNCHER = (
    f"#!/bin/sh\n# former two-part build: a launcher that needs its runtime\n"
    f'exec "$(dirname "$0")/{SUPPORT_DIR}/runtime" "$@"\n'
)
OLD_RUNTIME = f"#!/bin/sh\necho '{VERSION_JSON}'\n"


@dataclass
class Builds:
    """Plugin source dirs: `new` is the real static plugin from ci/build-plugin."""

    new: pathlib.Path
    old: pathlib.Path
    two_part: pathlib.Path
    known_hashes: set[str] = field(default_factory=set)
    support_digest: str = ""


def make_builds(root: pathlib.Path, plugin: pathlib.Path) -> Builds:
    new, old, two_part = root / "src-new", root / "src-old", root / "src-two-part"
    for d in (new, old, two_part / SUPPORT_DIR):
        d.mkdir(parents=True)
    shutil.copy(plugin, new / "istio-cni")
    (old / "istio-cni").write_text(OLD_PLUGIN)
    (two_part / "istio-cni").write_text(OLD_LAUNCHER)
    (two_part / SUPPORT_DIR / "runtime").write_text(OLD_RUNTIME)
    for i in range(24):  # stands in for libpython and the .pyc files: a copy that takes time
        (two_part / SUPPORT_DIR / f"lib{i:02d}.so").write_bytes(os.urandom(64 << 10))
    for f in (
        new / "istio-cni",
        old / "istio-cni",
        two_part / "istio-cni",
        two_part / SUPPORT_DIR / "runtime",
    ):
        f.chmod(0o755)
    builds = Builds(new, old, two_part)
    builds.known_hashes = {_sha(d / "istio-cni") for d in (new, old, two_part)}
    builds.support_digest = tree_digest(str(two_part / SUPPORT_DIR))
    return builds


def _sha(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class Trial:
    provider: str
    scenario: str
    root: pathlib.Path
    builds: Builds

    @property
    def bin_dir(self) -> pathlib.Path:
        return self.root / "bin"

    @property
    def conf_dir(self) -> pathlib.Path:
        return self.root / "conf"

    @property
    def primary(self) -> str:
        return f"10-{self.provider}"

    @property
    def command(self) -> str:
        uninstall = self.scenario.startswith("uninstall") or self.scenario == "named-uninstall"
        return "uninstall" if uninstall else "install"

    @property
    def conf_file_name(self) -> str:
        return self.primary if self.scenario.startswith("named-") else ""

    def settings(self, source: pathlib.Path | None = None, **overrides: Any) -> Settings:
        return Settings(
            mountedCniBinDir=str(self.bin_dir),
            mountedCniConfDir=str(self.conf_dir),
            pluginSourceDir=str(source or self.builds.new),
            metricsAddress="127.0.0.1",
            cniAgentRunDir=str(self.root / "run"),
            cniConfFileName=self.conf_file_name,
            **overrides,
        )

    def installer(self, settings: Settings | None = None) -> Installer:
        return Installer(settings or self.settings(), pod_name=POD[0], pod_namespace=POD[1])

    def original(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(SOURCES[self.provider].read_text())
        return value

    def setup(self) -> None:
        """The node before the command: the provider's config plus what the scenario puts."""
        if self.root.exists():
            shutil.rmtree(self.root)
        for d in (self.bin_dir, self.conf_dir, self.root / "run"):
            d.mkdir(parents=True)
        (self.bin_dir / "bridge").write_bytes(FOREIGN_PLUGIN)
        (self.bin_dir / "bridge").chmod(0o755)
        shutil.copy(SOURCES[self.provider], self.conf_dir / self.primary)
        os.chmod(self.conf_dir / self.primary, 0o644)
        (self.root / "config.yaml").write_text(
            json.dumps(
                {
                    "mountedCniBinDir": str(self.bin_dir),
                    "mountedCniConfDir": str(self.conf_dir),
                    "pluginSourceDir": str(self.builds.new),
                    "metricsAddress": "127.0.0.1",
                    "cniAgentRunDir": str(self.root / "run"),
                    "cniConfFileName": self.conf_file_name,
                    "logLevel": "error",
                }
            )
        )
        if self.scenario in ("upgrade", "uninstall-support-dir", "upgrade-support-dir"):
            source = self.builds.old if self.scenario == "upgrade" else self.builds.two_part
            self.installer(self.settings(source, logLevel="debug")).install()
        elif self.scenario in ("uninstall", "named-uninstall"):
            self.installer().install()
        elif self.scenario == "leftover-entry":
            self._leftover()
        elif self.scenario == "extra-config":
            (self.conf_dir / "99-extra.conflist").write_text(json.dumps(EXTRA_CONFIG, indent=1))

    def _leftover(self) -> None:
        shutil.copy(self.builds.old / "istio-cni", self.bin_dir / "istio-cni")
        listed = conflist.as_list(self.original())
        listed["plugins"].insert(len(listed["plugins"]) // 2, dict(STALE_ENTRY))
        os.unlink(self.conf_dir / self.primary)
        name = conflist.list_file_name(self.primary)
        (self.conf_dir / name).write_text(json.dumps(listed, indent=2))

    def child(self, kill_before: int | None) -> int:
        """Fork the command; returns its pid. The child never returns."""
        pid = os.fork()
        if pid:
            return pid
        code = 1
        try:
            fd = os.open(str(self.root / "command.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.environ["POD_NAME"], os.environ["POD_NAMESPACE"] = POD
            if kill_before is not None:
                kill_hook.arm(kill_before)
            from agent import cli

            code = cli.main([self.command, "--config", str(self.root / "config.yaml")])
        finally:
            os._exit(code)


Violation = tuple[str, str]


# -- what a runtime sees -----------------------------------------------------------------------


def libcni_loads(name: str, data: bytes) -> str | None:
    """Why libcni (containerd's go-cni loop, CRI-O's ocicni) would reject this file, or None."""
    try:
        value = json.loads(data)
    except ValueError as e:
        return f"not JSON: {e}"
    if not isinstance(value, dict):
        return "not an object"
    if name.endswith(".conflist"):
        plugins = value.get("plugins")
        if not isinstance(plugins, list) or not plugins:
            return "no plugins list"
        if not all(
            isinstance(p, dict) and isinstance(p.get("type"), str) and p["type"] for p in plugins
        ):
            return "a plugin without type"
        return None
    if not isinstance(value.get("type"), str) or not value["type"]:
        return "network type not found (a list in a .conf?)"
    return None


def _configs(conf_dir: pathlib.Path) -> list[str]:
    return sorted(
        n for n in os.listdir(conf_dir) if os.path.splitext(n)[1] in (".conf", ".conflist", ".json")
    )


def _as_plugins(config: dict[str, Any]) -> list[Any]:
    if "plugins" in config:
        return [p for p in config["plugins"] if not conflist.is_ours(p)]
    return [{k: v for k, v in config.items() if k != "cniVersion"}]


def _provider_kept(trial: Trial, config: dict[str, Any]) -> str | None:
    original = trial.original()
    want = [p for p in _as_plugins(original) if not conflist.is_ours(p)]
    if _as_plugins(config) != want:
        return "plugins changed or out of order"
    if "name" in original and config.get("name") != original["name"]:
        return "name changed"
    version = original.get("cniVersion")
    if "plugins" in config and conflist.is_single(original):
        version = conflist.list_version(original)  # a list needs one (absent: libcni hands "")
    if version is not None and config.get("cniVersion") != version:
        return "cniVersion changed"
    return None


def _runs(plugin: pathlib.Path) -> str | None:
    try:
        done = subprocess.run(
            [str(plugin)],
            env={"CNI_COMMAND": "VERSION"},
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=10,
            check=False,
        )
    except OSError as e:
        return f"exec failed: {e}"
    if done.returncode != 0 or b"supportedVersions" not in done.stdout:
        return f"VERSION exit {done.returncode}: {done.stdout[:200]!r} {done.stderr[-200:]!r}"
    return None


def node_violations(trial: Trial) -> list[Violation]:
    """What is wrong with the node as a runtime would see it right now (after a kill)."""
    out: list[Violation] = []
    names = _configs(trial.conf_dir)
    ours_total = 0
    for name in names:
        data = (trial.conf_dir / name).read_bytes()
        why = libcni_loads(name, data)
        if why is not None:
            out.append(("unloadable config", f"{name}: {why}"))
            continue
        ours_total += conflist.count_ours(json.loads(data))
    if ours_total > 1:
        out.append(("duplicate entry", f"{ours_total} istio-cni entries"))
    extra = trial.conf_dir / "99-extra.conflist"
    if trial.scenario == "extra-config" and json.loads(extra.read_bytes()) != EXTRA_CONFIG:
        out.append(("foreign config changed", extra.name))
    if (trial.bin_dir / "bridge").read_bytes() != FOREIGN_PLUGIN:
        out.append(("foreign plugin changed", "bridge"))
    plugin = trial.bin_dir / "istio-cni"
    if plugin.exists() and _sha(plugin) not in trial.builds.known_hashes:
        out.append(("half-written binary", f"sha256 {_sha(plugin)[:12]}"))
    support = trial.bin_dir / SUPPORT_DIR
    if support.exists() and tree_digest(str(support)) != trial.builds.support_digest:
        out.append(("half-written support dir", SUPPORT_DIR))
    if not names:
        out.append(("provider config lost", "no config file"))
        return out
    pick = names[0]
    picked = json.loads((trial.conf_dir / pick).read_bytes()) if not out else None
    if picked is None:
        return out
    why = _provider_kept(trial, picked)
    if why is not None:
        out.append(("provider plugins changed", f"{pick}: {why}"))
    if conflist.count_ours(picked) and (why := _runs(plugin)) is not None:
        out.append(("named plugin does not run", why))
    return out


def convergence_violations(trial: Trial) -> list[Violation]:
    """The next install puts everything right; a fresh uninstall then leaves nothing of ours."""
    out: list[Violation] = []
    installer = trial.installer()
    try:
        installer.install()
    except Exception as e:
        return [("install does not converge", f"{type(e).__name__}: {e}")]
    problems = installer.problems()
    if problems:
        out.append(("install does not converge", "; ".join(problems)))
    names = _configs(trial.conf_dir)
    expect = {conflist.list_file_name(trial.primary)}
    if trial.scenario == "extra-config":
        expect.add("99-extra.conflist")
    if set(names) != expect:
        out.append(("install does not converge", f"conf dir holds {names}"))
    picked = json.loads((trial.conf_dir / names[0]).read_bytes())
    plugins = picked.get("plugins", [])
    if conflist.count_ours(picked) != 1 or not conflist.is_ours(plugins[-1]):
        out.append(("install does not converge", "not exactly one entry, last"))
    if (why := _provider_kept(trial, picked)) is not None:
        out.append(("provider plugins changed", f"after install: {why}"))
    if _sha(trial.bin_dir / "istio-cni") != _sha(trial.builds.new / "istio-cni"):
        out.append(("install does not converge", "bin/istio-cni is not the new build"))
    elif (why := _runs(trial.bin_dir / "istio-cni")) is not None:
        out.append(("named plugin does not run", f"after install: {why}"))
    left = sorted(
        n
        for d in (trial.conf_dir, trial.bin_dir)
        for n in os.listdir(d)
        if n.startswith(".") or n.endswith(".d")
    )
    if left:
        out.append(("leftover after install", ", ".join(left)))
    out += _uninstall_violations(trial)
    return out


def _uninstall_violations(trial: Trial) -> list[Violation]:
    try:
        trial.installer().uninstall()
    except Exception as e:
        return [("uninstall fails", f"{type(e).__name__}: {e}")]
    out: list[Violation] = []
    bins = sorted(os.listdir(trial.bin_dir))
    if bins != ["bridge"]:
        out.append(("leftover after uninstall", f"bin dir holds {bins}"))
    names = sorted(os.listdir(trial.conf_dir))
    # The provider's own file comes back byte for byte; a stale entry a former install left in a
    # list it made (no record of the .conf's text) leaves that list, equal to the provider's.
    leftover = trial.scenario == "leftover-entry"
    expect = [conflist.list_file_name(trial.primary) if leftover else trial.primary]
    if trial.scenario == "extra-config":
        expect.append("99-extra.conflist")
    if names != expect:
        out.append(("leftover after uninstall", f"conf dir holds {names}"))
        return out
    data = (trial.conf_dir / names[0]).read_bytes()
    if leftover and json.loads(data) != conflist.as_list(trial.original()):
        out.append(("uninstall does not restore", names[0]))
    elif not leftover and data != SOURCES[trial.provider].read_bytes():
        out.append(("uninstall does not restore the provider's bytes", names[0]))
    return out


# -- running trials ----------------------------------------------------------------------------


@dataclass
class Outcome:
    killed: bool
    violations: list[Violation]


def run_trial(
    trial: Trial, *, delay: float | None = None, kill_before: int | None = None
) -> Outcome:
    """Set up, run the command, SIGKILL it after `delay` s (or let the kill hook do it), judge."""
    trial.setup()
    pid = trial.child(kill_before)
    if delay is not None:
        time.sleep(delay)  # the kill's instant: the injected fault
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    if not killed and os.waitstatus_to_exitcode(status) != 0:
        log = (trial.root / "command.log").read_text(errors="replace")[-1500:]
        return Outcome(False, [("command failed", f"exit {status}: {log}")])
    violations = node_violations(trial)
    violations += convergence_violations(trial)
    return Outcome(killed, violations)


def command_duration(trial: Trial, runs: int = 3) -> float:
    """Median wall time of the unkilled command for this trial's scenario."""
    times = []
    for _ in range(runs):
        trial.setup()
        start = time.monotonic()
        pid = trial.child(None)
        os.waitpid(pid, 0)
        times.append(time.monotonic() - start)
    return sorted(times)[len(times) // 2]


@dataclass
class Tally:
    trials: int = 0
    killed: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)

    def add(self, label: str, outcome: Outcome) -> None:
        self.trials += 1
        self.killed += outcome.killed
        for kind, detail in outcome.violations:
            self.by_kind[kind] += 1
            self.examples.setdefault(kind, f"{label}: {detail}")

    def report(self) -> str:
        lines = [
            f"{self.trials} trials, {self.killed} killed mid-command, "
            f"{sum(self.by_kind.values())} violations"
        ]
        lines += [
            f"  {kind}: {n} (e.g. {self.examples[kind]})"
            for kind, n in sorted(self.by_kind.items())
        ]
        return "\n".join(lines)


def random_trials(
    root: pathlib.Path,
    builds: Builds,
    count: int,
    *,
    seed: int,
    until_killed: int | None = None,
    progress: Callable[[int, Tally], None] | None = None,
) -> Tally:
    """`count` trials over random providers and scenarios, each killed at a random instant in
    [0, span]; span starts at the scenario's unkilled duration x 1.2 and follows the load.

    With `until_killed`, trials stop as soon as that many were killed mid-command (`count` is
    then the cap): how many kills land inside the command depends on the machine's load, the
    number a test asks for does not."""
    rng = random.Random(seed)
    spans = {s: command_duration(Trial(PROVIDERS[0], s, root, builds)) * 1.2 for s in SCENARIOS}
    tally = Tally()
    for i in range(count):
        if until_killed is not None and tally.killed >= until_killed:
            break
        trial = Trial(rng.choice(PROVIDERS), rng.choice(SCENARIOS), root, builds)
        delay = rng.uniform(0, spans[trial.scenario])
        outcome = run_trial(trial, delay=delay)
        tally.add(f"{trial.scenario}/{trial.provider} after {delay * 1000:.1f} ms", outcome)
        # Keep the window on the command as the machine's load changes: about two thirds of
        # the kills land inside it, the rest just after it finished.
        spans[trial.scenario] *= 1.05 if outcome.killed else 0.9
        if progress is not None:
            progress(i + 1, tally)
    return tally


EXACT_PROVIDERS = ("bridge.conf", "calico.conflist", "minikube-no-version.conf")
"""A single-plugin .conf (converted to a list), a list, and a .conf without cniVersion: every
code path of the config side."""


def exact_points(
    root: pathlib.Path, builds: Builds, providers: tuple[str, ...] = EXACT_PROVIDERS
) -> tuple[Tally, dict[str, int]]:
    """Kill before the 1st, 2nd, ... file operation of each scenario until the command ends
    untouched; returns the tally and the number of points per scenario/provider."""
    tally = Tally()
    points: dict[str, int] = {}
    for provider in providers:
        for scenario in SCENARIOS:
            n = 0
            while True:
                n += 1
                outcome = run_trial(Trial(provider, scenario, root, builds), kill_before=n)
                if not outcome.killed:
                    points[f"{scenario}/{provider}"] = n - 1
                    if outcome.violations:
                        tally.add(f"{scenario}/{provider} unkilled", outcome)
                    break
                tally.add(f"{scenario}/{provider} before op {n}", outcome)
                if n > 500:
                    tally.add(
                        f"{scenario}/{provider}",
                        Outcome(True, [("endless command", "more than 500 file operations")]),
                    )
                    break
    return tally, points
