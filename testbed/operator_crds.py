"""The Prometheus operator's CRDs (PodMonitor, PrometheusRule), so the test bed's API server can
validate the chart's monitoring resources against their schemas.

They come from the Go module proxy: the module github.com/prometheus-operator/prometheus-operator
ships them under example/prometheus-operator-crd/. The version and its module checksum are pinned
here; the two files land in $ISTIO_CNI_CACHE/prometheus-operator-crds/<version>/ and are reused
while they exist. ci/setup-testbed fetches them (`python -m testbed.operator_crds`); `crd_files()`
fetches on demand when they are missing and raises MissingPartError naming the step that failed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from testbed.parts import SETUP_TESTBED, MissingPartError, cache_dir

MODULE = "github.com/prometheus-operator/prometheus-operator"
VERSION = "v0.85.0"
"""The newest version of the module the proxy serves (later tags are refused by it)."""
MODULE_SUM = "h1:M5xLCLEoaW2IJfnuCwFzzpL+jSVQu3KGT84Pye+fW8s="
"""go.sum's hash of that version's zip: a different download is refused."""
CRD_DIR = "example/prometheus-operator-crd"
FILES = {
    "PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
    "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
}
DOWNLOAD_TIMEOUT = 300.0
log = logging.getLogger(__name__)


def cached_dir(version: str = VERSION) -> Path:
    return cache_dir() / "prometheus-operator-crds" / version


def go_binary() -> Path:
    """$GO, else /usr/local/go/bin/go, else go on PATH (as ci/setup-testbed finds it)."""
    for candidate in (os.environ.get("GO"), "/usr/local/go/bin/go", shutil.which("go")):
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    raise MissingPartError(
        f"Prometheus operator CRDs: no Go toolchain to download {MODULE}@{VERSION} "
        f"(tried $GO, /usr/local/go/bin/go, PATH); see {SETUP_TESTBED}"
    )


def download_module(go: Path) -> Path:
    """`go mod download` of the pinned module; the directory of its extracted source."""
    what = f"go mod download {MODULE}@{VERSION}"
    # Outside any module and with no project GOFLAGS: only the one module is fetched.
    env = dict(os.environ, GOFLAGS="", GOTOOLCHAIN="local", GO111MODULE="on")
    with tempfile.TemporaryDirectory(prefix="operator-crds-") as cwd:
        try:
            proc = subprocess.run(
                [str(go), "mod", "download", "-json", f"{MODULE}@{VERSION}"],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=DOWNLOAD_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise MissingPartError(f"Prometheus operator CRDs: {what}: {e}") from e
    try:
        info = json.loads(proc.stdout)
    except ValueError as e:
        raise MissingPartError(
            f"Prometheus operator CRDs: {what} exited {proc.returncode}: "
            f"{proc.stderr.strip()[-2000:]}"
        ) from e
    if info.get("Error") or proc.returncode != 0:
        raise MissingPartError(
            f"Prometheus operator CRDs: {what}: {info.get('Error') or proc.stderr.strip()[-2000:]}"
        )
    if info.get("Sum") != MODULE_SUM:
        raise MissingPartError(
            f"Prometheus operator CRDs: {what}: checksum {info.get('Sum')} is not the pinned "
            f"{MODULE_SUM}"
        )
    return Path(info["Dir"])


def fetch() -> Path:
    """The cache dir holding both CRD files, downloading them first when one is missing."""
    target = cached_dir()
    if all((target / name).is_file() for name in FILES.values()):
        log.info("Prometheus operator CRDs %s cached at %s", VERSION, target)
        return target
    log.info("Prometheus operator CRDs: fetching %s@%s", MODULE, VERSION)
    source = download_module(go_binary()) / CRD_DIR
    target.mkdir(parents=True, exist_ok=True)
    for name in FILES.values():
        if not (source / name).is_file():
            raise MissingPartError(
                f"Prometheus operator CRDs: {MODULE}@{VERSION} has no {CRD_DIR}/{name}"
            )
        # Copy then rename: a reader never sees half a file (the module cache's copy is
        # read-only, the cached one a plain file).
        tmp = target / f".{name}.tmp"
        shutil.copyfile(source / name, tmp)
        os.replace(tmp, target / name)
    return target


def crd_files() -> dict[str, Path]:
    """Kind -> path of its CRD manifest, fetched when not cached yet."""
    directory = fetch()
    return {kind: directory / name for kind, name in FILES.items()}


def main() -> int:
    """ci/setup-testbed's step: progress on stderr, `crd-<Kind> PATH` lines on stdout."""
    logging.basicConfig(level=logging.INFO, format="testbed: %(message)s", stream=sys.stderr)
    try:
        paths = crd_files()
    except MissingPartError as e:
        print(f"testbed: {e}", file=sys.stderr)
        return 1
    for kind, path in paths.items():
        print(f"crd-{kind} {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
