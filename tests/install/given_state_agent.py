"""`istio-cni-agent run` with the cluster's answer given in a file instead of asked of an API
server (the fetch part is replaced, the decision and everything around it are the real ones).

usage: python -m tests.install.given_state_agent CONFIG STATE_JSON
STATE_JSON: {"daemonset": {...} | null, "node": {...} | null, "error": ""}
"""

from __future__ import annotations

import json
import sys

from agent.config import Settings, load_settings
from agent.install import stop_policy
from agent.lifecycle import run
from agent.logs import setup_logging


def main() -> int:
    config_path, state_path = sys.argv[1], sys.argv[2]
    settings = load_settings(config_path)
    setup_logging(settings.logLevel)

    def given(s: Settings) -> stop_policy.StopDecision:
        with open(state_path) as f:
            raw = json.load(f)
        state = stop_policy.ClusterState(
            daemonset=raw.get("daemonset"), node=raw.get("node"), error=raw.get("error", "")
        )
        return stop_policy.decide(s.uninstallOnStop, state)

    return run(settings, decide_on_stop=given)


if __name__ == "__main__":
    sys.exit(main())
