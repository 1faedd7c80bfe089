"""Apply rules in-process with python-iptables (legacy xtables), inside the pod's namespace.

python-iptables keeps one handle per table for the whole process, bound to the namespace the
handle was opened in. So every use holds one module-wide lock, runs in a thread that entered the
pod's namespace, and refreshes each table there before reading or changing it. A table is
changed in memory and committed once: the kernel swaps it in one step.

A namespace owned by another user namespace (a user-namespaced pod's) takes no owner match from
this process (agent.netns.userns): its IPv4 rules go through iptables-legacy-restore run as that
namespace's root, into the same legacy tables.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from agent.errors import RedirectError
from agent.netns import run_in_netns
from agent.netns.userns import foreign_owner
from agent.rules import backend_restore
from agent.rules.model import RuleSet, TableRules
from agent.rules.ownership import OUR_TABLES, SIDECAR, Ownership, builtin
from agent.rules.render_iptc import iptc_rule

_LOCK = threading.Lock()


def apply(netns_path: str, ruleset: RuleSet | None, owner: Ownership = SIDECAR) -> None:
    """Replace our rules with `ruleset` (None removes them): IPv4 in-process, IPv6 by restore.

    libxtables keeps, per process, only the extension entries of the protocol that was active
    when an extension library was first loaded (REDIRECT, TPROXY, ... are per protocol), and
    loading one again for IPv6 aborts the whole process ("already registered"). So IPv4 is
    programmed in-process and the IPv6 legacy tables through ip6tables-legacy-restore.
    """

    def work() -> None:
        tables = ruleset.v4 if ruleset is not None else ()
        wanted: dict[str, TableRules] = {t.name: t for t in tables}
        for name in sorted(set(wanted) | set(OUR_TABLES)):
            _apply_table(name, wanted.get(name), owner)

    if (userns := foreign_owner(netns_path)) is None:
        _locked(netns_path, work)
    else:
        os.close(userns)
        backend_restore.apply_family(netns_path, ruleset, "legacy", 4, owner=owner)
    backend_restore.apply_family(netns_path, ruleset, "legacy", 6, owner=owner)


def _locked(netns_path: str, work: Any) -> Any:
    with _LOCK:
        try:
            return run_in_netns(netns_path, work)
        except RedirectError:
            raise
        except Exception as e:  # python-iptables raises its own error types
            raise RedirectError(f"python-iptables in {netns_path}: {e}") from e


def _table(name: str) -> Any:
    import iptc

    table = iptc.Table(name)
    table.autocommit = False
    table.refresh()  # reopen the handle in this thread's namespace
    return table


def _apply_table(name: str, new: TableRules | None, owner: Ownership) -> None:
    import iptc

    table = _table(name)
    changed = False
    for chain in list(table.chains):
        if builtin(chain.name):
            for rule in list(chain.rules):
                if owner.iptc_rule(name, rule):
                    chain.delete_rule(rule)
                    changed = True
        elif owner.chain(chain.name):
            chain.flush()
            changed = True
    wanted = list(new.chains) if new else []
    for chain in list(table.chains):
        if owner.chain(chain.name) and chain.name not in wanted:
            table.delete_chain(chain.name)
            changed = True
    for chain_name in wanted:
        if not table.is_chain(chain_name):
            table.create_chain(chain_name)
            changed = True
    for rule in new.rules if new else ():
        chain = iptc.Chain(table, rule.chain)
        built = iptc_rule(rule, family=4)
        if rule.insert_at is None:
            chain.append_rule(built)
        else:
            chain.insert_rule(built, rule.insert_at - 1)
        changed = True
    if changed:
        table.commit()
    table.refresh()
