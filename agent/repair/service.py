"""The repair loop: find pods on this node that run without redirect and handle them per mode.

A pod is broken, and handled by `repair.mode`, in two cases only:
- its validation init container failed (Istio's repair filter: `repair.initContainerName`
  terminated with `repair.initContainerExitCode`, and `repair.initContainerTerminationMessage`
  when set): it found no redirect from inside the pod;
- its network namespace (found by the pod's identity, agent.podnetns) holds no chain or table
  of ours at all: it started before the plugin was in place.
A pod whose rules are ours but differ from what this agent renders for it today (an older or
newer release, an annotation edited on the running pod) is not broken: it is reported (a log
line, istio_cni_repair_rules_differ_total, a Warning Event `RedirectRulesDiffer`, once per pod)
and left alone. Acting on it would let a release that renders one rule differently, or a tenant
who edits an annotation, make every meshed pod a repair target (with `delete`: deleted).

A pod whose values the plugin's ADD would refuse (an annotation set after start to a value the
parser refuses: `sidecar.istio.io/inject: "no thanks"`) is refused here too: neither repaired,
deleted nor labelled, but reported (a log line, istio_cni_repair_pods_repaired_total with result
`refused`, a Warning Event `RedirectRefused`, the status listing) once per distinct reason, and
looked at again each round, so that correcting the value lets it be handled.

One pod never stops a round: whatever fails for a pod ends that pod's handling this round (an
outcome `fail`, logged once per distinct reason), and the other pods proceed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import Counter

from agent import metrics
from agent.background import BackgroundLoop
from agent.config import Settings
from agent.errors import InvalidPodInputError
from agent.pods import states as pod_states
from agent.repair import actions
from agent.repair.detect import (
    check_sidecar_inputs,
    is_running_with_addresses,
    pod_key,
    validation_failed,
)

log = logging.getLogger(__name__)

Redirect = Callable[[Mapping[str, Any], str], object]
RulesInPlace = Callable[[Mapping[str, Any], str], bool]
OursPresent = Callable[[str], bool]
ShouldRedirect = Callable[[Mapping[str, Any]], bool]
FindNetns = Callable[[Sequence[Mapping[str, Any]]], Mapping[str, str]]
CheckInputs = Callable[[Mapping[str, Any]], object]

METRIC_TYPE = {"repair-in-place": "repair", "delete": "delete", "label": "label"}
RULES_DIFFER_REASON = "RedirectRulesDiffer"
REFUSED_REASON = "RedirectRefused"
"""The Event of a refused pod: the reason the pod server's refused ADD gives too."""
RULES_DIFFER = Counter(
    "istio_cni_repair_rules_differ",
    "Running pods whose redirect rules are ours but differ from what this agent renders for "
    "them: reported once per pod and left alone.",
)


class PodSource(Protocol):
    def list_pods(self) -> Sequence[Mapping[str, Any]]: ...
    def ready(self) -> bool: ...


@dataclass(frozen=True)
class Outcome:
    pod: str
    action: str  # repair | delete | label | none
    result: str  # success | fail | skip | differ | refused
    detail: str = ""


class RepairService:
    """Runs `run_once` every `interval` seconds until stopped; each pod UID is handled once."""

    def __init__(
        self,
        *,
        settings: Settings,
        node_name: str,
        pods: PodSource,
        core: actions.CoreApi,
        should_redirect: ShouldRedirect,
        redirect: Redirect,
        rules_in_place: RulesInPlace,
        ours_present: OursPresent,
        find_netns: FindNetns,
        interval: float = 5.0,
        states: pod_states.PodStates | None = None,
        check_inputs: CheckInputs = check_sidecar_inputs,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`states`: where each pod's outcome is noted (`istio-cni-agent status`);
        `check_inputs` raises InvalidPodInputError for a pod whose values the ADD refuses;
        `clock` times repairs (istio_cni_repair_duration_seconds)."""
        self._clock = clock
        self._round_started = clock()
        self._broken_since: dict[str, float] = {}
        """UID -> the start of the round that first found the pod to act on: a repair's
        duration runs from there to its success, failed rounds between included."""
        self._states = states
        self._check_inputs = check_inputs
        self._settings = settings
        self._node_name = node_name
        self._pods = pods
        self._core = core
        self._should_redirect = should_redirect
        self._redirect = redirect
        self._rules_in_place = rules_in_place
        self._ours_present = ours_present
        self._find_netns = find_netns
        self._handled: set[str] = set()
        self._failed: set[str] = set()
        """UIDs whose failure was reported: retried each round, reported (Event, metric) once."""
        self._reported: dict[str, str] = {}
        """UID -> the last problem logged for the pod (a refusal, a failed check): a problem is
        reported when it first shows, not every round."""
        # The round beats before each pod it repairs: a step is the scan (the node's /proc) or
        # one pod (its netns programmed, or its deletion and Event within the API's 12 s).
        self._loop = BackgroundLoop.every(
            "repair", interval, self._round, failed="repair round failed", step_bound=120.0
        )

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()

    def ready(self) -> bool:
        return True

    def _round(self) -> None:
        if self._pods.ready():
            self.run_once()

    def run_once(self) -> list[Outcome]:
        """One round: each pod is looked at on its own, so a pod that fails or is refused ends
        only its own handling; returns the outcome of each pod acted on, checked or refused."""
        self._round_started = self._clock()
        pods = self._pods.list_pods()
        live = {_uid(p) for p in pods}
        self._handled &= live  # forget deleted pods so the records cannot grow without bound
        self._failed &= live
        self._broken_since = {u: t for u, t in self._broken_since.items() if u in live}
        self._reported = {uid: r for uid, r in self._reported.items() if uid in live}
        todo: list[Mapping[str, Any]] = []
        looked: list[tuple[Mapping[str, Any], Outcome]] = []
        for pod in pods:
            chosen = self._select(pod)
            if isinstance(chosen, Outcome):
                looked.append((pod, chosen))
            elif chosen:
                todo.append(pod)
        found = self._find_netns(todo) if todo else {}
        for pod in todo:
            self._loop.beat()
            looked.append((pod, self._handle_one(pod, found.get(_uid(pod)))))
        for pod, outcome in looked:
            self._note(pod, outcome)
        return [outcome for _, outcome in looked]

    def _select(self, pod: Mapping[str, Any]) -> bool | Outcome:
        """Is the pod a candidate? An Outcome when its values are refused or looking failed."""
        try:
            return self._is_candidate(pod)
        except InvalidPodInputError as e:
            return self._refuse(pod, e)
        except Exception as e:
            return self._failed_unexpectedly(pod, e)

    def _handle_one(self, pod: Mapping[str, Any], netns: str | None) -> Outcome:
        try:
            return self._handle(pod, netns)
        except InvalidPodInputError as e:
            return self._refuse(pod, e)
        except Exception as e:
            return self._failed_unexpectedly(pod, e)

    def _first_report(self, uid: str, problem: str) -> bool:
        """True when `problem` is new for the pod (then remembered), False when reported."""
        if self._reported.get(uid) == problem:
            return False
        self._reported[uid] = problem
        return True

    def _refuse(self, pod: Mapping[str, Any], error: InvalidPodInputError) -> Outcome:
        """The ADD would refuse the pod's values: repair leaves it alone and reports it, once
        per distinct reason (the error names the value and quotes an excerpt of it)."""
        key, uid = pod_key(pod), _uid(pod)
        outcome = Outcome(key, "none", "refused", f"refused: {error}")
        if not self._first_report(uid, outcome.detail):
            return outcome
        kind = METRIC_TYPE[self._settings.repair.mode]
        actions.PODS_REPAIRED.labels(type=kind, result="refused").inc()
        log.warning(
            "pod's values are refused, as its CNI ADD would refuse them; repair leaves it alone",
            extra={"fields": {"pod": key, "error": str(error)}},
        )
        actions.record_event(
            self._core,
            pod,
            reason=REFUSED_REASON,
            message="this node's istio-cni agent refuses a value of the pod, as it refuses it "
            f"at a pod start (CNI ADD); repair leaves the pod as it is: {error}",
            node_name=self._node_name,
        )
        return outcome

    def _failed_unexpectedly(self, pod: Mapping[str, Any], error: Exception) -> Outcome:
        """A failure no step expected (a malformed pod, a bug): the pod's round ends here."""
        key = pod_key(pod)
        detail = f"internal error: {type(error).__name__}: {error}"
        if self._first_report(_uid(pod), detail):
            log.error(
                "repair of pod failed; the other pods go on",
                exc_info=error,
                extra={"fields": {"pod": key}},
            )
        return Outcome(key, "none", "fail", detail)

    def _note(self, pod: Mapping[str, Any], outcome: Outcome) -> None:
        state = _STATES.get(outcome.result)
        if outcome.result == "skip" and outcome.detail == "rules in place":
            state = pod_states.CAPTURED
        if self._states is None or state is None:
            return
        meta = pod.get("metadata") or {}
        if state == pod_states.CAPTURED:
            known = self._states.get(str(meta.get("uid")))
            if known is not None and pod_states.ADD in known.outcomes:
                return  # its ADD's outcome says more
        self._states.note(
            namespace=str(meta.get("namespace")),
            name=str(meta.get("name")),
            uid=str(meta.get("uid")),
            kind=pod_states.REPAIR,
            state=state,
            reason=f"repair: {outcome.detail}",
        )

    def _is_candidate(self, pod: Mapping[str, Any]) -> bool:
        """Raises InvalidPodInputError for a pod whose values the ADD would refuse."""
        uid = _uid(pod)
        if uid in self._handled or (pod["metadata"].get("deletionTimestamp")):
            return False
        if not (is_running_with_addresses(pod) and self._should_redirect(pod)):
            return False
        self._check_inputs(pod)
        return True

    def _handle(self, pod: Mapping[str, Any], netns: str | None) -> Outcome:
        key, uid = pod_key(pod), str(pod["metadata"]["uid"])
        repair = self._settings.repair
        broken = validation_failed(
            pod,
            init_container_name=repair.initContainerName,
            exit_code=repair.initContainerExitCode,
            termination_message=repair.initContainerTerminationMessage,
        )
        if not broken:
            if netns is None:
                return Outcome(key, "none", "skip", "netns not found yet")
            try:
                state = self._rules_state(pod, netns)
            except InvalidPodInputError:
                raise
            except Exception as e:
                if self._first_report(uid, f"check failed: {e}"):
                    log.warning("cannot check rules of pod %s in %s: %s", key, netns, e)
                return Outcome(key, "none", "skip", f"check failed: {e}")
            if state != "absent":
                self._handled.add(uid)
                self._reported.pop(uid, None)
                if state == "differ":
                    self._report_difference(pod, netns)
                    return Outcome(key, "none", "differ", f"rules differ in {netns}; left alone")
                return Outcome(key, "none", "skip", "rules in place")
        return self._act_and_report(pod, netns, key=key, uid=uid)

    def _rules_state(self, pod: Mapping[str, Any], netns: str) -> str:
        """exact (as rendered today), differ (ours, not as rendered) or absent (none of ours)."""
        if self._rules_in_place(pod, netns):
            return "exact"
        return "differ" if self._ours_present(netns) else "absent"

    def _report_difference(self, pod: Mapping[str, Any], netns: str) -> None:
        key = pod_key(pod)
        RULES_DIFFER.inc()
        log.warning(
            "pod's redirect rules differ from this agent's rendering; left alone",
            extra={"fields": {"pod": key, "netns": netns}},
        )
        actions.record_event(
            self._core,
            pod,
            reason=RULES_DIFFER_REASON,
            message="redirect rules in the pod differ from what this node's istio-cni agent "
            "renders for it (another release, or annotations changed after start); the pod is "
            "captured and left as it is: restart it to get this release's rules",
            node_name=self._node_name,
        )

    def _act_and_report(
        self, pod: Mapping[str, Any], netns: str | None, *, key: str, uid: str
    ) -> Outcome:
        mode = self._settings.repair.mode
        kind = METRIC_TYPE[mode]
        since = self._broken_since.setdefault(uid, self._round_started)
        try:
            detail = self._act(mode, pod, netns)
        except InvalidPodInputError:
            raise  # refused, not failed
        except Exception as e:
            if uid in self._failed:  # retried every round: one Event per pod, not a flood
                log.debug("repair of pod %s (%s) failed again: %s", key, mode, e)
                return Outcome(key, kind, "fail", str(e))
            self._failed.add(uid)
            log.error(
                "repair of pod %s (%s) failed: %s",
                key,
                mode,
                e,
                extra={"fields": {"pod": key, "mode": mode}},
            )
            actions.PODS_REPAIRED.labels(type=kind, result="fail").inc()
            message = f"pod started without traffic redirect; {mode} failed: {e}"
            actions.record_event(
                self._core, pod, reason=_REASON[mode], message=message, node_name=self._node_name
            )
            return Outcome(key, kind, "fail", str(e))
        self._handled.add(uid)
        self._reported.pop(uid, None)
        self._broken_since.pop(uid, None)
        if detail == "skip":
            actions.PODS_REPAIRED.labels(type=kind, result="skip").inc()
            return Outcome(key, kind, "skip", "already labeled")
        actions.PODS_REPAIRED.labels(type=kind, result="success").inc()
        metrics.REPAIR_DURATION.labels(type=kind).observe(max(0.0, self._clock() - since))
        log.info(
            "pod %s started without traffic redirect: %s",
            key,
            detail,
            extra={"fields": {"pod": key, "mode": mode}},
        )
        actions.record_event(
            self._core,
            pod,
            reason=_REASON[mode],
            message=f"pod started without traffic redirect; {detail}",
            node_name=self._node_name,
        )
        return Outcome(key, kind, "success", detail)

    def _act(self, mode: str, pod: Mapping[str, Any], netns: str | None) -> str:
        if mode == "repair-in-place":
            if netns is None:
                raise LookupError("network namespace not found on this node")
            self._redirect(pod, netns)
            return f"rules programmed in {netns}"
        if mode == "delete":
            actions.delete_pod(self._core, pod)
            return "deleted"
        repair = self._settings.repair
        if (pod["metadata"].get("labels") or {}).get(repair.labelKey) is not None:
            return "skip"
        actions.label_pod(self._core, pod, key=repair.labelKey, value=repair.labelValue)
        return f"labeled {repair.labelKey}={repair.labelValue}"


def _uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid"))


_STATES = {
    "success": pod_states.REPAIRED,
    "fail": pod_states.REPAIR_FAILED,
    "differ": pod_states.RULES_DIFFER,
    "refused": pod_states.REFUSED,
}

_REASON = {
    "repair-in-place": "RepairBrokenPod",
    "delete": "DeleteBrokenPod",
    "label": "LabelBrokenPod",
}
