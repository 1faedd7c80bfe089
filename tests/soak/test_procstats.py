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
    # The kernel's split of the same resident pages: a Python process maps its interpreter and
    # libraries (file-backed) and holds a heap (anonymous); together they are VmRSS, read apart.
    assert after.anon_mib > 1.0 and after.file_mib > 1.0
    assert abs(after.anon_mib + after.file_mib - after.rss_mib) < 1.0


def test_anonymous_growth_is_told_from_file_backed() -> None:
    """Memory the process allocates shows in the anonymous part; the file-backed part stays."""
    before = procstats.read(os.getpid(), node="n1", at=0.0)
    held = bytearray(32 * 1024 * 1024)
    held[::4096] = b"x" * len(held[::4096])  # touch every page, so each is resident
    after = procstats.read(os.getpid(), node="n1", at=1.0)
    del held
    assert before is not None and after is not None
    assert after.anon_mib - before.anon_mib > 30.0
    assert abs(after.file_mib - before.file_mib) < 2.0


def test_a_gone_process_reads_as_none() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert procstats.read(proc.pid, node="n1", at=0.0) is None
