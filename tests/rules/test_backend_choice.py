"""The `auto` backend's decision table (Istio's DetectIptablesVersion, per family) and the node's
choice pinned for a boot (agent.rules.backend_pin). No namespace needed: the tables a namespace
holds come in as a look, the tools and the boot id as parameters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.errors import RedirectError
from agent.netns.look import NetnsLook
from agent.rules import backend_pin, backends
from agent.rules.backends import FamilyChoice, decide_family

LEGACY, NFT = "iptables-legacy", "iptables-nft"


@pytest.mark.parametrize(
    ("legacy_tables", "legacy_tools", "nft_tools", "expected"),
    [
        (False, True, True, NFT),  # a fresh namespace
        (True, True, True, LEGACY),  # any legacy table, even an empty one (Istio: 3+ lines)
        (True, False, True, NFT),  # legacy tables but no legacy tools to program them
        (False, False, True, NFT),
        (True, True, False, LEGACY),
        (False, True, False, LEGACY),  # only the legacy tools: Istio's last resort
    ],
    ids=["fresh", "legacy-table", "no-legacy-tools", "nft-only", "legacy-only", "fallback"],
)
def test_decision_table(
    legacy_tables: bool, legacy_tools: bool, nft_tools: bool, expected: str
) -> None:
    got = decide_family(legacy_tables=legacy_tables, legacy_tools=legacy_tools, nft_tools=nft_tools)
    assert got == expected


def test_no_tools_at_all_is_an_error() -> None:
    with pytest.raises(RedirectError, match="no iptables tools"):
        decide_family(legacy_tables=True, legacy_tools=False, nft_tools=False)


def _look(ipv4: set[str], ipv6: set[str]) -> NetnsLook:
    return NetnsLook(
        legacy_tables={4: frozenset(ipv4), 6: frozenset(ipv6)},
        nft_tables=frozenset(),
        ipv6_addresses=(),
    )


@pytest.mark.parametrize(
    ("ipv4", "ipv6", "expected"),
    [
        (set(), set(), FamilyChoice(NFT, NFT)),
        ({"nat"}, set(), FamilyChoice(LEGACY, NFT)),  # Istio's own probe leaves an empty nat
        ({"filter"}, set(), FamilyChoice(LEGACY, NFT)),
        (set(), {"nat"}, FamilyChoice(NFT, LEGACY)),
        ({"nat", "mangle"}, {"filter"}, FamilyChoice(LEGACY, LEGACY)),
    ],
    ids=["fresh", "empty-v4-nat", "v4-filter", "v6-only", "both"],
)
def test_each_family_decides_on_its_own_tables(
    ipv4: set[str], ipv6: set[str], expected: FamilyChoice
) -> None:
    assert backends.detect("/unused", _look(ipv4, ipv6), tools=(True, True)) == expected


def test_a_choice_per_family_is_named_and_read_back() -> None:
    mixed = FamilyChoice(LEGACY, NFT)
    assert mixed.label == "ipv4=iptables-legacy,ipv6=iptables-nft"
    assert FamilyChoice.parse(mixed.label) == mixed
    assert FamilyChoice(NFT, NFT).label == NFT
    assert backends.choose("/unused", mixed.label) == mixed  # pinned: no look
    assert backends.choose("/unused", NFT) == FamilyChoice(NFT, NFT)
    assert backends.choose("/unused", "nftables") == "nftables"
    for bad in ("ipv4=iptables-legacy", "ipv4=nftables,ipv6=iptables-nft", "ipv4=,ipv6="):
        assert FamilyChoice.parse(bad) is None
        with pytest.raises(RedirectError, match="unknown rule backend"):
            backends.choose("/unused", bad)


class Node:
    """A node's boot id and what its tables would make `auto` decide now."""

    def __init__(self, tmp_path: Path) -> None:
        self.run_dir = tmp_path / "run"
        self.boot_file = tmp_path / "boot_id"
        self.boot_file.write_text("11111111-aaaa\n")
        self.now = FamilyChoice(NFT, NFT)
        self.decisions = 0

    def decide(self) -> FamilyChoice:
        self.decisions += 1
        return self.now

    def start(self, configured: str = "auto") -> str:
        """One agent start: the backend setting it uses."""
        return backend_pin.node_backend(
            configured, str(self.run_dir), boot_id_file=str(self.boot_file), decide=self.decide
        )

    @property
    def record(self) -> Path:
        return self.run_dir / backend_pin.STATE_FILE


def test_the_first_choice_of_a_boot_holds_across_restarts(tmp_path: Path) -> None:
    node = Node(tmp_path)
    assert node.start() == NFT
    assert json.loads(node.record.read_text()) == {
        "bootId": "11111111-aaaa",
        "ipv4": NFT,
        "ipv6": NFT,
    }
    # The node's tables change (Istio's look, or another agent, creates a legacy table): a
    # restart in the same boot keeps the choice its pods' rules were made with.
    node.now = FamilyChoice(LEGACY, NFT)
    assert node.start() == NFT
    assert node.start() == NFT
    assert node.decisions == 1


def test_a_new_boot_decides_again(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.start()
    node.now = FamilyChoice(LEGACY, NFT)
    node.boot_file.write_text("22222222-bbbb\n")
    assert node.start() == "ipv4=iptables-legacy,ipv6=iptables-nft"
    assert node.decisions == 2
    assert json.loads(node.record.read_text())["bootId"] == "22222222-bbbb"


def test_a_setting_other_than_auto_wins_and_forgets_the_choice(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.start()
    assert node.start("iptables-legacy") == "iptables-legacy"
    assert not node.record.exists()
    node.now = FamilyChoice(LEGACY, LEGACY)
    assert node.start() == LEGACY  # back to auto: decided afresh
    assert node.decisions == 2


@pytest.mark.parametrize(
    "content",
    [b"{", b"[]", b'{"bootId": "11111111-aaaa", "ipv4": "nftables", "ipv6": "iptables-nft"}'],
    ids=["truncated", "not-an-object", "not-a-variant"],
)
def test_a_record_that_cannot_be_read_is_decided_again(tmp_path: Path, content: bytes) -> None:
    node = Node(tmp_path)
    node.run_dir.mkdir()
    node.record.write_bytes(content)
    node.now = FamilyChoice(NFT, LEGACY)
    assert node.start() == "ipv4=iptables-nft,ipv6=iptables-legacy"
    assert node.decisions == 1


def test_without_a_boot_id_every_start_decides(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.boot_file.unlink()
    node.start()
    node.start()
    assert node.decisions == 2


def test_a_run_dir_that_cannot_be_written_still_gives_the_choice(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.run_dir.write_text("a file where the dir should be")
    assert node.start() == NFT


def test_no_tools_leaves_auto_to_each_namespace(tmp_path: Path) -> None:
    node = Node(tmp_path)

    def fail() -> FamilyChoice:
        raise RedirectError("no iptables tools found")

    node.decide = fail  # type: ignore[method-assign]
    assert node.start() == "auto"
