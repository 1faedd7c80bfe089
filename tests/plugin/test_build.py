"""The standalone build (ci/build-plugin, cached): one static file that needs nothing from the node
(no Python, no C library), speaks CNI, and comes out byte for byte the same from the same inputs."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed import elf
from tests.plugin.helpers import VERSIONS, AgentTestDouble, cni_env, net_conf, result_for

REPO = Path(__file__).resolve().parents[2]
# The former two-part build: 7.5 MB (launcher + support dir). The single file must not be larger.
MAX_BYTES = 7_500_000


def build_plugin(out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(REPO / "ci" / "build-plugin"), str(out)],
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, **env},
    )
    assert proc.returncode == 0, f"ci/build-plugin failed:\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("plugin-build")
    build_plugin(out)
    yield out
    shutil.rmtree(out, ignore_errors=True)


def run_built(
    exe: Path, env: dict[str, str], stdin: dict[str, object] | str = ""
) -> tuple[int, object]:
    """Exec the built plugin with only the CNI variables: no PATH, no PYTHON* anything."""
    data = stdin if isinstance(stdin, str) else json.dumps(stdin)
    proc = subprocess.run([str(exe)], env=env, input=data.encode(), capture_output=True, timeout=60)
    text = proc.stdout.decode()
    return proc.returncode, json.loads(text) if text.strip() else None


def test_one_static_file(build: Path) -> None:
    assert sorted(p.name for p in build.iterdir()) == ["istio-cni"]
    exe = build / "istio-cni"
    assert os.access(exe, os.X_OK) and elf.is_elf(exe)
    needs = elf.needs(exe)
    assert needs.interpreter is None, f"dynamically linked: {needs.interpreter}"
    assert needs.libraries == () and needs.glibc == (), needs
    assert exe.stat().st_size <= MAX_BYTES, exe.stat().st_size


def test_no_shipped_elf_needs_a_newer_glibc_than_the_floor(build: Path) -> None:
    assert elf.elf_files(build), "no ELF file found in the build"
    assert elf.too_new(build) == []


def test_the_glibc_check_catches_a_glibc_binary(tmp_path: Path) -> None:
    """The check above can fail: a program linked against this machine's glibc trips it."""
    (tmp_path / "hello.c").write_text('#include <stdio.h>\nint main(void){puts("hi");}\n')
    gcc = shutil.which("gcc")
    assert gcc, "gcc is missing: install it with ci/setup-apt"
    subprocess.run([gcc, "-o", str(tmp_path / "hello"), str(tmp_path / "hello.c")], check=True)
    problems = elf.too_new(tmp_path)
    assert len(problems) == 1 and "needs GLIBC_2.3" in problems[0], problems
    assert elf.too_new(tmp_path, floor=(2, 99)) == []


def test_rebuild_is_identical(build: Path, tmp_path: Path) -> None:
    """Freeze and link again (not from the cache), elsewhere: the same bytes."""
    proc = build_plugin(tmp_path / "again", ISTIO_CNI_PLUGIN_RELINK="1")
    assert "freeze the plugin" in proc.stderr and "link one static executable" in proc.stderr

    def digest(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()

    assert digest(tmp_path / "again" / "istio-cni") == digest(build / "istio-cni")


def test_install_replaces_a_former_two_part_layout(build: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "istio-cni-0123456789ab.d" / "lib").mkdir(parents=True)
    (out / "istio-cni").write_text("former launcher")
    build_plugin(out)
    assert sorted(p.name for p in out.iterdir()) == ["istio-cni"]
    assert (out / "istio-cni").read_bytes() == (build / "istio-cni").read_bytes()


def test_version(build: Path) -> None:
    code, out = run_built(build / "istio-cni", {"CNI_COMMAND": "VERSION"})
    assert code == 0
    assert out == {"cniVersion": "1.1.0", "supportedVersions": list(VERSIONS)}


def test_environment_cannot_change_what_runs(build: Path, tmp_path: Path) -> None:
    """PYTHON* variables are ignored: no path, no start-up file, no bytecode cache is used."""
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / "__init__.py").write_text("raise SystemExit('hijacked')\n")
    (tmp_path / "start.py").write_text("raise SystemExit('hijacked')\n")
    env = {
        "CNI_COMMAND": "VERSION",
        "PYTHONPATH": str(tmp_path),
        "PYTHONHOME": str(tmp_path),
        "PYTHONSTARTUP": str(tmp_path / "start.py"),
        "PYTHONINSPECT": "1",
        "PYTHONVERBOSE": "1",
    }
    code, out = run_built(build / "istio-cni", env)
    assert (code, out) == (0, {"cniVersion": "1.1.0", "supportedVersions": list(VERSIONS)})


def test_failure_before_python_runs_is_a_cni_error(build: Path, tmp_path: Path) -> None:
    """The launcher linked with no frozen modules (the interpreter cannot start: no codecs)
    still answers the runtime with a CNI error object and exit code 1."""
    stage = subprocess.run(
        [str(REPO / "ci" / "plugin" / "build-python")],
        capture_output=True,
        text=True,
        check=True,
        timeout=3600,
    ).stdout.strip()
    (tmp_path / "none.c").write_text(
        "#include <Python.h>\nconst struct _frozen istio_cni_frozen[] = {{0, 0, 0, 0, 0}};\n"
    )
    subprocess.run(
        [
            "musl-gcc",
            "-static",
            "-O2",
            f"-I{stage}/include",
            "-o",
            str(tmp_path / "broken"),
            str(REPO / "ci" / "plugin" / "launcher.c"),
            str(tmp_path / "none.c"),
            f"{stage}/lib/libpython3.11.a",
            "-lm",
        ],
        check=True,
        capture_output=True,
    )
    code, out = run_built(tmp_path / "broken", {"CNI_COMMAND": "VERSION"})
    assert code == 1
    assert isinstance(out, dict) and out["code"] == 999, out
    assert out["msg"] == "istio-cni: cannot start Python" and "codec" in out["details"], out


@pytest.mark.parametrize("version", ["0.3.1", "1.0.0"])
def test_add_in_excluded_namespace_passes_through(build: Path, version: str) -> None:
    env = cni_env("ADD", CNI_ARGS="K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-x")
    conf = net_conf(version, prevResult=result_for("1.0.0"))
    code, out = run_built(build / "istio-cni", env, conf)
    assert (code, out) == (0, result_for(version))


def test_input_larger_than_the_allocation_arena(build: Path) -> None:
    """90 MB of config (the launcher's bump arena holds 64 MB): the overflow goes to the usual
    allocator and the answer is the same as for a small config."""
    env = cni_env("ADD", CNI_ARGS="K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-x")
    conf = net_conf("1.0.0", padding="x" * (90 << 20))
    code, out = run_built(build / "istio-cni", env, conf)
    assert (code, out) == (0, result_for("1.0.0"))


def test_add_through_the_agent(build: Path, agent: AgentTestDouble) -> None:
    spawned = time.clock_gettime(time.CLOCK_BOOTTIME)
    code, out = run_built(
        build / "istio-cni", cni_env("ADD"), net_conf("1.1.0", str(agent.run_dir))
    )
    assert (code, out) == (0, result_for("1.1.0"))
    assert agent.paths() == ["/v1/cni/add"]
    # The static build reads its own start too (its clock and /proc), for the agent's
    # istio_cni_plugin_exec_duration_seconds.
    started = agent.requests[0][2]["startedAt"]
    half_tick = 0.5 / os.sysconf("SC_CLK_TCK")
    assert spawned - half_tick <= started <= agent.arrivals[0]


def test_add_agent_down_fails_closed(build: Path, tmp_path: Path) -> None:
    code, out = run_built(build / "istio-cni", cni_env("ADD"), net_conf(run_dir=str(tmp_path)))
    assert code == 1 and isinstance(out, dict) and out["code"] == 11


def test_malformed_stdin_gives_error_object(build: Path) -> None:
    code, out = run_built(build / "istio-cni", cni_env("ADD"), "{oops")
    assert code == 1 and isinstance(out, dict) and out["code"] == 6


def test_logs_of_an_absent_agent_reach_the_real_agent_later(
    build: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The built plugin with no agent: JSON on stderr (log_as_json) and the same lines in the
    run dir's file (0600); the agent's pod server starts and the forwarder logs them; then the
    plugin's lines go over the socket, with their fields apart."""
    from agent.logs import PLUGIN_LOGGER
    from agent.plugin_log_file import forward_once
    from agent.podserver.server import PodServer
    from plugin import wire
    from tests.podserver.helpers import InMemoryPods, ScriptedRedirector, build_rig, make_pod

    caplog.set_level(logging.DEBUG)
    run_dir = Path("/tmp") / f"plugin-build-{os.getpid()}-{tmp_path.name[-12:]}"
    run_dir.mkdir()
    try:
        conf = json.dumps(net_conf(run_dir=str(run_dir), log_as_json=True)).encode()
        proc = subprocess.run(
            [str(build / "istio-cni")],
            env=cni_env("ADD"),
            input=conf,
            capture_output=True,
            timeout=60,
        )
        assert proc.returncode == 1 and json.loads(proc.stdout)["code"] == 11
        [stderr_line] = [json.loads(line) for line in proc.stderr.decode().splitlines()]
        log_file = run_dir / wire.LOG_FILE_NAME
        assert stat.S_IMODE(log_file.stat().st_mode) == 0o600
        [file_line] = [json.loads(line) for line in log_file.read_text().splitlines()]
        assert file_line == stderr_line
        assert (file_line["level"], file_line["msg"], file_line["scope"]) == (
            "error",
            "ADD failed",
            "istio-cni",
        )

        rig = build_rig(InMemoryPods(make_pod()), ScriptedRedirector())
        server = PodServer(str(run_dir / wire.SOCKET_NAME), rig.handlers)
        server.start()
        try:
            assert forward_once(str(run_dir), settle=0) == 1
            assert not log_file.exists()
            proc = subprocess.run(
                [str(build / "istio-cni")],
                env=cni_env("DEL"),
                input=conf,
                capture_output=True,
                timeout=60,
            )
            assert proc.returncode == 0, proc.stdout
        finally:
            server.stop()
        records = [r for r in caplog.records if r.name == PLUGIN_LOGGER]
        late, live = records[0], records[1:]
        assert (late.levelno, late.getMessage()) == (logging.ERROR, "ADD failed")
        assert late.fields["via"] == "file" and late.fields["code"] == "11"  # type: ignore[attr-defined]
        assert live and all(r.fields["source"] == "plugin" for r in live)  # type: ignore[attr-defined]
        assert not log_file.exists()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def test_log_level_none_writes_nothing(build: Path, tmp_path: Path) -> None:
    conf = json.dumps(net_conf(run_dir=str(tmp_path), plugin_log_level="none")).encode()
    proc = subprocess.run(
        [str(build / "istio-cni")], env=cni_env("ADD"), input=conf, capture_output=True, timeout=60
    )
    assert proc.returncode == 1 and proc.stderr == b""
    assert list(tmp_path.iterdir()) == []
