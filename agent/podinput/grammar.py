"""What each kind of pod-controlled value may be: text in, tokens (or a plain answer) out.

Each function raises ValueError with a short reason; agent.podinput.pod names the input and
shows an excerpt of the value. Where Istio checks a value its check is kept (so every valid
input gives Istio's rules) and tightened where Istio lets garbage through; README.md lists each
input and each difference.
"""

from __future__ import annotations

import re
from typing import Literal

from agent import constants
from agent.errors import TokenError
from agent.excerpt import excerpt
from agent.podinput.tokens import Address, Cidr, Id, InterfaceName, Port, canonical_cidr

InterceptionMode = Literal["REDIRECT", "TPROXY"]
Wildcard = Literal["*"]
WILDCARD: Wildcard = "*"

MAX_LIST_ITEMS = 64
"""Items in one list value (ports, CIDRs, interfaces): each is one rule or more."""
WORD = re.compile(r"[A-Za-z0-9._-]{0,63}")
"""A value only compared, never written anywhere (a boolean, a switch): a Kubernetes label
value's characters and length. Istio reads such values as it pleases; text outside this shape
is refused here rather than ignored."""
INTERFACE_START = re.compile(r"[A-Za-z]")
"""Istio's sidecar check: an interface name starts with a letter (ambient's is held to it too)."""

GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
ALWAYS_EXCLUDED_INBOUND = tuple(Port(p) for p in constants.ALWAYS_EXCLUDED_INBOUND)


def word(value: str) -> str:
    """A value that is only compared: at most 63 of A-Z a-z 0-9 `.` `_` `-` (may be empty)."""
    if not WORD.fullmatch(value):
        raise ValueError("want at most 63 of A-Z a-z 0-9 . _ - (a label value's shape)")
    return value


def go_bool(value: str) -> bool | None:
    """Go's strconv.ParseBool of a word; None for any other word (Istio ignores those)."""
    word(value)
    if value in GO_TRUE:
        return True
    if value in GO_FALSE:
        return False
    return None


def parse_bool(text: str) -> bool:
    """Go's strconv.ParseBool, as flags and settings take it: any other text is an error."""
    if text in GO_TRUE:
        return True
    if text in GO_FALSE:
        return False
    raise ValueError(f"{text!r} is not a boolean (true/false/1/0)")


def interception_mode(value: str) -> InterceptionMode:
    if value == "TPROXY":
        return "TPROXY"
    if value != "REDIRECT":
        raise ValueError("interception mode must be REDIRECT or TPROXY")
    return "REDIRECT"


def _items(value: str) -> list[str]:
    items = value.split(",")
    if len(items) > MAX_LIST_ITEMS:
        raise ValueError(f"more than {MAX_LIST_ITEMS} items")
    return items


def port(item: str) -> Port:
    """A port 1-65535, canonical decimal (no sign, no leading zero, ASCII digits only)."""
    text = item.strip(" ")
    if not (text.isascii() and text.isdigit()) or (len(text) > 1 and text[0] == "0"):
        raise ValueError(f"port {excerpt(item)} is not a number 1-65535")
    if not 1 <= int(text) <= 65535:
        raise ValueError(f"port {excerpt(item)} is out of range 1-65535")
    return Port(text)


def ports(value: str) -> tuple[Port, ...]:
    """Istio's port list: comma separated, each item trimmed of spaces, none empty. `*` and a
    value of blanks pass Istio's check and then fail its iptables run: both refused here."""
    if value == WILDCARD:
        raise ValueError("'*' is not allowed here (iptables rejects '--dport *')")
    if not value:
        return ()
    if not value.strip(" "):
        raise ValueError("no port in a value of blanks (iptables rejects '--dport' without one)")
    return tuple(port(item) for item in _items(value.strip(" ")))  # repeats: one rule each


def ports_or_wildcard(value: str) -> tuple[Port, ...] | Wildcard:
    return WILDCARD if value == WILDCARD else ports(value)


def trimmed_ports(value: str) -> tuple[Port, ...]:
    """excludeInboundPorts: Istio trims the whole value, appends its own ports, then drops
    repeats of an item as written (`9000,9000`: one rule; `9000, 9000`: two)."""
    text = value.strip(" ")
    listed = [*ports(text), *ALWAYS_EXCLUDED_INBOUND]
    written = [*(text.split(",") if text else []), *ALWAYS_EXCLUDED_INBOUND]
    return tuple(p for i, p in enumerate(listed) if written[i] not in written[:i])


def cidrs(value: str) -> tuple[Cidr, ...]:
    """Istio's CIDR list: comma separated, nothing trimmed, each a Go netip prefix."""
    if not value:
        return ()
    return tuple(prefix(item) for item in _items(value))


def cidrs_or_wildcard(value: str) -> tuple[Cidr, ...] | Wildcard:
    return WILDCARD if value == WILDCARD else cidrs(value)


def prefix(item: str) -> Cidr:
    """Go's netip.ParsePrefix: address/bits, no zone, bits decimal without a leading zero."""
    address, slash, bits = item.rpartition("/")
    if not slash:
        raise ValueError(f"{excerpt(item)} is not a CIDR (no '/')")
    if "%" in address:
        raise ValueError(f"{excerpt(item)}: zones are not allowed in a CIDR")
    ip = ip_address(address)
    if not (bits.isascii() and bits.isdigit()) or (len(bits) > 1 and bits[0] == "0"):
        raise ValueError(f"{excerpt(item)}: bad prefix length {excerpt(bits)}")
    if int(bits) > (32 if ip.version == 4 else 128):
        raise ValueError(f"{excerpt(item)}: prefix length out of range")
    return canonical_cidr(item)


def ip_address(value: str) -> Address:
    try:
        return Address(value)
    except TokenError:
        raise ValueError(f"{excerpt(value)} is not an IP address") from None


def interfaces(value: str, *, skip_empty: bool = False) -> tuple[InterfaceName, ...]:
    """An interface list: comma separated, items trimmed of spaces, none empty (`skip_empty`:
    empty items are dropped, as Istio's ambient mode drops them); each a Linux name
    (agent.podinput.tokens.InterfaceName) that starts with a letter, as Istio's sidecar check
    wants (Istio's ambient mode checks nothing)."""
    if not value:
        return ()
    names: list[InterfaceName] = []
    for item in _items(value):
        name = item.strip(" ")
        if not name and skip_empty:
            continue
        if not name:
            raise ValueError("empty interface name")
        if len(name.encode()) > 15:
            raise ValueError(f"interface name {excerpt(name)} too long (max 15 bytes)")
        if not INTERFACE_START.match(name):
            raise ValueError(f"interface name {excerpt(name)} must start with a letter")
        try:
            names.append(InterfaceName(name))
        except TokenError:
            why = f"interface name {excerpt(name)} contains invalid characters"
            raise ValueError(why) from None
    return tuple(names)


def run_as(value: object) -> Id | None:
    """runAsUser / runAsGroup of the proxy container: an integer 0-4294967295 (None: unset).
    Istio reads the field as a Go integer; anything else is refused here, not defaulted."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("want an integer")
    if not 0 <= value <= 0xFFFFFFFF:
        raise ValueError("out of range 0-4294967295")
    return Id(str(value))
