"""`istio-cni-agent rules`: sidecar mode's rules (agent.rules.sidecar.cli), or with `--ambient`
ambient mode's (agent.rules.ambient.cli); each parses its own flags."""

from __future__ import annotations

from collections.abc import Mapping

from agent.rules.ambient import cli as ambient_cli
from agent.rules.sidecar import cli as sidecar_cli


def main(command: str, argv: list[str], environ: Mapping[str, str] | None = None) -> int:
    if ambient_cli.wants_ambient(argv):
        return ambient_cli.main(command, argv)
    return sidecar_cli.main(command, argv, environ)
