"""Multus on the OpenShift node of the `platforms` tier: its thin plugin is the real one
(parts.multus(), built by ci/setup-testbed), run by CRI-O from the platform's bin dir; its
NetworkAttachmentDefinition CRD, which OpenShift ships with it, is here."""

from __future__ import annotations

from typing import Any


def nad_crd() -> dict[str, Any]:
    """The NetworkAttachmentDefinition CRD as Multus's deployment (and OpenShift's network
    operator) installs it: namespaced k8s.cni.cncf.io/v1, spec.config a string."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "network-attachment-definitions.k8s.cni.cncf.io"},
        "spec": {
            "group": "k8s.cni.cncf.io",
            "scope": "Namespaced",
            "names": {
                "plural": "network-attachment-definitions",
                "singular": "network-attachment-definition",
                "kind": "NetworkAttachmentDefinition",
                "shortNames": ["net-attach-def"],
            },
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "description": (
                                "NetworkAttachmentDefinition is a CRD schema specified by the "
                                "Network Plumbing Working Group to express the intent for "
                                "attaching pods to one or more logical or physical networks."
                            ),
                            "type": "object",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": {
                                    "description": (
                                        "NetworkAttachmentDefinition spec defines the desired "
                                        "state of a network attachment"
                                    ),
                                    "type": "object",
                                    "properties": {
                                        "config": {
                                            "description": (
                                                "NetworkAttachmentDefinition config is a "
                                                "JSON-formatted CNI configuration"
                                            ),
                                            "type": "string",
                                        }
                                    },
                                },
                            },
                        }
                    },
                }
            ],
        },
    }
