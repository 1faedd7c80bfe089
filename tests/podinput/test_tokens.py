"""The rule model holds no unchecked text: a property test over every token kind, and the
model's constructors refusing plain strings and tokens of the wrong kind."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.errors import TokenError
from agent.podinput.tokens import (
    TOKEN_KINDS,
    Address,
    ChainName,
    Cidr,
    Id,
    InterfaceName,
    Mark,
    Padded,
    Port,
    Token,
)
from agent.rules.model import Match, Rule, Target, check_nft_rule

pytestmark = pytest.mark.hostile

BREAKERS = " \t\n\r\x0b\x0c\x00\x1b\x7f\x85\xa0\u2028\u3000\"';#\\$`{}<>|&*?!()[]"
"""Whitespace (ASCII and Unicode), control characters, quotes and the metacharacters of
iptables-restore, nft and the shell."""

VALID: dict[type[Token], str] = {
    InterfaceName: "eth0",
    Port: "15001",
    Id: "1337",
    Address: "fd00::1",
    Cidr: "10.0.0.0/8",
    Mark: "0x539/0xfff",
    ChainName: "ISTIO_OUTPUT",
}


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(TOKEN_KINDS),
    head=st.text(max_size=20),
    breaker=st.sampled_from(BREAKERS) | st.characters(categories=["Cc", "Zs", "Zl", "Zp"]),
    tail=st.text(max_size=20),
)
def test_no_token_holds_whitespace_or_a_control_character(
    kind: type[Token], head: str, breaker: str, tail: str
) -> None:
    """Whatever surrounds it, a value with whitespace, a control character, a quote or a
    metacharacter is no token of any kind."""
    with pytest.raises(TokenError):
        kind(head + breaker + tail)


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(TOKEN_KINDS), text=st.text(min_size=1, max_size=80))
def test_every_token_is_a_plain_ascii_word(kind: type[Token], text: str) -> None:
    """What a constructor accepts is short printable ASCII without a space, and itself."""
    try:
        token = kind(text)
    except TokenError:
        return
    assert token == text and token.isascii() and token.isprintable()
    assert not any(ch.isspace() for ch in token) and len(token) <= 64


@settings(max_examples=100, deadline=None)
@given(kind=st.sampled_from(TOKEN_KINDS), value=st.integers() | st.none() | st.binary())
def test_tokens_take_only_text(kind: type[Token], value: object) -> None:
    with pytest.raises(TokenError):
        kind(value)


@pytest.mark.parametrize("kind", list(VALID), ids=lambda kind: kind.__name__)
def test_valid_values_are_kept_as_spelled(kind: type[Token]) -> None:
    assert str(kind(VALID[kind])) == VALID[kind]


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        (InterfaceName, "a" * 16),
        (InterfaceName, "."),
        (InterfaceName, ".."),
        (InterfaceName, "eth/0"),
        (InterfaceName, "eth:0"),
        (InterfaceName, "eth+"),
        (InterfaceName, "asd^&&*$&*(#"),
        (Port, "65536"),
        (Port, "+80"),
        (Port, "\uff18\uff10"),
        (Id, "4294967296"),
        (Address, "10.0.0.1/8"),
        (Address, "fe80::1%eth0"),
        (Cidr, "10.0.0.1"),
        (Cidr, "10.0.0.0/33"),
        (Mark, "0x1ffffffff"),
        (ChainName, "istio_output"),
    ],
)
def test_kind_limits(kind: type[Token], value: str) -> None:
    with pytest.raises(TokenError):
        kind(value)


def test_padded_keeps_only_spaces_around_a_token() -> None:
    padded = Padded.spelled(Port, " 9000 ")
    assert isinstance(padded, Padded) and padded == " 9000 " and padded.token == "9000"
    assert type(Padded.spelled(Port, "9000")) is Port
    for text in ("\t9000", "9000\n", " 90 00"):
        with pytest.raises(TokenError):
            Padded.spelled(Port, text)
    with pytest.raises(TokenError):
        Padded("9000", 1, 0)  # type: ignore[arg-type]  # a plain string is no token


@pytest.mark.parametrize(
    "build",
    [
        lambda: Match("in", "eth0"),  # type: ignore[arg-type]
        lambda: Match("in", Port("80")),
        lambda: Match("dst", InterfaceName("eth0")),
        lambda: Match("dport", "80 -j ACCEPT"),  # type: ignore[arg-type]
        lambda: Target("jump", "ACCEPT"),  # type: ignore[arg-type]
        lambda: Target("redirect", Id("15001")),
        lambda: Rule("nat", "OUTPUT", (), Target("jump", ChainName("RETURN"))),  # type: ignore[arg-type]
        lambda: Rule("filter", ChainName("OUTPUT"), (), Target("jump", ChainName("RETURN"))),  # type: ignore[arg-type]
    ],
    ids=[
        "plain-interface",
        "port-as-interface",
        "interface-as-cidr",
        "plain-port",
        "plain-chain",
        "id-as-port",
        "plain-rule-chain",
        "unknown-table",
    ],
)
def test_model_refuses_unchecked_values(build: object) -> None:
    with pytest.raises(TypeError):
        build()  # type: ignore[operator]


@pytest.mark.parametrize(
    "expr",
    [
        'iifname "eth0" counter return',
        "iifname eth0 counter return\nflush ruleset",
        "iifname eth0; flush ruleset",
        "iifname eth0 # comment",
        "iifname eth0 \\",
        "iifname $x counter return",
    ],
)
def test_nft_rules_refuse_what_ours_never_hold(expr: str) -> None:
    with pytest.raises(TypeError):
        check_nft_rule("prerouting", expr)
