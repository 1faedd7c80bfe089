"""The images run under a real containerd + runc (a throwaway instance): the agent's CLI with
the chart's read-only root, capabilities and /tmp; the plugin; the test bed's pause and workload."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from testbed.wait import wait_for
from tests.image.archive import Archive
from tests.image.conftest import Built
from tests.image.containerd import Containerd
from tests.image.test_build import AGENT_MODULES

pytestmark = pytest.mark.node

# What the chart's DaemonSet gives the agent container (templates/daemonset.yaml).
CHART_CAPS = [
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_SYS_ADMIN",
    "CAP_SYS_PTRACE",
    "CAP_DAC_OVERRIDE",
    "CAP_CHOWN",
]


def run_agent(
    c: Containerd, ref: str, *args: str, env: tuple[str, ...] = (), no_stdin: bool = False
) -> subprocess.CompletedProcess[str]:
    return c.run(
        ref,
        args,
        read_only=True,
        cap_drop_all=True,
        cap_add=CHART_CAPS,
        tmpfs=["/tmp"],
        env=env,
        no_stdin=no_stdin,
    )


def ok(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r.stdout


def test_agent_cli_help(containerd: Containerd, images: dict[str, Built]) -> None:
    out = ok(run_agent(containerd, images["istio-cni"].ref, "istio-cni-agent", "--help"))
    assert out.startswith("usage: istio-cni-agent {run,install,uninstall,rules,status,check}")


def test_agent_prints_iptables_and_nft_rules(
    containerd: Containerd, images: dict[str, Built]
) -> None:
    ref = images["istio-cni"].ref
    flags = ["-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*", "-b", "*"]
    out = ok(run_agent(containerd, ref, "istio-cni-agent", "rules", *flags, "--ipv6=true"))
    assert "* nat" in out and "-A ISTIO_REDIRECT -p tcp -j REDIRECT --to-ports 15001" in out
    assert out.count("COMMIT") == 2, "IPv4 and IPv6 tables"
    # The container has only lo: like Istio, host detection cannot decide IPv6 there.
    nft = ok(
        run_agent(
            containerd, ref, "istio-cni-agent", "rules", *flags, "--ipv6=false", "--format=nft"
        )
    )
    assert "add table inet istio-proxy-nat" in nft  # Istio's native nftables form


def test_every_agent_module_imports(containerd: Containerd, images: dict[str, Built]) -> None:
    code = (
        "import importlib, sys\n"
        f"mods = {AGENT_MODULES!r}\n"
        "for m in mods: importlib.import_module(m)\n"
        "import iptc, pyroute2, kubernetes, watchfiles, yaml, prometheus_client\n"
        "print(len(mods), 'modules', sys.executable, sys.version.split()[0])\n"
    )
    out = ok(run_agent(containerd, images["istio-cni"].ref, "python3", "-c", code))
    assert f"{len(AGENT_MODULES)} modules /opt/istio-cni/venv/bin/python3 3.11." in out


def test_firewall_tools_present(containerd: Containerd, images: dict[str, Built]) -> None:
    script = "iptables-legacy --version && iptables-nft --version && nft --version && ip -V"
    out = ok(run_agent(containerd, images["istio-cni"].ref, "sh", "-c", script))
    assert "legacy" in out and "nf_tables" in out and "nftables" in out and "iproute2" in out


def test_plugin_answers_version(containerd: Containerd, images: dict[str, Built]) -> None:
    r = run_agent(
        containerd,
        images["istio-cni"].ref,
        "/opt/istio-cni/bin/istio-cni",
        env=("CNI_COMMAND=VERSION",),
        no_stdin=True,
    )
    info = json.loads(ok(r))
    assert "1.0.0" in info["supportedVersions"], info


def test_plugin_runs_without_any_userland(
    containerd: Containerd,
    images: dict[str, Built],
    agent_archive: Archive,
    tmp_path: Path,
) -> None:
    """Static: the plugin runs in the pause image (FROM scratch: no libc, no loader, no shell),
    as it must on a node without Python."""
    plugin = tmp_path / "istio-cni"
    plugin.write_bytes(agent_archive.read_file("/opt/istio-cni/bin/istio-cni"))
    plugin.chmod(0o755)
    r = containerd.run(
        images["pause"].ref,
        ["/istio-cni"],
        read_only=True,
        env=["CNI_COMMAND=VERSION"],
        binds=[(str(plugin), "/istio-cni")],
        no_stdin=True,
    )
    assert "supportedVersions" in ok(r)


def test_pause_stops_on_sigterm(containerd: Containerd, images: dict[str, Built]) -> None:
    cid = "image-test-pause"
    containerd.ctr("run", "-d", "--read-only", images["pause"].ref, cid)
    try:
        wait_for(lambda: "RUNNING" in containerd.ctr("tasks", "ls").stdout, "pause to run", 10)
        containerd.ctr("tasks", "kill", "-s", "SIGTERM", cid)

        def stopped() -> bool:
            tasks = containerd.ctr("tasks", "ls").stdout
            return cid not in tasks or "STOPPED" in tasks

        wait_for(
            stopped,
            "pause to stop after SIGTERM",
            10,
            interval=0.2,
            on_timeout=lambda: containerd.ctr("tasks", "ls").stdout,
        )
    finally:
        containerd.ctr("tasks", "delete", "-f", cid, check=False)
        containerd.ctr("containers", "delete", cid, check=False)


def test_workload_doubles(containerd: Containerd, images: dict[str, Built]) -> None:
    script = (
        "python3 /testbed/proxy-double.py & python3 /testbed/app.py serve 8080 & sleep 1.5; "
        "python3 /testbed/app.py connect 127.0.0.1 15001; "
        "python3 /testbed/app.py connect 127.0.0.1 15006; "
        "python3 /testbed/app.py connect 127.0.0.1 8080; "
        "python3 /testbed/app.py connect 127.0.0.1 9; echo rc=$?"
    )
    out = ok(containerd.run(images["workload"].ref, ["bash", "-c", script], read_only=True))
    assert "connect 127.0.0.1:15001 proxy-double port=15001 peer=127.0.0.1:" in out
    assert "original_dst=" in out  # none, or 127.0.0.1:15001: nothing is redirected here
    assert "connect 127.0.0.1:15006 proxy-double port=15006" in out
    assert "connect 127.0.0.1:8080 app port=8080 peer=127.0.0.1:" in out and "echo=hello" in out
    # A connection with no proxy between: the server saw the app's own end of it.
    direct = next(s for s in out.splitlines() if s.startswith("connect 127.0.0.1:8080 "))
    assert direct.endswith(" from=" + direct.split(" peer=")[1].split()[0]), direct
    assert "connect 127.0.0.1:9 error:" in out and "rc=1" in out
