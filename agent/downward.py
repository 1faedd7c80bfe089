"""The agent pod's identity from the downward API, read once at start (the DaemonSet sets
NODE_NAME from spec.nodeName, POD_NAME, POD_NAMESPACE and POD_UID from metadata)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from agent.errors import ConfigError


@dataclass(frozen=True)
class AgentPod:
    """Where this agent runs; empty strings when the variables are not set (tests, one-shots)."""

    node_name: str = ""
    pod_name: str = ""
    pod_namespace: str = ""
    pod_uid: str = ""
    """Events about the agent itself name its pod by UID too (`kubectl describe` matches it)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AgentPod:
        env = os.environ if environ is None else environ
        return cls(
            node_name=env.get("NODE_NAME", ""),
            pod_name=env.get("POD_NAME", ""),
            pod_namespace=env.get("POD_NAMESPACE", ""),
            pod_uid=env.get("POD_UID", ""),
        )

    def require_node(self) -> str:
        """The node name; ConfigError when unset (`run` cannot serve an unknown node)."""
        if not self.node_name:
            raise ConfigError(
                "environment variable NODE_NAME is not set: the DaemonSet sets it "
                "from the downward API (fieldRef spec.nodeName)"
            )
        return self.node_name
