"""A part that is missing or does not start fails with a message naming it, and nothing it
started is left running."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import parts
from testbed.controlplane import Binaries, ControlPlane
from testbed.kubelet import Kubelet, KubeletDirs
from testbed.ports import free_port
from testbed.process import PartFailedError
from testbed.realnode import RealCluster


def test_missing_binary_names_the_part_and_its_build_script(tmp_path: Path) -> None:
    part = parts.Part("kube-apiserver", tmp_path / "absent", parts.SETUP_TESTBED)
    with pytest.raises(parts.MissingPartError) as e:
        part.require()
    assert "kube-apiserver" in str(e.value)
    assert "ci/setup-testbed" in str(e.value)


@pytest.mark.cluster
def test_api_server_that_exits_fails_with_its_name_and_log(tmp_path: Path) -> None:
    # A stand-in executable, on purpose: the real one does not fail on demand.
    broken = tmp_path / "broken-apiserver"
    broken.write_text("#!/bin/sh\necho 'refusing to serve: storage unreachable' >&2\nexit 3\n")
    broken.chmod(0o755)
    real = Binaries.from_cache()
    plane = ControlPlane(
        tmp_path / "plane",
        Binaries(
            etcd=real.etcd,
            kube_apiserver=broken,
            kube_controller_manager=real.kube_controller_manager,
        ),
        ready_timeout=30,
    )
    try:
        with pytest.raises(PartFailedError) as e:
            plane.start()
        etcd = plane.daemons[0]
        assert etcd.name == "etcd" and etcd.alive()
        etcd_pid = etcd.pid
    finally:
        plane.stop()
    message = str(e.value)
    assert "'kube-apiserver'" in message
    assert "exited with 3" in message
    assert "refusing to serve: storage unreachable" in message
    assert not Path(f"/proc/{etcd_pid}").exists()
    assert not plane.data_dir.exists()


@pytest.mark.cluster
def test_port_taken_between_probe_and_bind_is_retried(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        # The first port handed out (etcd's client port) is already in use.
        ports = itertools.chain([taken], iter(free_port, None))
        plane = ControlPlane(
            tmp_path / "plane", Binaries.from_cache(), port_source=lambda: next(ports)
        )
        try:
            plane.start()
            assert (plane.log_dir / "etcd.1.log").exists()
            assert "address already in use" in (plane.log_dir / "etcd.1.log").read_text()
            assert plane.readyz()[0]
        finally:
            plane.stop()


def test_fixture_with_a_missing_part_errors_instead_of_skipping(tmp_path: Path) -> None:
    env = dict(os.environ, ISTIO_CNI_CACHE=str(tmp_path / "empty-cache"))
    env.pop("KUBECONFIG", None)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "--basetemp",
            str(tmp_path / "inner"),
            "tests/testbed/test_controlplane.py::test_simulated_node_is_ready",
        ],
        cwd=parts.REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert "1 error" in result.stdout and "skipped" not in result.stdout
    assert "test bed part 'kube-apiserver' is missing" in result.stdout
    assert "ci/setup-testbed" in result.stdout


def test_kubelet_ended_by_its_start_up_map_race_is_started_again_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kubelet 1.35 can die of a Go map race as it first sets its node status: the test bed
    starts it again, as a node's service manager would, once; any other exit still fails."""
    # A stand-in executable, on purpose: the real one hits the race only now and then.
    starts = tmp_path / "starts"
    stand_in = tmp_path / "kubelet"
    stand_in.write_text(
        "#!/bin/sh\necho x >> " + str(starts) + "\n"
        "if [ $(wc -l < " + str(starts) + ") -eq 1 ]; then\n"
        "  echo 'fatal error: concurrent map read and map write'; exit 2\nfi\nexec sleep 30\n"
    )
    stand_in.chmod(0o755)
    kubelet = Kubelet.__new__(Kubelet)
    kubelet.binary, kubelet.prefix, kubelet.starts = stand_in, [], 0
    kubelet.dirs = KubeletDirs(tmp_path / "kubelet-dirs")
    kubelet.node_name, kubelet.node_ip, kubelet.log_path = "tb", "192.0.2.1", tmp_path / "k.log"
    cluster = RealCluster.__new__(RealCluster)
    cluster.plane, cluster.runtime, cluster.kubelet, cluster.services = None, None, kubelet, None
    # Ready once the second kubelet has run for a moment.
    monkeypatch.setattr(
        cluster, "node_ready", lambda: kubelet.starts == 2 and starts.read_text().count("x") == 2
    )
    kubelet.start()
    try:
        cluster.wait_node_ready(timeout=20)
        assert kubelet.starts == 2 and kubelet.alive()
    finally:
        kubelet.stop()

    starts.write_text("")  # the race again, after the one restart a start allows: it fails
    kubelet.starts = 0
    monkeypatch.setattr(cluster, "node_ready", lambda: False)
    stand_in.write_text("#!/bin/sh\necho 'fatal error: concurrent map writes'; exit 2\n")
    kubelet.start()
    with pytest.raises(PartFailedError, match="kubelet"):
        cluster.wait_node_ready(timeout=20)
    assert kubelet.starts == 2
