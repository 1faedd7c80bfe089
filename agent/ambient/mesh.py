"""The ambient mesh dataplane: enroll a pod (rules in its netns, hand it to ztunnel, annotate it)
and release it, in the order of Istio's node agent (cni/pkg/nodeagent meshdataplane_linux.go and
net_linux.go at the version of our conformance data):

    add:    netns (from the CNI request, else found by the pod's identity) -> in-pod rules
            -> ztunnel add -> host probe IPs -> annotation `enabled` (last: once it is written,
            istiod treats the pod as captured)
    remove: host probe IPs -> in-pod rules (only when the pod lives on and its netns exists)
            -> ztunnel del -> annotation removed (a failure ignored when the pod is deleted)

Failures, as Istio treats them:
- no netns, or the rules failed: `NonRetryableAdd` (a CNI ADD fails; the watch does not retry);
  a pod not enrolled stays out, one enrolled before stays as it was (a rule write is atomic).
- ztunnel away or refusing: the rules stay, the pod stays in the set (sent with the next
  snapshot), annotation `pending`, `ZtunnelPending` raised (a CNI ADD fails and the runtime
  retries; the watch retries until enabled).
- host probe set or annotation failed: raised as is; the pod stays `pending` until both are
  done, so the watch's retry does what is left (ztunnel, which has the pod, is not asked again).
- a value of the pod refused (agent.podinput: `ambient.istio.io/bypass-inbound-capture: "yes
  please"`), failing closed by where the pod is. At a CNI ADD (a netns given) the pod is refused,
  `NonRetryableAdd`: it does not start, as the sidecar ADD and `rules --ambient pod --pod` refuse
  it. A running pod (the watch enrolling it, start-up reconcile re-checking it) cannot be kept
  from running, and leaving it out would let its owner take it out of the mesh with a bad value:
  it is captured with the node-wide options, none of its own overrides (inbound captured, DNS as
  the node says, no virtual interfaces), and the refusal logged once per distinct reason.

The enrolled set (uid -> AmbientPod) is ztunnel's snapshot on each connect and the agent's own
record of each pod's state: the pod-writable annotation is never read back as the truth. After
a restart the set is rebuilt from what the node shows: a pod is enrolled when its netns, found
by its identity, holds our in-pod rules; a pod claimed enrolled whose netns is not found stays
in the set without one (ztunnel gets KeepWorkload for it, as from Istio, and keeps what it had)
and `pending`, so the watch looks for its netns again. The watch makes the annotation match.

At a CNI ADD the pod's IPs are those of the CNI chain's result (Istio: prevResult), not its
status, which still holds the old sandbox's IP when a sandbox is re-created; the sandbox is
recorded, and only its DEL releases the pod (a stale sandbox's DEL after the new one's ADD
leaves the pod enrolled).

One DelWorkload per removal, as Istio sends one at a pod's delete event or terminal phase: a
deleted pod's last sandbox DEL and delete event, in either order, send one between them. Any
other delete event sends one, enrolled or not: ztunnel may hold a pod this agent does not know.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from agent import metrics
from agent.ambient.annotator import Annotator, StatusAnnotator
from agent.ambient.dataplane import AmbientPod, HostProbeRules, PodRules, ZtunnelLink
from agent.ambient.enrollment import RedirectionState, annotation_patch, is_terminated, pod_ips
from agent.ambient.pod_locks import PodLocks
from agent.ambient.reconcile import (
    NetnsFinder,
    ReconcileReport,
    StartupReconcile,
    ambient_pod,
)
from agent.ambient.reconcile import meta_of as _meta
from agent.ambient.reconcile import ref_of as _ref
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
    "NetnsFinder",
    "NonRetryableAdd",
    "ReconcileReport",
    "StatusAnnotator",
    "ZtunnelPending",
    "ambient_pod",
    "rule_options_for",
]


def _without_annotations(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod as its overrides would not be there: the node-wide options apply."""
    return {**pod, "metadata": {**_meta(pod), "annotations": {}}}


class MeshDataplane(StartupReconcile):
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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock` times enrollments (istio_cni_ambient_enrollment_duration_seconds)."""
        self._clock = clock
        self._first_try: dict[str, tuple[float, str]] = {}
        """uid -> (when its enrollment was first tried, by `cni` or `watch`), until ztunnel
        acknowledges it or it leaves the enrolled set: retries are in the duration."""
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
        self._unfinished: set[str] = set()
        """uids ztunnel took whose host probe IPs or `enabled` annotation are not done yet."""
        self._pod_locks = PodLocks()
        self._refusals: dict[str, str] = {}
        """uid -> the refusal of the running pod's values last logged (once per reason)."""
        self._released_by_del: set[str] = set()
        """uids a sandbox's DEL released (DelWorkload sent), not enrolled since: the pod's delete
        event sends no second one. Emptied by the delete event (forget) or a new enrollment."""
        ztunnel.set_snapshot_source(self.snapshot)

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
            unfinished = uid in self._pending or uid in self._unfinished
            return "pending" if unfinished else "enabled"

    def _put(self, pod: AmbientPod) -> None:
        with self._lock:
            self._enrolled[pod.uid] = pod
            self._released_by_del.discard(pod.uid)

    def _take(self, uid: str) -> AmbientPod | None:
        with self._lock:
            self._first_try.pop(uid, None)
            self._refusals.pop(uid, None)  # a pod let go (opted out) may never see remove(deleted)
            self._pending.discard(uid)
            self._unfinished.discard(uid)
            return self._enrolled.pop(uid, None)

    def _set_pending(self, uid: str, pending: bool) -> None:
        with self._lock:
            (self._pending.add if pending else self._pending.discard)(uid)

    # -- add / remove ------------------------------------------------------------------------

    def add(
        self,
        pod: Mapping[str, Any],
        netns_path: str = "",
        *,
        sandbox: str = "",
        ips: tuple[str, ...] = (),
        unless_enabled: bool = False,
    ) -> AmbientPod | None:
        """Enroll the pod; `netns_path`, `sandbox` (container id) and `ips` (the CNI result's,
        as Istio's AddPodToMesh takes them) from a CNI ADD; no netns to find it (a running pod,
        its status IPs). `unless_enabled` (the watch, deciding before this lock): a pod a CNI
        ADD enrolled meanwhile is left as it is (None), not given to ztunnel twice."""
        uid = str(_meta(pod).get("uid", ""))
        with self._pod_locks.hold(uid):  # the CNI server and the watch may race on a pod
            if unless_enabled and self.state(uid) == "enabled":
                log.debug("pod enrolled meanwhile", extra={"fields": {"pod": _ref(pod)}})
                return None
            return self._add(pod, netns_path, sandbox, ips)

    def remove(self, pod: Mapping[str, Any], *, deleted: bool, sandbox: str = "") -> None:
        """Release the pod; `deleted`: it is gone (or going), so its netns is left alone and a
        failed annotation removal does not matter. `sandbox`: a CNI DEL's container id; the
        pod is released only when that sandbox is the one it was enrolled with."""
        uid = str(_meta(pod).get("uid", ""))
        with self._pod_locks.hold(uid):
            known = self.enrolled(uid)
            if sandbox and known is not None and known.sandbox not in ("", sandbox):
                log.info(
                    "DEL of a sandbox the pod no longer runs in; the pod stays enrolled",
                    extra={"fields": {"pod": _ref(pod), "sandbox": sandbox}},
                )
                return
            if sandbox:
                self._release_sandbox(pod, known, sandbox, deleted=deleted)
            else:
                told = self._removal_told(uid, pod, known, deleted=deleted)
                self._remove(pod, known, deleted=deleted, tell_ztunnel=not told)
                if deleted:  # done (a failure above keeps it for the retry)
                    with self._lock:
                        self._released_by_del.discard(uid)
        if deleted:
            with self._lock:
                self._refusals.pop(uid, None)

    def forget(self, uid: str) -> None:
        """A deleted pod whose delete event released nothing: drop what is kept of it."""
        with self._lock:
            self._released_by_del.discard(uid)
            self._refusals.pop(uid, None)

    def _release_sandbox(
        self, pod: Mapping[str, Any], known: AmbientPod | None, sandbox: str, *, deleted: bool
    ) -> None:
        """A CNI DEL of the sandbox the pod is enrolled with (or of no recorded one)."""
        if known is None:
            # Released already (delete event first, or the watch let it go): no 2nd DelWorkload.
            log.info(
                "DEL of a sandbox whose pod is not enrolled; nothing to release",
                extra={"fields": {"pod": _ref(pod), "sandbox": sandbox}},
            )
            return
        self._remove(pod, known, deleted=deleted)
        with self._lock:
            self._released_by_del.add(known.uid)

    def _removal_told(
        self, uid: str, pod: Mapping[str, Any], known: AmbientPod | None, *, deleted: bool
    ) -> bool:
        """Was ztunnel told of this removal already? Only for a deleted pod its sandbox's DEL
        released while running: Istio sends one DelWorkload at its delete event, and the DEL sent
        it. A terminated pod gets another, as Istio sends one at its update to a terminal phase."""
        if not deleted or known is not None or is_terminated(pod):
            return False
        with self._lock:
            return uid in self._released_by_del

    def annotate_as_recorded(self, pod: Mapping[str, Any]) -> None:
        """Write the annotation of the pod's recorded state (`enabled`, or none when not
        enrolled); a pending pod's is written by its add."""
        uid = str(_meta(pod).get("uid", ""))
        with self._pod_locks.hold(uid):
            state = self.state(uid)
            if state != "pending":
                self._annotate(pod, state)

    def _add(
        self, pod: Mapping[str, Any], netns_path: str, sandbox: str, ips: tuple[str, ...]
    ) -> AmbientPod:
        uid = str(_meta(pod).get("uid", ""))
        known = self.enrolled(uid)
        if known is not None and not netns_path and self._only_finishing(uid):
            return self._finish(pod, known, None)
        with self._lock:
            self._first_try.setdefault(uid, (self._clock(), "cni" if netns_path else "watch"))
        try:
            return self._enroll(pod, netns_path, sandbox, ips, known)
        except ZtunnelPending:
            raise  # pending: the retry's acknowledgement ends the duration
        except BaseException:
            with self._lock:
                self._first_try.pop(uid, None)
            raise

    def _acknowledged(self, uid: str) -> None:
        """ztunnel took the pod: its enrollment's duration, from the first try."""
        with self._lock:
            first = self._first_try.pop(uid, None)
        if first is not None:
            started, source = first
            metrics.AMBIENT_ENROLLMENT_DURATION.labels(source=source).observe(
                max(0.0, self._clock() - started)
            )

    def _enroll(
        self,
        pod: Mapping[str, Any],
        netns_path: str,
        sandbox: str,
        ips: tuple[str, ...],
        known: AmbientPod | None,
    ) -> AmbientPod:
        ref, uid = _ref(pod), str(_meta(pod).get("uid", ""))
        try:  # the pod's own values first: at an ADD a refused one programs nothing
            options = self._options(pod, running=not netns_path)
            podinput.pod_ips(pod)
        except InvalidPodInputError as e:
            raise NonRetryableAdd(f"pod {ref}: {e}") from e
        netns = netns_path or self._known_or_found_netns(pod, known)
        if not sandbox and known is not None and known.netns_path == netns:
            sandbox = known.sandbox  # the same sandbox, enrolled again while running
        enrolled = ambient_pod(pod, netns, sandbox=sandbox, ips=ips)
        try:
            backend = self._rules.apply(netns, options)
        except Exception as e:
            raise NonRetryableAdd(f"pod {ref}: in-pod rules in {netns}: {e}") from e
        self._put(enrolled)
        with self._lock:
            self._pending.add(uid)
            self._unfinished.add(uid)
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
        self._acknowledged(uid)
        self._finish(pod, enrolled, known)
        log.info("pod enrolled", extra={"fields": {"pod": ref, "netns": netns, "backend": backend}})
        return enrolled

    def _only_finishing(self, uid: str) -> bool:
        with self._lock:
            return uid in self._unfinished and uid not in self._pending

    def _finish(
        self, pod: Mapping[str, Any], enrolled: AmbientPod, replaced: AmbientPod | None
    ) -> AmbientPod:
        """Istio's steps once ztunnel has the pod: its IPs in the host probe set (those of a
        `replaced` record, another sandbox's, out), then the annotation `enabled`. Until both
        are done the pod stays pending, so a retry does what is left."""
        uid = enrolled.uid
        stale = [ip for ip in (replaced.ips if replaced else ()) if ip not in enrolled.ips]
        try:
            self._host.add(uid, enrolled.ips or pod_ips(pod))
            if stale:
                self._host.remove(uid, stale)
        except Exception as e:
            raise MeshError(f"pod {_ref(pod)}: host probe address set: {e}") from e
        self._annotate(pod, "enabled")
        with self._lock:
            self._unfinished.discard(uid)
        return enrolled

    def _remove(
        self,
        pod: Mapping[str, Any],
        known: AmbientPod | None,
        *,
        deleted: bool,
        tell_ztunnel: bool = True,
    ) -> None:
        """`tell_ztunnel`: False when ztunnel was told of this removal already."""
        ref, uid = _ref(pod), str(_meta(pod).get("uid", ""))
        ips = tuple(dict.fromkeys((*pod_ips(pod), *(known.ips if known else ()))))
        try:
            self._host.remove(uid, ips)
        except Exception as e:
            raise MeshError(f"pod {ref}: remove from host probe address set: {e}") from e
        known = self._take(uid)
        if not deleted:
            if known is not None and known.netns_path and os.path.exists(known.netns_path):
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
            if tell_ztunnel:
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

    def _known_or_found_netns(self, pod: Mapping[str, Any], known: AmbientPod | None) -> str:
        uid = str(_meta(pod).get("uid", ""))
        if known is not None and known.netns_path and os.path.exists(known.netns_path):
            return known.netns_path
        found = self._find_netns([pod]).get(uid)
        if found is None:
            what = (
                f"pod {_ref(pod)}: cannot find its network namespace on the node "
                f"(IPs {', '.join(pod_ips(pod)) or 'none'})"
            )
            if known is not None and not known.netns_path:  # kept at start-up: look again
                raise MeshError(f"{what}; ztunnel keeps the pod meanwhile")
            raise NonRetryableAdd(what)
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
