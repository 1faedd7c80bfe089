"""Start-up reconcile of the mesh dataplane (Istio's ConstructInitialSnapshot), a part of
`agent.ambient.mesh.MeshDataplane`, and the pod record both build (`ambient_pod`).

After a restart the enrolled set is rebuilt from what the node shows: each candidate's netns is
found by its identity; a pod is enrolled when that netns holds our in-pod rules. A candidate
claimed enrolled (annotated `enabled`) whose netns is not found is kept without one: ztunnel
gets KeepWorkload for it, as from Istio (ztunnel deletes, at SnapshotSent, every pod the
snapshot does not name, while the pod's in-pod rules still redirect to it), and it stays
pending, so the watch looks for its netns again. A claim alone captures nothing: KeepWorkload
keeps only what ztunnel already had.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.ambient.dataplane import AmbientPod, HostProbeRules, PodRules
from agent.ambient.enrollment import pod_ips, redirection_state
from agent.rules.ambient.options import PodRuleOptions

log = logging.getLogger(__name__)


class NetnsFinder(Protocol):
    def __call__(self, pods: Sequence[Mapping[str, Any]]) -> Mapping[str, str]:
        """uid -> netns path of each running pod found on the node, by the pod's identity
        (agent.podnetns.finder), never by its IP alone."""
        ...


def meta_of(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def ref_of(pod: Mapping[str, Any]) -> str:
    return f"{meta_of(pod).get('namespace')}/{meta_of(pod).get('name')}"


def ambient_pod(
    pod: Mapping[str, Any], netns_path: str, *, sandbox: str = "", ips: tuple[str, ...] = ()
) -> AmbientPod:
    """The pod's record; `ips` (a CNI result's) instead of its status IPs when given."""
    meta = meta_of(pod)
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    account = (spec or {}).get("serviceAccountName")
    return AmbientPod(
        uid=str(meta.get("uid", "")),
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        # Istio's podToWorkload: pod.Spec.ServiceAccountName as it is ("" when unset; the API
        # server's ServiceAccount admission sets "default"). ztunnel finds the pod's workload
        # and issues its certificate by namespace and service account.
        service_account=account if isinstance(account, str) else "",
        ips=ips or pod_ips(pod),
        netns_path=netns_path,
        sandbox=sandbox,
    )


@dataclass
class ReconcileReport:
    """What start-up reconcile did (for logs and tests)."""

    found: list[str] = field(default_factory=list)
    """uids of pods whose netns was found holding our rules (now in the enrolled set)."""
    missing: list[str] = field(default_factory=list)
    """uids of candidate pods whose netns was not found on the node."""
    not_enrolled: list[str] = field(default_factory=list)
    """uids whose netns holds none of our rules: not enrolled, whatever their annotation says."""
    kept: list[str] = field(default_factory=list)
    """uids of missing pods claimed enrolled: kept for ztunnel (KeepWorkload) and pending."""
    reapplied: list[str] = field(default_factory=list)
    """uids whose rules were not as expected and were written again."""
    failed: list[str] = field(default_factory=list)


class StartupReconcile:
    """MeshDataplane's start-up half; the mesh provides these."""

    _rules: PodRules
    _host: HostProbeRules
    _find_netns: NetnsFinder

    def _put(self, pod: AmbientPod) -> None:
        raise NotImplementedError

    def _set_pending(self, uid: str, pending: bool) -> None:
        raise NotImplementedError

    def _options(self, pod: Mapping[str, Any], *, running: bool) -> PodRuleOptions:
        raise NotImplementedError

    def reconcile(
        self,
        pods: Sequence[Mapping[str, Any]],
        *,
        reapply_rules: bool,
        beat: Callable[[], None] = lambda: None,
    ) -> ReconcileReport:
        """Istio's ConstructInitialSnapshot, from what the node shows: each candidate's netns is
        found by its identity, and a pod is enrolled (in ztunnel's first snapshot, its IPs in the
        host probe set) when that netns holds our in-pod rules; with `reapply_rules`
        (reconcileIptablesOnStartup) rules that differ are written again. Candidates are the pods
        claimed enrolled and those the selectors enroll: a claim alone enrolls nothing.
        `beat` is called before each step (the caller's liveness heartbeat): the host rules, the
        netns scan, each pod, the host probe set."""
        report = ReconcileReport()
        beat()
        self._host.ensure()
        beat()
        found = self._find_netns(pods) if pods else {}
        enrolled: list[Mapping[str, Any]] = []
        for pod in pods:  # each on its own: one pod's failure leaves the others' start-up alone
            beat()
            uid = str(meta_of(pod).get("uid", ""))
            try:
                if self._reconcile_one(pod, found.get(uid), report):
                    enrolled.append(pod)
                    if reapply_rules and uid in found:
                        self._reapply(pod, found[uid], report)
            except Exception as e:
                report.failed.append(uid)
                log.error(
                    "reconcile of pod failed; the other pods go on",
                    exc_info=e,
                    extra={"fields": {"pod": ref_of(pod)}},
                )
        beat()
        self._sync_host(enrolled)
        log.info(
            "ambient reconcile on start-up",
            extra={
                "fields": {
                    "enrolled": len(report.found),
                    "missing": len(report.missing),
                    "kept": len(report.kept),
                    "notEnrolled": len(report.not_enrolled),
                    "reapplied": len(report.reapplied),
                    "failed": len(report.failed),
                }
            },
        )
        return report

    def _reconcile_one(
        self, pod: Mapping[str, Any], netns: str | None, report: ReconcileReport
    ) -> bool:
        """True when the pod is enrolled: its netns, found, holds our rules; or it is claimed
        enrolled and its netns is not found (Istio's snapshot entry without a netns: ztunnel
        gets KeepWorkload, and deletes nothing it had; the watch looks for the netns again). A
        `pending` claim is no claim: no ztunnel acknowledged that pod."""
        uid = str(meta_of(pod).get("uid", ""))
        if netns is None:
            report.missing.append(uid)
            # Only a pod ztunnel acknowledged (`enabled`) is claimed, as Istio's snapshot holds
            # only PodFullyEnrolled pods: a `pending` one was never taken by any ztunnel, so
            # KeepWorkload would name a pod it cannot hold; the watch enrolls it again instead.
            if redirection_state(pod) != "enabled":
                return False
            self._put(ambient_pod(pod, ""))
            self._set_pending(uid, True)
            report.kept.append(uid)
            return True
        if not self._rules_installed(pod, netns):
            report.not_enrolled.append(uid)
            return False
        self._put(ambient_pod(pod, netns))
        report.found.append(uid)
        return True

    def _rules_installed(self, pod: Mapping[str, Any], netns: str) -> bool:
        """Our rules in the pod's netns; when that cannot be read, not enrolled (the watch then
        enrolls the pod again, which captures it: never count an unknown as captured)."""
        try:
            return self._rules.installed(netns)
        except Exception as e:
            log.warning(
                "cannot read the pod's netns; treating it as not enrolled",
                extra={"fields": {"pod": ref_of(pod), "netns": netns, "error": str(e)}},
            )
            return False

    def _sync_host(self, pods: Sequence[Mapping[str, Any]]) -> None:
        with_ips = [(str(meta_of(p).get("uid", "")), pod_ips(p)) for p in pods]
        if all(ips for _, ips in with_ips):
            self._host.sync(with_ips)
            return
        log.warning("an enrolled pod has no IP yet; host probe set not pruned")  # as Istio
        for uid, ips in with_ips:
            if ips:
                self._host.add(uid, ips)

    def _reapply(self, pod: Mapping[str, Any], netns: str, report: ReconcileReport) -> None:
        """The pod stays enrolled whatever happens here: its netns holds our rules."""
        uid = str(meta_of(pod).get("uid", ""))
        try:
            options = self._options(pod, running=True)
            if not self._rules.present(netns, options):
                self._rules.apply(netns, options)
                report.reapplied.append(uid)
        except Exception as e:
            report.failed.append(uid)
            log.error(
                "reconcile of in-pod rules failed; restart the pod or re-label it",
                extra={"fields": {"pod": ref_of(pod), "error": str(e)}},
            )
