"""Start-up of the plugin as the runtime sees it: exec to exit, CNI_COMMAND=VERSION; and what each
build costs on the node: bytes shipped and the newest glibc any of its ELF files needs.

    python3 -m bench.plugin_startup [--runs 1000] [--build-dir DIR] [--before DIR] [EXE...]

Builds the plugin with ci/build-plugin (cached) into DIR (a temp dir by default) and times it,
round-robin with `--before` (another build's OUTDIR, e.g. one built from an older checkout) and
any extra executables, so a busy neighbour slows every case alike. Each sample is one
posix_spawn + waitpid (stdin/stdout/stderr on /dev/null, environment CNI_COMMAND=VERSION only):
no shell, no Python subprocess machinery in the timed path. 20 untimed rounds first.
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

from testbed import elf

REPO = Path(__file__).resolve().parents[1]
ENV = {"CNI_COMMAND": "VERSION"}


def spawn_ms(exe: str) -> float:
    actions = [(os.POSIX_SPAWN_OPEN, fd, "/dev/null", os.O_RDWR, 0) for fd in (0, 1, 2)]
    start = time.perf_counter_ns()
    pid = os.posix_spawn(exe, [exe], ENV, file_actions=actions)
    _, status = os.waitpid(pid, 0)
    elapsed = (time.perf_counter_ns() - start) / 1e6
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{exe} VERSION failed: {status}")
    return elapsed


def timings(cases: dict[str, str], runs: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {name: [] for name in cases}
    for n in range(runs + 20):
        for name, exe in cases.items():
            ms = spawn_ms(exe)
            if n >= 20:  # warm the page cache and the CPU frequency first
                out[name].append(ms)
    return out


def describe(build: Path) -> str:
    """Bytes of every file the build ships, and the newest glibc version one of them needs."""
    files = [p for p in build.rglob("*") if p.is_file()] if build.is_dir() else [build]
    size = sum(p.stat().st_size for p in files)
    newest = max(
        (n for p in elf.elf_files(build) if (n := elf.needs(p).newest_glibc)), default=None
    )
    floor = "none (static)" if newest is None else "GLIBC_" + ".".join(map(str, newest))
    return f"{len(files)} files, {size / 1e6:.2f} MB, needs glibc: {floor}"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--build-dir")
    parser.add_argument("--before", help="OUTDIR of another build to compare with")
    parser.add_argument("extra", nargs="*")
    opts = parser.parse_args()
    build = Path(opts.build_dir or tempfile.mkdtemp(prefix="istio-cni-bench-"))
    subprocess.run([str(REPO / "ci" / "build-plugin"), str(build)], check=True)
    cases = {"after: ci/build-plugin": str(build / "istio-cni")}
    builds = {"after: ci/build-plugin": build}
    if opts.before:
        cases["before: --before build"] = str(Path(opts.before) / "istio-cni")
        builds["before: --before build"] = Path(opts.before)
    cases.update({path: path for path in opts.extra})
    for name, path in builds.items():
        print(f"{name}: {describe(path)}")
    print(
        f"{'case (VERSION, exec to exit)':<40} {'mean':>7} {'p50':>7} {'p90':>7} {'p99':>7}"
        f"  ms, {opts.runs} runs, load {os.getloadavg()[0]:.1f}"
    )
    for name, times in timings(cases, opts.runs).items():
        t = sorted(times)
        p90, p99 = t[int(len(t) * 0.90)], t[min(len(t) - 1, int(len(t) * 0.99))]
        print(
            f"{name:<40} {statistics.fmean(t):7.2f} {statistics.median(t):7.2f} {p90:7.2f}"
            f" {p99:7.2f}"
        )
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
