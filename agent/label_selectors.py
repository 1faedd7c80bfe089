"""Kubernetes label selectors, as Istio's ambient enablement selectors use them.

The model (`LabelSelector`, `EnablementSelector`) is what `config.yaml`'s
`ambient.enablementSelectors` holds; `parse_enablement_selectors` validates it as Kubernetes'
`metav1.LabelSelectorAsSelector` does (operators In/NotIn/Exists/DoesNotExist, values required
for In/NotIn and forbidden for Exists/DoesNotExist, label key and value syntax), and
`selector_matches` is `labels.Selector.Matches`. An empty selector (no matchLabels, no
matchExpressions) selects everything, as in Istio's `NewCompiledEnablementSelectors`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from agent.errors import SelectorError

SelectorOperator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
OPERATORS: tuple[str, ...] = get_args(SelectorOperator)

DATAPLANE_MODE_LABEL = "istio.io/dataplane-mode"
"""Istio's label (pods and namespaces) for the data plane mode: `ambient` or `none`."""

_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)


@dataclass(frozen=True)
class LabelSelectorRequirement:
    """One `matchExpressions` entry."""

    key: str
    operator: SelectorOperator
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class LabelSelector:
    """A Kubernetes LabelSelector; `matchLabels` as (key, value) pairs in the order given."""

    matchLabels: tuple[tuple[str, str], ...] = ()
    matchExpressions: tuple[LabelSelectorRequirement, ...] = ()

    @property
    def empty(self) -> bool:
        """Selects everything (Istio: `labels.Everything()`)."""
        return not self.matchLabels and not self.matchExpressions

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.matchLabels:
            out["matchLabels"] = dict(self.matchLabels)
        if self.matchExpressions:
            out["matchExpressions"] = [_requirement_dict(r) for r in self.matchExpressions]
        return out


def _requirement_dict(req: LabelSelectorRequirement) -> dict[str, Any]:
    out: dict[str, Any] = {"key": req.key, "operator": req.operator}
    if req.values:
        out["values"] = list(req.values)
    return out


@dataclass(frozen=True)
class EnablementSelector:
    """A pod is ambient when both selectors of one entry match (pod labels, namespace labels)."""

    podSelector: LabelSelector = field(default_factory=LabelSelector)
    namespaceSelector: LabelSelector = field(default_factory=LabelSelector)

    def to_dict(self) -> dict[str, Any]:
        return {
            "podSelector": self.podSelector.to_dict(),
            "namespaceSelector": self.namespaceSelector.to_dict(),
        }


DEFAULT_ENABLEMENT_SELECTORS: tuple[EnablementSelector, ...] = (
    # The pod says ambient, whatever its namespace says.
    EnablementSelector(podSelector=LabelSelector(matchLabels=((DATAPLANE_MODE_LABEL, "ambient"),))),
    # The namespace says ambient and the pod does not opt out with `none`.
    EnablementSelector(
        podSelector=LabelSelector(
            matchExpressions=(LabelSelectorRequirement(DATAPLANE_MODE_LABEL, "NotIn", ("none",)),)
        ),
        namespaceSelector=LabelSelector(matchLabels=((DATAPLANE_MODE_LABEL, "ambient"),)),
    ),
)
"""Istio's chart default (values.yaml `ambient.enablementSelectors`)."""


def requirement_matches(req: LabelSelectorRequirement, labels: Mapping[str, str]) -> bool:
    """`labels.Requirement.Matches`: NotIn and DoesNotExist match a missing key."""
    present = req.key in labels
    if req.operator == "Exists":
        return present
    if req.operator == "DoesNotExist":
        return not present
    if req.operator == "In":
        return present and labels[req.key] in req.values
    return not present or labels[req.key] not in req.values


def selector_matches(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    """Every matchLabels pair and every matchExpressions entry holds; empty matches everything."""
    return all(k in labels and labels[k] == v for k, v in selector.matchLabels) and all(
        requirement_matches(r, labels) for r in selector.matchExpressions
    )


# --- parsing and validation -----------------------------------------------------------------


def label_key_problem(key: str) -> str | None:
    """Why `key` is not a qualified name (Kubernetes `IsQualifiedName`), or None."""
    prefix, slash, name = key.rpartition("/")
    if slash and ("/" in prefix or not prefix):
        return "a label key is [prefix/]name with one '/' and a non-empty prefix"
    if slash and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
        return "the prefix of a label key must be a DNS subdomain (lower case, '.', '-')"
    if not name or len(name) > 63 or not _NAME.match(name):
        return (
            "the name of a label key must be 1-63 characters: alphanumerics, '-', '_', '.', "
            "starting and ending with an alphanumeric"
        )
    return None


def label_value_problem(value: str) -> str | None:
    """Why `value` is not a label value (Kubernetes `IsValidLabelValue`), or None."""
    if value and (len(value) > 63 or not _NAME.match(value)):
        return (
            "a label value must be empty or 1-63 characters: alphanumerics, '-', '_', '.', "
            "starting and ending with an alphanumeric"
        )
    return None


def parse_enablement_selectors(data: object) -> tuple[EnablementSelector, ...]:
    """A YAML list of {podSelector, namespaceSelector}; null means no selector (nothing enrolls)."""
    if data is None:
        return ()
    if not isinstance(data, list):
        raise SelectorError(
            "", f"must be a list of {{podSelector, namespaceSelector}}, got {type(data).__name__}"
        )
    out = []
    for i, entry in enumerate(data):
        where = f"[{i}]"
        mapping = _mapping(entry, where)
        _known(mapping, where, ("podSelector", "namespaceSelector"))
        out.append(
            EnablementSelector(
                podSelector=parse_label_selector(
                    mapping.get("podSelector"), f"{where}.podSelector"
                ),
                namespaceSelector=parse_label_selector(
                    mapping.get("namespaceSelector"), f"{where}.namespaceSelector"
                ),
            )
        )
    return tuple(out)


def parse_label_selector(data: object, where: str) -> LabelSelector:
    """One Kubernetes LabelSelector; null or {} is the empty selector."""
    if data is None:
        return LabelSelector()
    mapping = _mapping(data, where)
    _known(mapping, where, ("matchLabels", "matchExpressions"))
    labels: list[tuple[str, str]] = []
    raw_labels = mapping.get("matchLabels")
    if raw_labels is None:
        raw_labels = {}
    for key, value in _mapping(raw_labels, f"{where}.matchLabels").items():
        at = f"{where}.matchLabels.{key}"
        if not isinstance(key, str):
            raise SelectorError(at, "a label key must be a string")
        _check(label_key_problem(key), at)
        if not isinstance(value, str):
            raise SelectorError(at, f"must be a string, got {type(value).__name__} {value!r}")
        _check(label_value_problem(value), at)
        labels.append((key, value))
    exprs = mapping.get("matchExpressions")
    if exprs is not None and not isinstance(exprs, list):
        raise SelectorError(f"{where}.matchExpressions", "must be a list")
    reqs = tuple(
        _requirement(e, f"{where}.matchExpressions[{i}]") for i, e in enumerate(exprs or [])
    )
    return LabelSelector(matchLabels=tuple(labels), matchExpressions=reqs)


def _requirement(data: object, where: str) -> LabelSelectorRequirement:
    mapping = _mapping(data, where)
    _known(mapping, where, ("key", "operator", "values"))
    key = mapping.get("key")
    if not isinstance(key, str):
        raise SelectorError(f"{where}.key", f"must be a string, got {type(key).__name__}")
    _check(label_key_problem(key), f"{where}.key")
    operator = mapping.get("operator")
    if operator not in OPERATORS:
        raise SelectorError(
            f"{where}.operator", f"{operator!r} is not one of {', '.join(OPERATORS)}"
        )
    values = mapping.get("values")
    if values is None:
        values = []
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise SelectorError(f"{where}.values", "must be a list of strings")
    if operator in ("In", "NotIn") and not values:
        raise SelectorError(f"{where}.values", f"must not be empty for operator {operator}")
    if operator in ("Exists", "DoesNotExist") and values:
        raise SelectorError(f"{where}.values", f"must be empty for operator {operator}")
    for i, value in enumerate(values):
        _check(label_value_problem(value), f"{where}.values[{i}]")
    return LabelSelectorRequirement(key=key, operator=operator, values=tuple(values))


def _mapping(data: object, where: str) -> Mapping[Any, Any]:
    if not isinstance(data, Mapping):
        raise SelectorError(where, f"must be a mapping, got {type(data).__name__}")
    return data


def _known(mapping: Mapping[Any, Any], where: str, known: tuple[str, ...]) -> None:
    for key in mapping:
        if key not in known:
            raise SelectorError(f"{where}.{key}", f"unknown key (known keys: {', '.join(known)})")


def _check(problem: str | None, where: str) -> None:
    if problem is not None:
        raise SelectorError(where, problem)
