"""Our own cases beyond Istio's sample: flags (testdata/*) and pods (testdata/pods/*)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rules.conftest import read_args, read_env, run_rules

TESTDATA = Path(__file__).parents[1] / "testdata"
FLAG_CASES = sorted(p for p in TESTDATA.iterdir() if (p / "args.txt").is_file())
POD_CASES = sorted(p for p in (TESTDATA / "pods").iterdir() if (p / "pod.yaml").is_file())


@pytest.mark.parametrize("case", FLAG_CASES, ids=lambda p: p.name)
def test_flag_case(case: Path) -> None:
    got = run_rules(read_args(case / "args.txt"), read_env(case / "env.txt"))
    assert got.code == 0, got.stderr
    assert got.stdout == (case / "golden.txt").read_text()


@pytest.mark.parametrize("case", POD_CASES, ids=lambda p: p.name)
def test_pod_case(case: Path) -> None:
    argv = ["--pod", str(case / "pod.yaml"), "--dns-servers=", *read_args(case / "args.txt")]
    got = run_rules(argv)
    assert got.code == 0, got.stderr
    assert got.stdout == (case / "golden.txt").read_text()


def test_nft_golden() -> None:
    case = TESTDATA / "pods" / "custom-uid-tproxy"
    got = run_rules(["--pod", str(case / "pod.yaml"), "--ipv6=true", "--format", "nft"])
    assert got.code == 0, got.stderr
    assert got.stdout == (TESTDATA / "nft" / "custom-uid-tproxy-ipv6.nft").read_text()
