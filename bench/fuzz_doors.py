"""Coverage-guided fuzzing of every door the agent and the plugin open (atheris, libFuzzer):
the HTTP port, the pod socket, the status socket, the ZDS socket, the plugin's CNI input and the
pod-input parser (bench/doors/: each door's target, seeds and contract).

    python -m bench.fuzz_doors --seconds N [--seed S] [--doors a,b] [--jobs J] [--json]
    python -m bench.fuzz_doors --door NAME --seconds N --workdir DIR   (one door, in-process)

Each door runs in a process of its own (its servers, its coverage), `--jobs` at a time, for N
seconds; a door's run stops at its first finding, whose input is kept in the work dir
(`crash-*`, `timeout-*`, `oom-*`) and printed. The last line with --json is one object:
{"doors": {NAME: {"execs", "coverage", "features", "corpus", "crashes", "artifacts", ...}}}.
Exit 0 when no door had a finding, 1 otherwise.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DOORS = ("http_port", "pod_socket", "status_socket", "zds_wire", "plugin_input", "pod_input")
INPUT_TIMEOUT_S = 10
"""One input taking longer is a finding (a hang)."""
RSS_LIMIT_MB = 2048
MAX_INPUT_BYTES = 8192
ARTIFACT = re.compile(r"^(crash|timeout|oom|leak|slow-unit)-")
STATUS = re.compile(r"cov: (\d+) ft: (\d+) corp: (\d+)")
FINAL = re.compile(r"stat::(\w+):\s+(\d+)")
DONE = re.compile(r"Done (\d+) runs in (\d+) second")


def run_door(name: str, seconds: int, seed: int, workdir: Path) -> None:
    """In this process: fuzz door `name` (exits when done, as libFuzzer does)."""
    import logging

    import atheris

    logging.disable(logging.CRITICAL)  # the doors log every refusal; the fuzzer's output is ours
    with atheris.instrument_imports(include=["agent", "plugin"]):
        door = importlib.import_module(f"bench.doors.{name}")
    door.setup()
    corpus = workdir / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for i, seed_input in enumerate(door.SEEDS):
        (corpus / f"seed-{i}").write_bytes(seed_input)
    tokens = getattr(door, "DICTIONARY", [])
    dictionary = workdir / "door.dict"
    dictionary.write_text("".join(f'"{_escaped(t)}"\n' for t in tokens))
    argv = [
        sys.argv[0],
        f"-max_total_time={seconds}",
        f"-seed={seed}",
        f"-timeout={INPUT_TIMEOUT_S}",
        f"-rss_limit_mb={RSS_LIMIT_MB}",
        f"-max_len={MAX_INPUT_BYTES}",
        f"-artifact_prefix={workdir}/",
        "-print_final_stats=1",
        "-keep_seed=1",  # boundary seeds add no coverage yet must stay to be mutated
        *([f"-dict={dictionary}"] if tokens else []),
        str(corpus),
    ]
    atheris.Setup(argv, door.one_input)
    atheris.Fuzz()


def _escaped(token: bytes) -> str:
    """A dictionary entry as libFuzzer reads it: printable ASCII, the rest as \\xNN."""
    return "".join(chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\x{b:02x}" for b in token)


def fuzz(name: str, seconds: int, seed: int, root: Path) -> dict[str, Any]:
    """Door `name` in a child process; its figures from libFuzzer's output and work dir."""
    workdir = root / name
    workdir.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "bench.fuzz_doors", "--door", name, "--seconds", str(seconds),
         "--seed", str(seed), "--workdir", str(workdir)],
        capture_output=True, text=True, errors="replace", timeout=seconds * 3 + 120,
    )  # fmt: skip
    output = done.stdout + done.stderr
    (workdir / "fuzzer.log").write_text(output)
    return summarize(name, output, done.returncode, workdir, time.monotonic() - began)


def summarize(
    name: str, output: str, returncode: int, workdir: Path, wall: float
) -> dict[str, Any]:
    stats = {k: int(v) for k, v in FINAL.findall(output)}
    status = STATUS.findall(output)
    cov, features, corpus = (int(x) for x in status[-1]) if status else (0, 0, 0)
    done = DONE.search(output)
    artifacts = sorted(p.name for p in workdir.iterdir() if ARTIFACT.match(p.name))
    execs = stats.get("number_of_executed_units") or (int(done.group(1)) if done else 0)
    finding = ""
    if artifacts or returncode != 0:
        tail = [line for line in output.splitlines() if line.strip()][-25:]
        finding = "\n".join(tail)
    return {
        "execs": execs,
        "execs_per_s": stats.get("average_exec_per_sec", 0),
        "coverage": cov,
        "features": features,
        "corpus": corpus,
        "new_units": stats.get("new_units_added", 0),
        "peak_rss_mb": stats.get("peak_rss_mb", 0),
        "crashes": len(artifacts) if artifacts else int(returncode != 0),
        "artifacts": [str(workdir / a) for a in artifacts],
        "exit_code": returncode,
        "wall_s": round(wall, 1),
        "finding": finding,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz_doors", description=__doc__)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--doors", default=",".join(DOORS))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--workdir", default="")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--door", help=argparse.SUPPRESS)  # the child's mode
    args = parser.parse_args(argv)
    if args.door:
        run_door(args.door, args.seconds, args.seed, Path(args.workdir))
        return 0
    names = [d for d in args.doors.split(",") if d]
    unknown = sorted(set(names) - set(DOORS))
    if unknown:
        parser.error(f"unknown doors {unknown}; known: {', '.join(DOORS)}")
    root = Path(args.workdir or tempfile.mkdtemp(prefix="fuzz-doors-"))
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = {n: pool.submit(fuzz, n, args.seconds, args.seed, root) for n in names}
        results = {n: f.result() for n, f in futures.items()}
    for name, r in results.items():
        verdict = "FINDING" if r["crashes"] else "ok"
        print(
            f"{name:14} {verdict:7} execs {r['execs']:>8} ({r['execs_per_s']}/s) "
            f"cov {r['coverage']:>5} ft {r['features']:>6} corpus {r['corpus']:>4} "
            f"rss {r['peak_rss_mb']} MB"
        )
        if r["crashes"]:
            print(f"  artifacts: {r['artifacts']}\n" + r["finding"])
    print(f"work dir: {root}")
    if args.json:
        print(json.dumps({"seconds": args.seconds, "seed": args.seed, "doors": results}))
    return 1 if any(r["crashes"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
