"""kill -9 of `istio-cni-agent install` / `uninstall` at random instants, at scale.

Each trial: a fresh node holding one of the 29 real providers' configs and what a scenario puts
there (tests/install/kill_rig.py: install, upgrade from an older build, upgrade from the former
two-part build with its support dir, uninstall of either, a leftover entry, an extra config),
the command killed after a random delay, then the node judged (loadable configs, provider's
plugins intact and in order, at most one entry, no half-written binary, the named plugin answers
VERSION) and driven to convergence and a clean uninstall. Prints the violation counts by kind;
with --exact, also every exact kill point (before each file operation).

    .venv/bin/python -m bench.kill_anywhere --trials 1000 --exact
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

from tests.install import kill_rig

REPO = pathlib.Path(__file__).resolve().parents[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=1000)
    p.add_argument("--seed", type=int, default=16)
    p.add_argument("--exact", action="store_true", help="also every exact kill point")
    args = p.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="kill-anywhere."))
    try:
        subprocess.run(
            [str(REPO / "ci" / "build-plugin"), str(work / "plugin")],
            check=True,
            capture_output=True,
        )
        builds = kill_rig.make_builds(work / "builds", work / "plugin" / "istio-cni")
        start = time.monotonic()

        def progress(i: int, tally: kill_rig.Tally) -> None:
            if i % 100 == 0:
                print(
                    f"  {i} trials, {tally.killed} killed, "
                    f"{sum(tally.by_kind.values())} violations",
                    file=sys.stderr,
                )

        tally = kill_rig.random_trials(
            work / "node", builds, args.trials, seed=args.seed, progress=progress
        )
        took = time.monotonic() - start
        print(f"random kills ({took:.0f} s):\n{tally.report()}")
        failed = bool(tally.by_kind)
        if args.exact:
            start = time.monotonic()
            exact, points = kill_rig.exact_points(work / "node", builds)
            took = time.monotonic() - start
            print(f"exact points ({took:.0f} s): {json.dumps(points)}\n{exact.report()}")
            failed = failed or bool(exact.by_kind)
        return 1 if failed else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
