"""An agent process's figures from /proc (bench/soak/procstats.py), read of real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from bench.soak import procstats


def test_a_process_rss_threads_and_descriptors_are_read() -> None:
    stop = threading.Event()
    extra = threading.Thread(target=stop.wait, daemon=True)
    before = procstats.read(os.getpid(), node="n1", at=1.5)
    fd = os.open(os.devnull, os.O_RDONLY)
    extra.start()
    try:
        after = procstats.read(os.getpid(), node="n1", at=2.0)
    finally:
        stop.set()
        extra.join()
        os.close(fd)
    assert before is not None and after is not None
    assert (after.node, after.pid, after.at) == ("n1", os.getpid(), 2.0)
    assert after.rss_mib > 5.0
    assert after.threads == before.threads + 1
    assert after.fds == before.fds + 1


def test_a_gone_process_reads_as_none() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert procstats.read(proc.pid, node="n1", at=0.0) is None
