"""The forge workflow (.github/workflows/ci.yml): valid by actionlint, built by ci/setup-tools
(a missing actionlint fails, naming the script); it runs the README's test command on every
push, and `ci/release` keyless, only on a tag and only after the tests pass."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from testbed import parts

WORKFLOWS = parts.REPO_ROOT / ".github" / "workflows"


def _workflow() -> dict[Any, Any]:
    loaded = yaml.safe_load((WORKFLOWS / "ci.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def _runs(job: dict[str, Any]) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def test_actionlint_finds_nothing_in_the_workflows() -> None:
    actionlint = parts.release_tool("actionlint").require()
    files = sorted(str(p) for p in WORKFLOWS.glob("*.yml"))
    assert files, f"no workflow in {WORKFLOWS}"
    done = subprocess.run(
        [str(actionlint), "-no-color", *files],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=parts.REPO_ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_refuses_a_broken_workflow(tmp_path: Path) -> None:
    """The check can fail: a job needing one that does not exist, an unknown context."""
    actionlint = parts.release_tool("actionlint").require()
    broken = tmp_path / "broken.yml"
    broken.write_text(
        "on: push\njobs:\n  a:\n    needs: nowhere\n    runs-on: ubuntu-24.04\n"
        "    steps:\n      - run: echo ${{ gihtub.ref }}\n"
    )
    done = subprocess.run(
        [str(actionlint), "-no-color", str(broken)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "nowhere" in done.stdout and "gihtub" in done.stdout, done.stdout


def test_the_tests_run_on_every_push_and_pull_request() -> None:
    workflow = _workflow()
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as true
    assert set(triggers) == {"push", "pull_request"}
    assert "ci/test" in _runs(workflow["jobs"]["test"]).split()


def test_the_release_is_keyless_on_a_tag_after_the_tests() -> None:
    workflow = _workflow()
    assert workflow["permissions"] == {"contents": "read"}, "nothing more unless a job asks"
    release = workflow["jobs"]["release"]
    assert release["needs"] == "test"
    assert release["if"] == "startsWith(github.ref, 'refs/tags/v')"
    assert release["permissions"]["id-token"] == "write"
    runs = _runs(release)
    assert "ci/release" in runs and "--keyless" in runs
    assert "--cosign-key" not in runs and "COSIGN_KEY" not in runs
