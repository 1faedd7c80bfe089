"""agent.kube.api, the boundary to the Kubernetes API: what a failure becomes, what a call is
given, and the timeouts from the settings."""

from __future__ import annotations

import json
from typing import Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from agent.config import KubeApiSettings
from agent.errors import AgentError, ApiConflict, ApiForbidden, ApiGone, ApiNotFound, KubeApiError
from agent.kube import api


class Response:
    def __init__(self, data: bytes) -> None:
        self.data = data


def failing(error: BaseException) -> Any:
    def call(*args: Any, **kw: Any) -> Any:
        raise error

    return call


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (404, ApiNotFound),
        (401, ApiForbidden),
        (403, ApiForbidden),
        (409, ApiConflict),
        (422, ApiConflict),
        (410, ApiGone),
        (500, KubeApiError),
        (503, KubeApiError),
    ],
)
def test_an_answer_becomes_the_error_of_its_status(status: int, kind: type) -> None:
    cause = ApiException(status=status, reason="Because")
    with pytest.raises(KubeApiError) as err:
        api.call(failing(cause), timeout=1.0)
    assert type(err.value) is kind and isinstance(err.value, AgentError)
    assert (err.value.status, err.value.reason, err.value.answered) == (status, "Because", True)
    assert str(err.value) == f"API server answered {status} Because"
    assert err.value.cause is cause and api.original(err.value) is cause


@pytest.mark.parametrize(
    "cause",
    [urllib3.exceptions.ProtocolError("connection aborted"), ConnectionRefusedError("refused")],
    ids=["urllib3", "oserror"],
)
def test_no_answer_is_retry_later_in_the_transports_words(cause: BaseException) -> None:
    with pytest.raises(KubeApiError) as err:
        api.call(failing(cause), timeout=1.0)
    assert type(err.value) is KubeApiError
    assert not err.value.answered and err.value.status is None
    assert str(err.value) == str(cause)


def test_an_answer_that_is_not_json_is_retry_later() -> None:
    with pytest.raises(KubeApiError) as err:
        api.get_json(lambda **kw: Response(b"<html>"), timeout=1.0)
    assert not err.value.answered and isinstance(err.value.cause, ValueError)


def test_the_call_is_raw_with_the_timeout_and_decoded() -> None:
    seen: dict[str, Any] = {}

    def read(name: str, **kw: Any) -> Response:
        seen.update(kw, name=name)
        return Response(json.dumps({"metadata": {"name": name}}).encode())

    assert api.get_json(read, "p", timeout=(2.0, 5)) == {"metadata": {"name": "p"}}
    assert seen == {"name": "p", "_preload_content": False, "_request_timeout": (2.0, 5)}
    seen.clear()
    api.call(read, "q", timeout=3.0, raw=False)
    assert "_preload_content" not in seen


def test_the_api_servers_message_is_read_from_its_status_object() -> None:
    cause = ApiException(status=422, reason="Unprocessable Entity")
    cause.body = json.dumps({"message": "the test failed"})
    assert ApiConflict(cause, 422, cause.reason).message == "the test failed"
    plain = ApiException(status=409, reason="Conflict")
    assert ApiConflict(plain, 409, "Conflict").message == "Conflict"


def test_timeouts_come_from_the_settings() -> None:
    default = api.DEFAULT_TIMEOUTS
    assert (default.lookup(), default.update(), default.list(), default.node()) == (
        (2.0, 5),
        (2.0, 10),
        (5.0, 60),
        (5.0, 15),
    )
    assert (default.stop(), default.readiness(), default.watch(240)) == (5.0, 3.0, (5.0, 130.0))
    mine = api.Timeouts(KubeApiSettings(lookupTimeoutSeconds=1, stopTimeoutSeconds=30))
    assert (mine.lookup(), mine.stop()) == ((2.0, 1), 30.0)
