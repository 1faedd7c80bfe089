"""The README's demo (`ci/demo` runs `python -m ci.demo` after its set-up scripts), end to end as a
user sees it: a real node, the chart, two pods, the rules and the redirected connections, then
nothing left behind, also when it fails or is interrupted.

The demo runs as a child process on purpose: that its own processes (etcd, kube-apiserver,
kubelet, containerd and its shims, the pods) are gone afterwards is part of what is checked.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed import netns
from testbed.parts import REPO_ROOT

pytestmark = [pytest.mark.node]

DEMO = [sys.executable, "-m", "ci.demo"]


def workdir_of(output: str) -> Path:
    found = re.search(r"\(work dir and logs: (\S+)\)", output)
    assert found, output
    return Path(found.group(1))


def node_netns_of(output: str) -> str:
    found = re.search(r"in network namespace (tb-rnode-[0-9a-f]+)", " ".join(output.split()))
    assert found, output
    return found.group(1)


def processes_naming(path: Path) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(path).encode() in cmdline.read_bytes():
                found.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


def mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as mounts:
        return [line.split()[4] for line in mounts if str(path) in line.split()[4]]


def assert_nothing_left(output: str) -> None:
    workdir = workdir_of(output)
    assert not netns.exists(node_netns_of(output))
    assert processes_naming(workdir) == []
    assert mounts_under(workdir) == []


@pytest.fixture
def demo_workdirs() -> Iterator[list[Path]]:
    """Work dirs of demos that failed on purpose: they keep their logs; the test removes them."""
    dirs: list[Path] = []
    yield dirs
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def test_demo_shows_every_step_and_leaves_nothing() -> None:
    done = subprocess.run(
        DEMO, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    flat = " ".join(out.split())  # sentences are wrapped; tables and rules are verbatim
    steps = [(int(n), int(of)) for n, of in re.findall(r"^\[(\d+)/(\d+)\] ", out, re.M)]
    assert steps == [(n, 8) for n in range(1, 9)], steps
    # The agent's pod, Running and Ready on the node, as `kubectl get pods -o wide` shows it.
    install = out[out.index("[2/") : out.index("[3/")]
    assert re.search(r"istio-cni-\S+\s+1/1\s+Running\s+0\s+\S+\s+tb-node", install), install
    assert "bridge (+ host-local) -> portmap -> istio-cni (our entry, chained last)" in flat
    assert "one static executable" in flat
    pods = out[out.index("[4/") : out.index("[5/")]
    assert re.search(r"app-with-sidecar\s+2/2\s+Running", pods), pods
    assert re.search(r"app-without-sidecar\s+1/1\s+Running", pods), pods
    rules = out[out.index("[5/") : out.index("[6/")]
    assert "-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001" in rules
    assert "-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006" in rules
    traffic = " ".join(out[out.index("[6/") : out.index("[7/")].split())
    assert "proxy-double port=15001" in traffic and "original_dst=203.0.113.10:80" in traffic
    assert "inbound: the node ->" in traffic and "proxy-double port=15006" in traffic
    assert "unreachable" in traffic
    log = out[out.index("[7/") : out.index("[8/")]
    assert re.search(r'msg="pod redirected" command=ADD pod=demo/app-with-sidecar', log), log
    assert re.search(r'msg="pod skipped" command=ADD pod=demo/app-without-sidecar', log), log
    uninstall = " ".join(out[out.index("[8/") : out.index("[cleanup]")].split())
    assert (
        "byte-identical to the one before the install; bin dir: no istio-cni files" in uninstall
    ), uninstall
    assert "nothing left behind" in flat
    assert not workdir_of(out).exists()
    assert_nothing_left(out)


def test_demo_interrupted_cleans_up(demo_workdirs: list[Path]) -> None:
    # Its own session, so the Ctrl-C reaches its children too, as a terminal's would.
    proc = subprocess.Popen(
        DEMO,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("[4/"):  # node, chart and agent are up
                os.killpg(proc.pid, signal.SIGINT)
                break
        rest, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    out = "".join(lines) + rest
    demo_workdirs.append(workdir_of(out))
    assert proc.returncode == 130, out + err
    assert "FAILED: interrupted by SIGINT during step 4 (Create a sidecar pod" in out
    assert_nothing_left(out)
    kept = [p for p in workdir_of(out).rglob("*") if p.is_file()]
    assert kept and all(p.suffix == ".log" for p in kept), kept


def test_demo_failure_names_the_step(tmp_path: Path, demo_workdirs: list[Path]) -> None:
    env = {**os.environ, "ISTIO_CNI_CACHE": str(tmp_path / "empty-cache")}
    done = subprocess.run(
        DEMO, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    demo_workdirs.append(workdir_of(done.stdout))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED: step 1 (Start a control plane and a node" in done.stdout
    assert "test bed part 'kube-apiserver' is missing" in done.stdout
    assert "ci/setup-testbed" in done.stdout
    assert f"  {workdir_of(done.stdout)}/demo.log" in done.stdout  # where the logs are
