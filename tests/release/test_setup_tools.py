"""ci/setup-tools: each tool at its pinned version in the cache dir, reused there without a
build; a failed build names the tool and leaves nothing half-written."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from testbed import parts

SCRIPT = parts.REPO_ROOT / "ci" / "setup-tools"


def _run(cache: Path, *tools: str) -> subprocess.CompletedProcess[str]:
    # GO=/bin/false: any attempt to build fails at once, so a pass proves nothing was built.
    env = dict(os.environ, ISTIO_CNI_CACHE=str(cache), GO="/bin/false")
    return subprocess.run(
        [str(SCRIPT), *tools], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_cached_tools_are_reused_without_building(tmp_path: Path) -> None:
    expected = []
    for tool, module in parts.RELEASE_TOOLS.items():
        path = tmp_path / tool / parts.pinned_version(tool, module) / tool
        path.parent.mkdir(parents=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
        expected.append(f"{tool} {path}")
    result = _run(tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("cached at") == 3
    assert result.stdout.splitlines() == expected


def test_a_failed_build_names_the_tool_and_leaves_nothing(tmp_path: Path) -> None:
    result = _run(tmp_path, "cosign")
    assert result.returncode != 0
    assert "tools: build of cosign failed" in result.stderr
    version = parts.pinned_version("cosign", parts.RELEASE_TOOLS["cosign"])
    assert not list((tmp_path / "cosign" / version).glob("*")), "no binary, no temp file"
    assert not list(tmp_path.glob("build-*/")), "scratch dirs removed"


def test_an_unknown_tool_is_refused(tmp_path: Path) -> None:
    result = _run(tmp_path, "grype")
    assert result.returncode != 0
    assert "unknown tool 'grype'" in result.stderr
