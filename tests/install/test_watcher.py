"""The watcher keeps the plugin and our entry in place, never reacting to its own writes."""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import watchfiles
from prometheus_client import REGISTRY

from agent.errors import InstallError
from agent.install import conflist
from agent.install.atomic import atomic_write
from agent.install.conflicts import FIGHT_HEAL_INTERVAL, ConflictTracker
from agent.install.installer import Installer
from agent.install.waiting import wait_installed
from agent.install.watcher import InstallWatcher, WatchTiming
from testbed.agent_host import Node, write_plugin
from testbed.wait import wait_for

LIST = {"cniVersion": "0.4.0", "name": "net", "plugins": [{"type": "ptp"}, {"type": "portmap"}]}


class Running:
    def __init__(self, node: Node, recheck: float) -> None:
        self.installer = Installer(node.settings, pod_name="agent-1", pod_namespace="istio-system")
        self.watcher = InstallWatcher(self.installer, timing=WatchTiming(recheck_seconds=recheck))
        self.node = node

    def has_entry(self, name: str) -> bool:
        try:
            return conflist.has_entry(self.node.conf(name), self.installer.entry)
        except (OSError, ValueError):
            return False


@pytest.fixture
def running(node: Node) -> Iterator[Callable[..., Running]]:
    started: list[Running] = []

    def start(recheck: float = 60.0) -> Running:
        r = Running(node, recheck)
        r.watcher.start()
        started.append(r)
        return r

    yield start
    for r in started:
        r.watcher.stop()


def _drop_entry(path: str, **extra: object) -> None:
    with open(path, "rb") as f:
        config = json.loads(f.read())
    config = {**conflist.remove(config), **extra}
    atomic_write(path, conflist.dumps(config))


def test_heals_removed_entry_and_keeps_their_change(
    node: Node, running: Callable[..., Running]
) -> None:
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    r = running()
    assert wait_for(r.watcher.ready)
    _drop_entry(str(node.conf_dir / "10-net.conflist"), mtu=9001)
    assert wait_for(lambda: r.has_entry("10-net.conflist"))
    assert node.conf("10-net.conflist")["mtu"] == 9001
    assert wait_for(r.watcher.ready)
    assert r.watcher.heals == 1


def test_heals_deleted_and_replaced_binary(node: Node, running: Callable[..., Running]) -> None:
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    r = running()
    assert wait_for(r.watcher.ready)
    plugin = node.bin_dir / "istio-cni"
    plugin.unlink()
    assert wait_for(plugin.exists)
    plugin.write_text("#!/bin/sh\nexit 1\n")
    assert wait_for(lambda: b"test plugin" in plugin.read_bytes())
    assert wait_for(r.watcher.ready)


def test_heals_deleted_conflist_by_waiting_then_reinstalling(
    node: Node, running: Callable[..., Running]
) -> None:
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    r = running()
    assert wait_for(r.watcher.ready)
    (node.conf_dir / "10-net.conflist").unlink()
    assert wait_for(lambda: not r.watcher.ready())
    (node.conf_dir / "20-new.conflist").write_text(json.dumps(LIST))
    assert wait_for(lambda: r.has_entry("20-new.conflist"))
    assert wait_for(r.watcher.ready)


def test_own_writes_do_not_wake_it(node: Node, running: Callable[..., Running]) -> None:
    shutil_conf = node.conf_dir / "10-net.conf"
    shutil_conf.write_text('{"cniVersion":"1.0.0","name":"n","type":"bridge"}')
    r = running()
    assert wait_for(lambda: r.has_entry("10-net.conflist"))
    inode = os.stat(node.conf_dir / "10-net.conflist").st_ino
    time.sleep(1.0)  # the check itself: nothing may happen in this second
    assert r.watcher.heals == 0
    assert os.stat(node.conf_dir / "10-net.conflist").st_ino == inode


def test_waits_for_primary_by_watching(node: Node, running: Callable[..., Running]) -> None:
    r = running(recheck=60.0)  # no periodic recheck within the test: only an event can help
    # A check that nothing happens without a primary (and the watch, which has no ready
    # signal, arms meanwhile: a file written before would be found by the first reconcile).
    time.sleep(0.3)
    assert not r.watcher.ready()
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    assert wait_for(lambda: r.has_entry("10-net.conflist"), timeout=3.0)
    assert wait_for(r.watcher.ready)


def test_ready_does_not_flap_on_harmless_rewrites(
    node: Node, running: Callable[..., Running]
) -> None:
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    r = running()
    assert wait_for(r.watcher.ready)
    samples: list[bool] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(r.watcher.ready())
            time.sleep(0.001)  # the sampling rate of the check

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        path = str(node.conf_dir / "10-net.conflist")
        for _ in range(20):  # same JSON, other formatting, as another tool would re-save it
            config = json.loads((node.conf_dir / "10-net.conflist").read_text())
            atomic_write(path, json.dumps(config, separators=(",", ":")).encode())
            time.sleep(0.02)  # rewrites spread in time, each its own event
        time.sleep(0.3)  # the check: no flap while the watcher handles the last ones
    finally:
        stop.set()
        sampler.join()
    assert samples and all(samples)
    assert r.watcher.heals == 0


def test_conflict_warning_names_file_and_culprit(
    node: Node, running: Callable[..., Running], caplog: pytest.LogCaptureFixture
) -> None:
    node.with_settings(conflictsPerMinuteWarning=2)
    (node.conf_dir / "05-cilium.conflist").write_text(
        json.dumps({"cniVersion": "0.3.1", "name": "cilium", "plugins": [{"type": "cilium-cni"}]})
    )
    r = running()
    assert wait_for(r.watcher.ready)
    path = str(node.conf_dir / "05-cilium.conflist")
    before = (
        REGISTRY.get_sample_value(
            "istio_cni_install_conflicts_total", {"file": "05-cilium.conflist"}
        )
        or 0.0
    )
    with caplog.at_level(logging.WARNING, logger="agent.install.watcher"):
        for _ in range(4):
            _drop_entry(path)
            assert wait_for(lambda: r.has_entry("05-cilium.conflist"))
    assert wait_for(lambda: r.watcher.heals == 4)
    warnings = [rec for rec in caplog.records if "keeps removing" in rec.getMessage()]
    assert len(warnings) == 1
    fields = warnings[0].fields  # type: ignore[attr-defined]
    assert fields["file"] == path and "Cilium" in fields["likely_culprit"]
    assert wait_for(
        lambda: (
            REGISTRY.get_sample_value(
                "istio_cni_install_conflicts_total", {"file": "05-cilium.conflist"}
            )
            == before + 4
        )
    )


def test_a_writer_answering_each_heal_gets_no_tight_loop(
    node: Node, running: Callable[..., Running]
) -> None:
    """Another writer that takes our entry out again as soon as it is back (Cilium with
    cni.exclusive, say): past the threshold heals are FIGHT_HEAL_INTERVAL apart, so 8 s of
    fighting cost at most 4 writes a second instead of one per event, and `on_conflict` hears
    of it with the likely culprit."""
    node.with_settings(conflictsPerMinuteWarning=2)
    name = "05-cilium.conflist"
    (node.conf_dir / name).write_text(
        json.dumps({"cniVersion": "0.3.1", "name": "cilium", "plugins": [{"type": "cilium-cni"}]})
    )
    r = running()
    assert wait_for(r.watcher.ready)
    heard: list[tuple[str, str, int]] = []
    r.watcher.on_conflict = lambda path, culprit, fights: heard.append((path, culprit, fights))
    path = str(node.conf_dir / name)
    deadline = time.monotonic() + 8.0
    rewrites = 0
    while time.monotonic() < deadline:
        if r.has_entry(name):
            _drop_entry(path)
            rewrites += 1
        time.sleep(0.02)
    # Unbounded, a heal follows each rewrite at once: 180 in 8 s here. Held off: 3 at once
    # (threshold 2, then the first past it), then one every 0.25 s at most.
    assert 3 <= r.watcher.heals <= 3 + 8 / FIGHT_HEAL_INTERVAL, (r.watcher.heals, rewrites)
    assert heard and heard[0][0] == path and "Cilium" in heard[0][1], heard


def test_hold_off_past_the_threshold_and_none_after_a_quiet_minute() -> None:
    now = [0.0]
    tracker = ConflictTracker(2, clock=lambda: now[0])
    holds = []
    for _ in range(5):
        tracker.record("/etc/cni/net.d/10-x.conflist")
        now[0] += 0.1
        holds.append(round(tracker.hold_off(), 3))
    assert holds == [0.0, 0.0, 0.15, 0.15, 0.15]  # 0.25 s from the last heal, 0.1 s ago
    now[0] += 61.0  # a quiet minute
    assert tracker.hold_off() == 0.0


def test_rearms_when_conf_dir_replaced(node: Node, running: Callable[..., Running]) -> None:
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    # The periodic recheck is far away: only a re-armed watch can heal within the timeout.
    r = running(recheck=30)
    assert wait_for(r.watcher.ready)
    os.rename(node.conf_dir, node.root / "conf-old")
    node.conf_dir.mkdir()
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    assert wait_for(lambda: r.has_entry("10-net.conflist"), timeout=10)
    _drop_entry(str(node.conf_dir / "10-net.conflist"))  # the new dir is watched
    assert wait_for(lambda: r.has_entry("10-net.conflist"), timeout=5)


def test_conf_dir_created_later_is_watched(node: Node, running: Callable[..., Running]) -> None:
    os.rmdir(node.conf_dir)
    # The periodic recheck is far away: the parent's watch must notice the new directory.
    r = running(recheck=30)
    time.sleep(0.2)  # nothing happens without the directory (and the parent's watch arms)
    assert not r.watcher.ready()
    node.conf_dir.mkdir()
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    assert wait_for(lambda: r.has_entry("10-net.conflist"), timeout=10)
    _drop_entry(str(node.conf_dir / "10-net.conflist"))
    assert wait_for(lambda: r.has_entry("10-net.conflist"), timeout=5)


def test_waiting_is_logged_at_a_steady_interval(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    installer = Installer(node.settings, pod_name="agent-1", pod_namespace="istio-system")
    watcher = InstallWatcher(
        installer, timing=WatchTiming(recheck_seconds=0.05, waiting_log_seconds=0.4)
    )
    with caplog.at_level(logging.INFO, logger="agent.install.watcher"):
        watcher.start()
        try:
            time.sleep(1.0)  # the behaviour under test: logs over about 20 rechecks
        finally:
            watcher.stop()
    lines = [r for r in caplog.records if "waiting for a primary CNI config" in r.getMessage()]
    assert 2 <= len(lines) <= 4
    assert str(node.conf_dir) in lines[0].getMessage()
    assert not watcher.ready()


def _no_inotify(*args: object, **kwargs: object) -> Iterator[set[tuple[object, str]]]:
    """watchfiles.watch on a node out of inotify instances or watches."""
    raise OSError(errno.ENOSPC, "OS file watch limit reached")


def test_heals_by_polling_when_the_node_has_no_inotify_left(
    node: Node, running: Callable[..., Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watchfiles, "watch", _no_inotify)
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    r = running(recheck=60.0)
    assert wait_for(r.watcher.ready)
    _drop_entry(str(node.conf_dir / "10-net.conflist"))
    # Checked every second instead of watched: back within a few seconds.
    assert wait_for(lambda: r.has_entry("10-net.conflist"), timeout=4.0)
    assert wait_for(r.watcher.ready)
    (node.bin_dir / "istio-cni").unlink()
    assert wait_for((node.bin_dir / "istio-cni").exists, timeout=4.0)


def test_not_ready_while_polling_cannot_heal(
    node: Node, running: Callable[..., Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watchfiles, "watch", _no_inotify)
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    r = running(recheck=60.0)
    assert wait_for(r.watcher.ready)

    def refuse() -> object:
        raise InstallError("write CNI config: No space left on device")

    monkeypatch.setattr(r.installer, "install", refuse)
    _drop_entry(str(node.conf_dir / "10-net.conflist"))
    assert wait_for(lambda: not r.watcher.ready(), timeout=4.0)
    assert any("our entry is missing" in p for p in r.watcher.problems())


def test_a_stuck_watch_loop_is_not_ready(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """A verdict the loop no longer renews is not trusted: it ages out after two rechecks."""
    release = threading.Event()

    def stuck(*args: object, **kwargs: object) -> Iterator[set[tuple[object, str]]]:
        release.wait(30)
        yield set()

    monkeypatch.setattr(watchfiles, "watch", stuck)
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    installer = Installer(node.settings, pod_name="agent-1", pod_namespace="istio-system")
    watcher = InstallWatcher(installer, timing=WatchTiming(recheck_seconds=0.5))
    watcher.start()
    try:
        assert wait_for(watcher.ready)
        assert wait_for(lambda: not watcher.ready(), timeout=6.0)
        assert "last checked" in watcher.problems()[0]
    finally:
        release.set()
        watcher.stop()


def test_install_waits_by_polling_when_the_node_has_no_inotify_left(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(watchfiles, "watch", _no_inotify)
    installer = Installer(node.settings, pod_name="agent-1", pod_namespace="istio-system")
    timer = threading.Timer(
        0.5, lambda: (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    )
    timer.start()
    try:
        wait_installed(installer, timeout=10.0, stop=threading.Event())
    finally:
        timer.cancel()
    assert installer.problems() == []


def test_two_agents_with_other_plugin_builds_are_held_off_and_warned(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """A surge: two agents whose images carry different plugin builds. Each puts its own back;
    past the threshold each heals at most once every FIGHT_HEAL_INTERVAL, and says who it
    fights (a log line and `on_conflict`, the Event)."""
    write_plugin(node.root / "src-2", version="2")
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    settings = node.with_settings(conflictsPerMinuteWarning=2)
    agents = []
    heard: list[tuple[str, str, int]] = []
    for src in (node.src_dir, node.root / "src-2"):
        installer = Installer(
            dataclasses.replace(settings, pluginSourceDir=str(src)),
            pod_name="agent-1",
            pod_namespace="istio-system",
        )
        watcher = InstallWatcher(installer, timing=WatchTiming(recheck_seconds=60.0))
        watcher.on_conflict = lambda path, culprit, fights: heard.append((path, culprit, fights))
        agents.append(watcher)
    with caplog.at_level(logging.WARNING, logger="agent.install.watcher"):
        agents[0].start()
        try:
            assert wait_for(agents[0].ready)
            time.sleep(0.3)  # its watch arms (it has no ready signal)
            agents[1].start()
            time.sleep(4.0)  # the fight under test
        finally:
            for watcher in agents:
                watcher.stop()
    heals = sum(w.heals for w in agents)
    # Unbounded, each answers the other at once: dozens of 30 MB writes a second on a node.
    assert 2 <= heals <= 2 * (3 + 4.0 / FIGHT_HEAL_INTERVAL), heals
    warned = [r for r in caplog.records if "keeps replacing our plugin" in r.getMessage()]
    assert warned, [r.getMessage() for r in caplog.records]
    assert heard and heard[0][0] == str(node.bin_dir / "istio-cni")
    assert "different plugin build" in heard[0][1]


def test_an_io_error_no_step_wrapped_fails_the_round_to_retry(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EIO reading the plugin's source at start: a failed round, retried, not a crash."""
    (node.conf_dir / "10-net.conflist").write_text(json.dumps(LIST))
    installer = Installer(node.settings, pod_name="agent-1", pod_namespace="istio-system")
    watcher = InstallWatcher(installer)

    def eio() -> list[str]:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(installer, "problems", eio)
    result = watcher.reconcile("start")
    assert (result.outcome, result.retry) == ("failed", True)
    assert "Input/output error" in result.error
    assert not watcher.ready()
    monkeypatch.undo()
    assert watcher.reconcile("recheck").outcome == "installed"
    assert watcher.ready()
