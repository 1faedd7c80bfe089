"""The redirection annotation's PATCH as the API server answers it: a refusal names the API
server's reason, which reaches kubelet's Event for the failed sandbox."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent.ambient.annotator import StatusAnnotator
from agent.ambient.enrollment import annotation_patch
from agent.errors import MeshError
from agent.kube.rest import ApiError


class RefusingCore:
    """Answers every pods/status PATCH as the API server answers a refused one."""

    def __init__(self, error: ApiError) -> None:
        self.error = error

    def patch_namespaced_pod_status(self, *args: Any, **kwargs: Any) -> Any:
        raise self.error


def test_a_refused_patch_names_the_api_servers_reason() -> None:
    denied = "ValidatingAdmissionPolicy 'p' with binding 'p' denied request: not now"
    body = json.dumps({"kind": "Status", "message": denied}).encode()
    annotator = StatusAnnotator(RefusingCore(ApiError(422, "Unprocessable Entity", body)))
    with pytest.raises(MeshError) as err:
        annotator.patch("app", "web-0", annotation_patch("enabled"))
    assert str(err.value) == (
        'annotate pod app/web-0 ({"metadata":{"annotations":{"ambient.istio.io/redirection":'
        f'"enabled"}}}}}}): API server answered 422 Unprocessable Entity: {denied}'
    )


def test_an_answer_without_a_status_object_is_named_once() -> None:
    annotator = StatusAnnotator(RefusingCore(ApiError(500, "Internal Server Error")))
    with pytest.raises(MeshError) as err:
        annotator.patch("app", "web-0", annotation_patch("enabled"))
    assert str(err.value).endswith("API server answered 500 Internal Server Error")
