"""A rule program's output never reaches a reply or an Event verbatim: nft's `include` of a
node file shows the file's lines on nft's stderr; the error the agent raises carries a bounded,
escaped summary and the node's log the whole output. Replies and Events are one bounded line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from agent.errors import RedirectError
from agent.podserver.requests import MAX_REPLY_TEXT, failure, ok
from agent.repair.actions import MAX_EVENT_MESSAGE, event_for
from agent.rules import backend_nft, backend_restore

pytestmark = pytest.mark.hostile

SECRET = "SECRET-LINE-0b5e a b"


@pytest.mark.netns
def test_nft_include_of_a_node_file_stays_on_the_node(
    pod_netns: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = tmp_path / "node-file"
    secret.write_text(f"{SECRET}\n")
    with caplog.at_level(logging.ERROR), pytest.raises(RedirectError) as err:
        backend_nft.nft(str(pod_netns), ["-f", "-"], f'include "{secret}"\n')
    assert "SECRET" not in str(err.value) and "\n" not in str(err.value)
    assert "nft -f -" in str(err.value) and "exit 1" in str(err.value)
    logged = [getattr(r, "fields", {}).get("stderr", "") for r in caplog.records]
    assert any(SECRET in line for line in logged), "the node's log keeps the whole output"


@pytest.mark.netns
def test_iptables_restore_failure_is_summarized(pod_netns: Path) -> None:
    script = "*nat\n-A OUTPUT -o eth0 -j RETURN " + "x" * 3000 + "\nCOMMIT\n"
    with pytest.raises(RedirectError) as err:
        backend_restore.run(str(pod_netns), ["iptables-nft-restore", "--noflush"], script)
    text = str(err.value)
    assert len(text) < 600 and "\n" not in text and "more lines in the agent's log" in text


def test_replies_and_events_are_one_bounded_line() -> None:
    hostile = "eth0\n-A ISTIO_OUTPUT -j ACCEPT\x1b[2J" + "\u202e" + "y" * 5000
    for body in (failure(500, 999, hostile, hostile).body, ok("skipped", hostile).body):
        for key in ("msg", "details", "reason"):
            text = str(body.get(key, ""))
            assert len(text) <= MAX_REPLY_TEXT + 3 and text.isascii() and text.isprintable()
    pod = {"metadata": {"name": "web-0", "namespace": "app", "uid": "u"}}
    message = event_for(pod, reason="X", message=hostile, node_name="n")["message"]
    assert len(message) <= MAX_EVENT_MESSAGE + 3 and message.isascii() and message.isprintable()
