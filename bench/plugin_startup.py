"""Start-up of the plugin as the runtime sees it: exec to exit, CNI_COMMAND=VERSION.

    python3 bench/plugin_startup.py [--runs 200] [--build-dir DIR] [EXTRA_EXECUTABLE...]

Builds the standalone plugin with ci/build-plugin (cached) into DIR (a temp dir by default) and
times, run after run, the built `istio-cni`, `python3 -I -S -c pass` (the bare interpreter's
floor) and `python3 -I -S -m plugin` from the sources; any extra executables are timed too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def timings(cases: dict[str, list[str]], runs: int, env: dict[str, str]) -> dict[str, list[float]]:
    """Round-robin over the cases, so a noisy neighbour slows every case alike."""
    out: dict[str, list[float]] = {name: [] for name in cases}
    for n in range(runs + 5):
        for name, cmd in cases.items():
            start = time.perf_counter()
            subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           check=True)
            if n >= 5:  # the first runs warm the page cache
                out[name].append((time.perf_counter() - start) * 1000)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--build-dir")
    parser.add_argument("extra", nargs="*")
    opts = parser.parse_args()
    build = Path(opts.build_dir or tempfile.mkdtemp(prefix="istio-cni-bench-"))
    subprocess.run([str(REPO / "ci" / "build-plugin"), str(build)], check=True)
    env = {"CNI_COMMAND": "VERSION", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    cases = {
        "built istio-cni (VERSION)": [str(build / "istio-cni")],
        "python3 -I -S -c pass": [sys.executable, "-I", "-S", "-c", "pass"],
        "python3 -I -S, plugin from sources (VERSION)": [sys.executable, "-I", "-S", "-c",
            f"import sys; sys.path.insert(0, {str(REPO)!r}); from plugin.main import main; "
            "sys.exit(main())"],
    }
    cases.update({f"{path} (VERSION)": [path] for path in opts.extra})
    print(f"{'case':<48} {'mean':>7} {'p50':>7} {'p99':>7}  ms, {opts.runs} runs")
    for name, times in timings(cases, opts.runs, env).items():
        t = sorted(times)
        p99 = t[min(len(t) - 1, int(len(t) * 0.99))]
        print(f"{name:<48} {statistics.fmean(t):7.1f} {statistics.median(t):7.1f} {p99:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
