"""A daemon of the test bed outlives the thread that started it (a fault's worker restarting
etcd or containerd), and still dies with the test process."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from testbed.process import Daemon


def test_daemon_started_by_a_worker_thread_outlives_the_thread(tmp_path: Path) -> None:
    daemon = Daemon("sleeper", ["sleep", "60"], tmp_path / "sleeper.log")
    worker = threading.Thread(target=daemon.start)
    worker.start()
    worker.join()
    try:
        time.sleep(0.5)  # the kernel's parent-death signal, if any, has been delivered by now
        assert daemon.alive(), "the daemon died with the thread that forked it"
    finally:
        daemon.stop()
    assert not daemon.alive()
