"""Validated values: the only text the rule model holds and its renderers write.

Every value that reaches an `iptables-restore` or `nft -f` program is one of these `str`
subclasses, and each constructor refuses what its kind cannot be. No token holds whitespace, a
control character, a quote, `;`, `#`, `\\`, `$`, a brace or any character outside its kind's
small ASCII alphabet, so a token can end neither a word nor a line nor a command of either
program, and cannot open a comment, a string or an `include`. A `str` that is not a token is
refused by the model (agent.rules.model), so nothing unchecked can be rendered.

Being `str`, a token renders exactly as it is spelled: rules for valid input stay byte-equal to
Istio's. `Padded` keeps the spaces an operator wrote around a list item on `istio-iptables`'
command line (Istio writes them verbatim, `--dport  9000`): a token plus counts of spaces, never
other text.
"""

from __future__ import annotations

import ipaddress
import re
from typing import ClassVar, Self

from agent.errors import TokenError
from agent.excerpt import excerpt

MAX_TOKEN = 64
"""No token is longer (an IPv6 CIDR is at most 43 characters)."""


class Token(str):
    """Text checked by its class: an ASCII word from the class's alphabet, at most MAX_TOKEN."""

    __slots__ = ()
    kind: ClassVar[str] = "value"
    alphabet: ClassVar[re.Pattern[str]] = re.compile(r"[A-Za-z0-9_.:/,-]+")

    def __new__(cls, text: object) -> Self:
        if type(text) is cls:
            return text  # already checked
        if not isinstance(text, str):
            raise TokenError(f"{cls.kind}: want text, got {type(text).__name__}")
        if not text:
            raise TokenError(f"{cls.kind}: empty")
        if len(text) > MAX_TOKEN or not text.isascii() or not cls.alphabet.fullmatch(text):
            raise TokenError(f"{cls.kind}: {excerpt(text)} {cls.describe()}")
        cls.check(text)
        return super().__new__(cls, text)

    @classmethod
    def describe(cls) -> str:
        return "has characters a value of this kind cannot have"

    @classmethod
    def check(cls, text: str) -> None:
        """Raise TokenError when `text` (already in the alphabet) is not of this kind."""


class InterfaceName(Token):
    """A Linux interface name: 1-15 bytes, no `/`, `:`, whitespace or control character, not
    `.` or `..`; and, so that neither program reads it as anything but a name, only ASCII
    letters, digits, `_`, `.` and `-` (no iptables `+` wildcard, no nft metacharacter)."""

    __slots__ = ()
    kind = "interface name"
    alphabet = re.compile(r"[A-Za-z0-9_.-]{1,15}")

    @classmethod
    def describe(cls) -> str:
        return "is not 1-15 of A-Z a-z 0-9 _ . -"

    @classmethod
    def check(cls, text: str) -> None:
        if text in (".", ".."):
            raise TokenError(f"{cls.kind}: {excerpt(text)} is not a name")


def _decimal(text: str, kind: str, high: int) -> int:
    number = int(text)
    if number > high:
        raise TokenError(f"{kind}: {excerpt(text)} is out of range 0-{high}")
    return number


class Port(Token):
    """A port as decimal digits, 0-65535 (Istio's flags take 0; pods are held to 1-65535 by
    agent.podinput)."""

    __slots__ = ()
    kind = "port"
    alphabet = re.compile(r"[0-9]{1,5}")

    @classmethod
    def describe(cls) -> str:
        return "is not a number 0-65535"

    @classmethod
    def check(cls, text: str) -> None:
        _decimal(text, cls.kind, 65535)

    @property
    def number(self) -> int:
        return int(self)


class PortList(Token):
    """Ports joined by commas (a multiport match): each a Port."""

    __slots__ = ()
    kind = "port list"
    alphabet = re.compile(r"[0-9]{1,5}(,[0-9]{1,5}){0,14}")

    @classmethod
    def describe(cls) -> str:
        return "is not 1-15 ports joined by commas"

    @classmethod
    def check(cls, text: str) -> None:
        for item in text.split(","):
            Port(item)

    @classmethod
    def of(cls, ports: tuple[Port, ...]) -> PortList:
        return cls(",".join(ports))


class Id(Token):
    """A numeric user or group id, 0-4294967295, as decimal digits."""

    __slots__ = ()
    kind = "user/group id"
    alphabet = re.compile(r"[0-9]{1,10}")

    @classmethod
    def describe(cls) -> str:
        return "is not a number 0-4294967295"

    @classmethod
    def check(cls, text: str) -> None:
        _decimal(text, cls.kind, 0xFFFFFFFF)


class GroupName(Token):
    """A group by name (iptables resolves it) or by id: POSIX portable name characters."""

    __slots__ = ()
    kind = "group"
    alphabet = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}")

    @classmethod
    def describe(cls) -> str:
        return "is not a group name (A-Z a-z 0-9 _ . -, at most 32) or id"


_IP_CHARS = re.compile(r"[0-9A-Fa-f.:]+")


class Address(Token):
    """An IPv4 or IPv6 address as `ipaddress` parses it (no zone, no prefix)."""

    __slots__ = ()
    kind = "IP address"
    alphabet = _IP_CHARS

    @classmethod
    def describe(cls) -> str:
        return "is not an IP address"

    @classmethod
    def check(cls, text: str) -> None:
        try:
            ipaddress.ip_address(text)
        except ValueError:
            raise TokenError(f"{cls.kind}: {excerpt(text)} is not an IP address") from None

    @property
    def version(self) -> int:
        return ipaddress.ip_address(self).version


class Cidr(Token):
    """ADDRESS/BITS as `ipaddress` parses it (host bits may be set, as Istio keeps them)."""

    __slots__ = ()
    kind = "CIDR"
    alphabet = re.compile(r"[0-9A-Fa-f.:]+/[0-9]{1,3}")

    @classmethod
    def describe(cls) -> str:
        return "is not a CIDR (address/prefix-length)"

    @classmethod
    def check(cls, text: str) -> None:
        try:
            ipaddress.ip_interface(text)
        except ValueError:
            raise TokenError(f"{cls.kind}: {excerpt(text)} is not a CIDR") from None

    @property
    def version(self) -> int:
        return ipaddress.ip_interface(self).version


class Mark(Token):
    """A packet or connection mark, decimal or 0x hex, with an optional `/mask` (32 bits)."""

    __slots__ = ()
    kind = "mark"
    alphabet = re.compile(r"(0x[0-9a-f]{1,8}|[0-9]{1,10})(/(0x[0-9a-f]{1,8}|[0-9]{1,10}))?")

    @classmethod
    def describe(cls) -> str:
        return "is not a 32-bit mark (N or N/MASK, decimal or 0x hex)"

    @classmethod
    def check(cls, text: str) -> None:
        for part in text.split("/"):
            if int(part, 0 if part.startswith("0x") else 10) > 0xFFFFFFFF:
                raise TokenError(f"{cls.kind}: {excerpt(text)} is out of 32 bits")


class Zone(Token):
    """A conntrack zone, 0-65535."""

    __slots__ = ()
    kind = "conntrack zone"
    alphabet = re.compile(r"[0-9]{1,5}")

    @classmethod
    def check(cls, text: str) -> None:
        _decimal(text, cls.kind, 65535)


class ChainName(Token):
    """An iptables chain or verdict (`ISTIO_OUTPUT`, `PREROUTING`, `RETURN`): upper case."""

    __slots__ = ()
    kind = "chain"
    alphabet = re.compile(r"[A-Z][A-Z0-9_]{0,27}")

    @classmethod
    def describe(cls) -> str:
        return "is not an upper-case chain name"


class SetName(Token):
    """An ipset or nft set name."""

    __slots__ = ()
    kind = "set name"
    alphabet = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,30}")


class Word(Token):
    """A fixed word of a rule (a protocol, a module, conntrack states): from a closed list."""

    __slots__ = ()
    kind = "word"
    alphabet = re.compile(r"[A-Za-z,]+")
    WORDS: ClassVar[frozenset[str]] = frozenset(
        {"tcp", "udp", "INVALID", "RELATED,ESTABLISHED", "ESTABLISHED", "RELATED", "NEW"}
    )

    @classmethod
    def check(cls, text: str) -> None:
        if text not in cls.WORDS:
            raise TokenError(f"{cls.kind}: {excerpt(text)} is not one of {sorted(cls.WORDS)}")


MAX_PAD = 8


class Padded(str):
    """A token with the spaces written around it (an operator's `8080, 9090`): at most
    MAX_PAD spaces on each side, nothing but spaces. `token` is the value itself."""

    token: Token

    def __new__(cls, token: Token, lead: int = 0, trail: int = 0) -> Self:
        if not isinstance(token, Token):
            raise TokenError(f"padded value: want a token, got {type(token).__name__}")
        if not (0 <= lead <= MAX_PAD and 0 <= trail <= MAX_PAD):
            raise TokenError(f"padded value: at most {MAX_PAD} spaces around {excerpt(token)}")
        out = super().__new__(cls, " " * lead + token + " " * trail)
        out.token = token
        return out

    @classmethod
    def spelled(cls, kind: type[Token], text: str) -> Token | Padded:
        """`text` as written: a token of `kind`, with the spaces around it when there are any.
        Other whitespace (tabs, line breaks) is refused: it would end a word or a line."""
        core = text.strip(" ")
        token = kind(core)
        lead = len(text) - len(text.lstrip(" "))
        trail = len(text) - len(text.rstrip(" "))
        return token if not (lead or trail) else cls(token, lead, trail)


def canonical_cidr(item: str) -> Cidr:
    """The CIDR as Go's netip.Prefix prints it (host bits kept, IPv4-mapped as ::ffff:a.b.c.d)."""
    if "/" not in item:
        raise ValueError(f"{excerpt(item)} is not a CIDR (address/prefix-length)")
    if "%" in item:
        raise ValueError(f"{excerpt(item)}: zones are not allowed in a CIDR")
    try:
        net = ipaddress.ip_interface(item)
    except ValueError:
        raise ValueError(f"{excerpt(item)} is not a valid CIDR") from None
    return Cidr(f"{go_addr(net.ip)}/{net.network.prefixlen}")


def go_addr(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """An address as Go's netip.Addr.String() writes it: IPv4-mapped IPv6 keeps its dotted
    IPv4 tail (Python before 3.13 prints it as hex groups)."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        scope = f"%{addr.scope_id}" if addr.scope_id else ""
        return f"::ffff:{addr.ipv4_mapped}{scope}"
    return str(addr)


def core(value: Token | Padded) -> Token:
    """The token itself, without the spaces a Padded value keeps."""
    return value.token if isinstance(value, Padded) else value


TOKEN_KINDS: tuple[type[Token], ...] = (
    InterfaceName,
    Port,
    PortList,
    Id,
    GroupName,
    Address,
    Cidr,
    Mark,
    Zone,
    ChainName,
    SetName,
    Word,
)
"""Every kind of token (the property tests walk them all)."""
