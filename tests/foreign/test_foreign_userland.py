"""The built plugin on userlands other than the build machine's: Debian 11 (glibc 2.31, older
than the 2.34/2.35 the former build needed) and an empty root with nothing but the plugin (no C
library, no /proc, no /dev), the latter also with the plugin built for linux/arm64 (run by
qemu-user). Each test runs in all three (see the `root` fixture)."""

from __future__ import annotations

import subprocess

import pytest

from testbed import elf
from tests.foreign.conftest import RealAgent
from tests.foreign.roots import RUN_DIR_IN_ROOT, ForeignRoot
from tests.plugin.helpers import VERSIONS, cni_env, net_conf, result_for

pytestmark = pytest.mark.netns  # root: mount namespaces, chroot, network namespaces


def test_the_root_is_what_it_claims(root: ForeignRoot) -> None:
    run = root.run({"CNI_COMMAND": "VERSION"}, list_root=True)
    listing = [line for line in run.stderr.splitlines() if line.startswith("./")]
    machine = elf.machine(root.plugin)
    if root.name.endswith("arm64"):
        assert machine == "aarch64", machine
    else:
        assert machine == "x86_64", machine
    if root.base is None:
        assert listing == ["./istio-cni"], listing
    else:
        libc = {"./lib/x86_64-linux-gnu/libc-2.31.so", "./usr/lib/x86_64-linux-gnu/libc-2.31.so"}
        assert libc & set(listing), "not a glibc 2.31 userland"
        assert "./opt/cni/bin/istio-cni" in listing


def test_version(root: ForeignRoot) -> None:
    run = root.run({"CNI_COMMAND": "VERSION"})
    assert run.code == 0, run.stderr
    assert run.out == {"cniVersion": "1.1.0", "supportedVersions": list(VERSIONS)}


def test_malformed_config_gives_a_cni_error_object(root: ForeignRoot) -> None:
    run = root.run(cni_env("ADD"), "{oops")
    assert run.code == 1, run.stderr
    assert isinstance(run.out, dict) and run.out["code"] == 6, run.stdout
    assert run.out["msg"]


def test_excluded_namespace_passes_through(root: ForeignRoot) -> None:
    env = cni_env("ADD", CNI_ARGS="K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-x")
    run = root.run(env, net_conf("1.0.0", RUN_DIR_IN_ROOT))
    assert (run.code, run.out) == (0, result_for("1.0.0")), run.stderr


def test_agent_unreachable_fails_closed(root: ForeignRoot) -> None:
    run = root.run(cni_env("ADD"), net_conf("1.0.0", RUN_DIR_IN_ROOT))
    assert run.code == 1, run.stderr
    assert isinstance(run.out, dict) and run.out["code"] == 11, run.stdout


def test_add_served_by_the_real_agent(root: ForeignRoot, real_agent: RealAgent) -> None:
    env = cni_env("ADD", CNI_NETNS=str(real_agent.netns))
    run = root.run(env, net_conf("1.1.0", RUN_DIR_IN_ROOT), run_dir=real_agent.run_dir)
    assert (run.code, run.out) == (0, result_for("1.1.0")), run.stderr + run.stdout
    nat = subprocess.run(
        ["ip", "netns", "exec", real_agent.netns.name, "iptables-nft-save", "-t", "nat"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "ISTIO_REDIRECT" in nat and "ISTIO_OUTPUT" in nat, nat
