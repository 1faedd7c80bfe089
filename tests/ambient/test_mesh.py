"""MeshDataplane with named fakes of its parts: the order of Istio's node agent, rollback on each
failure, the enrolled set as ztunnel's snapshot, and start-up reconcile."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agent.ambient.mesh import (
    MeshDataplane,
    MeshError,
    NonRetryableAdd,
    ZtunnelPending,
    rule_options_for,
)
from agent.podinput.tokens import InterfaceName
from agent.rules.ambient.options import PodRuleOptions
from tests.ambient.fakes import (
    FakeAnnotator,
    FakeHostProbeRules,
    FakeNetnsFinder,
    FakePodRules,
    FakeZtunnelLink,
    Journal,
    pod,
)


class Parts:
    def __init__(self, tmp_path: Path) -> None:
        self.journal: Journal = []
        self.rules = FakePodRules(self.journal)
        self.host = FakeHostProbeRules(self.journal)
        self.ztunnel = FakeZtunnelLink(self.journal)
        self.annotator = FakeAnnotator(self.journal)
        self.finder = FakeNetnsFinder(self.journal)
        self.netns = tmp_path / "netns-1"
        self.netns.touch()
        self.mesh = MeshDataplane(
            pod_rules=self.rules,
            host_rules=self.host,
            ztunnel=self.ztunnel,
            annotator=self.annotator,
            find_netns=self.finder,
            options_for=rule_options_for(PodRuleOptions()),
        )


@pytest.fixture
def parts(tmp_path: Path) -> Parts:
    return Parts(tmp_path)


def test_add_runs_in_istios_order_and_enrolls(parts: Parts) -> None:
    parts.mesh.add(pod(), str(parts.netns))
    assert parts.journal == [
        ("rules.apply", str(parts.netns)),
        ("ztunnel.add", "uid-1"),
        ("host.add", "uid-1", "10.0.0.5"),
        ("annotate", "app/web-0", "enabled"),
    ]
    assert [p.uid for p in parts.mesh.snapshot()] == ["uid-1"]
    assert parts.ztunnel.workloads["uid-1"].service_account == "web"


def test_rules_failure_is_not_retryable_and_leaves_nothing(parts: Parts) -> None:
    parts.rules.fail_apply = True
    with pytest.raises(NonRetryableAdd, match=r"app/web-0: in-pod rules"):
        parts.mesh.add(pod(), str(parts.netns))
    assert parts.mesh.snapshot() == []
    assert ("ztunnel.add", "uid-1") not in parts.journal
    assert parts.annotator.values == {} and parts.host.entries == {}


def test_a_failed_re_enrolment_keeps_the_pod_enrolled_as_before(parts: Parts) -> None:
    """ztunnel still serves the pod and its former rules are in place: dropping the record
    would leave it out of the next snapshot (ztunnel lets it go, its rules point nowhere)
    while its annotation still says enabled."""
    parts.mesh.add(pod(), str(parts.netns))
    parts.rules.fail_apply = True
    with pytest.raises(NonRetryableAdd, match=r"app/web-0: in-pod rules"):
        parts.mesh.add(pod())  # enrolled again while running (the watch, a changed value)
    assert parts.mesh.enrolled("uid-1") is not None
    assert parts.mesh.state("uid-1") == "enabled"
    assert [p.uid for p in parts.ztunnel.reconnect()] == ["uid-1"]
    with pytest.raises(NonRetryableAdd, match="app/web-0"):
        parts.mesh.add(pod(ips=("10.0.0.5", "not-an-address")))  # a refused value
    assert [p.uid for p in parts.ztunnel.reconnect()] == ["uid-1"]


def test_a_watch_add_leaves_a_pod_a_cni_add_enrolled_meanwhile(parts: Parts) -> None:
    """The watch read `none`, then the pod's CNI ADD enrolled it before the watch's add took
    the pod's lock: ztunnel gets one AddWorkload, not two."""
    parts.mesh.add(pod(), str(parts.netns))
    assert parts.mesh.add(pod(), unless_enabled=True) is None
    assert [c for c in parts.journal if c[0] in ("ztunnel.add", "rules.apply")] == [
        ("rules.apply", str(parts.netns)),
        ("ztunnel.add", "uid-1"),
    ]


def test_ztunnel_away_is_a_partial_add(parts: Parts) -> None:
    parts.ztunnel.connected = False
    with pytest.raises(ZtunnelPending, match="no ztunnel connection"):
        parts.mesh.add(pod(), str(parts.netns))
    # Rules stay, pod kept for the snapshot, annotation pending, host probe IPs not yet.
    assert str(parts.netns) in parts.rules.programmed
    assert parts.annotator.values == {"app/web-0": "pending"}
    assert parts.host.entries == {}
    assert [p.uid for p in parts.ztunnel.reconnect()] == ["uid-1"]


def test_ztunnel_refusal_is_pending_too(parts: Parts) -> None:
    parts.ztunnel.refuse = True
    with pytest.raises(ZtunnelPending, match="netns gone"):
        parts.mesh.add(pod(), str(parts.netns))
    assert parts.annotator.values == {"app/web-0": "pending"}


def test_host_probe_failure_raises_without_annotation(parts: Parts) -> None:
    parts.host.fail_add = True
    with pytest.raises(MeshError, match="host probe address set"):
        parts.mesh.add(pod(), str(parts.netns))
    assert parts.annotator.values == {}


def test_add_of_running_pod_finds_its_netns(parts: Parts) -> None:
    parts.finder.by_uid["uid-1"] = str(parts.netns)
    parts.mesh.add(pod())
    assert parts.journal[0] == ("find_netns", "uid-1")
    assert parts.mesh.enrolled("uid-1") is not None


def test_add_of_running_pod_without_netns_is_not_retryable(parts: Parts) -> None:
    with pytest.raises(NonRetryableAdd, match=r"cannot find its network namespace.*10\.0\.0\.5"):
        parts.mesh.add(pod())
    assert parts.journal == [("find_netns", "uid-1")]


def test_remove_of_live_pod_runs_in_istios_order(parts: Parts) -> None:
    parts.mesh.add(pod(), str(parts.netns))
    parts.journal.clear()
    parts.mesh.remove(pod(), deleted=False)
    assert parts.journal == [
        ("host.remove", "uid-1"),
        ("rules.remove", str(parts.netns)),
        ("ztunnel.remove", "uid-1"),
        ("annotate", "app/web-0", "None"),
    ]
    assert parts.mesh.snapshot() == [] and parts.rules.programmed == {}


def test_remove_of_deleted_pod_leaves_netns_and_ignores_annotation(parts: Parts) -> None:
    parts.mesh.add(pod(), str(parts.netns))
    parts.journal.clear()
    parts.annotator.fail = True
    parts.mesh.remove(pod(), deleted=True)
    assert ("rules.remove", str(parts.netns)) not in parts.journal
    assert ("ztunnel.remove", "uid-1") in parts.journal


def test_remove_when_netns_is_gone_skips_rules(parts: Parts) -> None:
    parts.mesh.add(pod(), str(parts.netns))
    parts.netns.unlink()
    parts.journal.clear()
    parts.mesh.remove(pod(), deleted=False)
    assert not any(step[0] == "rules.remove" for step in parts.journal)


def test_failed_rule_removal_keeps_the_pod_for_the_retry(parts: Parts) -> None:
    parts.mesh.add(pod(), str(parts.netns))
    parts.rules.fail_remove = True
    with pytest.raises(MeshError, match="remove in-pod rules"):
        parts.mesh.remove(pod(), deleted=False)
    assert parts.mesh.enrolled("uid-1") is not None
    parts.rules.fail_remove = False
    parts.mesh.remove(pod(), deleted=False)
    assert parts.mesh.enrolled("uid-1") is None


def test_annotation_failure_of_live_pod_raises(parts: Parts) -> None:
    parts.mesh.add(pod(), str(parts.netns))
    parts.annotator.fail = True
    with pytest.raises(MeshError, match="annotate pod app/web-0"):
        parts.mesh.remove(pod(), deleted=False)


def test_reconcile_keeps_good_rules_and_reapplies_those_that_differ(
    parts: Parts, tmp_path: Path
) -> None:
    other, bare = tmp_path / "netns-2", tmp_path / "netns-3"
    other.touch()
    bare.touch()
    parts.rules.programmed[str(parts.netns)] = PodRuleOptions()  # as a previous run left it
    parts.rules.programmed[str(other)] = PodRuleOptions(ingress=True)  # an older rendering
    parts.finder.by_uid = {"uid-1": str(parts.netns), "uid-2": str(other), "uid-4": str(bare)}
    pods = [
        pod(),
        pod("web-1", uid="uid-2", ips=("10.0.0.6",)),
        pod("web-2", uid="uid-3", ips=("10.0.0.7",)),
        pod("web-3", uid="uid-4", ips=("10.0.0.8",)),
    ]
    report = parts.mesh.reconcile(pods, reapply_rules=True)
    assert report.found == ["uid-1", "uid-2"] and report.missing == ["uid-3"]
    assert report.not_enrolled == ["uid-4"]  # a netns without our rules: not enrolled
    assert report.reapplied == ["uid-2"]
    assert ("rules.apply", str(parts.netns)) not in parts.journal  # no duplicate writes
    assert set(parts.host.entries) == {"uid-1", "uid-2"}
    assert {p.uid for p in parts.mesh.snapshot()} == {"uid-1", "uid-2"}
    assert [parts.mesh.state(u) for u in ("uid-1", "uid-3", "uid-4")] == [
        "enabled",
        "none",
        "none",
    ]


@pytest.mark.hostile
def test_reconcile_enrolls_no_pod_on_its_annotation_alone(parts: Parts) -> None:
    """A pod claiming `enabled` whose netns holds none of our rules is not in ztunnel's
    snapshot nor in the probe set: the watch captures it as any pod not yet enrolled."""
    claimed = pod(annotations={"ambient.istio.io/redirection": "enabled"})
    parts.finder.by_uid = {"uid-1": str(parts.netns)}
    report = parts.mesh.reconcile([claimed], reapply_rules=True)
    assert report.found == [] and report.not_enrolled == ["uid-1"]
    assert parts.mesh.snapshot() == [] and parts.mesh.state("uid-1") == "none"
    assert parts.host.entries == {}


def test_reconcile_without_reapply_only_finds(parts: Parts) -> None:
    parts.finder.by_uid = {"uid-1": str(parts.netns)}
    parts.rules.programmed[str(parts.netns)] = PodRuleOptions(ingress=True)
    report = parts.mesh.reconcile([pod()], reapply_rules=False)
    assert report.found == ["uid-1"]
    assert [s for s in parts.journal if s[0].startswith("rules.")] == [
        ("rules.installed", str(parts.netns))
    ]


def test_reconcile_does_not_prune_while_an_ip_is_unknown(parts: Parts, tmp_path: Path) -> None:
    parts.host.entries = {"stale": {"10.9.9.9"}}
    parts.finder.by_uid = {"uid-1": str(parts.netns)}
    parts.rules.programmed[str(parts.netns)] = PodRuleOptions()
    parts.mesh.reconcile([pod(ips=())], reapply_rules=False)
    assert "stale" in parts.host.entries
    parts.mesh.reconcile([pod()], reapply_rules=False)
    assert set(parts.host.entries) == {"uid-1"}


def test_state_follows_the_ztunnel_answer(parts: Parts) -> None:
    parts.ztunnel.connected = False
    with pytest.raises(ZtunnelPending):
        parts.mesh.add(pod(), str(parts.netns))
    assert parts.mesh.state("uid-1") == "pending"
    parts.ztunnel.connected = True
    parts.mesh.add(pod(), str(parts.netns))
    assert parts.mesh.state("uid-1") == "enabled"
    parts.mesh.remove(pod(), deleted=True)
    assert parts.mesh.state("uid-1") == "none"


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({}, PodRuleOptions()),
        ({"ambient.istio.io/dns-capture": "false"}, PodRuleOptions(dns_proxy="disabled")),
        ({"ambient.istio.io/dns-capture": "T"}, PodRuleOptions(dns_proxy="enabled")),
        ({"ambient.istio.io/dns-capture": "yes"}, PodRuleOptions()),
        ({"ambient.istio.io/bypass-inbound-capture": "true"}, PodRuleOptions(ingress=True)),
        (
            {"istio.io/reroute-virtual-interfaces": " tun0, ,ppp0"},
            PodRuleOptions(virtual_interfaces=(InterfaceName("tun0"), InterfaceName("ppp0"))),
        ),
    ],
    ids=["none", "dns-off", "dns-on-go-bool", "dns-invalid-ignored", "ingress", "virt"],
)
def test_pod_level_overrides(annotations: dict[str, str], expected: PodRuleOptions) -> None:
    assert rule_options_for(PodRuleOptions())(pod(annotations=annotations)) == expected


REFUSED = {"ambient.istio.io/bypass-inbound-capture": "yes please"}


def test_reconcile_goes_on_past_a_pod_whose_value_is_refused(parts: Parts, tmp_path: Path) -> None:
    """An enrolled pod whose owner set a refused value after it started stays enrolled (fail
    closed: captured with the node-wide options), and the pods after it are reconciled too."""
    second = tmp_path / "netns-2"
    second.touch()
    parts.rules.programmed[str(parts.netns)] = PodRuleOptions(ingress=True)  # value was "true"
    parts.rules.programmed[str(second)] = PodRuleOptions()
    parts.finder.by_uid = {"uid-1": str(parts.netns), "uid-2": str(second)}
    pods = [pod(annotations=REFUSED), pod("web-1", uid="uid-2", ips=("10.0.0.6",))]
    report = parts.mesh.reconcile(pods, reapply_rules=True)
    assert report.found == ["uid-1", "uid-2"] and report.failed == []
    assert {p.uid for p in parts.mesh.snapshot()} == {"uid-1", "uid-2"}
    assert set(parts.host.entries) == {"uid-1", "uid-2"}  # the probe set synced
    assert report.reapplied == ["uid-1"]
    assert parts.rules.programmed[str(parts.netns)] == PodRuleOptions()  # inbound captured


def test_reconcile_isolates_a_pod_that_fails_unexpectedly(parts: Parts, tmp_path: Path) -> None:
    second = tmp_path / "netns-2"
    second.touch()
    parts.rules.programmed[str(parts.netns)] = PodRuleOptions()
    parts.rules.programmed[str(second)] = PodRuleOptions()
    parts.finder.by_uid = {"uid-1": str(parts.netns), "uid-2": str(second)}
    malformed = pod()
    malformed["status"]["podIPs"] = 5  # not a list: reading its IPs raises
    report = parts.mesh.reconcile([malformed, pod("web-1", uid="uid-2")], reapply_rules=True)
    assert report.failed == ["uid-1"] and report.found == ["uid-2"]
    assert set(parts.host.entries) == {"uid-2"}


def test_a_running_pod_with_a_refused_value_is_captured_with_the_node_wide_options(
    parts: Parts, caplog: pytest.LogCaptureFixture
) -> None:
    """The watch enrolling a running pod: refusing it would leave it uncaptured, so it is
    captured, none of its own overrides applied; the refusal is logged once per reason."""
    parts.finder.by_uid["uid-1"] = str(parts.netns)
    refused = pod(annotations={**REFUSED, "ambient.istio.io/dns-capture": "false"})
    with caplog.at_level(logging.WARNING, logger="agent.ambient"):
        for _ in range(3):
            parts.mesh.add(refused)
    assert parts.mesh.state("uid-1") == "enabled"
    assert parts.rules.programmed[str(parts.netns)] == PodRuleOptions()
    [warning] = [r for r in caplog.records if "refused" in r.getMessage()]
    assert "yes please" in str(warning.__dict__.get("fields"))


def test_a_cni_add_with_a_refused_value_is_refused(parts: Parts) -> None:
    """A pod that is starting is refused instead: it does not start (the runtime retries)."""
    with pytest.raises(NonRetryableAdd, match=r"bypass-inbound-capture.*yes please"):
        parts.mesh.add(pod(annotations=REFUSED), str(parts.netns))
    assert parts.rules.programmed == {} and parts.mesh.snapshot() == []


# -- what ztunnel is told: the pod's own identity ------------------------------------------------


def test_ztunnel_gets_the_pods_own_service_account(parts: Parts) -> None:
    """ztunnel finds the pod's workload and issues its certificate by namespace and service
    account: Istio's podToWorkload sends spec.serviceAccountName, never a default of its own."""
    mine = pod()
    mine["spec"]["serviceAccountName"] = "payments"
    parts.mesh.add(mine, str(parts.netns))
    assert parts.ztunnel.workloads["uid-1"].service_account == "payments"


def test_a_pod_without_service_account_is_sent_as_istio_sends_it(parts: Parts) -> None:
    """Without spec.serviceAccountName (no ServiceAccount admission) Istio sends "", not the
    name of an account the pod does not run as."""
    bare = pod()
    del bare["spec"]["serviceAccountName"]
    parts.mesh.add(bare, str(parts.netns))
    assert parts.ztunnel.workloads["uid-1"].service_account == ""


# -- each step after ztunnel retried until done ---------------------------------------------------


def test_a_failed_enabled_annotation_leaves_the_pod_pending_and_is_retried(parts: Parts) -> None:
    """Istio writes `enabled` last: until it is written, the pod is not done and the watch's
    retry writes it (without sending the pod to ztunnel again)."""
    parts.annotator.fail_times = 1
    parts.finder.by_uid["uid-1"] = str(parts.netns)
    with pytest.raises(MeshError, match="annotate pod app/web-0"):
        parts.mesh.add(pod())  # a running pod (the watch)
    assert parts.mesh.state("uid-1") == "pending"
    parts.journal.clear()
    parts.mesh.add(pod())
    assert parts.mesh.state("uid-1") == "enabled"
    assert parts.annotator.values == {"app/web-0": "enabled"}
    assert ("ztunnel.add", "uid-1") not in parts.journal


def test_a_failed_host_probe_add_leaves_the_pod_pending_and_is_retried(parts: Parts) -> None:
    parts.host.fail_add_times = 1
    with pytest.raises(MeshError, match="host probe address set"):
        parts.mesh.add(pod(), str(parts.netns))
    assert parts.mesh.state("uid-1") == "pending"
    assert parts.annotator.values == {}
    parts.mesh.add(pod())
    assert parts.host.entries == {"uid-1": {"10.0.0.5"}}
    assert parts.annotator.values == {"app/web-0": "enabled"}
    assert parts.mesh.state("uid-1") == "enabled"


def test_annotate_as_recorded_writes_the_agents_state(parts: Parts) -> None:
    parts.mesh.annotate_as_recorded(pod())
    assert parts.annotator.values == {"app/web-0": None}
    parts.mesh.add(pod(), str(parts.netns))
    parts.annotator.values.clear()
    parts.mesh.annotate_as_recorded(pod())
    assert parts.annotator.values == {"app/web-0": "enabled"}


# -- start-up: a pod enrolled before the restart whose netns is not found -------------------------


def test_reconcile_keeps_a_claimed_pod_whose_netns_is_not_found(parts: Parts) -> None:
    """Istio's snapshot entry without a netns: ztunnel gets KeepWorkload (our ZDS server sends
    it for a pod without a netns path) and deletes nothing at SnapshotSent; the pod's IPs stay
    in the probe set; it is pending, so the watch looks for its netns again, retryably."""
    claimed = pod(annotations={"ambient.istio.io/redirection": "enabled"})
    report = parts.mesh.reconcile([claimed], reapply_rules=True)
    assert report.missing == ["uid-1"] and report.kept == ["uid-1"]
    [kept] = parts.mesh.snapshot()
    assert kept.uid == "uid-1" and kept.netns_path == ""
    assert parts.host.entries == {"uid-1": {"10.0.0.5"}}
    assert parts.mesh.state("uid-1") == "pending"
    with pytest.raises(MeshError, match="cannot find its network namespace") as raised:
        parts.mesh.add(claimed)
    assert not isinstance(raised.value, NonRetryableAdd)  # the watch retries it
    assert [p.uid for p in parts.mesh.snapshot()] == ["uid-1"]
    parts.finder.by_uid["uid-1"] = str(parts.netns)
    parts.mesh.add(claimed)
    assert parts.ztunnel.workloads["uid-1"].netns_path == str(parts.netns)
    assert parts.mesh.state("uid-1") == "enabled"


def test_reconcile_keeps_no_pending_pod_whose_netns_is_not_found(parts: Parts) -> None:
    """`pending`: the rules went in but no ztunnel acknowledged the pod, so none holds it and
    Istio's snapshot (PodFullyEnrolled) leaves it out; the watch's add enrolls it once its netns
    is found."""
    pending = pod(annotations={"ambient.istio.io/redirection": "pending"})
    report = parts.mesh.reconcile([pending], reapply_rules=True)
    assert report.missing == ["uid-1"] and report.kept == []
    assert parts.mesh.snapshot() == []
    assert parts.host.entries == {}
    parts.finder.by_uid["uid-1"] = str(parts.netns)
    parts.mesh.add(pending)
    assert parts.ztunnel.workloads["uid-1"].netns_path == str(parts.netns)
    assert parts.mesh.state("uid-1") == "enabled"


def test_reconcile_keeps_no_unclaimed_pod_whose_netns_is_not_found(parts: Parts) -> None:
    report = parts.mesh.reconcile([pod()], reapply_rules=True)
    assert report.missing == ["uid-1"] and report.kept == []
    assert parts.mesh.snapshot() == []


# -- a CNI ADD's sandbox and IPs -------------------------------------------------------------------


def test_a_stale_sandboxs_release_leaves_the_pod_enrolled(parts: Parts, tmp_path: Path) -> None:
    new = tmp_path / "netns-new"
    new.touch()
    parts.mesh.add(pod(), str(parts.netns), sandbox="old")
    parts.mesh.add(pod(ips=("10.0.0.6",)), str(new), sandbox="new")
    parts.mesh.remove(pod(), deleted=True, sandbox="old")
    assert parts.mesh.state("uid-1") == "enabled"
    assert "uid-1" in parts.ztunnel.workloads
    parts.mesh.remove(pod(ips=("10.0.0.6",)), deleted=True, sandbox="new")
    assert parts.mesh.state("uid-1") == "none" and "uid-1" not in parts.ztunnel.workloads


def test_a_new_sandboxs_ips_replace_the_old_ones_in_the_probe_set(
    parts: Parts, tmp_path: Path
) -> None:
    new = tmp_path / "netns-new"
    new.touch()
    parts.mesh.add(pod(), str(parts.netns), sandbox="old")
    parts.mesh.add(pod(ips=("10.0.0.6",)), str(new), sandbox="new")
    assert parts.host.entries == {"uid-1": {"10.0.0.6"}}


class Clock:
    def __init__(self) -> None:
        self.now = 200.0

    def __call__(self) -> float:
        return self.now


def enrollment(source: str) -> tuple[float, float]:
    """(count, sum) of istio_cni_ambient_enrollment_duration_seconds{source} so far."""
    from prometheus_client import REGISTRY

    labels = {"source": source}
    name = "istio_cni_ambient_enrollment_duration_seconds"
    count = REGISTRY.get_sample_value(f"{name}_count", labels) or 0.0
    return count, REGISTRY.get_sample_value(f"{name}_sum", labels) or 0.0


def timed_parts(tmp_path: Path, clock: Clock) -> Parts:
    parts = Parts(tmp_path)
    parts.mesh = MeshDataplane(
        pod_rules=parts.rules,
        host_rules=parts.host,
        ztunnel=parts.ztunnel,
        annotator=parts.annotator,
        find_netns=parts.finder,
        options_for=rule_options_for(PodRuleOptions()),
        clock=clock,
    )
    return parts


def test_enrollment_is_timed_from_the_first_add_to_ztunnels_acknowledgement(
    tmp_path: Path,
) -> None:
    """ztunnel away at the first ADD: the runtime's retries are in the duration."""
    clock = Clock()
    parts = timed_parts(tmp_path, clock)
    before = enrollment("cni")
    parts.ztunnel.connected = False
    with pytest.raises(ZtunnelPending):
        parts.mesh.add(pod(), str(parts.netns))
    clock.now += 3.5
    parts.ztunnel.connected = True
    parts.mesh.add(pod(), str(parts.netns))
    count, total = enrollment("cni")
    assert count - before[0] == 1
    assert total - before[1] == pytest.approx(3.5)
    clock.now += 10
    parts.mesh.add(pod())  # a watch's re-enrollment of the same pod is timed on its own
    assert enrollment("cni")[0] == count
    assert enrollment("watch")[0] >= 1


def test_a_failed_enrollment_leaves_no_timer_behind(tmp_path: Path) -> None:
    clock = Clock()
    parts = timed_parts(tmp_path, clock)
    before = enrollment("cni")
    parts.rules.fail_apply = True
    with pytest.raises(NonRetryableAdd):
        parts.mesh.add(pod(), str(parts.netns))
    assert parts.mesh._first_try == {}
    parts.ztunnel.connected = False
    parts.rules.fail_apply = False
    with pytest.raises(ZtunnelPending):
        parts.mesh.add(pod(), str(parts.netns))
    parts.mesh.remove(pod(), deleted=True)  # gone while pending: never acknowledged
    assert parts.mesh._first_try == {}
    assert enrollment("cni") == before
