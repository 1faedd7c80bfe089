"""The netns finder on real namespaces: a named netns, and one held only by a process."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.repair.addresses import netns_addresses
from agent.repair.netns_finder import find_pod_netns, index_netns_by_address

pytestmark = pytest.mark.netns


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


@pytest.fixture
def named_netns() -> Iterator[tuple[str, str]]:
    name = f"rp-{uuid.uuid4().hex[:8]}"
    sh("ip", "netns", "add", name)
    try:
        sh("ip", "-n", name, "link", "set", "lo", "up")
        sh("ip", "-n", name, "addr", "add", "10.250.7.9/32", "dev", "lo")
        yield name, "10.250.7.9"
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_named_netns_found_by_address(named_netns: tuple[str, str], tmp_path: Path) -> None:
    name, ip = named_netns
    index = index_netns_by_address(
        netns_dir="/var/run/netns", proc_dir=str(tmp_path), read_addresses=netns_addresses
    )
    assert find_pod_netns([ip], index) == f"/var/run/netns/{name}"
    assert find_pod_netns(["10.250.7.10"], index) is None


def test_netns_held_only_by_a_process_found_through_proc(
    named_netns: tuple[str, str], tmp_path: Path
) -> None:
    name, ip = named_netns
    pause = subprocess.Popen(["ip", "netns", "exec", name, "sleep", "60"])
    try:
        # Empty netns dir: only /proc can lead to the namespace, as for runtimes that keep none.
        index = index_netns_by_address(
            netns_dir=str(tmp_path), proc_dir="/proc", read_addresses=netns_addresses
        )
        path = find_pod_netns([ip], index)
        assert path is not None and path.startswith("/proc/") and path.endswith("/ns/net")
        assert ip in netns_addresses(path)
    finally:
        pause.kill()
        pause.wait()
