"""`istio-cni-agent`: dispatches a subcommand to the module that owns it.

Each subcommand module exposes `main(command: str, argv: list[str]) -> int` and parses its own
flags (every one accepts `--config FILE`). Modules are imported lazily so `rules` does not pay
for the Kubernetes client and `run` does not pay for what it does not use.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("agent.lifecycle", "Install, watch, serve pods and repair until SIGTERM."),
    "install": ("agent.install.commands", "Install the plugin and its config entry once."),
    "uninstall": ("agent.install.commands", "Remove what install put on the node."),
    "rules": ("agent.rules.cli", "Print the redirect rules for a configuration or a pod."),
    "status": (
        "agent.status.cli",
        "Ask the running agent what it did to this node's pods, or compare one pod's rules.",
    ),
    "check": ("agent.check.cli", "Check a cluster from your machine, before or after install."),
}

USAGE = "usage: istio-cni-agent {" + ",".join(SUBCOMMANDS) + "} [--config FILE] [FLAGS]\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        for name, (_, summary) in SUBCOMMANDS.items():
            sys.stdout.write(f"  {name:<10} {summary}\n")
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        sys.stderr.write(f"istio-cni-agent: unknown subcommand {name!r}\n{USAGE}")
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    entry: Callable[[str, list[str]], int] = module.main
    return entry(name, rest)


if __name__ == "__main__":
    sys.exit(main())
