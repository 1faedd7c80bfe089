"""Istio's own binaries: the reference the differential tier compares our rules with, and istiod.

ci/setup-testbed builds `pilot-agent` (whose `istio-iptables` subcommand writes Istio's rules), the
`istio-cni` plugin and `pilot-discovery` (istiod, testbed/istiod.py) from the Go module proxy at the
istio.io/istio version pinned in ci/go/istio/go.mod, into $ISTIO_CNI_CACHE/istio/<version>/.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from testbed.parts import REPO_ROOT, SETUP_TESTBED, MissingPartError, Part, cache_dir

ISTIO_MODULE = "istio.io/istio"


def istio_version() -> str:
    """The istio.io/istio version ci/go/istio/go.mod pins (a line of its require block)."""
    gomod = REPO_ROOT / "ci" / "go" / "istio" / "go.mod"
    found = re.search(r"^\s*istio\.io/istio (v\S+)", gomod.read_text(), re.MULTILINE)
    if not found:
        raise MissingPartError(f"{gomod}: no '{ISTIO_MODULE} vX' requirement")
    return found.group(1)


def pilot_agent() -> Part:
    """Istio's pilot-agent: `pilot-agent istio-iptables --dry-run` prints Istio's rules."""
    path = cache_dir() / "istio" / istio_version() / "pilot-agent"
    return Part("pilot-agent", path, SETUP_TESTBED)


def istio_cni() -> Part:
    """Istio's CNI plugin (sidecar and ambient modes), for the pod-level differential."""
    return Part("istio-cni", cache_dir() / "istio" / istio_version() / "istio-cni", SETUP_TESTBED)


def pilot_discovery() -> Part:
    """istiod (Istio's control plane, its sidecar injector): what testbed/istiod.py runs."""
    path = cache_dir() / "istio" / istio_version() / "pilot-discovery"
    return Part("pilot-discovery", path, SETUP_TESTBED)


def bootstrap_template() -> Path:
    """The Envoy bootstrap template pilot-agent renders (tools/packaging/common/
    envoy_bootstrap.json of the pinned module): in Go's module cache since ci/setup-testbed built
    pilot-agent from it; ci/build-testbed-images copies it into the proxy image."""
    go = next(
        (g for g in (os.environ.get("GO"), "/usr/local/go/bin/go", shutil.which("go")) if g),
        None,
    )
    if go is None or not os.access(go, os.X_OK):
        raise MissingPartError(f"no Go toolchain to find {ISTIO_MODULE}; see {SETUP_TESTBED}")
    done = subprocess.run(
        [go, "env", "GOMODCACHE"], capture_output=True, text=True, timeout=30, check=False
    )
    module = Path(done.stdout.strip()) / f"{ISTIO_MODULE}@{istio_version()}"
    path = module / "tools" / "packaging" / "common" / "envoy_bootstrap.json"
    if not path.is_file():
        raise MissingPartError(f"no {path} (the module's source); run {SETUP_TESTBED}")
    return path
