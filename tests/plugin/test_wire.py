"""The shared wire format: builders and parsers agree, bad bodies are named precisely."""

from __future__ import annotations

import pytest

from plugin import framing, wire


def test_cni_request_round_trip() -> None:
    body = wire.cni_request(
        command="DEL",
        container_id="c",
        netns="",
        ifname="eth0",
        pod_name="p",
        pod_namespace="ns",
        pod_uid="",
        cni_version="0.4.0",
        prev_result={"cniVersion": "0.4.0"},
    )
    assert wire.parse_cni_request(wire.encode(body), command="DEL") == body


@pytest.mark.parametrize(
    ("body", "word"),
    [
        (b"nope", "not JSON"),
        (b"[]", "JSON object"),
        (b'{"command": "FOO"}', "command"),
        (b'{"command": "ADD", "containerId": 5}', "containerId"),
    ],
    ids=["not-json", "array", "command", "field-type"],
)
def test_cni_request_errors_name_the_field(body: bytes, word: str) -> None:
    with pytest.raises(wire.WireError, match=word):
        wire.parse_cni_request(body)


def test_command_must_match_path() -> None:
    body = wire.encode(
        wire.cni_request(
            command="ADD",
            container_id="c",
            netns="n",
            ifname="i",
            pod_name="p",
            pod_namespace="ns",
            pod_uid="u",
            cni_version="1.0.0",
            prev_result=None,
        )
    )
    with pytest.raises(wire.WireError, match="DEL path"):
        wire.parse_cni_request(body, command="DEL")


def test_gc_and_log_round_trip() -> None:
    gc = wire.gc_request([("a", "eth0")])
    assert wire.parse_gc_request(wire.encode(gc)) == gc
    line = wire.log_request(
        level="warn", msg="m", pod_name="p", pod_namespace="n", container_id="c"
    )
    assert wire.parse_log_request(wire.encode(line)) == line
    with pytest.raises(wire.WireError, match="level"):
        wire.parse_log_request(wire.encode({**line, "level": "loud"}))
    with pytest.raises(wire.WireError, match=r"validAttachments\[0\]"):
        wire.parse_gc_request(b'{"validAttachments": [{"containerId": 1}]}')


def test_replies() -> None:
    assert wire.parse_reply(wire.encode(wire.reply("skipped", "why"))) == {
        "result": "skipped",
        "reason": "why",
    }
    assert wire.parse_status_reply(wire.encode(wire.status_reply(False, "x"))) == {
        "ready": False,
        "reason": "x",
    }
    assert wire.parse_error_reply(b'{"code": true, "msg": ""}', 500) == {
        "code": 999,
        "msg": "agent answered HTTP 500",
        "details": "",
    }


def test_http_request_is_plain_http11() -> None:
    raw = framing.http_request("POST", "/v1/cni/add", b"{}")
    assert raw.startswith(b"POST /v1/cni/add HTTP/1.1\r\n")
    assert b"Content-Length: 2\r\n" in raw and raw.endswith(b"\r\n\r\n{}")


def _feed(data: bytes, size: int = 7):  # type: ignore[no-untyped-def]
    chunks = [data[i : i + size] for i in range(0, len(data), size)]
    return lambda n: chunks.pop(0) if chunks else b""


def test_chunked_response() -> None:
    data = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6;x=y\r\n world\r\n0\r\n\r\n"
    )
    response = framing.read_http_response(_feed(data))
    assert (response.status, response.body, response.truncated) == (200, b"hello world", False)


def test_response_without_length_reads_to_eof() -> None:
    response = framing.read_http_response(_feed(b'HTTP/1.0 503 No\r\n\r\n{"ready": false}'))
    assert response.status == 503 and response.body == b'{"ready": false}'


@pytest.mark.parametrize(
    "data",
    [b"", b"HTTP/1.1 200", b"hello\r\n\r\n", b"HTTP/1.1 OK x\r\n\r\n"],
    ids=["empty", "no-head-end", "no-status", "status-not-number"],
)
def test_malformed_responses(data: bytes) -> None:
    with pytest.raises(wire.WireError):
        framing.read_http_response(_feed(data))
