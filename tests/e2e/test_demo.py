"""The README's demo (`ci/demo` runs `python -m ci.demo` after its set-up scripts), run end
to end as a user would see it: its own control plane, the chart, the agent, three pods and a
redirected connection, then nothing left behind, also when it fails or is interrupted.

The demo runs as a child process on purpose: that its own processes (etcd, kube-apiserver,
kube-controller-manager, the agent) are gone afterwards is part of what is checked.
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

from ci.demo import STEPS
from tests.e2e.daemon import REPO_ROOT
from tests.testbed import netns

pytestmark = [pytest.mark.e2e, pytest.mark.chart, pytest.mark.cluster, pytest.mark.netns]

DEMO = [sys.executable, "-m", "ci.demo"]


def workdir_of(output: str) -> Path:
    found = re.search(r"\(work dir and logs: (\S+)\)", output)
    assert found, output
    return Path(found.group(1))


def netns_named(output: str) -> set[str]:
    return set(re.findall(r"\b((?:demo-node|tb-pod)-[0-9a-f]{8})\b", output))


def processes_naming(path: Path) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(path).encode() in cmdline.read_bytes():
                found.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


def assert_nothing_left(output: str) -> None:
    workdir = workdir_of(output)
    names = netns_named(output)
    assert names, output
    assert [n for n in names if netns.exists(n)] == []
    assert processes_naming(workdir) == []


@pytest.fixture
def demo_workdirs() -> Iterator[list[Path]]:
    """Work dirs of demos that failed on purpose: they keep their logs; the test removes them."""
    dirs: list[Path] = []
    yield dirs
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def test_demo_shows_every_step_and_leaves_nothing() -> None:
    done = subprocess.run(DEMO, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          check=False)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    flat = " ".join(out.split())  # sentences are wrapped; rules and JSON are printed verbatim
    # Every step, in order.
    positions = [out.index(f"[{n}/{len(STEPS)}] {title}") for n, (title, _) in
                 enumerate(STEPS, start=1)]
    assert positions == sorted(positions)
    # The chart's agent chained itself last into the node's conflist and became ready.
    assert "bridge (+ host-local) -> portmap -> istio-cni (our entry, chained last)" in flat
    assert "GET /readyz on 127.0.0.1:" in flat
    # The sidecar pod's rules, as the save command of the agent's backend prints them.
    rules = out[out.index("[8/"):out.index("[9/")]
    assert "-A OUTPUT -j ISTIO_OUTPUT" in rules
    assert "-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001" in rules
    assert "-A ISTIO_IN_REDIRECT -p tcp -j REDIRECT --to-ports 15006" in rules
    # Neither pod that must not be captured has rules.
    plain = flat[flat.index("[9/"):flat.index("[10/")]
    assert plain.count("in its netns prints nothing") == 2, plain
    assert "ISTIO" not in plain
    # The connection: delivered to 15001 with its original destination; not for the plain pod.
    assert ("app-with-sidecar (10.250.0.2) -> 203.0.113.10:80: delivered to port 15001 in the "
            "pod; SO_ORIGINAL_DST = 203.0.113.10:80") in flat
    assert re.search(r"app-without-sidecar \(10\.250\.0\.\d+\) -> 203\.0\.113\.10:80: not "
                     r"redirected;", flat), flat
    # helm uninstall, then SIGTERM: the agent removed its entry and binaries.
    uninstall = flat[flat.index("[11/"):flat.index("[cleanup]")]
    assert "msg=uninstalled" in uninstall
    assert "bridge (+ host-local) -> portmap; bin dir: no istio-cni files" in uninstall
    # Cleanup.
    assert "nothing left behind" in flat
    assert not workdir_of(out).exists()
    assert_nothing_left(out)


def test_demo_interrupted_cleans_up(demo_workdirs: list[Path]) -> None:
    # Its own session, so the Ctrl-C reaches its children too, as a terminal's would.
    proc = subprocess.Popen(DEMO, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("[8/"):  # control plane, chart and agent are up
                os.killpg(proc.pid, signal.SIGINT)
                break
        rest, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    out = "".join(lines) + rest
    demo_workdirs.append(workdir_of(out))
    assert proc.returncode == 130, out + err
    assert "FAILED: interrupted by SIGINT during step 8 (Start a sidecar pod" in out
    assert_nothing_left(out)
    kept = [p for p in workdir_of(out).rglob("*") if p.is_file()]
    assert kept and all(p.suffix == ".log" for p in kept), kept


def test_demo_failure_names_the_step(tmp_path: Path, demo_workdirs: list[Path]) -> None:
    env = {**os.environ, "ISTIO_CNI_CACHE": str(tmp_path / "empty-cache")}
    done = subprocess.run(DEMO, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    demo_workdirs.append(workdir_of(done.stdout))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED: step 1 (Start the control plane): test bed part 'kube-apiserver' is " \
           "missing" in done.stdout
    assert "ci/setup-testbed" in done.stdout
    assert f"  {workdir_of(done.stdout)}/demo.log" in done.stdout  # where the logs are
