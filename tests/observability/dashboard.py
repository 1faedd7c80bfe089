"""Reading the chart's Grafana dashboard: its queries as Prometheus sees them (Grafana's
variables filled in) and the metric names they use; the names an agent's /metrics exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# Grafana's variables as "All" fills them in.
VARIABLES = {"$instance": ".*"}
KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
}
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
    "summary": ("", "_sum", "_count"),
}


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel with queries, rows' nested panels included."""
    out: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        out += panels({"panels": panel.get("panels", [])}) if panel["type"] == "row" else [panel]
    return out


def queries(path: Path) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and query variable, variables filled in."""
    dashboard = json.loads(path.read_text())
    found = [
        (f"panel {p['title']!r} target {t['refId']}", t["expr"])
        for p in panels(dashboard)
        for t in p.get("targets", [])
    ]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            text = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            # label_values(METRIC, label): Grafana asks for METRIC's series.
            match = re.fullmatch(r"label_values\((.+),\s*\w+\)", text.strip())
            assert match, f"variable {var['name']}: unexpected query {text!r}"
            found.append((f"variable {var['name']}", match.group(1)))
    out: list[tuple[str, str]] = []
    for where, expr in found:
        for name, value in VARIABLES.items():
            expr = expr.replace(name, value)
        assert "$" not in expr, f"{where}: an unknown Grafana variable in {expr!r}"
        out.append((where, expr))
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords and labels left out)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        rest = text[match.end() :].lstrip()
        if match.group() in KEYWORDS or rest.startswith("("):
            continue
        names.add(match.group())
    return names


def exported_names(metrics_text: str) -> set[str]:
    """Every series name a /metrics page can carry, those of families with no sample yet
    included (a labelled counter appears with its first increment)."""
    names: set[str] = set()
    for line in metrics_text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            if kind == "counter":  # the text format names a counter with or without _total
                name = name.removesuffix("_total")
            names |= {name + s for s in SUFFIXES.get(kind, ("",))}
    for family in text_string_to_metric_families(metrics_text):
        names |= {s.name for s in family.samples}
    return names
