"""What the soak's test-bed bed (bench/soak/testbed_bed.py) decides without a node: the uninstall
line it looks for, as the agent's own formatters write it, and the timeline its kinds make."""

from __future__ import annotations

import logging

import pytest

from agent.logs import JsonFormatter, KeyValueFormatter
from bench.soak import faults, schedule
from bench.soak.testbed_bed import LACKS, UNINSTALLED


def agent_line(formatter: logging.Formatter, message: str) -> str:
    record = logging.LogRecord("agent.lifecycle", logging.INFO, __file__, 1, message, None, None)
    record.fields = {"removed": "plugin,entry"}
    # kubelet's CRI log format in front, as in its pod log files
    return "2026-12-06T20:00:00.000000000Z stderr F " + formatter.format(record)


@pytest.mark.parametrize(
    "formatter", [KeyValueFormatter(), JsonFormatter()], ids=["logfmt", "json"]
)
def test_the_agents_uninstall_line_is_recognised_and_no_other(formatter: logging.Formatter) -> None:
    assert UNINSTALLED.search(agent_line(formatter, "uninstalled"))
    for other in ("uninstalled nothing? no: upgrade", "install done", "not uninstalled"):
        assert not UNINSTALLED.search(agent_line(formatter, other)), other


def test_the_kinds_this_bed_lacks_are_in_the_catalogue_and_the_rest_plan_in_four_minutes() -> None:
    names = faults.catalogue_by_name()
    assert set(LACKS) <= set(names)
    kinds = [k for k in faults.available() if k.name not in LACKS]
    nodes = ["tb-node-1", "tb-node-2", "tb-node-3"]
    for seed in range(1, 51):
        windows = schedule.plan(kinds, nodes, minutes=4, seed=seed)
        assert {w.kind for w in windows} == {k.name for k in kinds}
