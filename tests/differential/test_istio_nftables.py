"""Differential, native nftables mode: the same random configurations as test_istio_iptables,
each with `--native-nftables` spelled one of the ways Istio accepts, through Istio's
`istio-iptables` and our `istio-cni-agent rules`, in the same namespace.

Istio's native mode ignores --dry-run: it programs the namespace and logs the transaction it
ran. Both sides are compared twice: the commands (Istio's log against our output, line for
line) and the rules the kernel holds after each (`nft list ruleset`, counters aside; ours
applied with `nft -f` as our backend does). A case agrees when both fail (nft refusing the
rules counts as failing: Istio's own rules name a group the host lacks, say), or both succeed
with the same commands and the same ruleset.

ISTIO_CNI_DIFF_SEED / ISTIO_CNI_DIFF_NFT_CASES replay or size a run (default 1,000: each case
runs one at a time in its namespace, as both sides program it).
"""

from __future__ import annotations

import os
import random
import time

import pytest

from testbed.istio_binaries import pilot_agent
from tests.differential.generator import TRUE_WORDS, Case, Generator
from tests.differential.runner import run_cases
from tests.differential.test_istio_iptables import HOSTS, _describe, _diff, _seed

pytestmark = pytest.mark.differential

MIN_CASES = 1000


def with_native(case: Case, rng: random.Random) -> Case:
    """The case in native mode: `--native-nftables`, `--native-nftables=TRUE-WORD` or
    $NATIVE_NFTABLES."""
    form = rng.random()
    if form < 0.4:
        case.argv.append("--native-nftables")
    elif form < 0.7:
        case.argv.append("--native-nftables=" + rng.choice(TRUE_WORDS))
    else:
        case.env["NATIVE_NFTABLES"] = rng.choice(TRUE_WORDS)
    return case


def _agree(istio: dict[str, object], ours: dict[str, object]) -> bool:
    if (istio["rc"] == 0) != (ours["rc"] == 0):
        return False
    return istio["rc"] != 0 or (
        istio["lines"] == ours["lines"] and istio["ruleset"] == ours["ruleset"]
    )


def test_random_configurations_match_istio_native_nftables() -> None:
    seed = _seed()
    count = int(os.environ.get("ISTIO_CNI_DIFF_NFT_CASES", MIN_CASES))
    print(f"nftables differential seed={seed} cases={count} (replay: ISTIO_CNI_DIFF_SEED={seed})")
    gen = Generator(seed)
    rng = random.Random(seed ^ 0x6E6674)
    hosts = gen.hosts(HOSTS)
    cases = [with_native(gen.case(i, len(hosts)), rng) for i in range(count)]
    start = time.monotonic()
    results = run_cases(pilot_agent().require(), hosts, cases, native=True)
    print(f"ran {len(results)} cases in {time.monotonic() - start:.1f}s")
    assert len(results) == count

    failures: list[str] = []
    istio_ok = programmed = 0
    for case in cases:
        istio, ours = results[case.index]["istio"], results[case.index]["ours"]
        istio_ok += istio["rc"] == 0
        programmed += istio["rc"] == 0 and "table inet istio-proxy-nat" in istio["ruleset"]
        if _agree(istio, ours):
            continue
        detail = {
            "istio_rc": istio["rc"],
            "istio_error": istio["error"],
            "ours_rc": ours["rc"],
            "ours_error": ours["error"],
            "diff": _diff(istio["lines"], ours["lines"]),
            "ruleset_diff": _diff(istio["ruleset"].splitlines(), ours["ruleset"].splitlines()),
        }
        failures.append(_describe(case, hosts[case.host], detail))
    print(f"Istio succeeded on {istio_ok}/{count}, programmed rules on {programmed}")
    assert programmed > count // 3, "most generated cases must be ones Istio programs"
    assert not failures, (
        f"{len(failures)} of {count} cases differ from Istio (seed {seed}); first ones:\n"
        + "\n".join(failures[:8])
    )
