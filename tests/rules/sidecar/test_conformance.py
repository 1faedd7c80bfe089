"""Istio's own cases (tests/testdata/istio-conformance): `rules` must equal the goldens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.rules.conftest import (
    conformance_dir,
    golden_lines,
    read_args,
    read_env,
    run_rules,
    tables,
)


def _cases(kind: str) -> list[Path]:
    root = conformance_dir() / kind
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if (p / "golden.txt").is_file())


def test_conformance_folder_is_present() -> None:
    root = conformance_dir()
    assert (root / "iptables").is_dir() and (root / "plugin").is_dir(), (
        f"conformance cases not found at {root}"
    )


@pytest.mark.parametrize("case", _cases("iptables"), ids=lambda p: p.name)
def test_iptables_case(case: Path) -> None:
    config = json.loads((case / "config.json").read_text())
    dns = ",".join(config.get("DNSServersV4", []) + config.get("DNSServersV6", []))
    ipv6 = "true" if config["EnableIPv6"] else "false"
    argv = [*read_args(case / "args.txt"), f"--ipv6={ipv6}", f"--dns-servers={dns}"]
    got = run_rules(argv, read_env(case / "env.txt"))
    assert got.code == 0, got.stderr
    assert got.stdout.strip().splitlines() == golden_lines(case / "golden.txt")


@pytest.mark.parametrize("case", _cases("plugin"), ids=lambda p: p.name)
def test_plugin_case(case: Path) -> None:
    got = run_rules(["--pod", str(case / "pod.yaml"), "--ipv6=false"])
    assert got.code == 0, got.stderr
    assert tables(got.stdout.strip().splitlines()) == tables(golden_lines(case / "golden.txt"))
