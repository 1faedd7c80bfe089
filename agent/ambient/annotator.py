"""The `ambient.istio.io/redirection` annotation as the mesh dataplane writes it: the `Annotator`
it needs, and the real one, which patches pods/status with Istio's merge patch."""

from __future__ import annotations

from typing import Any, Protocol

from agent.ambient.enrollment import AnnotationPatch
from agent.errors import ApiNotFound, KubeApiError, MeshError
from agent.kube import api


class Annotator(Protocol):
    def patch(self, namespace: str, name: str, patch: AnnotationPatch) -> None:
        """Apply the redirection annotation patch (pods/status, merge patch)."""
        ...


class StatusAnnotator:
    """The real annotator: `PATCH pods/<name>/status` with Istio's merge patch."""

    def __init__(self, core: Any, timeouts: api.Timeouts = api.DEFAULT_TIMEOUTS) -> None:
        self._core = core
        self._timeouts = timeouts

    def patch(self, namespace: str, name: str, patch: AnnotationPatch) -> None:
        try:
            api.call(
                self._core.patch_namespaced_pod_status,
                name,
                namespace,
                patch.body,
                _content_type=patch.content_type,
                timeout=self._timeouts.update(),
                raw=False,
            )
        except KubeApiError as e:
            if isinstance(e, ApiNotFound) and patch.ignore_not_found:
                return
            if not e.answered:
                raise  # no answer: the caller names the step, as for any other failure
            # The API server's own words say why (an admission policy's message, say); they
            # reach kubelet's FailedCreatePodSandBox Event through the failed ADD.
            why = f": {e.message}" if e.message != str(e.reason) else ""
            raise MeshError(
                f"annotate pod {namespace}/{name} ({patch.data.decode()}): {e}{why}"
            ) from e
