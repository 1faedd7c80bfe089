"""One check's verdict: a status, one line saying what was found, the fix, and detail lines
(one per node or pod); printed as text or as JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.excerpt import bounded

PASS, WARN, FAIL = "pass", "warn", "fail"
RANK = {PASS: 0, WARN: 1, FAIL: 2}
LABEL = {PASS: "PASS", WARN: "WARN", FAIL: "FAIL"}
MAX_DETAILS = 20
"""Detail lines printed per check (JSON has them all)."""


@dataclass(frozen=True)
class Result:
    name: str
    status: str
    message: str
    fix: str = ""
    details: tuple[str, ...] = field(default=())

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "message": self.message,
            "fix": self.fix,
            "details": list(self.details),
        }


def passed(name: str, message: str, details: Sequence[str] = ()) -> Result:
    return Result(name, PASS, message, details=tuple(details))


def warning(name: str, message: str, fix: str, details: Sequence[str] = ()) -> Result:
    return Result(name, WARN, message, fix, tuple(details))


def failure(name: str, message: str, fix: str, details: Sequence[str] = ()) -> Result:
    return Result(name, FAIL, message, fix, tuple(details))


def worst(results: Sequence[Result]) -> str:
    return max((r.status for r in results), key=RANK.__getitem__, default=PASS)


def text(results: Sequence[Result]) -> str:
    """One line per check (`FAIL name: message`), its details and fix indented below it."""
    out: list[str] = []
    width = max((len(r.name) for r in results), default=0)
    for r in results:
        out.append(f"{LABEL[r.status]}  {r.name:<{width}}  {_line(r.message)}")
        shown = r.details[:MAX_DETAILS]
        out.extend(f"      - {_line(d)}" for d in shown)
        if len(r.details) > len(shown):
            out.append(f"      ... {len(r.details) - len(shown)} more (--json lists all)")
        if r.fix and r.status != PASS:
            out.append(f"      fix: {_line(r.fix)}")
    counts = {s: sum(r.status == s for r in results) for s in (PASS, WARN, FAIL)}
    out.append(f"{counts[PASS]} passed, {counts[WARN]} warnings, {counts[FAIL]} failures")
    return "\n".join(out) + "\n"


def as_json(results: Sequence[Result]) -> str:
    return json.dumps([r.as_json() for r in results], indent=2) + "\n"


def _line(value: str) -> str:
    """Names and messages may come from pod owners: one printable line each."""
    return bounded(value, 2000)
