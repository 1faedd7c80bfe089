"""The ambient mesh dataplane: enroll a pod (rules in its netns, hand it to ztunnel, annotate it)
and release it, in the order of Istio's node agent (cni/pkg/nodeagent meshdataplane_linux.go and
net_linux.go at the version of our conformance data):

    add:    netns (from the CNI request, else found by the pod's identity) -> in-pod rules
            -> ztunnel add -> host probe IPs -> annotation `enabled`
    remove: host probe IPs -> in-pod rules (only when the pod lives on and its netns exists)
            -> ztunnel del -> annotation removed (a failure ignored when the pod is deleted)

Failures, as Istio treats them:
- no netns, or the rules failed: `NonRetryableAdd`; the pod leaves the enrolled set, no annotation
  (a CNI ADD fails; the watch does not retry).
- ztunnel away or refusing: the rules stay, the pod stays in the set (sent with the next
  snapshot), annotation `pending`, `ZtunnelPending` raised (a CNI ADD fails and the runtime
  retries; the watch retries until enabled).
- host probe set or annotation failed: raised as is, retried by the watch.
- a value of the pod refused (agent.podinput: `ambient.istio.io/bypass-inbound-capture: "yes
  please"`), failing closed by where the pod is. At a CNI ADD (a netns given) the pod is refused,
  `NonRetryableAdd`: it does not start, as the sidecar ADD and `rules --ambient pod --pod` refuse
  it. A running pod (the watch enrolling it, start-up reconcile re-checking it) cannot be kept
  from running, and leaving it out would let its owner take it out of the mesh with a bad value:
  it is captured with the node-wide options, none of its own overrides (inbound captured, DNS as
  the node says, no virtual interfaces), and the refusal logged once per distinct reason.

The enrolled set (uid -> AmbientPod) is what ztunnel gets as its snapshot on each connect, and
the agent's own record of each pod's state (`state`): the pod-writable annotation is written for
others to read, never read back as the truth. After a restart the set is rebuilt from what the
node shows: a pod is enrolled when its netns, found by its identity, holds our in-pod rules.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.ambient.annotator import Annotator, StatusAnnotator
from agent.ambient.dataplane import AmbientPod, HostProbeRules, PodRules, ZtunnelLink
from agent.ambient.enrollment import RedirectionState, annotation_patch, pod_ips
from agent.errors import (
    InvalidPodInputError,
    MeshError,
    NonRetryableAdd,
    ZtunnelError,
    ZtunnelPending,
)
from agent.podinput import pod as podinput
from agent.rules.ambient.options import PodRuleOptions
from agent.rules.ambient.overrides import OptionsFor, rule_options_for

log = logging.getLogger(__name__)

__all__ = [
    "Annotator",
    "MeshDataplane",
    "MeshError",
    "NonRetryableAdd",
    "StatusAnnotator",
    "ZtunnelPending",
    "rule_options_for",
]


class NetnsFinder(Protocol):
    def __call__(self, pods: Sequence[Mapping[str, Any]]) -> Mapping[str, str]:
        """uid -> netns path of each running pod found on the node, by the pod's identity
        (agent.podnetns.finder), never by its IP alone."""
        ...


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _ref(pod: Mapping[str, Any]) -> str:
    return f"{_meta(pod).get('namespace')}/{_meta(pod).get('name')}"


def _without_annotations(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod as its overrides would not be there: the node-wide options apply."""
    return {**pod, "metadata": {**_meta(pod), "annotations": {}}}


def ambient_pod(pod: Mapping[str, Any], netns_path: str) -> AmbientPod:
    meta = _meta(pod)
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    return AmbientPod(
        uid=str(meta.get("uid", "")),
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        service_account=str((spec or {}).get("serviceAccountName") or "default"),
        ips=pod_ips(pod),
        netns_path=netns_path,
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
    reapplied: list[str] = field(default_factory=list)
    """uids whose rules were not as expected and were written again."""
    failed: list[str] = field(default_factory=list)


class MeshDataplane:
    """add / remove / sync_host_probe / reconcile for ambient pods; thread-safe per pod uid."""

    def __init__(
        self,
        *,
        pod_rules: PodRules,
        host_rules: HostProbeRules,
        ztunnel: ZtunnelLink,
        annotator: Annotator,
        find_netns: NetnsFinder,
        options_for: OptionsFor,
    ) -> None:
        self._rules = pod_rules
        self._host = host_rules
        self._ztunnel = ztunnel
        self._annotator = annotator
        self._find_netns = find_netns
        self._options_for = options_for
        self._lock = threading.Lock()
        self._enrolled: dict[str, AmbientPod] = {}
        self._pending: set[str] = set()
        """uids in the enrolled set that ztunnel has not acknowledged (yet)."""
        self._pod_locks: dict[str, threading.Lock] = {}
        self._refusals: dict[str, str] = {}
        """uid -> the refusal of the running pod's values last logged (once per reason)."""
        ztunnel.set_snapshot_source(self.snapshot)

    def _pod_lock(self, uid: str) -> threading.Lock:
        """One operation per pod at a time (the CNI server and the watch may race on a pod)."""
        with self._lock:
            return self._pod_locks.setdefault(uid, threading.Lock())

    # -- the enrolled set --------------------------------------------------------------------

    def snapshot(self) -> list[AmbientPod]:
        """The pods ztunnel must hold: sent on each (re)connect."""
        with self._lock:
            return list(self._enrolled.values())

    def enrolled(self, uid: str) -> AmbientPod | None:
        with self._lock:
            return self._enrolled.get(uid)

    def state(self, uid: str) -> RedirectionState:
        """The pod's state as this agent made and saw it (never its annotation)."""
        with self._lock:
            if uid not in self._enrolled:
                return "none"
            return "pending" if uid in self._pending else "enabled"

    def _put(self, pod: AmbientPod) -> None:
        with self._lock:
            self._enrolled[pod.uid] = pod

    def _take(self, uid: str) -> AmbientPod | None:
        with self._lock:
            self._pending.discard(uid)
            return self._enrolled.pop(uid, None)

    def _set_pending(self, uid: str, pending: bool) -> None:
        with self._lock:
            (self._pending.add if pending else self._pending.discard)(uid)

    # -- add / remove ------------------------------------------------------------------------

    def add(self, pod: Mapping[str, Any], netns_path: str = "") -> AmbientPod:
        """Enroll the pod; `netns_path` from a CNI ADD, empty to find it (a running pod)."""
        with self._pod_lock(str(_meta(pod).get("uid", ""))):
            return self._add(pod, netns_path)

    def remove(self, pod: Mapping[str, Any], *, deleted: bool) -> None:
        """Release the pod; `deleted`: it is gone (or going), so its netns is left alone and a
        failed annotation removal does not matter."""
        uid = str(_meta(pod).get("uid", ""))
        with self._pod_lock(uid):
            self._remove(pod, deleted=deleted)
        if deleted:
            with self._lock:
                self._pod_locks.pop(uid, None)
                self._refusals.pop(uid, None)

    def _add(self, pod: Mapping[str, Any], netns_path: str) -> AmbientPod:
        ref, uid = _ref(pod), str(_meta(pod).get("uid", ""))
        try:  # the pod's own values first: at an ADD a refused one programs nothing
            options = self._options(pod, running=not netns_path)
            podinput.pod_ips(pod)
        except InvalidPodInputError as e:
            self._take(uid)
            raise NonRetryableAdd(f"pod {ref}: {e}") from e
        netns = netns_path or self._known_or_found_netns(pod)
        enrolled = ambient_pod(pod, netns)
        try:
            backend = self._rules.apply(netns, options)
        except Exception as e:
            self._take(uid)
            raise NonRetryableAdd(f"pod {ref}: in-pod rules in {netns}: {e}") from e
        self._put(enrolled)
        self._set_pending(uid, True)
        try:
            self._ztunnel.add(enrolled)
        except ZtunnelError as e:
            log.warning(
                "pod partially added, annotating pending",
                extra={"fields": {"pod": ref, "error": str(e)}},
            )
            self._annotate(pod, "pending")
            raise ZtunnelPending(f"pod {ref}: ztunnel did not take the pod: {e}") from e
        self._set_pending(uid, False)
        try:
            self._host.add(uid, enrolled.ips)
        except Exception as e:
            raise MeshError(f"pod {ref}: host probe address set: {e}") from e
        self._annotate(pod, "enabled")
        log.info("pod enrolled", extra={"fields": {"pod": ref, "netns": netns, "backend": backend}})
        return enrolled

    def _remove(self, pod: Mapping[str, Any], *, deleted: bool) -> None:
        ref, uid = _ref(pod), str(_meta(pod).get("uid", ""))
        try:
            self._host.remove(uid, pod_ips(pod))
        except Exception as e:
            raise MeshError(f"pod {ref}: remove from host probe address set: {e}") from e
        known = self._take(uid)
        if not deleted:
            if known is not None and os.path.exists(known.netns_path):
                try:
                    self._rules.remove(known.netns_path)
                except Exception as e:
                    self._put(known)  # kept, so the retry finds the netns again
                    raise MeshError(
                        f"pod {ref}: remove in-pod rules in {known.netns_path}: {e}"
                    ) from e
            else:
                log.warning(
                    "pod netns already gone, not deleting in-pod rules",
                    extra={"fields": {"pod": ref}},
                )
        try:
            self._ztunnel.remove(uid)
        except ZtunnelError as e:
            raise MeshError(f"pod {ref}: remove from ztunnel: {e}") from e
        try:
            self._annotate(pod, "none")
        except MeshError:
            if not deleted:
                raise
        log.info("pod released", extra={"fields": {"pod": ref, "deleted": deleted}})

    def sync_host_probe(self, pod: Mapping[str, Any]) -> None:
        """An enrolled pod's IPs changed: add them to the host probe set."""
        uid = str(_meta(pod).get("uid", ""))
        self._host.add(uid, pod_ips(pod))

    # -- start-up ----------------------------------------------------------------------------

    def reconcile(
        self, pods: Sequence[Mapping[str, Any]], *, reapply_rules: bool
    ) -> ReconcileReport:
        """Istio's ConstructInitialSnapshot, from what the node shows: each candidate's netns is
        found by its identity, and a pod is enrolled (in ztunnel's first snapshot, its IPs in the
        host probe set) when that netns holds our in-pod rules; with `reapply_rules`
        (reconcileIptablesOnStartup) rules that differ are written again. Candidates are the pods
        claimed enrolled and those the selectors enroll: a claim alone enrolls nothing."""
        report = ReconcileReport()
        self._host.ensure()
        found = self._find_netns(pods) if pods else {}
        enrolled: list[Mapping[str, Any]] = []
        for pod in pods:  # each on its own: one pod's failure leaves the others' start-up alone
            uid = str(_meta(pod).get("uid", ""))
            try:
                if self._reconcile_one(pod, found.get(uid), report):
                    enrolled.append(pod)
                    if reapply_rules:
                        self._reapply(pod, str(found.get(uid)), report)
            except Exception as e:
                report.failed.append(uid)
                log.error(
                    "reconcile of pod failed; the other pods go on",
                    exc_info=e,
                    extra={"fields": {"pod": _ref(pod)}},
                )
        self._sync_host(enrolled)
        log.info(
            "ambient reconcile on start-up",
            extra={
                "fields": {
                    "enrolled": len(report.found),
                    "missing": len(report.missing),
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
        """True when the pod is enrolled: its netns, found, holds our rules."""
        uid = str(_meta(pod).get("uid", ""))
        if netns is None:
            report.missing.append(uid)
            return False
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
                extra={"fields": {"pod": _ref(pod), "netns": netns, "error": str(e)}},
            )
            return False

    def _sync_host(self, pods: Sequence[Mapping[str, Any]]) -> None:
        with_ips = [(str(_meta(p).get("uid", "")), pod_ips(p)) for p in pods]
        if all(ips for _, ips in with_ips):
            self._host.sync(with_ips)
            return
        log.warning("an enrolled pod has no IP yet; host probe set not pruned")  # as Istio
        for uid, ips in with_ips:
            if ips:
                self._host.add(uid, ips)

    def _reapply(self, pod: Mapping[str, Any], netns: str, report: ReconcileReport) -> None:
        """The pod stays enrolled whatever happens here: its netns holds our rules."""
        uid = str(_meta(pod).get("uid", ""))
        try:
            options = self._options(pod, running=True)
            if not self._rules.present(netns, options):
                self._rules.apply(netns, options)
                report.reapplied.append(uid)
        except Exception as e:
            report.failed.append(uid)
            log.error(
                "reconcile of in-pod rules failed; restart the pod or re-label it",
                extra={"fields": {"pod": _ref(pod), "error": str(e)}},
            )

    def remove_host_rules(self) -> None:
        """Uninstall (Istio's Stop without skipCleanup): node-side rules and sets go."""
        self._host.remove_all()

    # -- helpers -----------------------------------------------------------------------------

    def _options(self, pod: Mapping[str, Any], *, running: bool) -> PodRuleOptions:
        """The pod's rule options. A refused value raises InvalidPodInputError unless the pod is
        `running`: then it is captured with the node-wide options (see the module docstring)."""
        try:
            return self._options_for(pod)
        except InvalidPodInputError as e:
            if not running:
                raise
            uid = str(_meta(pod).get("uid", ""))
            with self._lock:
                reported, self._refusals[uid] = self._refusals.get(uid), str(e)
            if reported != str(e):
                log.warning(
                    "a value of the running pod is refused; it is captured with the node-wide "
                    "options, none of its own",
                    extra={"fields": {"pod": _ref(pod), "error": str(e)}},
                )
            return self._options_for(_without_annotations(pod))

    def _known_or_found_netns(self, pod: Mapping[str, Any]) -> str:
        uid = str(_meta(pod).get("uid", ""))
        known = self.enrolled(uid)
        if known is not None and os.path.exists(known.netns_path):
            return known.netns_path
        found = self._find_netns([pod]).get(uid)
        if found is None:
            raise NonRetryableAdd(
                f"pod {_ref(pod)}: cannot find its network namespace on the node "
                f"(IPs {', '.join(pod_ips(pod)) or 'none'})"
            )
        return found

    def _annotate(self, pod: Mapping[str, Any], state: str) -> None:
        meta = _meta(pod)
        patch = annotation_patch(
            "enabled" if state == "enabled" else "pending" if state == "pending" else "none"
        )
        try:
            self._annotator.patch(str(meta.get("namespace")), str(meta.get("name")), patch)
        except MeshError:
            raise
        except Exception as e:
            raise MeshError(f"annotate pod {_ref(pod)} ({state}): {e}") from e
