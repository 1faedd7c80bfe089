"""What testbed/istiod.py asks of Istio's own charts, rendered by real Helm (3 and 4): every
webhook points at istiod on the host with the test bed's CA, the injector is switched to CNI
(`pilot.cni.enabled`) and names the test bed's proxy image, and the chart's Deployment can run on
no node. A chart refresh that drops one of these values fails here, before the node tier."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed import pki
from testbed.helm import Helm
from testbed.images import Image
from testbed.istiod import (
    BASE_CHART,
    INJECTOR_WEBHOOK,
    ISTIOD_CHART,
    NAMESPACE,
    NOT_ON_ANY_NODE,
    VALIDATING_WEBHOOKS,
    Ports,
    base_values,
    istiod_values,
)
from tests.chart.conftest import helm, only  # noqa: F401 (fixture)

pytestmark = pytest.mark.chart

PROXY = Image("proxy", "localhost/testbed/proxy:0123456789ab", Path("/nonexistent.tar"))


def render(h: Helm, chart: Path, release: str, values: dict[str, Any]) -> list[dict[str, Any]]:
    path = h.home / f"{release}-values.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(values))
    return h.render(chart=chart, release=release, namespace=NAMESPACE, values=[path])


def webhooks(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    kinds = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    return {d["metadata"]["name"]: d["webhooks"] for d in docs if d["kind"] in kinds}


def test_istio_charts_with_the_test_bed_values(helm: Helm, tmp_path: Path) -> None:  # noqa: F811
    ca = pki.make_ca(tmp_path)
    ports = Ports.free()
    bundle = base64.b64encode(ca.cert.read_bytes()).decode()
    istiod = render(helm, ISTIOD_CHART, "istiod", istiod_values(ports, ca, PROXY))
    base = render(helm, BASE_CHART, "istio-base", base_values(ports, ca))

    found = webhooks(istiod) | webhooks(base)
    assert set(found) == {INJECTOR_WEBHOOK, *VALIDATING_WEBHOOKS}, sorted(found)
    for name, hooks in found.items():
        path = "/inject" if name == INJECTOR_WEBHOOK else "/validate"
        for hook in hooks:
            config = hook["clientConfig"]
            assert config.get("url") == f"https://127.0.0.1:{ports.https}{path}", (name, config)
            assert "service" not in config, (name, config)
            assert config.get("caBundle") == bundle, name

    injector = next(
        d for d in istiod if d["kind"] == "ConfigMap" and d["metadata"]["name"] == INJECTOR_WEBHOOK
    )
    values = json.loads(injector["data"]["values"])
    assert values["pilot"]["cni"]["enabled"] is True
    assert values["global"]["hub"] == PROXY.hub and values["global"]["tag"] == PROXY.tag
    assert values["global"]["proxy"]["image"] == values["global"]["proxy_init"]["image"] == "proxy"
    assert values["global"]["imagePullPolicy"] == "Never"

    deployment = only(istiod, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == NOT_ON_ANY_NODE
    assert pod["containers"][0]["imagePullPolicy"] == "Never"
    assert not [d for d in istiod if d["kind"] == "HorizontalPodAutoscaler"]
