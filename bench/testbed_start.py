"""Time the test bed's control plane start with the binaries already built: certificates,
etcd healthy, kube-apiserver /readyz, kube-controller-manager working (seconds from start).

Run from the repository root: python3 -m bench.testbed_start [ROUNDS]   (after ci/setup-testbed)
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from testbed.controlplane import Binaries, ControlPlane


def one_start() -> dict[str, float]:
    workdir = Path(tempfile.mkdtemp(prefix="testbed-bench-"))
    plane = ControlPlane(workdir, Binaries.from_cache())
    try:
        plane.start()
        return dict(plane.timings)
    finally:
        plane.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    results = [one_start() for _ in range(rounds)]
    for phase in results[0]:
        values = [r[phase] for r in results]
        print(
            f"{phase:25s} median {statistics.median(values):5.2f}s  "
            f"min {min(values):5.2f}s  max {max(values):5.2f}s  (n={rounds})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
