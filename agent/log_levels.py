"""Log levels as the chart gives them: one level, or Istio's per-scope `scope:level,...` list.

Istio's `logging.level` (its `--log_output_level` flag) accepts `debug`, or
`default:info,cni-plugin:debug,repair:warn`. A bare level sets the default scope; `all` sets every
scope. The agent maps the scopes it has onto its loggers and tells the plugin the `cni-plugin` one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

# Istio's level names plus panic (kept from the first releases of this chart); none = silent.
LEVEL_NAMES = ("none", "panic", "fatal", "error", "warn", "info", "debug")

DEFAULT_SCOPE = "default"
ALL_SCOPES = "all"
PLUGIN_SCOPE = "cni-plugin"

# Istio's scope names for the node agent, and the agent logger each one sets.
AGENT_SCOPES: Mapping[str, str] = MappingProxyType(
    {
        "cni-agent": "agent",
        "install": "agent.install",
        "repair": "agent.repair",
        "ambient": "agent.ambient",
    }
)
KNOWN_SCOPES = frozenset({DEFAULT_SCOPE, ALL_SCOPES, PLUGIN_SCOPE, *AGENT_SCOPES})

_SCOPE = re.compile(r"[a-z0-9][a-z0-9_.-]*")


@dataclass(frozen=True)
class LogLevels:
    """The default level plus the scopes set apart from it."""

    default: str = "info"
    scopes: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def level_of(self, scope: str) -> str:
        """The level of `scope`: its own when set, else the default."""
        return self.scopes.get(scope, self.default)

    @property
    def plugin(self) -> str:
        return self.level_of(PLUGIN_SCOPE)

    @property
    def unknown_scopes(self) -> tuple[str, ...]:
        """Scopes named in the setting that nothing here logs under (Istio accepts them too)."""
        return tuple(sorted(s for s in self.scopes if s not in KNOWN_SCOPES))


def parse_log_levels(spec: str) -> LogLevels:
    """Parse `debug` or `default:info,cni-plugin:debug`; ValueError names the bad part."""
    default = "info"
    scopes: dict[str, str] = {}
    parts = [p.strip() for p in spec.split(",")]
    if not spec.strip() or any(not p for p in parts):
        raise ValueError(f"empty entry in log level {spec!r}")
    for part in parts:
        scope, sep, level = part.rpartition(":")
        scope = scope.strip() if sep else DEFAULT_SCOPE
        level = level.strip()
        if level not in LEVEL_NAMES:
            raise ValueError(f"level {level!r} in {spec!r} is not one of {', '.join(LEVEL_NAMES)}")
        if not _SCOPE.fullmatch(scope):
            raise ValueError(f"scope {scope!r} in {spec!r} is not a scope name")
        if scope == ALL_SCOPES:
            # `all` overrides every scope set before it and the default, as in Istio.
            default = level
            scopes = {s: level for s in scopes}
        elif scope == DEFAULT_SCOPE:
            default = level
        else:
            scopes[scope] = level
    return LogLevels(default=default, scopes=MappingProxyType(scopes))
