"""The agent pod's identity from the downward API, read once at start (the DaemonSet sets
NODE_NAME from spec.nodeName, POD_NAME and POD_NAMESPACE from metadata)."""

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

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AgentPod:
        env = os.environ if environ is None else environ
        return cls(
            node_name=env.get("NODE_NAME", ""),
            pod_name=env.get("POD_NAME", ""),
            pod_namespace=env.get("POD_NAMESPACE", ""),
        )

    def require_node(self) -> str:
        """The node name; ConfigError when unset (`run` cannot serve an unknown node)."""
        if not self.node_name:
            raise ConfigError(
                "environment variable NODE_NAME is not set: the DaemonSet sets it "
                "from the downward API (fieldRef spec.nodeName)"
            )
        return self.node_name
