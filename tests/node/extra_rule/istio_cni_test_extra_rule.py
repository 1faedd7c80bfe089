"""TEST BUILD ONLY, loaded by a .pth file at interpreter start in the test image: the sidecar
rule set gets its last nat rule once more, so this agent's rendering differs from the release's
by one rule (what another release of the agent, or an edited annotation, looks like to repair)."""

from dataclasses import replace

from agent.rules.sidecar import builder

_release_build = builder.build


def build(config):  # type: ignore[no-untyped-def]
    rules = _release_build(config)
    v4 = list(rules.v4)
    for i, table in enumerate(v4):
        if table.name == "nat" and table.rules:
            v4[i] = replace(table, rules=(*table.rules, table.rules[-1]))
            break
    return replace(rules, v4=tuple(v4))


builder.build = build
