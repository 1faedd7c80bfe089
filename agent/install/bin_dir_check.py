"""Is `cniBinDir` the container runtime's CNI bin dir? The runtime runs every plugin of the
primary config from its bin dir, so there they all are; when none of them is in `cniBinDir`, the
runtime looks for ours elsewhere and every pod start on the node fails (a preset or a
`cniBinDir` of another platform). The agent is then not Ready, saying so, rather than Ready
beside failing pods. Chained mode only: a standalone config names no other plugin.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from agent.config import Settings
from agent.errors import InstallError
from agent.install import conflist
from agent.install.plan import ConfigPlan, Reader, preset_words


def bin_dir_problem(
    settings: Settings, plan: Callable[[], ConfigPlan], read: Reader, bin_dir: str
) -> str | None:
    """None when `bin_dir` (cniBinDir, as mounted) holds a plugin of the primary config, or
    when there is nothing to tell by (no primary yet, standalone mode); else what is wrong."""
    if not settings.chained:
        return None
    try:
        primary = plan().primary
    except InstallError:
        return None  # the install check names it
    data = read(primary) if primary else None
    if primary is None or data is None:
        return None
    try:
        config = conflist.as_list(conflist.load(data, source=primary))
    except InstallError:
        return None
    types = sorted(
        {
            str(p["type"])
            for p in config.get("plugins") or []
            if isinstance(p, dict) and isinstance(p.get("type"), str) and not conflist.is_ours(p)
        }
    )
    # lexists: a node's plugins may be links to paths that only the node resolves (k3s's into
    # its data dir), not this container.
    if not types or any(os.path.lexists(os.path.join(bin_dir, t)) for t in types):
        return None
    return (
        f"cniBinDir {settings.cniBinDir} holds none of the plugins that "
        f"{os.path.join(settings.cniConfDir, primary)} names ({', '.join(types)}): the "
        "container runtime runs them from its CNI bin dir and will look for ours there too; "
        f"set cniBinDir to that dir ({preset_words(settings)})"
    )
