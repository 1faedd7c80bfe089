"""The invariants' recorders (bench/soak/invariants.py), fed synthetic sample streams."""

from __future__ import annotations

from bench.soak import faults
from bench.soak.invariants import Activity, Invariants

A, B = "tb-node-1", "tb-node-2"


def checked(activity: Activity) -> Invariants:
    return Invariants(activity, 30.0, 60.0, frozenset({"conflist_delete"}))


def fired(
    activity: Activity, kind: str, node: str | None, start: float, stop: float, up: float | None
) -> None:
    firing = activity.started(kind, node, start)
    firing.stopped, firing.recovered = stop, up


def test_an_uncaptured_pod_during_a_fault_names_that_fault_and_not_others() -> None:
    activity = Activity()
    fired(activity, "agent_kill9", A, 10.0, 10.0, 25.0)
    fired(activity, "agent_kill9", B, 50.0, 50.0, 60.0)
    fired(activity, "api_429", None, 12.0, 32.0, 33.0)
    inv = checked(activity)
    inv.pod_captured(20.0, A, "p1", captured=True)
    assert inv.violations == []
    inv.pod_captured(20.0, A, "p2", captured=False)
    (v,) = inv.violations
    assert (v.invariant, v.at, v.node) == ("uncaptured", 20.0, A)
    assert v.faults == ("agent_kill9@tb-node-1", "api_429")
    inv.pod_captured(40.0, B, "p3", captured=False)  # no fault active then: still a violation
    assert inv.violations[-1].faults == ()


def test_a_pod_may_wait_while_its_node_is_faulted_but_not_past_the_bound() -> None:
    activity = Activity()
    fired(activity, "runtime_restart", A, 0.0, 5.0, 100.0)
    inv = checked(activity)
    inv.pod_waiting(125.0, A, "waits-through-fault", created=10.0, running=125.0)
    assert inv.violations == []
    inv.pod_waiting(140.0, A, "stuck-after-fault", created=10.0, running=None)
    (v,) = inv.violations
    assert v.invariant == "stuck" and v.at == 130.0 and v.faults == ()
    inv.pod_waiting(150.0, A, "stuck-after-fault", created=10.0, running=None)
    assert len(inv.violations) == 1  # recorded once
    # On another node the fault excuses nothing.
    inv.pod_waiting(50.0, B, "other-node", created=10.0, running=None)
    last = inv.violations[-1]
    assert (last.node, last.at, last.faults) == (B, 40.0, ())


def test_a_cluster_fault_excuses_waits_on_every_node_and_is_named() -> None:
    activity = Activity()
    fired(activity, "api_stopped", None, 0.0, 20.0, None)  # never recovered
    inv = checked(activity)
    inv.pod_waiting(200.0, B, "p", created=5.0, running=None)
    assert inv.violations == []  # the fault has not ended: the pod is excused
    inv.fault_recovered(activity.firings[0], 200.0)
    (v,) = inv.violations
    assert v.invariant == "unrecovered" and v.faults == ("api_stopped",)


def test_broken_files_are_the_fault_only_while_a_fault_breaking_them_is_active() -> None:
    activity = Activity()
    fired(activity, "conflist_delete", A, 10.0, 15.0, 18.0)
    fired(activity, "agent_kill9", B, 10.0, 10.0, 30.0)
    inv = checked(activity)
    inv.files(12.0, A, working=False, detail="no conflist")
    assert inv.violations == []
    inv.files(19.0, A, working=False, detail="no conflist")
    inv.files(12.0, B, working=False, detail="our entry missing")
    assert [(v.at, v.node, v.faults) for v in inv.violations] == [
        (19.0, A, ()),
        (12.0, B, ("agent_kill9@tb-node-2",)),
    ]


def test_an_uninstall_is_always_a_violation_naming_the_faults_then() -> None:
    activity = Activity()
    fired(activity, "helm_upgrade", None, 5.0, 5.0, 40.0)
    inv = checked(activity)
    inv.uninstalled(20.0, A, "plugin entry removed by the agent")
    (v,) = inv.violations
    assert v.invariant == "uninstall" and v.faults == ("helm_upgrade",)


def test_leftovers_are_violations_each() -> None:
    inv = checked(Activity())
    inv.leftovers(300.0, ["netns cni-1234", "nft table inet istio-x"])
    assert [v.detail for v in inv.violations] == ["netns cni-1234", "nft table inet istio-x"]


def test_a_pod_created_on_a_rebooting_node_is_stuck_only_past_the_bound_after_recovery() -> None:
    # The reboot's pods are recreated by kubelet: a pod created meanwhile waits for the node;
    # the bound counts from the reboot's recovery (agent and Node Ready), not its start.
    activity = Activity()
    fired(activity, "node_reboot", B, 10.0, 40.0, 70.0)
    touching = frozenset(k.name for k in faults.CATALOGUE if k.touches_files)
    inv = Invariants(activity, 30.0, 60.0, touching)
    inv.pod_waiting(99.0, B, "waits-for-the-reboot", created=12.0, running=99.0)
    assert inv.violations == []
    inv.pod_waiting(101.0, B, "still-waiting", created=12.0, running=None)
    (v,) = inv.violations
    assert (v.invariant, v.node, v.at) == ("stuck", B, 100.0)
    # The reboot keeps the node's conflist and plugin: broken files during it are a violation.
    inv.files(20.0, B, working=False, detail="conflist plugins ['ptp']: our entry missing")
    assert inv.violations[-1].invariant == "files"
    assert inv.violations[-1].faults == ("node_reboot@tb-node-2",)


def test_the_last_recovery_before_a_time_counts_the_nodes_faults_and_the_clusters() -> None:
    activity = Activity()
    activity.started("agent_kill9", "n1", 10.0).recovered = 15.0
    activity.started("api_stopped", None, 20.0).recovered = 30.0
    activity.started("agent_kill9", "n2", 40.0).recovered = 45.0
    activity.started("conflist_delete", "n1", 50.0)  # not recovered yet
    assert activity.last_recovery_before("n1", 12.0) is None
    assert activity.last_recovery_before("n1", 25.0) == 15.0
    assert activity.last_recovery_before("n1", 60.0) == 30.0, "n2's fault is not n1's"
    assert activity.last_recovery_before("n2", 60.0) == 45.0
