"""What Istio's own node agent leaves behind when it stopped without its clean-up (killed,
evicted, its node rebooted): the kubeconfig it writes for its plugin, holding a ServiceAccount
token. Our plugin and entry replace its plugin and entry by name (same binary, entry type
`istio-cni`), so after our install nothing reads that file; a credential nothing uses does not
stay on the node. Istio writes it into its run dir (`istio-cni-kubeconfig`, our run dir by
default) and, before 1.23, into the CNI conf dir (`ZZZ-istio-cni-kubeconfig`)."""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

RUN_DIR_KUBECONFIG = "istio-cni-kubeconfig"
CONF_DIR_KUBECONFIG = "ZZZ-istio-cni-kubeconfig"


def leftover_paths(run_dir: str, conf_dir: str) -> list[str]:
    return [os.path.join(run_dir, RUN_DIR_KUBECONFIG), os.path.join(conf_dir, CONF_DIR_KUBECONFIG)]


def remove_istio_leftovers(run_dir: str, conf_dir: str) -> list[str]:
    """Remove Istio's plugin kubeconfig wherever it is; the paths removed. A file we cannot
    remove is logged, never fatal: it stops nothing of ours from working."""
    removed = []
    for path in leftover_paths(run_dir, conf_dir):
        if not os.path.lexists(path):
            continue
        try:
            os.remove(path)
        except FileNotFoundError:
            continue
        except OSError as e:
            log.warning(
                "could not remove the kubeconfig Istio's node agent left for its plugin",
                extra={"fields": {"path": path, "error": e.strerror}},
            )
            continue
        log.info(
            "removed the kubeconfig Istio's node agent left for its plugin (ours replaces it)",
            extra={"fields": {"path": path}},
        )
        removed.append(path)
    return removed
