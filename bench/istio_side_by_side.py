"""Istio's sidecar-mode `istio-cni` against ours, one run, the same chain setup.

    cd REPO && /root/.pyenv/versions/3.11.7/bin/python3 -m bench.istio_side_by_side \
        [--sequential 100] [--concurrent 110]

Set-up: bench/add_latency.py's (control plane, a Node, sidecar pods created through the API,
our agent started as its DaemonSet runs it and our plugin installed and chained after bridge +
portmap), plus Istio's plugin binary (built by ci/setup-testbed) with a run dir holding
`istio-cni-kubeconfig` for the same API server (the control plane's kubeconfig). Each ADD gets
a fresh pod netns with eth0 holding the pod's address, made before the clock starts, and the
same chained config on stdin (Istio's fields for Istio's plugin, ours for ours) with a prevResult
as bridge returns it. Timed: exec to exit. Peak memory: GNU time's %M (ru_maxrss) over the
10 untimed warm-up ADDs.
Size: the executable(s) installed into the CNI bin dir (ours: the launcher and its runtime dir).
Every ADD must exit 0; afterwards each netns is checked to hold the pod's rules.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.add_latency import Bench, Sandbox, percentile
from testbed.istio_binaries import istio_cni

WARM = 10
"""Untimed ADDs per plugin first, each under GNU time for its peak memory."""


def exec_measured(
    binary: Path, env: dict[str, str], stdin: bytes, *, memory: bool = False
) -> tuple[int, float, int]:
    """(exit code, wall ms, peak RSS KiB or 0) of one exec. Peak memory comes from GNU time
    (its wait4 ru_maxrss): a child forked straight from this big Python process would report
    the parent's pages as its own high-water mark. Timed runs go without it."""
    argv = [str(binary)]
    with tempfile.NamedTemporaryFile("r") as rss:
        if memory:
            argv = ["/usr/bin/time", "-f", "%M", "-o", rss.name, *argv]
        start = time.perf_counter()
        done = subprocess.run(argv, input=stdin, capture_output=True, env=env, check=False)
        ms = (time.perf_counter() - start) * 1000
        kib = int(rss.read().strip().splitlines()[-1]) if memory else 0
    return done.returncode, ms, kib


class SideBySide(Bench):
    def setup_istio(self) -> None:
        self.istio_bin = self.workdir / "istio-bin" / "istio-cni"
        self.istio_bin.parent.mkdir()
        self.istio_bin.write_bytes(istio_cni().require().read_bytes())
        self.istio_bin.chmod(0o755)
        self.istio_run = self.workdir / "istio-run"
        self.istio_run.mkdir()
        assert self.plane is not None
        (self.istio_run / "istio-cni-kubeconfig").write_bytes(self.plane.kubeconfig.read_bytes())

    def conf(self, which: str, sandbox: Sandbox) -> dict[str, Any]:
        prev = {
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "benchbr0"}, {"name": "eth0", "sandbox": sandbox.path}],
            "ips": [{"address": f"{sandbox.address}/16", "gateway": "10.251.0.1", "interface": 1}],
        }
        if which == "ours":
            return {**self.entry(), "prevResult": prev}
        return {
            "cniVersion": "1.0.0",
            "name": "bench",
            "type": "istio-cni",
            "plugin_log_level": "error",
            "cni_agent_run_dir": str(self.istio_run),
            "exclude_namespaces": ["istio-system", "kube-system"],
            "prevResult": prev,
        }

    def run_add(
        self, which: str, sandbox: Sandbox, *, memory: bool = False
    ) -> tuple[int, float, int]:
        meta = sandbox.pod["metadata"]
        binary = self.bin_dir / "istio-cni" if which == "ours" else self.istio_bin
        env = {
            "CNI_COMMAND": "ADD",
            "CNI_PATH": str(binary.parent),
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "CNI_CONTAINERID": sandbox.container_id,
            "CNI_NETNS": sandbox.path,
            "CNI_IFNAME": "eth0",
            "CNI_ARGS": (
                f"IgnoreUnknown=1;K8S_POD_NAMESPACE={meta['namespace']};"
                f"K8S_POD_NAME={meta['name']};"
                f"K8S_POD_INFRA_CONTAINER_ID={sandbox.container_id};"
                f"K8S_POD_UID={meta['uid']}"
            ),
        }
        return exec_measured(
            binary, env, json.dumps(self.conf(which, sandbox)).encode(), memory=memory
        )


def captured(netns_name: str) -> bool:
    """The pod's netns holds Istio's output chain (either iptables variant)."""
    for tool in ("iptables-nft-save", "iptables-legacy-save"):
        done = subprocess.run(
            ["ip", "netns", "exec", netns_name, tool], capture_output=True, text=True, check=False
        )
        if "-A ISTIO_OUTPUT" in done.stdout:
            return True
    return False


def size_mib(path: Path) -> float:
    """The executable plus, for ours, the runtime directory installed beside it."""
    total = path.stat().st_size
    side = path.with_name(path.name + ".d")
    if side.is_dir():
        total += sum(p.stat().st_size for p in side.rglob("*") if p.is_file())
    return total / 2**20


def measure(
    bench: SideBySide, which: str, pods: list[dict[str, Any]], seq: int, conc: int
) -> dict[str, Any]:
    boxes = bench.sandboxes(pods[: WARM + seq + conc])
    rss = []
    for sb in boxes[:WARM]:  # warm-up, untimed: the peak memory samples
        code, _, kib = bench.run_add(which, sb, memory=True)
        assert code == 0, f"{which} ADD failed"
        rss.append(kib)
    sequential = []
    for sb in boxes[WARM : WARM + seq]:
        code, ms, _ = bench.run_add(which, sb)
        assert code == 0, f"{which} ADD failed"
        sequential.append(ms)
    concurrent: list[float] = []
    barrier = threading.Barrier(conc)
    codes: list[int] = []

    def one(sb: Sandbox) -> None:
        barrier.wait()
        code, ms, _ = bench.run_add(which, sb)
        codes.append(code)
        concurrent.append(ms)

    threads = [threading.Thread(target=one, args=(sb,)) for sb in boxes[WARM + seq :]]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = (time.perf_counter() - start) * 1000
    assert codes.count(0) == conc, f"{which}: {conc - codes.count(0)} concurrent ADDs failed"
    missing = [sb.netns for sb in boxes if not captured(sb.netns)]
    assert not missing, f"{which}: {len(missing)} netns without ISTIO_OUTPUT after ADD"
    return {
        "seq_p50": percentile(sequential, 0.5),
        "seq_p99": percentile(sequential, 0.99),
        "conc_p50": percentile(concurrent, 0.5),
        "conc_p99": percentile(concurrent, 0.99),
        "conc_wall": wall,
        "rss_mib": statistics.median(rss) / 1024,
        "rss_max_mib": max(rss) / 1024,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequential", type=int, default=100)
    parser.add_argument("--concurrent", type=int, default=110)
    opts = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/istio_side_by_side.py needs root (network namespaces, mounts)")
    per = WARM + opts.sequential + opts.concurrent
    bench = SideBySide(Path(tempfile.mkdtemp(prefix="istio-cni-side-")), "auto")
    print(f"python {sys.version.split()[0]}, load average {os.getloadavg()[0]:.2f}")
    try:
        bench.start(2 * per)
        bench.setup_istio()
        results = {
            "Istio istio-cni": measure(
                bench, "istio", bench.pods[:per], opts.sequential, opts.concurrent
            ),
            "ours": measure(bench, "ours", bench.pods[per:], opts.sequential, opts.concurrent),
        }
        sizes = {
            "Istio istio-cni": size_mib(bench.istio_bin),
            "ours": size_mib(bench.bin_dir / "istio-cni"),
        }
    finally:
        bench.close()
    rows = [
        ("ADD p50 sequential (ms)", "seq_p50"),
        ("ADD p99 sequential (ms)", "seq_p99"),
        (f"ADD p50, {opts.concurrent} concurrent (ms)", "conc_p50"),
        (f"ADD p99, {opts.concurrent} concurrent (ms)", "conc_p99"),
        (f"{opts.concurrent} concurrent, wall (ms)", "conc_wall"),
        ("peak RSS per exec, median (MiB)", "rss_mib"),
        ("peak RSS per exec, max (MiB)", "rss_max_mib"),
    ]
    print("| | Istio istio-cni | ours |\n|---|---:|---:|")
    for label, key in rows:
        print(f"| {label} | {results['Istio istio-cni'][key]:.1f} | {results['ours'][key]:.1f} |")
    print(f"| executable size (MiB) | {sizes['Istio istio-cni']:.1f} | {sizes['ours']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
