"""The seeded fault timeline (bench/soak/schedule.py)."""

from __future__ import annotations

import itertools

import pytest

from bench.soak import faults, schedule
from bench.soak.faults import FaultKind

NODES = ["tb-node-1", "tb-node-2", "tb-node-3"]
KINDS = faults.available()
SEEDS = range(1, 21)


def test_the_same_seed_gives_the_same_timeline_and_another_seed_another() -> None:
    one = schedule.plan(KINDS, NODES, minutes=5, seed=7)
    assert one == schedule.plan(KINDS, NODES, minutes=5, seed=7)
    assert one != schedule.plan(KINDS, NODES, minutes=5, seed=8)


@pytest.mark.parametrize("seed", SEEDS)
def test_every_available_kind_is_in_a_five_minute_plan(seed: int) -> None:
    windows = schedule.plan(KINDS, NODES, minutes=5, seed=seed)
    assert {w.kind for w in windows} == {k.name for k in KINDS}


@pytest.mark.parametrize("seed", SEEDS)
def test_faults_come_alone_and_overlapping(seed: int) -> None:
    windows = schedule.plan(KINDS, NODES, minutes=5, seed=seed)
    overlapping = [(a, b) for i, a in enumerate(windows) for b in windows[i + 1 :] if a.overlaps(b)]
    assert overlapping, windows
    assert schedule.alone(windows), windows


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("minutes", [5, 30])
def test_no_two_faults_of_one_group_overlap_on_one_target(seed: int, minutes: int) -> None:
    group = {k.name: k.exclusive for k in KINDS}
    windows = schedule.plan(KINDS, NODES, minutes=minutes, seed=seed)
    for i, a in enumerate(windows):
        for b in windows[i + 1 :]:
            if group[a.kind] == group[b.kind] and a.same_target(b):
                assert not a.overlaps(b), (a, b)


@pytest.mark.parametrize("seed", SEEDS)
def test_windows_fit_the_span_and_node_faults_name_a_node(seed: int) -> None:
    first, last = schedule.span(5)
    scope = {k.name: k.scope for k in KINDS}
    for w in schedule.plan(KINDS, NODES, minutes=5, seed=seed):
        assert first <= w.start < w.end <= last, w
        assert (w.node in NODES) if scope[w.kind] == "node" else w.node is None, w


def test_a_longer_run_draws_more_faults_than_one_of_each() -> None:
    windows = schedule.plan(KINDS, NODES, minutes=30, seed=3)
    assert len(windows) > 2 * len(KINDS)


def test_every_kind_of_the_catalogue_is_available() -> None:
    assert faults.unavailable() == []
    assert "node_reboot" in {k.name for k in KINDS}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("minutes", [5, 30])
def test_a_node_reboot_never_targets_the_node_holding_the_control_plane(
    seed: int, minutes: int
) -> None:
    targets = {"node_reboot": NODES[1:]}
    windows = schedule.plan(KINDS, NODES, minutes=minutes, seed=seed, targets=targets)
    reboots = [w for w in windows if w.kind == "node_reboot"]
    assert reboots
    assert all(w.node in NODES[1:] for w in reboots), reboots


def test_without_a_restriction_a_node_reboot_may_hit_any_node() -> None:
    hit = {
        w.node
        for seed in SEEDS
        for w in schedule.plan(KINDS, NODES, minutes=30, seed=seed)
        if w.kind == "node_reboot"
    }
    assert hit == set(NODES)


def test_a_kind_with_no_node_it_may_target_is_refused() -> None:
    with pytest.raises(schedule.PlanError, match="node_reboot"):
        schedule.plan(KINDS, NODES, minutes=5, seed=1, targets={"node_reboot": ["elsewhere"]})


@pytest.mark.parametrize("seed", SEEDS)
def test_a_node_reboot_never_overlaps_a_fault_on_the_agents_process_of_its_node(
    seed: int,
) -> None:
    agent = {"agent_kill9", "agent_pod_delete", "agent_cpu_throttle", "runtime_restart"}
    windows = schedule.plan(KINDS, NODES, minutes=30, seed=seed, targets={"node_reboot": NODES[1:]})
    for r in (w for w in windows if w.kind == "node_reboot"):
        for w in windows:
            if w.kind in agent and w.node == r.node:
                assert not w.overlaps(r), (r, w)


def test_a_run_too_short_for_its_longest_fault_is_refused() -> None:
    with pytest.raises(schedule.PlanError):
        schedule.plan(KINDS, NODES, minutes=1, seed=1)


def test_a_kind_that_may_not_overlap_itself_is_spread_apart() -> None:
    only = [FaultKind("k", "one kind", "cluster", 30.0)]
    windows = schedule.plan(only, NODES, minutes=10, seed=5)
    assert len(windows) > 3
    for a, b in itertools.pairwise(windows):
        assert a.end <= b.start
