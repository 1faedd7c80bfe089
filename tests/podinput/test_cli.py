"""`rules --pod FILE` and `rules --ambient pod --pod FILE` refuse every hostile value of every
pod-controlled input: exit 1, a message naming the input with an escaped excerpt, no rules.

The whole corpus runs through the CLI's entry function in-process (the same code the command
runs); each input also runs once through the real `istio-cni-agent` command in a subprocess,
all of them at once. Valid pods print Istio's rules through the same parser.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from agent.cli import main as agent_main
from tests.podinput.corpus import (
    EXPLOIT,
    INPUTS,
    Input,
    Manifest,
    ambient_pod,
    cases,
    refusal_problems,
    sidecar_pod,
)

pytestmark = pytest.mark.hostile

AGENT = Path(sys.executable).with_name("istio-cni-agent")
NO_CONFIG = "/nonexistent/istio-cni/config.yaml"
"""Settings come from the defaults (an absent default config file is the defaults)."""


def argv(item_mode: str, path: Path) -> list[str]:
    if item_mode == "sidecar":
        return ["rules", "--pod", str(path)]
    return ["rules", "--ambient", "pod", "--pod", str(path), "--ipv6=false"]


def write(tmp_path: Path, name: str, pod: Manifest) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(pod))
    return path


def run_in_process(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = agent_main(args)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(autouse=True)
def _defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller's environment is not the pod's: no ISTIO_* variable reaches the parser."""
    for key in list(os.environ):
        if key.startswith("ISTIO_"):
            monkeypatch.delenv(key)


@pytest.mark.parametrize("mode", ["sidecar", "ambient"])
def test_every_input_and_hostile_value_is_refused(tmp_path: Path, mode: str) -> None:
    problems: list[str] = []
    for item, name, value in cases(mode):  # type: ignore[arg-type]
        path = write(tmp_path, "pod", item.pod(value))
        code, out, err = run_in_process(argv(mode, path))
        case = f"{item.id} = {name}"
        if code != 1 or out:
            problems.append(f"{case}: exit {code}, stdout {out[:80]!r} (want exit 1, nothing)")
            continue
        problems += [f"{case}: {p}" for p in refusal_problems(err, item, value)]
    assert not problems, "\n".join(problems)


def test_inputs_through_the_real_command(tmp_path: Path) -> None:
    """A subprocess of the installed command per input (the issue's value), side by side."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ISTIO_")}
    running: list[tuple[Input, subprocess.Popen[str]]] = []
    for i, item in enumerate(INPUTS):
        value: object = EXPLOIT
        path = write(tmp_path, f"pod-{i}", item.pod(value))
        proc = subprocess.Popen(
            [str(AGENT), *argv(item.mode, path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        running.append((item, proc))
    problems: list[str] = []
    for item, proc in running:
        out, err = proc.communicate(timeout=120)
        if proc.returncode != 1 or out:
            problems.append(f"{item.id}: exit {proc.returncode}, stdout {out[:80]!r}")
        problems += [f"{item.id}: {p}" for p in refusal_problems(err, item, EXPLOIT)]
    assert not problems, "\n".join(problems)


def test_ambient_pod_prints_the_rules_for_its_annotations(tmp_path: Path) -> None:
    pod = ambient_pod()
    pod["metadata"]["annotations"] = {
        "istio.io/reroute-virtual-interfaces": "tun0, ,ppp0",
        "ambient.istio.io/bypass-inbound-capture": "true",
        "ambient.istio.io/dns-capture": "false",
    }
    path = write(tmp_path, "pod", pod)
    code, out, err = run_in_process(argv("ambient", path))
    flags = run_in_process(
        [
            "rules",
            "--ambient",
            "pod",
            "--ipv6=false",
            "--virtual-interfaces=tun0,ppp0",
            "--ingress",
            "--dns-proxy=disabled",
        ]
    )
    assert (code, err) == (0, "")
    assert out == flags[1] and "-A ISTIO_PRERT -i tun0 -p tcp -j REDIRECT --to-ports 15001" in out
    nft = run_in_process([*argv("ambient", path), "--format=nft"])
    assert nft[0] == 0 and "iifname tun0 meta l4proto tcp" in nft[1]


def test_ambient_pod_flags_are_the_pods_own(tmp_path: Path) -> None:
    path = write(tmp_path, "pod", ambient_pod())
    code, _, err = run_in_process([*argv("ambient", path), "--ingress"])
    assert code == 2 and "--pod takes its settings from the pod; drop --ingress" in err
    code, _, err = run_in_process(["rules", "--ambient", "host", "--pod", str(path)])
    assert code == 2 and "only with --ambient pod" in err


def test_rules_help_names_the_pod_contract() -> None:
    code, out, _ = run_in_process(["rules", "--ambient", "pod", "--help"])
    assert code == 0 and "--ambient pod --pod FILE" in out


def test_sidecar_pod_still_prints_its_rules(tmp_path: Path) -> None:
    pod = sidecar_pod()
    pod["metadata"]["annotations"]["traffic.sidecar.istio.io/excludeInterfaces"] = "eth1"
    code, out, err = run_in_process(argv("sidecar", write(tmp_path, "pod", pod)))
    assert code == 0 and "-A PREROUTING -i eth1 -j RETURN" in out, err


@pytest.mark.parametrize(
    "args",
    [
        ["rules", "--ambient", "pod", "--ipv6=false", f"--virtual-interfaces={EXPLOIT}"],
        ["rules", "--ipv6=false", "--dns-servers=", f"--istio-exclude-interfaces={EXPLOIT}"],
        ["rules", "--ipv6=false", "--dns-servers=", "--istio-local-exclude-ports=9000\n-A X"],
        ["rules", "--ipv6=false", "--dns-servers=", "--proxy-uid=1337\t"],
    ],
    ids=["ambient-virtual-interfaces", "exclude-interfaces", "exclude-ports", "proxy-uid"],
)
def test_operator_flags_are_held_to_the_same_tokens(args: list[str]) -> None:
    code, out, err = run_in_process(args)
    assert (code, out) == (2, "") and "invalid value" in err
    assert "\n" not in err.removesuffix("\n")
