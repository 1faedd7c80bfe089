"""Render the rule model as `iptables-restore` input, spelled exactly as Istio writes it.

`render(ruleset)` is what `istio-cni-agent rules` prints and what the restore backends feed to
`iptables-restore --noflush`: for each table `* name`, `-N` lines for our chains, the rule
operations (`-A`/`-I`) in order, `COMMIT`; IPv4 tables then IPv6 tables.
"""

from __future__ import annotations

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
    if m.kind == "proto":
        return [*neg, "-p", m.value]
    if m.kind in ("in", "out", "src", "dst"):
        flag = {"in": "-i", "out": "-o", "src": "-s", "dst": "-d"}[m.kind]
        return [*neg, flag, m.value]
    if m.kind == "dport":
        return [*neg, "--dport", m.value]
    if m.kind == "sport":
        return [*neg, "--sport", m.value]
    if m.kind == "dports":
        return ["-m", "multiport", *neg, "--dports", m.value]
    if m.kind == "uid":
        return ["-m", "owner", *neg, "--uid-owner", m.value]
    if m.kind == "gid":
        return ["-m", "owner", *neg, "--gid-owner", m.value]
    if m.kind == "ctstate":
        return ["-m", "conntrack", *neg, "--ctstate", m.value]
    if m.kind == "mark":
        return ["-m", "mark", *neg, "--mark", m.value]
    if m.kind == "connmark":
        return ["-m", "connmark", *neg, "--mark", m.value]
    if m.kind == "module":
        return ["-m", m.value]
    if m.kind == "socket_exists":
        return ["-m", "owner", *neg, "--socket-exists"]
    if m.kind == "match_set":
        return ["-m", "set", *neg, "--match-set", *m.value.split()]
    raise AssertionError(f"unknown match kind {m.kind}")


def target_words(t: Target) -> list[str]:
    if t.kind == "jump":
        return ["-j", t.value]
    if t.kind == "redirect":
        return ["-j", "REDIRECT", t.spelling or "--to-ports", t.value]
    if t.kind == "tproxy":
        return ["-j", "TPROXY", "--tproxy-mark", f"{t.mark}/0xffffffff", "--on-port", t.value]
    if t.kind == "set_mark":
        return ["-j", "MARK", "--set-mark", t.value]
    if t.kind == "save_mark":
        return ["-j", "CONNMARK", "--save-mark"]
    if t.kind == "restore_mark":
        masks = ["--nfmask", t.mark, "--ctmask", t.mark] if t.mark else []
        return ["-j", "CONNMARK", "--restore-mark", *masks]
    if t.kind == "ct_zone":
        return ["-j", "CT", "--zone", t.value]
    if t.kind == "connmark_set":
        return ["-j", "CONNMARK", "--set-xmark", t.value]
    if t.kind == "snat":
        return ["-j", "SNAT", "--to-source", t.value]
    raise AssertionError(f"unknown target kind {t.kind}")
