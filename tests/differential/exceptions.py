"""Where we differ from Istio's istio-iptables on purpose, each with its reason.

The random differential never generates these inputs; tests/differential/test_exceptions.py runs
each one through both tools and checks the difference is still exactly the one described, so an
entry disappears once Istio changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.differential.generator import Case


@dataclass(frozen=True)
class Difference:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    istio_ok: bool = True
    """Istio exits 0 (its dry run prints rules)."""
    ours_ok: bool = False
    reason: str = ""


DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        "stray-word-after-bool-flag",
        ["-n", "--redirect-dns", "false", "--capture-all-dns"],
        reason="cobra ignores positional words, so `--redirect-dns false` turns DNS capture ON; "
        "we refuse the word (exit 2) rather than silently invert what the user wrote",
    ),
    Difference(
        "non-numeric-uid",
        ["-n", "--proxy-uid=istio-proxy"],
        reason="Istio writes `--uid-owner istio-proxy` and iptables resolves the name where the "
        "rules are applied: on the node (agent container), not in the pod's image, so the UID "
        "may not be the proxy's; we take numeric ids only and say so",
    ),
    Difference(
        "port-with-garbage",
        ["-n", "--istio-inbound-ports=80x"],
        reason="Istio prints `--dport 80x`, which iptables-restore rejects when applied: the pod "
        "would fail anyway; we fail at once with the flag and value named",
    ),
)


def as_case(index: int, diff: Difference) -> Case:
    return Case(index, list(diff.argv), dict(diff.env), 0, [diff.name])


def outcome_matches(diff: Difference, istio: dict[str, Any], ours: dict[str, Any]) -> bool:
    return (istio["rc"] == 0) == diff.istio_ok and (ours["rc"] == 0) == diff.ours_ok
