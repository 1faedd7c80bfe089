"""Differential: random capture configurations through Istio's `istio-iptables --dry-run` and our
`istio-cni-agent rules`, in the same namespace, compared line for line. Inputs where we differ
on purpose are never generated; they are listed, with reasons, in exceptions.py and checked by
test_exceptions.py.

The seed is printed; ISTIO_CNI_DIFF_SEED=N replays a run, ISTIO_CNI_DIFF_CASES=N sets its size
(default 1,000, what CI runs). A case agrees when both fail, or both succeed with the same lines.
"""

from __future__ import annotations

import json
import os
import random
import time

import pytest

from testbed.istio_binaries import pilot_agent
from tests.differential.generator import Case, Generator, Host
from tests.differential.runner import run_cases

pytestmark = pytest.mark.differential

MIN_CASES = 1000
HOSTS = 20


def _seed() -> int:
    if text := os.environ.get("ISTIO_CNI_DIFF_SEED"):
        return int(text)
    return random.SystemRandom().randrange(2**32)


def _describe(case: Case, host: Host, result: dict[str, object]) -> str:
    return json.dumps(
        {
            "case": case.index,
            "argv": case.argv,
            "env": case.env,
            "host": {"links": host.links, "resolv_conf": host.resolv_conf},
            **result,
        },
    )


def _diff(istio: list[str], ours: list[str]) -> list[str]:
    import difflib

    return list(difflib.unified_diff(istio, ours, "istio", "ours", lineterm="", n=0))[2:12]


def test_random_configurations_match_istio() -> None:
    seed = _seed()
    count = int(os.environ.get("ISTIO_CNI_DIFF_CASES", MIN_CASES))
    print(f"differential seed={seed} cases={count} (replay: ISTIO_CNI_DIFF_SEED={seed})")
    gen = Generator(seed)
    hosts = gen.hosts(HOSTS)
    cases = [gen.case(i, len(hosts)) for i in range(count)]
    start = time.monotonic()
    results = run_cases(pilot_agent().require(), hosts, cases)
    print(f"ran {len(results)} cases in {time.monotonic() - start:.1f}s")
    assert len(results) == count

    failures: list[str] = []
    istio_ok = 0
    for case in cases:
        result = results[case.index]
        istio, ours = result["istio"], result["ours"]
        istio_ok += istio["rc"] == 0
        same = (istio["rc"] == 0) == (ours["rc"] == 0) and (
            istio["rc"] != 0 or istio["lines"] == ours["lines"]
        )
        if same:
            continue
        detail = {
            "istio_rc": istio["rc"],
            "istio_error": istio["error"],
            "ours_rc": ours["rc"],
            "ours_error": ours["error"],
            "diff": _diff(istio["lines"], ours["lines"]),
        }
        failures.append(_describe(case, hosts[case.host], detail))
    print(f"Istio succeeded on {istio_ok}/{count}")
    assert istio_ok > count // 2, "most generated cases must be ones Istio programs"
    assert not failures, (
        f"{len(failures)} of {count} cases differ from Istio (seed {seed}); first ones:\n"
        + "\n".join(failures[:8])
    )
