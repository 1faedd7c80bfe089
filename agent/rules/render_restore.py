"""Render the rule model as `iptables-restore` input, spelled exactly as Istio writes it.

`render(ruleset)` is what `istio-cni-agent rules` prints and what the restore backends feed to
`iptables-restore --noflush`: for each table `* name`, `-N` lines for our chains, the rule
operations (`-A`/`-I`) in order, `COMMIT`; IPv4 tables then IPv6 tables.
"""

from __future__ import annotations

from typing import assert_never

from agent.rules.model import Match, Rule, RuleSet, TableRules, Target


def render(ruleset: RuleSet) -> str:
    return render_tables(ruleset.v4) + render_tables(ruleset.v6)


def render_tables(tables: tuple[TableRules, ...]) -> str:
    lines: list[str] = []
    for table in tables:
        lines.append(f"* {table.name}")
        lines.extend(f"-N {chain}" for chain in table.chains)
        lines.extend(rule_line(rule) for rule in table.rules)
        lines.append("COMMIT")
    return "".join(line + "\n" for line in lines)


def rule_line(rule: Rule) -> str:
    head = f"-A {rule.chain}" if rule.insert_at is None else f"-I {rule.chain} {rule.insert_at}"
    return " ".join([head, *rule_spec(rule)])


def rule_spec(rule: Rule) -> list[str]:
    """The rule without its `-A CHAIN` head: matches then target."""
    words: list[str] = []
    for match in rule.matches:
        words.extend(match_words(match))
    words.extend(target_words(rule.target))
    return words


def match_words(m: Match) -> list[str]:
    neg = ["!"] if m.negate else []
    kind = m.kind
    match kind:
        case "proto":
            return [*neg, "-p", m.value]
        case "in" | "out" | "src" | "dst":
            flag = {"in": "-i", "out": "-o", "src": "-s", "dst": "-d"}[kind]
            return [*neg, flag, m.value]
        case "dport":
            return [*neg, "--dport", m.value]
        case "sport":
            return [*neg, "--sport", m.value]
        case "dports":
            return ["-m", "multiport", *neg, "--dports", m.value]
        case "uid":
            return ["-m", "owner", *neg, "--uid-owner", m.value]
        case "gid":
            return ["-m", "owner", *neg, "--gid-owner", m.value]
        case "ctstate":
            return ["-m", "conntrack", *neg, "--ctstate", m.value]
        case "mark":
            return ["-m", "mark", *neg, "--mark", m.value]
        case "connmark":
            return ["-m", "connmark", *neg, "--mark", m.value]
        case "module":
            return ["-m", m.value]
        case "socket_exists":
            return ["-m", "owner", *neg, "--socket-exists"]
        case "match_set":
            return ["-m", "set", *neg, "--match-set", m.value, "dst"]
        case _:
            assert_never(kind)


def target_words(t: Target) -> list[str]:
    kind = t.kind
    match kind:
        case "jump":
            return ["-j", t.value]
        case "redirect":
            return ["-j", "REDIRECT", t.spelling or "--to-ports", t.value]
        case "tproxy":
            return ["-j", "TPROXY", "--tproxy-mark", f"{t.mark}/0xffffffff", "--on-port", t.value]
        case "set_mark":
            return ["-j", "MARK", "--set-mark", t.value]
        case "save_mark":
            return ["-j", "CONNMARK", "--save-mark"]
        case "restore_mark":
            masks = ["--nfmask", t.mark, "--ctmask", t.mark] if t.mark else []
            return ["-j", "CONNMARK", "--restore-mark", *masks]
        case "ct_zone":
            return ["-j", "CT", "--zone", t.value]
        case "connmark_set":
            return ["-j", "CONNMARK", "--set-xmark", t.value]
        case "snat":
            return ["-j", "SNAT", "--to-source", t.value]
        case _:
            assert_never(kind)
