"""Seeded random capture configurations for `istio-iptables`, spelled every way Istio accepts.

A case is an argument list, an environment and the host it runs on (addresses of the network
namespace, its resolv.conf). Values are ones the real iptables would take; spellings vary: long
and short flags, `=` or a separate word, Go's bool spellings, environment variables (primary and
additional), repeated flags, spaces around list items, duplicates, IPv4-mapped IPv6 addresses.
The same seed always gives the same cases, so a failure replays from the seed printed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

TRUE_WORDS = ("1", "t", "T", "TRUE", "true", "True")
FALSE_WORDS = ("0", "f", "F", "FALSE", "false", "False")


@dataclass(frozen=True)
class Host:
    """The namespace a case runs in: links with their addresses, and the resolv.conf text."""

    links: tuple[tuple[str, tuple[str, ...]], ...]
    """(name, addresses with prefix); name `lo` adds to the loopback device, others are dummies."""
    resolv_conf: str


@dataclass
class Case:
    index: int
    argv: list[str]
    env: dict[str, str]
    host: int
    """Index of the case's Host in the run's host list."""
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Opt:
    name: str
    short: str | None
    env: tuple[str, ...]
    kind: str
    """What values to draw: port, ports, ids, ifaces, cidrs, mode, mark, table, bool, uint16,
    duration, binary, netns."""


def _env(name: str) -> tuple[str, ...]:
    return (name.upper().replace("-", "_"),)


OPTS: tuple[Opt, ...] = (
    Opt("envoy-port", "p", (), "port"),
    Opt("inbound-capture-port", "z", _env("inbound-capture-port"), "port"),
    Opt("inbound-tunnel-port", "e", _env("inbound-tunnel-port"), "port"),
    Opt("proxy-uid", "u", _env("proxy-uid"), "ids"),
    Opt("proxy-gid", "g", _env("proxy-gid"), "ids"),
    Opt("istio-inbound-interception-mode", "m", _env("istio-inbound-interception-mode"), "mode"),
    Opt("istio-inbound-ports", "b", _env("istio-inbound-ports"), "ports*"),
    Opt("istio-local-exclude-ports", "d", _env("istio-local-exclude-ports"), "ports"),
    Opt("istio-exclude-interfaces", "c", _env("istio-exclude-interfaces"), "ifaces"),
    Opt("istio-service-cidr", "i", _env("istio-service-cidr"), "cidrs*"),
    Opt("istio-service-exclude-cidr", "x", _env("istio-service-exclude-cidr"), "cidrs"),
    Opt("istio-outbound-ports", "q", _env("istio-outbound-ports"), "ports"),
    Opt(
        "istio-local-outbound-ports-exclude",
        "o",
        _env("istio-local-outbound-ports-exclude"),
        "ports",
    ),
    Opt("kube-virt-interfaces", "k", _env("kube-virt-interfaces"), "ifaces"),
    Opt("istio-inbound-tproxy-mark", "t", _env("istio-inbound-tproxy-mark"), "mark"),
    Opt("istio-inbound-tproxy-route-table", "r", _env("istio-inbound-tproxy-route-table"), "table"),
    Opt("iptables-probe-port", None, _env("iptables-probe-port"), "uint16"),
    Opt("probe-timeout", None, _env("probe-timeout"), "duration"),
    Opt("skip-rule-apply", None, _env("skip-rule-apply"), "rarebool"),
    Opt("run-validation", None, _env("run-validation"), "falsebool"),
    Opt("redirect-dns", None, ("REDIRECT_DNS", "ISTIO_META_DNS_CAPTURE"), "bool"),
    Opt("drop-invalid", None, ("DROP_INVALID", "INVALID_DROP"), "bool"),
    Opt("dual-stack", None, ("DUAL_STACK", "ISTIO_DUAL_STACK"), "bool"),
    Opt("capture-all-dns", None, _env("capture-all-dns"), "bool"),
    Opt("network-namespace", None, _env("network-namespace"), "netns"),
    Opt("cni-mode", None, _env("cni-mode"), "bool"),
    Opt("reconcile", None, _env("reconcile"), "bool"),
    Opt("cleanup-only", None, _env("cleanup-only"), "rarebool"),
    Opt("force-apply", None, _env("force-apply"), "bool"),
    Opt("force-iptables-binary", None, _env("force-iptables-binary"), "binary"),
)
"""Every flag of istio-iptables except --dry-run (always on) and --native-nftables (its own
mode, compared by the nftables differential)."""

IFACES = ("eth0", "eth1", "net1", "veth-ab12", "tap0", "ens3.100", "k-virt_1")
V4_CIDRS = (
    "10.0.0.0/8",
    "10.96.0.0/12",
    "172.16.0.0/16",
    "192.168.1.0/24",
    "0.0.0.0/0",
    "1.2.3.4/32",
    "127.0.0.1/32",
    "127.0.0.0/8",
    "10.1.2.3/16",
    "169.254.169.254/32",
    "100.64.0.0/10",
)
V6_CIDRS = (
    "fd00::/8",
    "2001:db8::/32",
    "::/0",
    "::1/128",
    "fd00:10:96::/112",
    "2001:DB8::1/128",
    "fe80::/10",
    "2001:db8:0:0:0:0:0:1/64",
)
MAPPED_CIDRS = (
    "::ffff:10.0.0.0/104",
    "::ffff:127.0.0.1/128",
    "::ffff:192.168.0.1/128",
    "::ffff:0:0/96",
)
USERS = ("istio-proxy", "root", "nobody", "daemon", "no-such-user")


class Generator:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    # --- hosts ----------------------------------------------------------------------------
    def hosts(self, count: int) -> list[Host]:
        return [self._host() for _ in range(count)]

    def _host(self) -> Host:
        r = self.rng
        links: list[tuple[str, tuple[str, ...]]] = []
        if r.random() < 0.25:
            links.append(
                (
                    "lo",
                    tuple(
                        r.sample(["fd00::1/128", "10.9.9.9/32", "2001:db8::9/128"], r.randint(1, 2))
                    ),
                )
            )
        # Mostly hosts with a usable address: without one istio-iptables (and `rules`) refuse.
        for n in range(r.choice((0, 1, 1, 1, 1, 2, 2))):
            pool = [
                f"10.244.0.{r.randint(2, 250)}/24",
                f"fd00:10:244::{r.randint(2, 999):x}/64",
                f"192.168.{n}.7/16",
                f"2001:db8:{r.randint(1, 99):x}::5/64",
                "169.254.3.3/16",
            ]
            links.append((f"eth{n}", tuple(r.sample(pool, r.randint(r.random() < 0.9, 3)))))
        return Host(tuple(links), self._resolv_conf())

    def _resolv_conf(self) -> str:
        r = self.rng
        lines = []
        servers = [
            "10.96.0.10",
            "192.168.0.1",
            "fd00:10:96::a",
            "FD00:10:96::A",
            "8.8.8.8",
            "2001:4860:4860:0:0:0:0:8888",
            "127.0.0.53",
            "::1",
            "::ffff:10.0.0.1",
        ]
        for _ in range(r.randint(0, 4)):
            server = r.choice(servers)
            form = r.random()
            if form < 0.6:
                lines.append(f"nameserver {server}")
            elif form < 0.7:
                lines.append(f"nameserver\t{server}  # cluster DNS")
            elif form < 0.8:
                lines.append(f"nameserver {server}#comment")
            elif form < 0.9:
                lines.append(f"# nameserver {server}")
            else:
                lines.append(f"  nameserver {server} ")
        if r.random() < 0.5:
            lines.insert(0, "search default.svc.cluster.local svc.cluster.local cluster.local")
        if r.random() < 0.3:
            lines.append("options ndots:5")
        return "".join(line + "\n" for line in lines)

    # --- cases ----------------------------------------------------------------------------
    def case(self, index: int, hosts: int) -> Case:
        r = self.rng
        argv: list[str] = []
        env: dict[str, str] = {}
        argv += self._dry_run()
        for opt in OPTS:
            if r.random() < 0.35:
                self._set(opt, argv, env)
        if r.random() < 0.2:
            env["ISTIO_OUTBOUND_OWNER_GROUPS"] = self._groups(include=True)
        if r.random() < 0.2:
            env["ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE"] = self._groups(include=False)
        if r.random() < 0.1:
            env["ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR"] = r.choice(
                ("127.0.0.1/32", "127.0.0.0/8", "127.0.0.1/8", "127.10.0.0/16", "127.0.0.1/24")
            )
        if r.random() < 0.2:
            env["ENVOY_USER"] = r.choice(USERS)
        return Case(index, argv, env, r.randrange(hosts))

    def _dry_run(self) -> list[str]:
        forms = (
            ["-n"],
            ["--dry-run"],
            ["--dry-run=" + self.rng.choice(TRUE_WORDS)],
            ["-n=" + self.rng.choice(TRUE_WORDS)],
        )
        return list(self.rng.choice(forms))

    def _set(self, opt: Opt, argv: list[str], env: dict[str, str]) -> None:
        r = self.rng
        where = r.random()
        if opt.env and where < 0.3:
            for var in r.sample(opt.env, r.randint(1, len(opt.env))):
                env[var] = self._value(opt.kind)
            if r.random() < 0.3:  # a flag given as well wins over the variables
                argv += self._spell(opt, self._value(opt.kind))
            return
        argv += self._spell(opt, self._value(opt.kind))
        if r.random() < 0.08:  # repeated: the last one wins
            argv += self._spell(opt, self._value(opt.kind))

    def _spell(self, opt: Opt, value: str) -> list[str]:
        r = self.rng
        if opt.kind.endswith("bool") and value in TRUE_WORDS and r.random() < 0.4:
            return [f"--{opt.name}"]
        forms: list[list[str]] = [[f"--{opt.name}={value}"]]
        if not opt.kind.endswith("bool"):
            forms.append([f"--{opt.name}", value])
        if opt.short:
            forms.append([f"-{opt.short}", value])
            if value:  # pflag reads a bare `-s=` as the value "="
                forms.append([f"-{opt.short}={value}"])
            if value and not value.startswith("="):
                forms.append([f"-{opt.short}{value}"])
        return r.choice(forms)

    def _value(self, kind: str) -> str:
        r = self.rng
        if kind == "port":
            return r.choice(("15001", "15006", "15008", "8080", "80", "0", "65535", "15021"))
        if kind in ("ports", "ports*"):
            if kind == "ports*" and r.random() < 0.35:
                return r.choice(("*", "*"))
            return self._list(
                [
                    str(r.choice((22, 53, 80, 443, 3306, 8080, 9090, 15020, 65535)))
                    for _ in range(r.randint(0, 4))
                ]
            )
        if kind == "ids":
            return self._list(
                [
                    str(r.choice((0, 1337, 1000, 101, 65534, 4294967295)))
                    for _ in range(r.randint(0, 3))
                ]
            )
        if kind == "ifaces":
            return self._list(r.sample(IFACES, r.randint(0, 3)))
        if kind in ("cidrs", "cidrs*"):
            if kind == "cidrs*" and r.random() < 0.3:
                return "*"
            pool = V4_CIDRS + V6_CIDRS + (MAPPED_CIDRS if r.random() < 0.3 else ())
            return ",".join(r.choice(pool) for _ in range(r.randint(0, 4)))
        if kind == "mode":
            return r.choice(("REDIRECT", "TPROXY", "", "TPROXY"))
        if kind == "mark":
            return r.choice(("1337", "1", "4294967295", "42"))
        if kind == "table":
            return r.choice(("133", "1", "200", "65535"))
        if kind in ("bool", "rarebool"):
            on = r.random() < (0.5 if kind == "bool" else 0.1)
            return r.choice(TRUE_WORDS if on else FALSE_WORDS)
        if kind == "falsebool":
            return r.choice(FALSE_WORDS)
        if kind == "uint16":
            return r.choice(("15002", "0", "65535", "0x10", "1_000", "017"))
        if kind == "duration":
            return r.choice(("5s", "1m30s", "0", "250ms", "1.5h", "-1s"))
        if kind == "binary":
            return r.choice(("", "legacy", "nft"))
        if kind == "netns":
            return r.choice(("", "/var/run/netns/pod", "/proc/1/ns/net"))
        raise AssertionError(kind)

    def _list(self, items: list[str]) -> str:
        """A comma list as people write it: sometimes spaces after commas, duplicates, a stray
        trailing comma."""
        r = self.rng
        if items and r.random() < 0.1:
            items.append(r.choice(items))
        sep = ", " if r.random() < 0.1 else ","
        text = sep.join(items)
        if items and r.random() < 0.05:
            text = " " + text
        if r.random() < 0.05:
            text += ","
        return text

    def _groups(self, *, include: bool) -> str:
        r = self.rng
        if include and r.random() < 0.4:
            return "*"
        return self._list(
            r.sample(["1337", "101", "root", "daemon", "65534", "0"], r.randint(0, 3))
        )
