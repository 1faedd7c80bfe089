"""A rule program's failure as the node logs it and as a reply may show it.

`iptables-restore` and `nft` print the lines they choke on, and nft prints the lines of any
file an `include` names. Their output is logged here in full, on the node, and the error raised
carries only a bounded, escaped summary (agent.excerpt.tool_summary): a CNI reply or an Event
never shows a tool's output verbatim.
"""

from __future__ import annotations

import logging

from agent.errors import RedirectError
from agent.excerpt import bounded, tool_summary

log = logging.getLogger(__name__)


def failed(what: str, netns_path: str, returncode: int, stderr: str) -> RedirectError:
    """Log `what`'s whole error output; return the error that names it with a summary."""
    log.error(
        "rule program failed",
        extra={
            "fields": {
                "command": what,
                "netns": netns_path,
                "exit": returncode,
                "stderr": bounded(stderr, 16384),
            }
        },
    )
    return RedirectError(
        f"{what} in {netns_path} failed (exit {returncode}): {tool_summary(stderr)}"
    )
