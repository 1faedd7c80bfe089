"""python -m bench.soak --minutes N --seed S --report FILE [--json] [--without KIND[,KIND]]

The soak on the three-node test bed: pods churned in sidecar and ambient namespaces while a
seeded timeline of faults runs, alone and overlapping; every invariant checked throughout. The
report is written to FILE (markdown), FILE's .png (plot) and .json beside it; with --json the
JSON object is also printed, last. Exit 0 when nothing was violated, 1 on any violation, 2 when
the bed cannot run here (the message names what is missing), 130 when interrupted (SIGINT: the
bed is torn down and the partial report written). `--list-faults` prints the
catalogue, each kind available or not and why.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from bench.soak import faults, report, schedule
from bench.soak.bed import Bed, BedUnavailable
from bench.soak.run import Runner, Settings


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--report", type=Path, default=Path("soak-report.md"))
    p.add_argument("--json", action="store_true", help="print the JSON object last")
    p.add_argument("--pods-per-minute", type=float, default=30.0)
    p.add_argument(
        "--workdir", type=Path, default=None, help="the bed's files (default: a temp dir)"
    )
    p.add_argument("--list-faults", action="store_true")
    p.add_argument(
        "--without",
        action="append",
        default=[],
        metavar="KIND[,KIND]",
        help="leave these fault kinds out (e.g. those that replace the agents' processes, so "
        "one agent lives the whole run and its resource trends can be judged)",
    )
    args = p.parse_args(argv)
    args.without = {k for arg in args.without for k in arg.split(",") if k}
    unknown = sorted(args.without - set(faults.catalogue_by_name(faults.CATALOGUE)))
    if unknown:
        p.error(f"--without: no fault kind {', '.join(unknown)} (see --list-faults)")
    return args


def list_faults() -> str:
    lines = []
    for kind in faults.CATALOGUE:
        state = "available" if kind.available else f"NOT AVAILABLE: {kind.unavailable}"
        lines.append(f"{kind.name:20} {kind.scope:8} {kind.what}; {state}")
    return "\n".join(lines)


def open_bed(args: argparse.Namespace) -> Bed:
    # The test bed's imports only when a run needs them (--list-faults needs none).
    from bench.soak.testbed_bed import open_bed as open_testbed

    return open_testbed(args.workdir, pods_per_minute=args.pods_per_minute)


def main(argv: list[str]) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.list_faults:
        print(list_faults())
        return 0
    try:
        bed = open_bed(args)
    except BedUnavailable as e:
        print(f"bed not available: {e}", file=sys.stderr)
        return 2
    lacking = {k.name: k.unavailable for k in faults.unavailable()} | bed.lacks()
    lacking |= {name: "left out (--without)" for name in args.without}
    kinds = [k for k in faults.available() if k.name not in lacking]
    for name, why in sorted(lacking.items()):
        print(f"soak: fault {name} not fired: {why}", file=sys.stderr)
    windows = schedule.plan(
        kinds, list(bed.nodes), minutes=args.minutes, seed=args.seed, targets=bed.targets()
    )
    settings = Settings(total_s=args.minutes * 60.0, seed=args.seed)
    result = Runner(bed, windows, faults.catalogue_by_name(kinds), settings).run()
    result.unavailable = lacking
    data = report.write(result, args.report)
    print(report.markdown(data))
    if args.json:
        print(json.dumps(data))
    if result.interrupted_at is not None:
        return 130
    return 1 if data["violations"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
