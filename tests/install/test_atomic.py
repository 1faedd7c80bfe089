"""Temp files: which are still being written is told by a lock, never by a PID (the agent is
PID 1 in its pod, as every other agent is in its own)."""

from __future__ import annotations

import fcntl
import os
import pathlib
import threading

from agent.install.atomic import atomic_write, remove_stale_temps
from agent.install.installer import Installer
from testbed.agent_host import Node


def test_a_temp_named_with_our_own_pid_is_removed(node: Node) -> None:
    """A kill -9 between fsync and rename of an agent that was PID 1, as the next one is: its
    20 MB temp must not outlive the next install, nor uninstall."""
    (node.conf_dir / "10-net.conflist").write_text('{"name":"n","plugins":[{"type":"ptp"}]}')
    pid = os.getpid()
    binary = node.bin_dir / f".istio-cni.{pid}.deadbeef.istio-tmp"
    binary.write_bytes(b"\0" * (20 << 20))
    config = node.conf_dir / f".10-net.conflist.{pid}.0badcafe.istio-tmp"
    config.write_text("{")
    installer = Installer(node.settings, pod_name="agent-1", pod_namespace="istio-system")
    installer.install()
    assert not binary.exists() and not config.exists()
    binary.write_bytes(b"half")
    config.write_text("{")
    installer.uninstall()
    assert not binary.exists() and not config.exists()


def test_a_temp_another_writer_holds_is_kept_until_released(tmp_path: pathlib.Path) -> None:
    temp = tmp_path / ".10-net.conflist.0123456789abcdef.istio-tmp"
    temp.write_text("being written")
    fd = os.open(temp, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert remove_stale_temps(str(tmp_path)) == []
        assert temp.exists()
    finally:
        os.close(fd)
    assert remove_stale_temps(str(tmp_path)) == [temp.name]
    assert not temp.exists()


def test_writers_and_cleaners_at_once_lose_no_write(tmp_path: pathlib.Path) -> None:
    """A cleaner that takes a temp between its create and its lock makes the writer start over
    under a new name: every write lands, and no temp is left."""
    target = str(tmp_path / "10-net.conflist")
    stop = threading.Event()

    def clean() -> None:
        while not stop.is_set():
            remove_stale_temps(str(tmp_path))

    cleaners = [threading.Thread(target=clean) for _ in range(2)]
    for t in cleaners:
        t.start()
    try:
        for i in range(300):
            atomic_write(target, f"{i}".encode())
            assert pathlib.Path(target).read_text() == f"{i}"
    finally:
        stop.set()
        for t in cleaners:
            t.join()
    assert os.listdir(tmp_path) == ["10-net.conflist"]
