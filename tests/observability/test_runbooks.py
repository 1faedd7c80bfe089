"""The runbooks (docs/runbooks/): one per alert, each alert's runbook_url pointing at its page,
and every shell block run: bash parses it, and each `kubectl` and `helm` command in it runs with
its arguments plus `--help` against the real binaries (kubectl of the test bed's Kubernetes, both
Helm versions), so an unknown subcommand or flag fails the test; other commands run for real on
the empty output. The chart's NOTES and its README commands are checked the same way."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed import parts
from testbed.helm import Helm
from tests.chart.conftest import helm  # noqa: F401 (fixture)
from tests.chart.test_docs import helm4, notes  # noqa: F401 (fixture)
from tests.observability.promtool import ALERTS, REPO_ROOT

pytestmark = pytest.mark.chart

RUNBOOKS = REPO_ROOT / "docs" / "runbooks"
BASE = "https://github.com/istio-cni/istio-cni/blob/main/docs/runbooks/"
# The variables the runbooks' README asks the reader to set.
PREAMBLE = "NS=kube-system POD=istio-cni-x7k2p NODE=node-a RELEASE=istio-cni PORT=15014\n"
SHIMS = r"""
check() {  # check TOOL BINARY ARGS...: ARGS (before a `--`) plus --help must be accepted
  local tool=$1 binary=$2; shift 2
  local args=()
  for a in "$@"; do [[ $a == -- ]] && break; args+=("$a"); done
  local out
  if ! out=$("$binary" "${args[@]}" --help 2>&1); then
    printf '%s %s: %s\n' "$tool" "$*" "${out%%$'\n'*}" >>"$FAILS"
  fi
  printf '%s\n' "$tool" >>"$CALLS"
}
kubectl() { check kubectl "$KUBECTL" "$@"; }
helm() { check helm "$HELM" "$@"; }
"""


def alerts() -> list[dict[str, object]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [r for g in groups for r in g["rules"]]


def shell_blocks(text: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)


def run_block(block: str, *, helm_binary: Path, tmp_path: Path) -> list[str]:
    """Run one block with the shims; the problems found (empty: all good)."""
    syntax = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True)
    if syntax.returncode != 0:
        return [f"bash -n: {syntax.stderr.strip()}"]
    fails, calls = tmp_path / "fails", tmp_path / "calls"
    fails.write_text("")
    calls.write_text("")
    env = {
        # The project's console scripts too: kubectl finds its plugin kubectl-istio_cni there.
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "FAILS": str(fails),
        "CALLS": str(calls),
        "KUBECTL": str(parts.kubectl().require()),
        "HELM": str(helm_binary),
        "KUBECONFIG": "/dev/null",
    }
    done = subprocess.run(
        ["bash"],
        input=SHIMS + PREAMBLE + block,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    problems = fails.read_text().splitlines()
    problems += [line for line in done.stderr.splitlines() if "command not found" in line]
    if not calls.read_text() and not block.startswith("NS="):  # the README's variables
        problems.append("no kubectl or helm command in the block")
    return problems


def test_each_alert_has_its_runbook_page() -> None:
    names = [str(r["alert"]) for r in alerts()]
    pages = {p.stem for p in RUNBOOKS.glob("*.md")} - {"README"}
    assert pages == set(names), "one runbook page per alert, named after it"
    index = (RUNBOOKS / "README.md").read_text()
    for rule in alerts():
        name = str(rule["alert"])
        annotations = rule["annotations"]
        assert isinstance(annotations, dict)
        assert annotations["runbook_url"] == f"{BASE}{name}.md"
        page = (RUNBOOKS / f"{name}.md").read_text()
        assert page.startswith(f"# {name}\n")
        assert f"**Severity** {rule['labels']['severity']}." in page.replace("\n", " ")  # type: ignore[index]
        assert f"[{name}.md]({name}.md)" in index


@pytest.mark.parametrize(
    "page", sorted(p.name for p in RUNBOOKS.glob("*.md")), ids=lambda n: n.removesuffix(".md")
)
def test_runbook_commands_are_valid(helm: Helm, page: str, tmp_path: Path) -> None:  # noqa: F811
    blocks = shell_blocks((RUNBOOKS / page).read_text())
    assert blocks, f"{page}: no sh block"
    for block in blocks:
        assert run_block(block, helm_binary=helm.binary, tmp_path=tmp_path) == [], block


def test_a_wrong_flag_is_caught(helm: Helm, tmp_path: Path) -> None:  # noqa: F811
    """The check bites: the chart README's old runbook command (kubectl logs has no
    --field-selector), a misspelt helm flag, a bash syntax error, an unknown command."""
    bad = [
        'kubectl -n "$NS" logs -l app=istio-cni --field-selector spec.nodeName=x',
        'helm -n "$NS" upgrade "$RELEASE" charts/istio-cni --reuse-value',
        "kubectl get pods -A | grep (",
        "kubectl logz x",
    ]
    for block in bad:
        assert run_block(block, helm_binary=helm.binary, tmp_path=tmp_path), block


def commands_in(text: str, *, bare_lines: bool) -> list[str]:
    """The kubectl and helm commands of a text: inline code spans, lines of sh/bash/console code
    blocks, and (`bare_lines`: NOTES) lines starting with one; placeholders `<...>` filled in."""
    spans = re.findall(r"`((?:kubectl|helm) [^`]+)`", text)
    blocks = re.findall(r"^```(?:sh|bash|console)\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    lines = [line.strip() for line in (text if bare_lines else "\n".join(blocks)).splitlines()]
    spans += [
        line.removeprefix("$ ") for line in lines if re.match(r"^(\$ )?(kubectl|helm) ", line)
    ]
    return [re.sub(r"<[^>]+>", "x", " ".join(span.split())) for span in spans]


def test_notes_and_readme_commands_are_valid(helm4: Helm, tmp_path: Path) -> None:  # noqa: F811
    readmes = [REPO_ROOT / "README.md", REPO_ROOT / "charts" / "istio-cni" / "README.md"]
    commands = [c for r in readmes for c in commands_in(r.read_text(), bare_lines=False)]
    commands += commands_in(notes(helm4), bare_lines=True)
    assert any("proxy/readyz" in c for c in commands)
    for command in commands:
        assert run_block(command, helm_binary=helm4.binary, tmp_path=tmp_path) == [], command
