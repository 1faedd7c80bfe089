"""plugin.fastjson against json itself: the same objects, the same text, the same errors."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from plugin import fastjson

DOCUMENTS = [
    '{"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "istio-cni"}',
    ' \n\t{"a": [1, 2.5, -3e10, true, false, null, "\\u00e9\\ud83d\\ude00"]}\r\n',
    "[]",
    "{}",
    '"text"',
    "12",
    "-0.0",
    "1e400",
    "NaN",
    "-Infinity",
    "[Infinity]",
    '{"a": 1, "a": 2}',
    '{"nested": {"deep": [[[{"x": "y"}]]]}}',
]
INVALID = [
    "",
    " ",
    "{",
    '{"a": }',
    "[1,]",
    '{"a" 1}',
    "{'a': 1}",
    "[1] [2]",
    '{"a": 1} x',
    "nul",
    '"\\x"',
    '"unterminated',
    '"ctrl\x01char"',
    "\ufeff{}",
    "01",
    "[1 2]",
    '{"a":1,}',
]
BYTES = [
    b'{"a": "\xc3\xa9"}',
    b'\xef\xbb\xbf{"a": 1}',
    '{"a": 1}'.encode("utf-16"),
    '{"a": 1}'.encode("utf-16-le"),
    '{"a": 1}'.encode("utf-32"),
    b"\xff\xfe",
    b'{"a": "\xff"}',
    b"[1]",
    b"\x00",
    b'{"a": "\xed\xa0\x80"}',
    bytearray(b'{"b": [true]}'),
]


def outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except Exception as e:  # compared: same type and message
        return type(e).__name__, str(e)


def same(a: tuple[str, Any], b: tuple[str, Any]) -> bool:
    # NaN != NaN: compare the canonical text of results.
    return a[0] == b[0] and (a[0] != "ok" or json.dumps(a[1]) == json.dumps(b[1]))


@pytest.mark.parametrize("doc", [*DOCUMENTS, *INVALID, *BYTES])
def test_loads_matches_json(doc: str | bytes) -> None:
    assert same(outcome(fastjson.loads, doc), outcome(json.loads, doc))


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 4 else 5)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.randint(-(10**20), 10**20)
    if kind == 2:
        return rng.choice([rng.uniform(-1e9, 1e9), float("inf"), float("nan"), 0.1, -0.0])
    if kind in (3, 4):
        return "".join(
            chr(rng.choice([rng.randrange(32, 127), rng.randrange(0, 0x10FFFF)]))
            for _ in range(rng.randrange(6))
        )
    if kind == 5:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {
        random_value(rng, 9) if rng.random() < 0.1 else f"k{rng.randrange(5)}": random_value(
            rng, depth + 1
        )
        for _ in range(rng.randrange(4))
    }


def test_random_documents_round_trip_like_json() -> None:
    rng = random.Random(20261130)
    for _ in range(3000):
        value = random_value(rng)
        assert same(outcome(fastjson.dumps, value), outcome(json.dumps, value))
        compact = outcome(fastjson.dumps_compact, value)
        assert same(
            compact,
            outcome(lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=False), value),
        )
        if compact[0] == "ok":
            text = compact[1]
            assert same(outcome(fastjson.loads, text), outcome(json.loads, text))
            raw = text.encode("utf-8", "surrogatepass")
            assert same(outcome(fastjson.loads, raw), outcome(json.loads, raw))
            cut = text[: rng.randrange(len(text) + 1)]
            assert same(outcome(fastjson.loads, cut), outcome(json.loads, cut))


def test_unencodable_values_raise_what_json_raises() -> None:
    loop: list[Any] = []
    loop.append(loop)
    for value in (object(), {1j: 1}, {"a": {1, 2}}, loop, {(1, 2): 3}):
        assert outcome(fastjson.dumps, value) == outcome(json.dumps, value)
    # After an error the next call is clean (no stale circular-reference markers).
    assert fastjson.dumps([[1], [1]]) == json.dumps([[1], [1]])


def test_errors_in_a_process_that_never_imported_json() -> None:
    """The plugin's case: json is imported only on the error path."""
    import subprocess
    import sys
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[2])
    code = (
        f"import sys; sys.path.insert(0, {repo!r}); from plugin import fastjson\n"
        "assert 'json' not in sys.modules\n"
        "try:\n    fastjson.loads(b'{\"a\": tru}')\n"
        "except ValueError as e:\n    print(type(e).__name__, e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "JSONDecodeError Expecting value: line 1 column 7 (char 6)"
