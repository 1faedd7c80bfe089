"""Two faults of the ZDS differential (tests/node/zds_scenario.py) that make a pod's enrollment
fail after ztunnel took it, each applied by the node's own kernel or API server, so the same way
whichever agent runs:

    annotation_refused()  a ValidatingAdmissionPolicy denies setting the pod's
                          `ambient.istio.io/redirection: enabled` (both agents PATCH pods/status
                          with the same merge patch), for the pods carrying FAULT_LABEL
    probe_set_full()      the host probe set `istio-inpod-probes-v4` (both agents write it over
                          ipset's netlink API) swapped for a copy of itself that is full
                          (maxelem = its entries), so adding a new pod IP fails with "hash is
                          full"; swapped back when lifted

The policy is waited for, on the way in and on the way out, until it is in force or gone (an API
server loads policies in the background): a dry-run request tells. The swap is in force at
once; what an agent removes from the set meanwhile comes back with it, so nothing should."""

from __future__ import annotations

import contextlib
import ipaddress
import secrets
import socket
from collections.abc import Iterator
from typing import Any

from kubernetes.client.exceptions import ApiException
from pyroute2 import IPSet

from agent.netns import run_in_netns
from agent.rules.ambient.builder import PROBE_IPSET_V4
from testbed import kubepods

FAULT_LABEL = {"zds-fault": "annotation-refused"}
REDIRECTION = "ambient.istio.io/redirection"
POLICY_LOAD_TIMEOUT = 30.0
REFUSAL = "redirection refused (test fault)"
"""The policy's message: each agent's failed ADD names it (the API server's answer)."""
IPSET_ERR_HASH_FULL = 4352
"""The kernel's answer to an add to a full hash set: each agent's failed ADD names it."""


def _policy(name: str, namespace: str) -> dict[str, Any]:
    ((key, value),) = FAULT_LABEL.items()
    enabled = (
        f"has(object.metadata.annotations) && '{REDIRECTION}' in object.metadata.annotations"
        f" && object.metadata.annotations['{REDIRECTION}'] == 'enabled'"
    )
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "objectSelector": {"matchLabels": {key: value}},
                # CREATE too: the dry-run probe below, a pod created with the annotation.
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["pods", "pods/status"],
                    }
                ],
            },
            "validations": [{"expression": f"!({enabled})", "message": REFUSAL}],
        },
    }


def _binding(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }


def _refused(core: Any, namespace: str, image: str) -> bool:
    """Does the API server refuse a pod of FAULT_LABEL annotated `enabled`? (dry run)"""
    probe = kubepods.pod_manifest(
        "zds-fault-probe",
        image,
        app_command=["sleep"],
        sidecar=False,
        annotations={REDIRECTION: "enabled"},
        labels=FAULT_LABEL,
    )
    try:
        core.create_namespaced_pod(namespace, probe, dry_run="All")
    except ApiException as e:
        if e.status in (403, 422) and REFUSAL in str(e.body):
            return True
        raise
    return False


@contextlib.contextmanager
def annotation_refused(admission: Any, core: Any, namespace: str, image: str) -> Iterator[None]:
    """While inside: no pod of FAULT_LABEL in `namespace` can be annotated `enabled`."""
    name = f"zds-fault-{secrets.token_hex(3)}"
    admission.create_validating_admission_policy(_policy(name, namespace))
    try:
        admission.create_validating_admission_policy_binding(_binding(name))
        try:
            kubepods.wait_for(
                lambda: _refused(core, namespace, image), f"{name} in force", POLICY_LOAD_TIMEOUT
            )
            yield
        finally:
            admission.delete_validating_admission_policy_binding(name)
    finally:
        admission.delete_validating_admission_policy(name)
    kubepods.wait_for(
        lambda: not _refused(core, namespace, image), f"{name} lifted", POLICY_LOAD_TIMEOUT
    )


def _entries(ipset: Any, name: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for msg in ipset.list(name):
        adt = msg.get_attr("IPSET_ATTR_ADT")
        for entry in adt.get_attrs("IPSET_ATTR_DATA") if adt else ():
            addr = entry.get_attr("IPSET_ATTR_IP_FROM").get_attr("IPSET_ATTR_IPADDR_IPV4")
            out[str(ipaddress.ip_address(addr))] = entry.get_attr("IPSET_ATTR_COMMENT")
    return out


def probe_set(node_netns: str) -> dict[str, str]:
    """The node's v4 host probe set: ip -> comment (the pod's uid)."""

    def work() -> dict[str, str]:
        with IPSet() as ipset:
            return _entries(ipset, PROBE_IPSET_V4)

    return run_in_netns(node_netns, work)


@contextlib.contextmanager
def probe_set_full(node_netns: str) -> Iterator[None]:
    """While inside: the v4 probe set holds what it held (probes keep working) and no more."""
    full = f"zds-fault-{secrets.token_hex(3)}"

    def swap_in() -> None:
        with IPSet() as ipset:
            held = _entries(ipset, PROBE_IPSET_V4)
            assert held, "the probe set is empty: nothing to fill a copy with"
            ipset.create(
                full, stype="hash:ip", family=socket.AF_INET, comment=True, maxelem=len(held)
            )
            try:
                for ip, comment in held.items():
                    ipset.add(full, ip, family=socket.AF_INET, comment=comment)
                # The kernel swaps the sets in place: the host rules match the full one now.
                ipset.swap(PROBE_IPSET_V4, full)
            except BaseException:
                ipset.destroy(full)
                raise

    def swap_back() -> None:
        with IPSet() as ipset:
            ipset.swap(PROBE_IPSET_V4, full)
            ipset.destroy(full)

    run_in_netns(node_netns, swap_in)
    try:
        yield
    finally:
        run_in_netns(node_netns, swap_back)
