"""The image scripts' records are per checkout: two checkouts on one machine get two manifests
(the one testbed.images reads is this checkout's), and pruning old archives keeps those another
live checkout's record names. Runs ci/image/lib.sh itself on a throwaway cache dir (no build)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from testbed.images import manifest_path
from testbed.parts import REPO_ROOT

pytestmark = pytest.mark.node


def lib(checkout: Path, cache: Path, script: str) -> str:
    """Run `script` after sourcing `checkout`'s ci/image/lib.sh with `cache` as $CACHE_DIR."""
    done = subprocess.run(
        ["bash", "-c", f'source "$1/ci/image/lib.sh"; {script}', "lib", str(checkout)],
        env={**os.environ, "ISTIO_CNI_CACHE": str(cache)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def other_checkout(tmp_path: Path) -> Path:
    """A second checkout as the image scripts see one: its own ci/lib.sh and ci/image/lib.sh."""
    root = tmp_path / "other-checkout"
    (root / "ci" / "image").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "ci" / "lib.sh", root / "ci" / "lib.sh")
    shutil.copy(REPO_ROOT / "ci" / "image" / "lib.sh", root / "ci" / "image" / "lib.sh")
    return root


def test_each_checkout_has_its_own_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("ISTIO_CNI_CACHE", str(cache))
    other = other_checkout(tmp_path)
    ours = Path(lib(REPO_ROOT, cache, 'printf %s "$MANIFEST"'))
    theirs = Path(lib(other, cache, 'printf %s "$MANIFEST"'))
    assert ours == manifest_path() and theirs == manifest_path(other)
    assert ours != theirs
    assert ours.parent.parent == theirs.parent.parent == cache / "images" / "checkouts"
    assert (ours.parent / "checkout").read_text() == f"{REPO_ROOT.resolve()}\n"
    assert (theirs.parent / "checkout").read_text() == f"{other.resolve()}\n"
    lib(other, cache, 'manifest_set istio-cni \'{"ref": "theirs"}\'')
    lib(REPO_ROOT, cache, 'manifest_set istio-cni \'{"ref": "ours"}\'')
    assert json.loads(theirs.read_text()) == {"istio-cni": {"ref": "theirs"}}
    assert json.loads(ours.read_text()) == {"istio-cni": {"ref": "ours"}}


def test_pruning_keeps_what_a_live_checkout_records(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    other = other_checkout(tmp_path)
    images = cache / "images"
    images.mkdir(parents=True)
    archives = [images / f"istio-cni-{n:012x}.tar" for n in range(3)]  # oldest first
    for age, archive in enumerate(reversed(archives)):
        archive.write_text("x")
        os.utime(archive, (1_000_000 - age, 1_000_000 - age))
    recorded = {"istio-cni": {"archive": str(archives[0]), "tags": {}}}
    lib(other, cache, f"manifest_set istio-cni '{json.dumps(recorded['istio-cni'])}'")

    lib(REPO_ROOT, cache, "prune_old istio-cni 1")
    assert [a.exists() for a in archives] == [True, False, True]  # the newest, and the recorded

    shutil.rmtree(other)  # a checkout that is gone protects nothing
    lib(REPO_ROOT, cache, "prune_old istio-cni 1")
    assert [a.exists() for a in archives] == [False, False, True]
