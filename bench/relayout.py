"""What laying the test bed's real node out on containerd 2 and back costs (RealCluster.relayout,
as tests/node/conftest.py's on_containerd2 and own_layout do around the modules on containerd 2):
kubelet and the runtime stopped, every container killed, the layout's mount namespace made,
the other runtime started (the node's images it lacks imported), kubelet started, the Node
Ready again.

    1. to containerd 2, first time: containerd 2 made, the bed's images imported into it
    2. Istio's images imported while there (the `istiod` tier's proxy, the `migration` tier's
       install-cni), then back to containerd 1.6, which imports them too
    3. ROUNDS more rounds there and back, nothing to import

Run as root from the repository root, after ci/setup-testbed, ci/build-testbed-images and
ci/build-image:
    .venv/bin/python -m bench.relayout [ROUNDS]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from testbed import images
from testbed.platforms import RUNTIME_VARIANTS, Platform
from testbed.realnode import RealCluster

CONTAINERD2 = RUNTIME_VARIANTS["kind-on-containerd2"]


def timed(cluster: RealCluster, platform: Platform | None) -> float:
    began = time.monotonic()
    cluster.relayout(platform)
    return time.monotonic() - began


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    cluster = RealCluster(Path(tempfile.mkdtemp(prefix="relayout-bench-")))
    try:
        cluster.start()
        print(f"to containerd 2, first: {timed(cluster, CONTAINERD2):.1f}s", flush=True)
        for name in ("proxy", "install-cni"):
            cluster.import_image(images.image(name))
        print(f"back to 1.6, importing 2 images: {timed(cluster, None):.1f}s", flush=True)
        there, back = [], []
        for _ in range(rounds):
            there.append(timed(cluster, CONTAINERD2))
            back.append(timed(cluster, None))
        for what, times in (("to containerd 2", there), ("back to 1.6", back)):
            print(
                f"{what}: median {statistics.median(times):.1f}s "
                f"min {min(times):.1f}s max {max(times):.1f}s (n={rounds})"
            )
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
