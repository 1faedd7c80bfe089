"""The real agent on the real node while the node's CNI dirs misbehave, one fault after another on
one chart install, a sidecar pod started during each.

Faults (each against the chart's agent, run by kubelet and containerd):
- owner and mode: the primary config owned by 1234:1234, mode 0640, before the install; the same
  after the install and after the uninstall;
- inotify exhausted: `fs.inotify.max_user_instances` at 1 (restored after) and the agent's pod
  replaced, so it starts unable to watch; then our entry removed from the primary: put back by
  polling;
- primary a symlink: to a file in the conf dir without our entry (resolving), then to a node
  path that does not exist (dangling): both refused, not Ready naming the link; then a regular
  file again;
- conf dir deleted and made again (a CNI reinstall): not Ready naming `cni-dirs`, liveness
  fails, kubelet restarts the container, which chains into the new dir's primary (the new dir a
  small tmpfs, for the faults after it); then kubelet and containerd restart, as containerd
  stops watching a removed conf dir;
- disk full mid-run and the conf dir read-only, each with our entry removed meanwhile: not
  Ready naming `install`, healed once the disk is freed or the dir writable again;
- disk full at start: the agent's container killed on a full disk with our entry removed; the
  one kubelet starts stays up, not Ready, and heals once the disk is freed;
- `istioOwnedCNIConfig` turned on, then off, by upgrades: the runtime loads the owned copy,
  then the primary, our entry in both.

Checked throughout, every 0.5 s: the file libcni would load from the conf dir (the libcni oracle
ci/setup-testbed builds) holds our entry whenever the agent's /readyz says ready (a sample right
after someone else removed the entry may still read ready for one readiness period: STALE_GRACE).
Each pod started during a fault ends captured (Istio's rules in its netns) or failed closed
first and was captured after; for the faults in which a third party removes our entry from a dir
the agent cannot write, the runtime loads a config without our plugin: a pod started then
fails closed at its istio-validation init container (Istio's injected check, as every sidecar pod
has with the CNI on) until the agent's repair programs it, within REPAIR_WINDOW. The figures (how
the agent reported each fault, time to heal, the pods) are printed as a table; bench/README.md
("Node faults on the real node") keeps one run's.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config import settings_from_mapping
from agent.install.conflicts import FIGHT_HEAL_INTERVAL
from agent.netns import run_in_netns
from testbed import chart as agent_mod
from testbed import images, kubepods, podnet
from testbed.agent_host import (
    RunningAgent,
    agent_command,
    http_get,
    running_agent,
    wait_checks,
)
from testbed.images import Image
from testbed.parts import libcni_oracle
from testbed.ports import free_port
from testbed.realnode import RealCluster
from testbed.wait import WaitTimeout, wait_for

pytestmark = [pytest.mark.nodefaults]

PORT = 15014  # the chart's default metricsPort, in the node's network namespace (hostNetwork)
SAMPLE_SECONDS = 0.5
STALE_GRACE = 3.0
"""Longest the agent may still read ready after someone else removed its entry: the install
check's period (2 s) plus the polling interval (1 s)."""
HEAL_TIMEOUT = 90.0
"""To Ready with our entry loaded: up to a liveness restart (3 x 10 s) and kubelet's back-off."""
POD_TIMEOUT = 120.0
REPAIR_WINDOW = 30.0
"""For the agent's repair to program a pod that started uncaptured: its loop looks every 5 s,
once its pod cache has listed (a restarted agent's first rounds)."""
OWNER = (1234, 1234)
MODE = 0o640
TMPFS_SIZE = "256k"
LOOP = ["connect-loop", "203.0.113.10", "80", "1"]
REPAIRED = "started without traffic redirect"
REPAIRED_POD = re.compile(r" pod=[^/ ]+/(\S+)")
SECOND_BUILD = b"\0another build of the plugin\n"
FIGHT_SECONDS = 8.0
INOTIFY_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")


@dataclass
class Sample:
    at: float
    ready: bool | None
    """None: /readyz did not answer (not listening, paused)."""
    first_line: str
    loaded: str | None
    """The file libcni would load (its name), None: none."""
    has_entry: bool


@dataclass
class FaultResult:
    name: str
    began: float = 0.0
    ended: float = 0.0
    healed: float | None = None
    reported: list[str] = field(default_factory=list)
    pods: dict[str, str] = field(default_factory=dict)
    """pod -> how it ended."""
    held_pods: list[str] = field(default_factory=list)
    """Pods of a fault in which the runtime may load no entry of ours (a third party removed it
    from a dir the agent could not write): the fault is held until the runtime decided."""


class Sampler:
    """/readyz and the file libcni would load, every SAMPLE_SECONDS."""

    def __init__(self, cluster: RealCluster, core: Any) -> None:
        self.cluster = cluster
        self.core = core
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._oracle = str(libcni_oracle().require())

    def _readyz(self) -> tuple[bool | None, str]:
        try:
            code, body = run_in_netns(
                self.cluster.network.netns_path, lambda: http_get(PORT, "/readyz")
            )
        except OSError:
            return None, "no answer"
        return code == 200, body.splitlines()[0] if body else str(code)

    def _loaded(self) -> tuple[str | None, bool]:
        conf_dir = self.cluster.cni_conf_dir
        done = subprocess.run(
            [self._oracle, str(conf_dir)], capture_output=True, text=True, timeout=10, check=False
        )
        loaded = done.stdout.strip() or None
        if loaded is None:
            return None, False
        try:  # the oracle prints the file's name; a symlink is read through
            plugins = json.loads((conf_dir / loaded).read_text()).get("plugins") or []
        except (OSError, ValueError):
            return loaded, False
        return loaded, any(p.get("type") == "istio-cni" for p in plugins)

    def sample(self) -> Sample:
        ready, first = self._readyz()
        loaded, has_entry = self._loaded()
        return Sample(time.monotonic(), ready, first, loaded, has_entry)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self.samples.append(self.sample())

    def between(self, start: float, end: float) -> list[Sample]:
        return [s for s in self.samples if start <= s.at <= end]

    def stale_runs(self) -> list[tuple[float, float]]:
        """Runs of samples that read ready while the loaded file lacked our entry, longer than
        STALE_GRACE: (start, length)."""
        runs, start = [], None
        for s in self.samples:
            bad = s.ready is True and not s.has_entry
            if bad and start is None:
                start = s.at
            elif not bad and start is not None:
                runs.append((start, s.at - start))
                start = None
        if start is not None:
            runs.append((start, self.samples[-1].at - start))
        return [r for r in runs if r[1] > STALE_GRACE]

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def loads_with_entry(sampler: Sampler, name: str) -> bool:
    """The agent ready and the runtime loading `name`, our entry in it."""
    sample = sampler.sample()
    return bool(sample.ready and sample.has_entry and sample.loaded == name)


def healed(sampler: Sampler, what: str, timeout: float = HEAL_TIMEOUT) -> float:
    """Until /readyz is ready and the loaded file holds our entry; the time it happened."""
    sample = wait_for(
        lambda: s if (s := sampler.sample()).ready and s.has_entry else None,
        f"the agent Ready with our entry loaded after {what}",
        timeout,
        interval=0.25,
        on_timeout=lambda: explain(sampler, sampler.core),
    )
    return float(sample.at)


def explain(sampler: Sampler, core: Any) -> str:
    """The last sample and the conf dir's files, for a timeout's message."""
    conf_dir = sampler.cluster.cni_conf_dir
    files = []
    for p in sorted(conf_dir.iterdir()):
        files.append(f"{p.name}: {p.read_text(errors='replace')[:600] if p.is_file() else '-'}")
    logs = [
        kubepods.logs(core, agent_mod.AGENT_NAMESPACE, p.metadata.name, agent_mod.AGENT_CONTAINER)
        for p in agent_mod.agent_pods(core)
    ]
    return f"last sample: {sampler.sample()}\n" + "\n".join(files + [s[-4000:] for s in logs])


def reported(sampler: Sampler, start: float, end: float) -> list[str]:
    """The distinct ways /readyz said not ready between start and end."""
    seen: list[str] = []
    for s in sampler.between(start, end):
        word = s.first_line if s.ready is False else ("no answer" if s.ready is None else "")
        if word and word not in seen:
            seen.append(word)
    return seen


def wait_reported(sampler: Sampler, check: str, timeout: float = 60.0) -> str:
    """Until /readyz names `check`; its first line."""
    sample = wait_for(
        lambda: s if (s := sampler.sample()).ready is False and check in s.first_line else None,
        f"the agent's /readyz to name {check}",
        timeout,
        interval=0.25,
    )
    return str(sample.first_line)


def write_conflist(path: Path, conf: dict[str, Any]) -> None:
    """Rewrite the file in place (keeps its inode, owner and mode), as an editor of it would."""
    with open(path, "r+") as f:
        f.truncate(0)
        f.write(json.dumps(conf, indent=2) + "\n")


def without_entry(conf: dict[str, Any]) -> dict[str, Any]:
    return {**conf, "plugins": [p for p in conf["plugins"] if p.get("type") != "istio-cni"]}


VALIDATION = kubepods.VALIDATION


def sidecar_pod(core: Any, ns: str, image: str, proxy_image: str, name: str) -> str:
    """A pod as Istio's injector leaves it with the CNI on: istio-validation (the test bed's
    proxy image, Istio's pilot-agent) before the app and istio-proxy."""
    validation = kubepods.validation_container(proxy_image)
    manifest = kubepods.pod_manifest(
        name, image, app_command=LOOP, sidecar=True, init_containers=[validation]
    )
    core.create_namespaced_pod(ns, manifest)
    return name


def validation_failed(core: Any, ns: str, name: str) -> bool:
    """Did istio-validation find the pod's traffic not redirected (exit 126) at some point?"""
    pod = core.read_namespaced_pod(name, ns)
    for status in pod.status.init_container_statuses or []:
        if status.name == VALIDATION:
            last = status.last_state.terminated if status.last_state else None
            return bool(last is not None and last.exit_code == 126)
    return False


def note_repairs(core: Any, repaired: set[str]) -> None:
    """Add the pods the agent's repair found started without redirect (its log) to `repaired`."""
    for pod in agent_mod.agent_pods(core):
        log = kubepods.logs(
            core, agent_mod.AGENT_NAMESPACE, pod.metadata.name, agent_mod.AGENT_CONTAINER
        )
        for line in log.splitlines():
            if REPAIRED in line and (found := REPAIRED_POD.search(line)):
                repaired.add(found.group(1))


def pod_end(cluster: RealCluster, core: Any, ns: str, name: str, repaired: set[str]) -> str:
    """How a pod started during a fault ended: captured, failed closed then captured, ran
    uncaptured until the agent's repair programmed it, or runs without Istio's rules once the
    repair has had REPAIR_WINDOW to find it (a pod whose sandbox kubelet retried may start only
    when the agent comes back, with the config the runtime loaded just before)."""
    view = kubepods.wait_running(core, ns, name, timeout=POD_TIMEOUT, ready=False)
    events = kubepods.pod_events(core, ns, name)
    refused = "FailedCreatePodSandBox" in events
    if refused:  # why, for the printed record
        print(name, [e.strip()[:400] for e in events.splitlines() if "FailedCreatePod" in e][:1])
    netns = cluster.pod_netns(view.uid)
    try:
        wait_for(lambda: podnet.has_istio_rules(netns), f"Istio's rules in {name}", REPAIR_WINDOW)
    except WaitTimeout:
        return "UNCAPTURED"
    note_repairs(core, repaired)
    if validation_failed(core, ns, name):
        return "failed closed (istio-validation exited 126), repaired in place, then captured"
    if name in repaired:  # repaired within istio-validation's 5 s of retries: it passed then
        return "held by istio-validation until repaired in place, then captured"
    return f"{'failed closed, then ' if refused else ''}captured"


def wait_sandbox_tried(cluster: RealCluster, core: Any, ns: str, name: str) -> str:
    """Until the runtime has tried the pod's sandbox (its network set up, or refused), or
    kubelet holds it because the runtime has no network config (the node not Ready): the fault
    is still on when the pod's start is decided. How it was decided."""

    def decided() -> str | None:
        if core.read_namespaced_pod(name, ns).status.pod_ip:
            return "sandbox started"
        if "FailedCreatePodSandBox" in kubepods.pod_events(core, ns, name):
            return "sandbox refused"
        return None if cluster.node_ready() else "held by kubelet: network not ready"

    return str(
        wait_for(decided, f"the runtime to decide {name}'s start", POD_TIMEOUT, interval=0.5)
    )


@contextlib.contextmanager
def paused(pid: int) -> Iterator[None]:
    """The agent's process stopped (SIGSTOP) meanwhile: what the test changes then, the agent
    finds at once when it goes on, as if both had happened in the same instant."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def fill(conf_dir: Path) -> Path:
    """A file filling the conf dir's file system (the test's tmpfs) to its last byte."""
    filler = conf_dir / ".filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for chunk in (65536, 4096, 1):
            with contextlib.suppress(OSError):  # ENOSPC: full at this chunk size
                while True:
                    os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)
    return filler


def remount(conf_dir: Path, mode: str) -> None:
    """The conf dir's file system (the test's tmpfs) read-only or read-write, for every mount of
    it: the agent's view included."""
    subprocess.run(["mount", "-o", f"remount,{mode}", str(conf_dir)], check=True)


@contextlib.contextmanager
def inotify_instances(limit: int) -> Iterator[None]:
    """fs.inotify.max_user_instances at `limit` (machine-wide), restored whatever happens."""
    saved = INOTIFY_INSTANCES.read_text()
    INOTIFY_INSTANCES.write_text(f"{limit}\n")
    try:
        yield
    finally:
        INOTIFY_INSTANCES.write_text(saved)


@contextlib.contextmanager
def second_agent(cluster: RealCluster, core: Any, root: Path) -> Iterator[tuple[RunningAgent, int]]:
    """Another agent on the node, as a surge's second pod is: the chart's settings and node
    dirs, the plugin's socket in the same run dir, but another plugin build (the chart's with
    bytes appended: it runs the same) and its own HTTP port on loopback; a process of the
    machine with the admin's credentials. Never uninstalls on stop. (agent, port)."""
    src = root / "second-plugin"
    src.mkdir()
    plugin = src / "istio-cni"
    plugin.write_bytes((cluster.cni_bin_dir / "istio-cni").read_bytes() + SECOND_BUILD)
    plugin.chmod(0o755)
    port = free_port()
    settings = {
        **chart_config(core),
        "mountedCniBinDir": str(cluster.cni_bin_dir),
        "mountedCniConfDir": str(cluster.cni_conf_dir),
        "mountedNetnsDir": str(cluster.netns_dir),
        "hostProcDir": "/proc",
        "pluginSourceDir": str(src),
        "metricsAddress": "127.0.0.1",
        "metricsPort": port,
        "uninstallOnStop": "never",
    }
    config = root / "second-config.yaml"
    config.write_text(yaml.safe_dump(settings))
    env = {
        "POD_NAME": "istio-cni-second",
        "POD_NAMESPACE": agent_mod.AGENT_NAMESPACE,
        "NODE_NAME": cluster.node_name,
        "KUBECONFIG": str(cluster.kubeconfig),
    }
    with running_agent(agent_command("run", "--config", str(config)), **env) as agent:
        yield agent, port


def plugin_writes(path: Path, seconds: float) -> int:
    """How many times the plugin's bytes changed in `seconds` (sampled every 20 ms)."""
    changes, last = 0, path.read_bytes()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.02)
        with contextlib.suppress(OSError):
            now = path.read_bytes()
            changes += now != last
            last = now
    return changes


def chart_config(core: Any) -> dict[str, Any]:
    """The agent's config.yaml as the chart rendered it into its ConfigMap."""
    maps = core.list_namespaced_config_map(agent_mod.AGENT_NAMESPACE).items
    config = next(m.data["config.yaml"] for m in maps if "config.yaml" in (m.data or {}))
    return dict(yaml.safe_load(config))


def settings_threshold(core: Any) -> int:
    """The chart's conflictsPerMinuteWarning (heals of a file a minute before the hold-off),
    defaulted as the agent defaults it."""
    settings = settings_from_mapping(chart_config(core), source="the chart's ConfigMap")
    return settings.conflictsPerMinuteWarning


def agent_pid(cluster: RealCluster, agent: agent_mod.Agent) -> tuple[str, int]:
    assert cluster.runtime is not None
    return cluster.runtime.running_container(agent.pod.uid, agent_mod.AGENT_CONTAINER)


def agent_restarts(core: Any, before: kubepods.PodView) -> int:
    """Restarts of the agent container of pod `before` since `before` was seen."""
    now = kubepods.pod_view(core, agent_mod.AGENT_NAMESPACE, before.name)
    assert now is not None and now.uid == before.uid, "the agent pod was replaced"
    restarts = now.containers[agent_mod.AGENT_CONTAINER]["restarts"]
    return int(restarts) - int(before.containers[agent_mod.AGENT_CONTAINER]["restarts"])


def owner_mode(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_uid, st.st_gid, st.st_mode & 0o7777


@pytest.mark.timeout(900)
def test_node_faults_keep_our_entry_loaded_while_ready(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    agent_image: Image,
    workload_ns: str,
    tmp_path: Path,
) -> None:
    image = real_cluster.images["workload"].ref
    proxy = images.image("proxy")
    real_cluster.import_image(proxy)
    conf_dir = real_cluster.cni_conf_dir
    primary = real_cluster.conflist_path
    results: list[FaultResult] = []
    ownership: dict[str, tuple[int, int, int]] = {}
    pods_count = 0
    repaired: set[str] = set()

    def during(result: FaultResult, *, held: bool = False) -> None:
        nonlocal pods_count
        pods_count += 1
        name = sidecar_pod(node_core, workload_ns, image, proxy.ref, f"during-{pods_count}")
        result.pods[name] = ""
        if held:
            result.held_pods.append(name)
            wait_sandbox_tried(real_cluster, node_core, workload_ns, name)

    with contextlib.ExitStack() as stack:
        recreated = [False]

        @stack.callback
        def _restore_node() -> None:
            # The tmpfs gone, the node's own config back as the test bed made it (root-owned,
            # 0644) in the dir under it; containerd restarted when the dir was recreated: it
            # stops watching a conf dir that is removed, and would load no change after.
            while subprocess.run(["mountpoint", "-q", str(conf_dir)], check=False).returncode == 0:
                subprocess.run(["umount", "-l", str(conf_dir)], check=True)
            reference = json.dumps(real_cluster.reference_conflist(), indent=2) + "\n"
            (conf_dir / "primary.real").unlink(missing_ok=True)
            primary.unlink(missing_ok=True)
            primary.write_text(reference)
            if recreated[0]:
                real_cluster.restart_node()

        os.chown(primary, *OWNER)
        os.chmod(primary, MODE)
        ownership["before install"] = owner_mode(primary)
        helm = node_helm("4")
        agent = agent_mod.install(helm, real_cluster, node_core, agent_image)
        ownership["after install"] = owner_mode(primary)
        sampler = stack.enter_context(Sampler(real_cluster, node_core))

        # -- inotify exhausted: a new agent that cannot watch, then our entry removed.
        result = FaultResult("inotify exhausted")
        with inotify_instances(1):
            result.began = time.monotonic()
            node_core.delete_namespaced_pod(agent.pod.name, agent_mod.AGENT_NAMESPACE)
            agent = agent_mod.ready_agent(node_core, real_cluster, image=agent_image)
            log = kubepods.wait_log_line(
                node_core,
                agent_mod.AGENT_NAMESPACE,
                agent.pod.name,
                agent_mod.AGENT_CONTAINER,
                lambda line: "cannot watch the CNI dirs" in line,
                "the agent polling",
                timeout=30,
            )
            result.reported.append("log: cannot watch the CNI dirs; checking every 1 s")
            assert "checking them every 1 s" in log, log
            write_conflist(primary, without_entry(agent_mod.conflist(real_cluster)))
            result.ended = time.monotonic()
            result.healed = healed(sampler, "our entry removed while polling")
            during(result)  # inotify still exhausted
            time.sleep(2)
        results.append(result)

        # -- the primary a symlink: resolving (chained into its target), then dangling.
        result = FaultResult("primary a symlink")
        # In the conf dir, under a name libcni passes over: the agent's mount has it too.
        target = conf_dir / "primary.real"
        target.write_text(json.dumps(without_entry(agent_mod.conflist(real_cluster))))
        result.began = time.monotonic()
        primary.unlink()
        primary.symlink_to(target.name)
        # Refused, resolving or not: the agent replaces no link and edits no file it names.
        result.reported.append(wait_reported(sampler, "install"))
        assert primary.is_symlink(), "the agent replaced the symlink"
        during(result, held=True)
        dangling = conf_dir.parent / "gone.conflist"
        primary.unlink()
        primary.symlink_to(dangling)
        result.reported.append(wait_reported(sampler, "install"))
        during(result, held=True)
        time.sleep(2)
        primary.unlink()
        primary.write_text(target.read_text())
        os.chown(primary, *OWNER)
        os.chmod(primary, MODE)
        result.ended = time.monotonic()
        result.healed = healed(sampler, "the dangling symlink replaced by a file")
        results.append(result)

        note_repairs(node_core, repaired)

        # -- the conf dir deleted and made again (a tmpfs, for the faults after this one).
        result = FaultResult("conf dir recreated")
        before = agent_mod.ready_agent(node_core, real_cluster).pod
        content = json.dumps(real_cluster.reference_conflist(), indent=2) + "\n"
        result.began = time.monotonic()
        recreated[0] = True
        shutil.rmtree(conf_dir)
        conf_dir.mkdir()
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0755", "tmpfs", str(conf_dir)],
            check=True,
        )
        primary.write_text(content)
        os.chown(primary, *OWNER)
        os.chmod(primary, MODE)
        result.ended = time.monotonic()
        result.reported.append(wait_reported(sampler, "cni-dirs"))
        during(result, held=True)
        result.healed = healed(sampler, "the conf dir recreated")
        agent = agent_mod.ready_agent(node_core, real_cluster, image=agent_image)
        assert agent_restarts(node_core, before) == 1, agent.pod  # the same pod, restarted once
        result.reported.append("liveness: container restarted by kubelet")
        results.append(result)
        # containerd (2.x) stops watching a conf dir that is removed: until it restarts it
        # loads no later change, whatever the dir holds. Restarted here (its containers keep
        # running), so that the runtime in the faults below loads what the dir holds.
        real_cluster.restart_node()
        healed(sampler, "containerd and kubelet restarted")

        # -- the disk full mid-run: our entry removed while the conf dir's file system is full,
        # so the agent cannot write its temp file.
        result = FaultResult("disk full mid-run")
        _, pid = agent_pid(real_cluster, agent)
        with paused(pid):
            write_conflist(primary, without_entry(agent_mod.conflist(real_cluster)))
            filler = fill(conf_dir)
        result.began = time.monotonic()
        result.reported.append(wait_reported(sampler, "install"))
        during(result, held=True)
        filler.unlink()
        result.ended = time.monotonic()
        result.healed = healed(sampler, "the disk freed")
        results.append(result)

        # -- the conf dir read-only: our entry removed, then no one may write there.
        result = FaultResult("conf dir read-only")
        _, pid = agent_pid(real_cluster, agent)
        with paused(pid):
            write_conflist(primary, without_entry(agent_mod.conflist(real_cluster)))
            remount(conf_dir, "ro")
        try:
            result.began = time.monotonic()
            result.reported.append(wait_reported(sampler, "install"))
            during(result, held=True)
        finally:
            remount(conf_dir, "rw")
        result.ended = time.monotonic()
        result.healed = healed(sampler, "the conf dir writable again")
        results.append(result)

        # -- the disk full at start: the agent's container killed while the file system is full
        # and our entry is gone; the one kubelet starts cannot write, and must not exit.
        result = FaultResult("disk full at start")
        before = agent_mod.ready_agent(node_core, real_cluster).pod
        note_repairs(node_core, repaired)  # the log of the container about to be killed
        _, pid = agent_pid(real_cluster, agent)
        with paused(pid):
            write_conflist(primary, without_entry(agent_mod.conflist(real_cluster)))
            filler = fill(conf_dir)
            os.kill(pid, signal.SIGKILL)
        result.began = time.monotonic()
        wait_for(lambda: agent_restarts(node_core, before) > 0, "kubelet to restart the agent", 60)
        result.reported.append(wait_reported(sampler, "install", timeout=HEAL_TIMEOUT))
        during(result, held=True)
        time.sleep(5)  # it stays up, not ready, while it cannot write
        assert agent_restarts(node_core, before) == 1, "the agent exited on a full disk"
        filler.unlink()
        result.ended = time.monotonic()
        result.healed = healed(sampler, "the disk freed at start")
        agent = agent_mod.ready_agent(node_core, real_cluster, image=agent_image)
        results.append(result)

        # -- istioOwnedCNIConfig turned on, then off, by upgrades: the runtime loads the owned
        # copy while it is on, the primary again once it is off, our entry in both.
        result = FaultResult("owned config toggled")
        owned = conf_dir / "02-istio-cni.conflist"
        note_repairs(node_core, repaired)  # the log of the pod the upgrades replace
        result.began = time.monotonic()
        for on in (True, False):
            helm.upgrade(
                agent_mod.RELEASE,
                agent_mod.CHART,
                namespace=agent_mod.AGENT_NAMESPACE,
                values=agent_mod.node_values(real_cluster, agent_image, istioOwnedCNIConfig=on),
            )
            wanted = owned.name if on else primary.name
            wait_for(
                functools.partial(loads_with_entry, sampler, wanted),
                f"the runtime to load {wanted} with our entry",
                HEAL_TIMEOUT,
                interval=0.25,
                on_timeout=lambda: explain(sampler, node_core),
            )
            assert owned.exists() == on, sorted(p.name for p in conf_dir.iterdir())
            result.reported.append(f"{'on' if on else 'off'}: loaded {wanted}")
            during(result)
        result.ended = result.healed = time.monotonic()
        agent = agent_mod.ready_agent(node_core, real_cluster, image=agent_image)
        results.append(result)

        # -- two agents at once with different plugin builds (a rolling update's surge): the
        # second takes the plugin's socket (the newer agent does) and puts its own plugin back;
        # each is held off and warns. Then it stops, and the chart's agent serves alone again.
        result = FaultResult("two agents")
        ours = (real_cluster.cni_bin_dir / "istio-cni").read_bytes()
        result.began = time.monotonic()
        with second_agent(real_cluster, node_core, tmp_path) as (second, second_port):
            wait_checks(second_port, "install", "pod-socket", timeout=30)
            writes = plugin_writes(real_cluster.cni_bin_dir / "istio-cni", FIGHT_SECONDS)
            result.reported.append(f"plugin rewritten {writes} times in {FIGHT_SECONDS:.0f} s")
            during(result)
            code, second_log = second.stop()
        assert code == 0, second_log[-3000:]
        result.ended = time.monotonic()
        result.healed = healed(sampler, "the second agent gone")
        during(result)
        warned = "keeps replacing our plugin"
        assert warned in second_log, second_log[-3000:]
        assert warned in agent_mod.ready_agent(node_core, real_cluster).logs(node_core)
        result.reported.append("both: log 'keeps replacing our plugin'")
        # Each heals at most once per FIGHT_HEAL_INTERVAL past the warning threshold; unheld,
        # each answered the other at once: 6-36 writes a second each.
        assert (
            0 < writes <= 2 * (settings_threshold(node_core) + FIGHT_SECONDS / FIGHT_HEAL_INTERVAL)
        )
        wait_for(
            lambda: (real_cluster.cni_bin_dir / "istio-cni").read_bytes() == ours,
            "the chart's plugin build back in the bin dir",
            30,
        )
        results.append(result)

        sampler.__exit__()
        for r in results:
            for pod in r.pods:
                r.pods[pod] = pod_end(real_cluster, node_core, workload_ns, pod, repaired)

        agent_mod.uninstall(helm, node_core)
        assert "istio-cni" not in agent_mod.plugin_types(real_cluster)
        assert not (conf_dir / "02-istio-cni.conflist").exists()
        ownership["after uninstall"] = owner_mode(primary)

    print("\nfault                 reported as                                  heal (s)  pods")
    for r in results:
        heal = f"{(r.healed or r.ended) - r.ended:8.1f}"
        print(f"{r.name:<21} {' | '.join(r.reported) or '-':<44} {heal}  ", end="")
        print("; ".join(f"{p}: {how}" for p, how in r.pods.items()))
    print("owner/mode of the primary:", {k: f"{u}:{g} {m:o}" for k, (u, g, m) in ownership.items()})
    stale = sampler.stale_runs()
    print(
        f"samples: {len(sampler.samples)}, ready without our entry loaded > {STALE_GRACE} s: "
        f"{stale}"
    )

    assert set(ownership.values()) == {(*OWNER, MODE)}, ownership
    covered = sampler.samples[-1].at - sampler.samples[0].at
    assert len(sampler.samples) >= covered / 2 and stale == [], (len(sampler.samples), stale)
    # istio-validation runs before the app: no app ran uncaptured, whatever the fault.
    uncaptured = [(r.name, p) for r in results for p, how in r.pods.items() if how == "UNCAPTURED"]
    assert uncaptured == [], uncaptured
