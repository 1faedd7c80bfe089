"""A runtime counts as started once its CRI answers (testbed/containerd.py cri_answers), not when
it lists its CRI plugin ok: containerd does that before its CRI server serves, and a kubelet
started in between exits at once ("server is not initialized")."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from testbed.containerd import cri_answers

VERSION = "/runtime.v1.RuntimeService/Version"


@contextmanager
def cri_server(socket: Path, answer: Callable[[bytes, Any], bytes]) -> Iterator[list[str]]:
    """A gRPC server on `socket` answering VERSION with `answer`; yields the methods called."""
    called: list[str] = []

    def version(request: bytes, context: Any) -> bytes:
        called.append(VERSION)
        return answer(request, context)

    handlers = {"Version": grpc.unary_unary_rpc_method_handler(version)}
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("runtime.v1.RuntimeService", handlers),)
    )
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield called
    finally:
        server.stop(None)


def test_a_cri_not_initialized_does_not_answer(tmp_path: Path) -> None:
    def not_initialized(request: bytes, context: Any) -> bytes:
        context.abort(grpc.StatusCode.UNKNOWN, "server is not initialized")
        raise AssertionError("abort returns only by raising")

    socket = tmp_path / "cri.sock"
    with cri_server(socket, not_initialized) as called:
        assert not cri_answers(socket)
    assert called == [VERSION]


def test_a_serving_cri_answers(tmp_path: Path) -> None:
    socket = tmp_path / "cri.sock"
    with cri_server(socket, lambda request, context: b"") as called:
        assert cri_answers(socket)
    assert called == [VERSION]


def test_no_socket_does_not_answer(tmp_path: Path) -> None:
    assert not cri_answers(tmp_path / "missing.sock", timeout=0.5)
