"""Helpers for the rules tests: run `istio-cni-agent rules` in-process and compare outputs."""

from __future__ import annotations

import io
import os
import shlex
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

from agent.rules.cli import main
from tests.conformance_data import CONFORMANCE_DIR
from tests.rules.podnet import podnet  # noqa: F401  (fixture of the netns-tier tests here)

REPO = Path(__file__).resolve().parents[2]
SAVE_LINES = {"iptables-save", "ip6tables-save"}


def conformance_dir() -> Path:
    """Istio's cases: the project's copy (tests/conformance_data.py)."""
    return CONFORMANCE_DIR


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str


def run_rules(argv: list[str], env: dict[str, str] | None = None) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ISTIO_")}
    environ.update(env or {})
    with redirect_stdout(out), redirect_stderr(err):
        code = main("rules", argv, environ)
    return Outcome(code, out.getvalue(), err.getvalue())


def read_env(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if "=" in line:
                key, value = line.split("=", 1)
                env[key] = value
    return env


def read_args(path: Path) -> list[str]:
    return shlex.split(path.read_text())


def golden_lines(path: Path) -> list[str]:
    """The golden without Istio's iptables-save/ip6tables-save log lines."""
    lines = path.read_text().strip().splitlines()
    return [line for line in lines if line.strip() not in SAVE_LINES]


def tables(lines: list[str]) -> dict[tuple[str, int], list[str]]:
    """Split restore text into tables keyed by header (order of tables free)."""
    out: dict[tuple[str, int], list[str]] = {}
    current: list[str] = []
    for line in lines:
        if not line.strip():
            continue
        current.append(line)
        if line.strip() == "COMMIT":
            key = (current[0], sum(1 for k in out if k[0] == current[0]))
            out[key] = current
            current = []
    return out
