"""One error tree: every exception the agent defines is an AgentError, errors.py draws each of
its own, and the one retry-or-give-up axis is what the pod server turns into CNI codes."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import agent
from agent import errors
from agent.podserver.requests import FAILURE_REPLY
from plugin import wire


def agent_exceptions() -> list[type[BaseException]]:
    found = []
    for info in pkgutil.walk_packages(agent.__path__, "agent."):
        if info.name.endswith("zds_pb2"):
            continue
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == info.name:
                found.append(obj)
    return found


def test_every_exception_of_the_agent_is_in_the_tree() -> None:
    outside = [
        f"{e.__module__}.{e.__name__}"
        for e in agent_exceptions()
        if not issubclass(e, errors.AgentError) and not e.__name__.startswith("_")
    ]
    assert outside == []


def test_errors_py_draws_each_of_its_classes() -> None:
    doc = errors.__doc__ or ""
    own = [e for e in agent_exceptions() if e.__module__ == "agent.errors"]
    assert len(own) > 20
    assert [e.__name__ for e in own if e.__name__ not in doc] == []


def test_retry_later_is_one_axis_mapped_to_cni_codes_in_one_table() -> None:
    assert errors.retry_later(errors.ZtunnelPending("x"))
    assert errors.retry_later(errors.AmbientLookupError("x"))
    assert errors.retry_later(errors.ApiLookupError("x"))
    assert not errors.retry_later(errors.NonRetryableAdd("x"))
    assert not errors.retry_later(errors.InvalidPodInputError("x"))
    assert not errors.retry_later(KeyError("a bug"))  # not ours: give up
    not_found = errors.ApiNotFound(ValueError(), 404, "Not Found", answered=True)
    assert not errors.retry_later(not_found) and isinstance(not_found, errors.KubeApiError)
    assert FAILURE_REPLY == {True: (503, wire.TRY_AGAIN_LATER), False: (500, wire.INTERNAL)}
