"""The `ambient` section of config.yaml: defaults as Istio's chart, selectors validated as
Kubernetes' LabelSelectorAsSelector does, every error naming the key path and the file."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agent.config import AmbientSettings, Settings, load_settings, settings_from_mapping
from agent.errors import ConfigError
from agent.label_selectors import (
    DEFAULT_ENABLEMENT_SELECTORS,
    EnablementSelector,
    LabelSelector,
    LabelSelectorRequirement,
)

ISTIO_DEFAULT_SELECTORS = """
- podSelector:
    matchLabels: {istio.io/dataplane-mode: ambient}
- podSelector:
    matchExpressions:
    - { key: istio.io/dataplane-mode, operator: NotIn, values: [none] }
  namespaceSelector:
    matchLabels: {istio.io/dataplane-mode: ambient}
"""


def load(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_settings(str(path))


def test_defaults_are_istios() -> None:
    a = Settings().ambient
    assert a == AmbientSettings()
    assert a.enabled is False
    assert (a.dnsCapture, a.ipv6, a.reconcileIptablesOnStartup) == (True, True, True)
    assert a.enableAmbientDetectionRetry is False
    assert a.ztunnelSocketPath == "/var/run/ztunnel/ztunnel.sock"
    assert a.systemNamespace == "istio-system"
    assert (a.hostProbeSnatAddress, a.hostProbeSnatAddressV6) == (
        "169.254.7.127",
        "fd16:9254:7127:1337:ffff:ffff:ffff:ffff",
    )


def test_istio_chart_default_selectors_parse_to_our_default() -> None:
    raw = yaml.safe_load(ISTIO_DEFAULT_SELECTORS)
    s = settings_from_mapping({"ambient": {"enablementSelectors": raw}}, source="x")
    assert s.ambient.enablementSelectors == DEFAULT_ENABLEMENT_SELECTORS
    assert [e.to_dict() for e in DEFAULT_ENABLEMENT_SELECTORS] == [
        {
            "podSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}},
            "namespaceSelector": {},
        },
        {
            "podSelector": {
                "matchExpressions": [
                    {"key": "istio.io/dataplane-mode", "operator": "NotIn", "values": ["none"]}
                ]
            },
            "namespaceSelector": {"matchLabels": {"istio.io/dataplane-mode": "ambient"}},
        },
    ]


def test_ambient_values_are_read(tmp_path: Path) -> None:
    s = load(
        tmp_path,
        """
ambient:
  enabled: true
  dnsCapture: false
  ipv6: false
  reconcileIptablesOnStartup: false
  enableAmbientDetectionRetry: true
  ztunnelSocketPath: /run/zt/zds.sock
  systemNamespace: kube-system
  hostProbeSnatAddress: 169.254.7.1
  hostProbeSnatAddressV6: fd00::7
  enablementSelectors:
  - podSelector:
      matchExpressions:
      - {key: app, operator: Exists}
      - {key: example.com/tier, operator: In, values: [web, api]}
  - namespaceSelector: {}
  - {}
""",
    )
    a = s.ambient
    assert a.enabled and not a.dnsCapture and not a.ipv6 and not a.reconcileIptablesOnStartup
    assert a.enableAmbientDetectionRetry and a.ztunnelSocketPath == "/run/zt/zds.sock"
    assert a.systemNamespace == "kube-system"
    assert (a.hostProbeSnatAddress, a.hostProbeSnatAddressV6) == ("169.254.7.1", "fd00::7")
    assert a.enablementSelectors == (
        EnablementSelector(
            podSelector=LabelSelector(
                matchExpressions=(
                    LabelSelectorRequirement("app", "Exists"),
                    LabelSelectorRequirement("example.com/tier", "In", ("web", "api")),
                )
            )
        ),
        EnablementSelector(),
        EnablementSelector(),
    )
    assert s.repair == Settings().repair  # other sections untouched


def test_null_or_empty_selectors_enroll_nothing(tmp_path: Path) -> None:
    for text in ("null", "[]"):
        settings = load(tmp_path, f"ambient: {{enablementSelectors: {text}}}\n")
        assert settings.ambient.enablementSelectors == ()


SEL = "ambient.enablementSelectors"
BAD = {
    "unknown-ambient-key": (
        "ambient: {shareHostNetworkNamespace: true}\n",
        "unknown key ambient.shareHostNetworkNamespace",
    ),
    "ambient-not-mapping": ("ambient: true\n", "key ambient must be a mapping"),
    "bool-type": ("ambient: {enabled: 'yes'}\n", "key ambient.enabled must be true or false"),
    "socket-relative": (
        "ambient: {ztunnelSocketPath: zt.sock}\n",
        "key ambient.ztunnelSocketPath must be an absolute path",
    ),
    "snat-v4-family": (
        "ambient: {hostProbeSnatAddress: 'fd00::1'}\n",
        "key ambient.hostProbeSnatAddress must be an IPv4 address",
    ),
    "snat-v6-garbage": (
        "ambient: {hostProbeSnatAddressV6: nope}\n",
        "key ambient.hostProbeSnatAddressV6 must be an IPv6 address",
    ),
    "system-namespace": (
        "ambient: {systemNamespace: Istio_System}\n",
        "key ambient.systemNamespace must be a namespace name",
    ),
    "selectors-not-list": (
        "ambient: {enablementSelectors: {podSelector: {}}}\n",
        f"key {SEL}: must be a list",
    ),
    "entry-not-mapping": (
        "ambient: {enablementSelectors: [x]}\n",
        f"key {SEL}[0]: must be a mapping",
    ),
    "entry-unknown-key": (
        "ambient: {enablementSelectors: [{podselector: {}}]}\n",
        f"key {SEL}[0].podselector: unknown key",
    ),
    "selector-unknown-key": (
        "ambient: {enablementSelectors: [{podSelector: {labels: {}}}]}\n",
        f"key {SEL}[0].podSelector.labels: unknown key",
    ),
    "operator": (
        "ambient: {enablementSelectors: [{}, {namespaceSelector: {matchExpressions: "
        "[{key: a, operator: Equals, values: [b]}]}}]}\n",
        f"key {SEL}[1].namespaceSelector.matchExpressions[0].operator: 'Equals' is not "
        "one of In, NotIn, Exists, DoesNotExist",
    ),
    "operator-case": (
        "ambient: {enablementSelectors: [{podSelector: {matchExpressions: "
        "[{key: a, operator: in, values: [b]}]}}]}\n",
        "'in' is not one of",
    ),
    "operator-missing": (
        "ambient: {enablementSelectors: [{podSelector: {matchExpressions: [{key: a}]}}]}\n",
        "operator: None is not one of",
    ),
    "in-without-values": (
        "ambient: {enablementSelectors: [{podSelector: {matchExpressions: "
        "[{key: a, operator: In}]}}]}\n",
        f"key {SEL}[0].podSelector.matchExpressions[0].values: must not be empty for operator In",
    ),
    "notin-empty-values": (
        "ambient: {enablementSelectors: [{podSelector: {matchExpressions: "
        "[{key: a, operator: NotIn, values: []}]}}]}\n",
        "must not be empty for operator NotIn",
    ),
    "exists-with-values": (
        "ambient: {enablementSelectors: [{podSelector: {matchExpressions: "
        "[{key: a, operator: Exists, values: [b]}]}}]}\n",
        "values: must be empty for operator Exists",
    ),
    "doesnotexist-with-values": (
        "ambient: {enablementSelectors: [{podSelector: "
        "{matchExpressions: [{key: a, operator: DoesNotExist, "
        "values: [b]}]}}]}\n",
        "must be empty for operator DoesNotExist",
    ),
    "values-not-strings": (
        "ambient: {enablementSelectors: [{podSelector: {matchExpressions: "
        "[{key: a, operator: In, values: [1]}]}}]}\n",
        "values: must be a list of strings",
    ),
    "bad-value": (
        "ambient: {enablementSelectors: [{podSelector: {matchExpressions: "
        "[{key: a, operator: In, values: ['-x']}]}}]}\n",
        f"key {SEL}[0].podSelector.matchExpressions[0].values[0]: a label value",
    ),
    "bad-key": (
        "ambient: {enablementSelectors: [{podSelector: {matchExpressions: "
        "[{key: 'a b', operator: Exists}]}}]}\n",
        "matchExpressions[0].key: the name of a label key",
    ),
    "bad-key-prefix": (
        "ambient: {enablementSelectors: [{podSelector: {matchLabels: {'Istio.IO/mode': x}}}]}\n",
        "matchLabels.Istio.IO/mode: the prefix of a label key",
    ),
    "key-two-slashes": (
        "ambient: {enablementSelectors: [{podSelector: {matchLabels: {'a/b/c': x}}}]}\n",
        "with one '/'",
    ),
    "label-value-type": (
        "ambient: {enablementSelectors: [{podSelector: {matchLabels: {a: true}}}]}\n",
        f"key {SEL}[0].podSelector.matchLabels.a: must be a string, got bool",
    ),
    "label-value-long": (
        "ambient: {enablementSelectors: [{podSelector: {matchLabels: {a: " + "x" * 64 + "}}}]}\n",
        "a label value must be empty or 1-63",
    ),
    "expressions-not-list": (
        "ambient: {enablementSelectors: [{podSelector: {matchExpressions: {key: a}}}]}\n",
        "matchExpressions: must be a list",
    ),
}


@pytest.mark.parametrize(("text", "expected"), BAD.values(), ids=BAD.keys())
def test_bad_ambient_config_names_key_path_and_file(
    tmp_path: Path, text: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, text)
    assert expected in str(err.value)
    assert str(tmp_path / "config.yaml") in str(err.value)


def test_empty_label_value_and_prefixed_key_are_valid(tmp_path: Path) -> None:
    s = load(
        tmp_path,
        "ambient: {enablementSelectors: [{podSelector: {matchLabels: "
        "{'example.com/a': '', b: x.y_z-1}}}]}\n",
    )
    assert s.ambient.enablementSelectors[0].podSelector.matchLabels == (
        ("example.com/a", ""),
        ("b", "x.y_z-1"),
    )
