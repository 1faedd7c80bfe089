"""Each listed difference from Istio, run through both tools: it must still be exactly as listed
(tests/differential/exceptions.py gives the reason for each)."""

from __future__ import annotations

import pytest

from testbed.istio_binaries import pilot_agent
from tests.differential.exceptions import DIFFERENCES, as_case, outcome_matches
from tests.differential.generator import Host
from tests.differential.runner import run_cases

pytestmark = pytest.mark.differential

HOST = Host((("eth0", ("10.244.0.5/24",)),), "nameserver 10.96.0.10\n")


def test_listed_differences_are_still_the_listed_ones() -> None:
    cases = [as_case(i, diff) for i, diff in enumerate(DIFFERENCES)]
    results = run_cases(pilot_agent().require(), [HOST], cases)
    wrong = []
    for case, diff in zip(cases, DIFFERENCES, strict=True):
        istio, ours = results[case.index]["istio"], results[case.index]["ours"]
        if not outcome_matches(diff, istio, ours):
            wrong.append(
                f"{diff.name}: Istio rc={istio['rc']}, ours rc={ours['rc']} "
                f"({ours['error']}); listed: {diff.reason}"
            )
        elif not diff.ours_ok:
            assert ours["error"], f"{diff.name}: our refusal must name what is wrong"
    assert not wrong, "\n".join(wrong)
