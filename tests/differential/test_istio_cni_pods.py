"""Pod-level differential: Istio's own `istio-cni` plugin and ours, for the same random pods.

For each random sidecar pod (annotations, labels, proxy environment, args and placement,
security context; some that Istio skips or refuses) created in the test bed's API server: our
chain (bridge + host-local + our istio-cni, which asks our agent,
started from the chart) runs ADD in one pod namespace through cnitool; Istio's plugin binary
(sidecar mode, reading the pod through a kubeconfig in its run dir as Istio's installer writes
it: the API server, its CA and a ServiceAccount token) runs ADD in another namespace holding an
address of the same family. The rules left in each (`iptables-save` of both variants, IPv4 and
IPv6, counters stripped) must be equal; a pod neither captures leaves both empty, and a pod
Istio's plugin refuses (its ADD fails) must fail our ADD too. test_istio_cni_pods_nft.py runs the
same pods with native nftables on both sides.
"""

from __future__ import annotations

import difflib
import json
import os
import random
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testbed import podnet
from testbed.cni import Sandbox
from testbed.istio_binaries import istio_cni
from tests.differential.pods import random_pod
from tests.integration.conftest import AGENT_NAMESPACE, MeshNode, mesh_node  # noqa: F401

pytestmark = pytest.mark.differential

PODS = 40


def istio_kubeconfig(node: MeshNode, make_identity: Any, run_dir: Path) -> None:
    """What Istio's installer writes for its plugin: <run dir>/istio-cni-kubeconfig."""
    account = node.installed.daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    identity = make_identity(node.installed.namespace, account)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "istio-cni-kubeconfig").write_bytes(identity.kubeconfig.read_bytes())


def istio_add(
    binary: Path, sandbox: Sandbox, run_dir: Path, address: str, *, native_nftables: bool = False
) -> subprocess.CompletedProcess[str]:
    """Istio's plugin ADD for the sandbox, chained after an interface holding `address`
    (`native_nftables`: the key Istio's installer writes when its chart says nativeNftables)."""
    ns = sandbox.netns_name
    for cmd in (
        "link add eth0 type veth peer name peer0",
        f"addr add {address}/24 dev eth0",
        "link set eth0 up",
    ):
        subprocess.run(["ip", "-n", ns, *cmd.split()], check=True)
    conf = {
        "cniVersion": "1.0.0",
        "name": "istio-reference",
        "type": "istio-cni",
        "plugin_log_level": "debug",
        "cni_agent_run_dir": str(run_dir),
        "exclude_namespaces": ["istio-system", "kube-system"],
        "native_nftables": native_nftables,
        "prevResult": {
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": str(sandbox.netns_path)}],
            "ips": [{"address": f"{address}/24", "interface": 0}],
        },
    }
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": sandbox.infra_container_id,
        "CNI_NETNS": str(sandbox.netns_path),
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": sandbox.cni_args(),
        "CNI_PATH": str(binary.parent),
    }
    return subprocess.run(
        [str(binary)],
        input=json.dumps(conf),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def compare_pods(
    node: MeshNode,
    make_identity: Any,
    tmp_path: Path,
    *,
    listing: Callable[[str], str],
    captured_by: str,
    native_nftables: bool = False,
) -> None:
    """PODS random pods through Istio's plugin and ours; `listing(netns name)` of each equal.
    A pod counts as captured when Istio's listing holds `captured_by`."""
    seed = int(os.environ.get("ISTIO_CNI_DIFF_SEED") or random.SystemRandom().randrange(2**32))
    print(f"pod differential seed={seed} (replay: ISTIO_CNI_DIFF_SEED={seed})")
    rng = random.Random(seed)
    binary = istio_cni().require()
    run_dir = tmp_path / "istio-run"
    istio_kubeconfig(node, make_identity, run_dir)
    start = time.monotonic()
    failures, captured, rejected = [], 0, 0
    for i in range(PODS):
        spec = random_pod(rng)
        pod = node.pod("default", **spec)
        meta = pod["metadata"]
        ours = node.sandbox(pod)
        result = node.cnitool("ADD", ours)
        theirs = node.cni.new_sandbox(meta["name"], meta["namespace"], meta["uid"])
        done = istio_add(
            binary, theirs, run_dir, f"10.251.0.{i + 2}", native_nftables=native_nftables
        )
        rejected += done.returncode != 0
        if (done.returncode == 0) != result.ok:  # a pod Istio refuses must not start with ours
            failures.append(
                f"pod {i} {json.dumps(spec)}\nIstio's ADD exit {done.returncode}: "
                f"{done.stdout[-800:]}\nour ADD ok={result.ok}: {result.stdout}"
            )
            continue
        want, got = listing(theirs.netns_name), listing(ours.netns_name)
        captured += captured_by in want
        if want != got:
            diff = difflib.unified_diff(
                want.splitlines(), got.splitlines(), "istio", "ours", lineterm="", n=1
            )
            failures.append(f"pod {i} {json.dumps(spec)}\n" + "\n".join(diff))
    elapsed = time.monotonic() - start
    print(f"{PODS} pods in {elapsed:.1f}s, {captured} captured by Istio, {rejected} refused")
    assert captured >= PODS // 3, "most random pods must be ones Istio captures"
    assert not failures, f"{len(failures)} of {PODS} pods differ (seed {seed}):\n" + failures[0]


def test_random_pods_get_istios_rules(
    mesh_node: MeshNode,  # noqa: F811
    make_identity: Any,
    tmp_path: Path,
) -> None:
    compare_pods(
        mesh_node, make_identity, tmp_path, listing=podnet.saved_tables, captured_by="ISTIO_OUTPUT"
    )
