"""The images a real node runs, built on this machine: `ci/build-testbed-images` (pause, workload)
and `ci/build-image` (the agent) write docker-archives under $CACHE_DIR/images and record them in
this checkout's manifest.json as {name: {"ref": ..., "archive": ...}}: one record per checkout
(ci/image/lib.sh), so a node test runs the images its own checkout built, whatever another
checkout on the machine built since."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from testbed.parts import REPO_ROOT, MissingPartError, cache_dir

BUILD_TESTBED_IMAGES = "ci/build-testbed-images"
BUILD_IMAGE = "ci/build-image"
SCRIPTS = {
    "pause": BUILD_TESTBED_IMAGES,
    "workload": BUILD_TESTBED_IMAGES,
    "istio-cni": BUILD_IMAGE,
}


@dataclass(frozen=True)
class Image:
    name: str
    ref: str
    archive: Path

    @property
    def hub(self) -> str:
        """The chart's `hub`: the ref up to the last path element (`<hub>/istio-cni:<tag>`)."""
        return self.ref.rsplit(":", 1)[0].rsplit("/", 1)[0]

    @property
    def tag(self) -> str:
        return self.ref.rsplit(":", 1)[1]


def manifest_path(checkout: Path = REPO_ROOT) -> Path:
    """This checkout's record: the key is ci/image/lib.sh's, over the checkout's real path."""
    key = hashlib.sha256(str(checkout.resolve()).encode()).hexdigest()[:12]
    return cache_dir() / "images" / "checkouts" / key / "manifest.json"


def image(name: str) -> Image:
    """The image `name` of the manifest; MissingPartError naming the script that builds it."""
    script = SCRIPTS.get(name, BUILD_TESTBED_IMAGES)
    path = manifest_path()
    try:
        entry = json.loads(path.read_text())[name]
        found = Image(name, str(entry["ref"]), Path(entry["archive"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise MissingPartError(
            f"test bed image '{name}' is missing: no entry in {path} ({type(e).__name__}: {e}); "
            f"build it with {script}"
        ) from e
    if not found.archive.is_file():
        raise MissingPartError(
            f"test bed image '{name}' is missing: {found.archive} (from {path}) does not exist; "
            f"build it with {script}"
        )
    return found


def build_agent_image(tag: str) -> Image:
    """`ci/build-image --tag TAG`: the agent image also tagged TAG, with its own archive (what an
    upgrade to a new tag installs), as the manifest records it under istio-cni.tags.TAG."""
    done = subprocess.run(
        [str(REPO_ROOT / BUILD_IMAGE), "--tag", tag],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ),
        timeout=3600,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{BUILD_IMAGE} --tag {tag} failed ({done.returncode}):\n{done.stderr[-3000:]}"
        )
    try:
        entry = json.loads(manifest_path().read_text())["istio-cni"]["tags"][tag]
        return Image("istio-cni", str(entry["ref"]), Path(entry["archive"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise RuntimeError(
            f"{BUILD_IMAGE} --tag {tag} recorded no istio-cni.tags.{tag} in {manifest_path()}: {e}"
        ) from e


BUILD_TEST_IMAGE = "ci/build-test-image"


def build_test_image(context: Path, name: str) -> Image:
    """`ci/build-test-image CONTEXT NAME`: a test-only image layered on the agent image (its
    Containerfile `FROM ${AGENT_IMAGE}`), tagged so the chart's hub/tag reach it."""
    done = subprocess.run(
        [str(REPO_ROOT / BUILD_TEST_IMAGE), str(context), name],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ),
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{BUILD_TEST_IMAGE} {context} {name} failed ({done.returncode}):\n"
            + done.stderr[-3000:]
        )
    _, ref, archive = done.stdout.split()
    return Image("istio-cni", ref, Path(archive))
