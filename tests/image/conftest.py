"""Fixtures of the image tests: the images built by ci/build-testbed-images and ci/build-image
(once per session), read from this checkout's manifest.json (testbed.images.manifest_path), and
a throwaway containerd with them imported. A build that fails fails the tests, naming the script
and the end of its output."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testbed.images import manifest_path
from testbed.parts import REPO_ROOT
from tests.image.archive import Archive
from tests.image.containerd import Containerd, throwaway_containerd

BUILD_TIMEOUT = 3600  # a cold agent image compiles CPython for the plugin on 2 shared cores


@dataclass(frozen=True)
class Built:
    name: str
    ref: str
    archive: Path
    entry: dict[str, Any]


@dataclass(frozen=True)
class BuildRun:
    script: str
    seconds: float
    stdout: str
    stderr: str


def run_build(script: str, *args: str, timeout: float = BUILD_TIMEOUT) -> BuildRun:
    start = time.monotonic()
    try:
        r = subprocess.run(
            [str(REPO_ROOT / script), *args],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
    except FileNotFoundError:
        pytest.fail(f"{script} is missing", pytrace=False)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{script} {' '.join(args)} did not finish in {timeout}s: {e.stderr!r}")
    if r.returncode != 0:
        tail = "\n".join(r.stderr.splitlines()[-40:])
        pytest.fail(
            f"{script} {' '.join(args)} exited {r.returncode}; the end of its output:\n{tail}",
            pytrace=False,
        )
    return BuildRun(script, time.monotonic() - start, r.stdout, r.stderr)


def manifest() -> dict[str, dict[str, Any]]:
    path = manifest_path()
    data: dict[str, dict[str, Any]] = json.loads(path.read_text())
    return data


def built(name: str, script: str) -> Built:
    entry = manifest().get(name)
    if not entry:
        pytest.fail(f"{script} ran but left no '{name}' entry in the manifest", pytrace=False)
    archive = Path(str(entry["archive"]))
    if not archive.is_file():
        pytest.fail(f"{script}: the archive of '{name}' is missing: {archive}", pytrace=False)
    return Built(name, str(entry["ref"]), archive, entry)


@pytest.fixture(scope="session")
def build_runs() -> dict[str, BuildRun]:
    """Runs both build scripts once (cold or cached); their outputs, by script."""
    return {
        "ci/build-testbed-images": run_build("ci/build-testbed-images"),
        "ci/build-image": run_build("ci/build-image"),
    }


@pytest.fixture(scope="session")
def images(build_runs: dict[str, BuildRun]) -> dict[str, Built]:
    return {
        "pause": built("pause", "ci/build-testbed-images"),
        "workload": built("workload", "ci/build-testbed-images"),
        "istio-cni": built("istio-cni", "ci/build-image"),
    }


@pytest.fixture(scope="session")
def agent_archive(images: dict[str, Built]) -> Archive:
    return Archive(images["istio-cni"].archive)


@pytest.fixture(scope="session")
def containerd(
    images: dict[str, Built], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Containerd]:
    """A throwaway containerd with the three images imported; stopped and removed at the end."""
    with throwaway_containerd(tmp_path_factory.mktemp("containerd")) as c:
        for image in images.values():
            refs = c.import_archive(image.archive)
            assert image.ref in refs, f"importing {image.archive} gave {refs}, not {image.ref}"
        yield c
