"""Ambient mode in Istio's native nftables form: every one of Istio's ambient nftables goldens
(ambient-nft/, from cni/pkg/nftables/testdata) through `rules --ambient pod|host --format=nft`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agent.errors import RedirectError
from agent.rules.ambient.kubelet import kubelet_uid
from tests.conformance_data import CONFORMANCE_DIR
from tests.rules.ambient.test_rules import ambient_argv
from tests.rules.conftest import run_rules

NFT_DIR = CONFORMANCE_DIR / "ambient-nft"
CASES = sorted(p for p in NFT_DIR.iterdir() if (p / "golden.txt").is_file())


def nft_argv(case: dict[str, object]) -> list[str]:
    return [*ambient_argv(case), "--format=nft", f"--kubelet-uid={case['kubeletUID']}"]


def test_every_istio_ambient_nftables_golden_is_here() -> None:
    # Istio's cni/pkg/nftables tests: 6 in-pod cases and 1 host case, each IPv4 and IPv6.
    assert len(CASES) == 14, [p.name for p in CASES]
    origin = (NFT_DIR / "ORIGIN.md").read_text()
    assert "cni/pkg/nftables/testdata" in origin and "Apache-2.0" in origin


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name)
def test_ambient_nft_case(case: Path) -> None:
    got = run_rules(nft_argv(json.loads((case / "case.json").read_text())))
    assert got.code == 0, got.stderr
    # Byte for byte: Istio's spacing quirks ("mark and 0xfff  != 0x539") included.
    assert got.stdout == (case / "golden.txt").read_text().rstrip("\n") + "\n"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ambient=pod", "--format=json"], "--format: invalid value 'json'"),
        (["--ambient=host", "--format=nft", "--kubelet-uid=kubelet"], "--kubelet-uid: invalid"),
    ],
    ids=["format", "kubelet-uid"],
)
def test_bad_flags_name_the_flag(argv: list[str], message: str) -> None:
    got = run_rules(argv)
    assert got.code == 2 and got.stdout == ""
    assert message in got.stderr


def fake_proc(root: Path, pid: int, comm: str, cmdline: list[str], uid: int) -> None:
    d = root / str(pid)
    d.mkdir()
    (d / "comm").write_text(comm + "\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in cmdline) + b"\0")
    (d / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t0\t{uid}\t{uid}\nGid:\t0\t0\t0\t0\n")


def test_kubelet_uid_is_the_kubelet_process_real_uid(tmp_path: Path) -> None:
    # A /proc tree laid out as the kernel does (comm, NUL-separated cmdline, status Uid: line).
    fake_proc(tmp_path, 7, "bash", ["bash"], 0)
    fake_proc(tmp_path, 8, "kubelet", ["/bin/sleep"], 5)  # named kubelet, but not one
    fake_proc(tmp_path, 12, "kubelite", ["/snap/kubelite", "--kubelet-args-file=x"], 1234)
    (tmp_path / "self").mkdir()
    assert kubelet_uid(str(tmp_path)) == "1234"


def test_no_kubelet_is_an_error_naming_where_it_looked(tmp_path: Path) -> None:
    fake_proc(tmp_path, 7, "bash", ["bash"], 0)
    with pytest.raises(
        RedirectError, match=re.escape(f"no kubelet or kubelite process in {tmp_path}")
    ):
        kubelet_uid(str(tmp_path))
