"""A pod manifest from a file, for `istio-cni-agent rules --pod FILE` in either mode."""

from __future__ import annotations

import json
from typing import Any

import yaml


def load_pod_manifest(path: str) -> dict[str, Any]:
    """A Pod manifest from a YAML or JSON file."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: not valid YAML or JSON: {e}") from e
    if not isinstance(data, dict) or data.get("kind", "Pod") != "Pod":
        raise ValueError(f"{path}: not a Pod manifest")
    return data
