"""ADD returns prevResult in the config's cniVersion: 0.1/0.2 results carry ip4/ip6, 0.3/0.4
results ips[].version, 1.x ips[] without it. A config without cniVersion is 0.1.0 (libcni)."""

from __future__ import annotations

import copy
import json

import pytest

from plugin import wire
from plugin.errors import CniError
from plugin.versions import SUPPORTED, convert_result
from tests.conformance_data import CONFORMANCE_DIR
from tests.plugin.helpers import (
    LEGACY_VERSIONS,
    VERSIONS,
    cni_env,
    net_conf,
    result_for,
    run_plugin,
)

# Within one family of shapes a conversion loses nothing; across them see the tests below.
PAIRS = [
    (src, dst)
    for src in VERSIONS
    for dst in VERSIONS
    if (src in LEGACY_VERSIONS) == (dst in LEGACY_VERSIONS)
]
CONFORMANCE = CONFORMANCE_DIR / "plugin"


def test_supported_versions() -> None:
    assert SUPPORTED == VERSIONS


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=[f"{s}-to-{d}" for s, d in PAIRS])
def test_add_returns_prev_result_converted(src: str, dst: str) -> None:
    """The runtime passes prevResult (in `src`'s shape) in a `dst` config; excluded pod."""
    conf = net_conf(dst, prevResult=result_for(src), exclude_namespaces=["default"])
    run = run_plugin(cni_env("ADD"), conf)
    assert run.code == 0, run.raw
    assert run.out == result_for(dst)


@pytest.mark.parametrize("version", VERSIONS, ids=VERSIONS)
def test_add_without_prev_result_returns_empty_result(version: str) -> None:
    conf = net_conf(version, exclude_namespaces=["default"])
    del conf["prevResult"]
    run = run_plugin(cni_env("ADD"), conf)
    assert run.code == 0 and run.out == {"cniVersion": version}


def test_conversion_keeps_unknown_fields_and_does_not_touch_input() -> None:
    prev = result_for("1.0.0") | {"x-vendor": {"a": 1}}
    before = copy.deepcopy(prev)
    out = convert_result(prev, "0.4.0")
    assert out["x-vendor"] == {"a": 1}
    assert [ip["version"] for ip in out["ips"]] == ["4", "6"]
    assert prev == before


def test_legacy_shape_drops_fields_it_does_not_have() -> None:
    prev = result_for("1.1.0")
    prev["interfaces"][2].update(mtu=1450, socketPath="/s", pciID="0000:00:01.0")
    prev["routes"][0].update(mtu=1400, advmss=1360, priority=5, table=100, scope=0)
    out = convert_result(prev, "0.4.0")
    assert out["interfaces"][2] == result_for("0.4.0")["interfaces"][2]
    assert out["routes"][0] == {"dst": "0.0.0.0/0", "gw": "10.1.0.1"}
    assert convert_result(prev, "1.0.0")["interfaces"][2]["mtu"] == 1450


def test_lower_case_cniversion_key_is_replaced() -> None:
    """Istio's sample stdin spells it `cniversion` inside prevResult."""
    stdin = json.loads((CONFORMANCE / "cni-stdin.json").read_text())
    run = run_plugin(
        cni_env("ADD", CNI_ARGS="K8S_POD_NAMESPACE=testExcludeNS;K8S_POD_NAME=p"), stdin
    )
    assert run.code == 0, run.raw
    assert run.out == {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": "/tmp"}],
        "ips": [{"address": "10.0.0.2/24", "gateway": "10.0.0.1", "interface": 0}],
        "routes": [],
    }


@pytest.mark.parametrize(
    ("prev", "code", "word"),
    [
        ({"cniVersion": "0.0.9", "ips": []}, wire.INCOMPATIBLE_VERSION, "0.0.9"),
        ({"cniVersion": "0.2.0", "ip4": "10.0.0.1/24"}, wire.INVALID_CONFIG, "prevResult.ip4"),
        ({"ips": {"address": "10.0.0.1/24"}}, wire.INVALID_CONFIG, "prevResult.ips"),
        ({"ips": [{"gateway": "10.0.0.1"}]}, wire.INVALID_CONFIG, "prevResult.ips[0].address"),
        ({"ips": ["10.0.0.1/24"]}, wire.INVALID_CONFIG, "prevResult.ips[0]"),
        ({"ips": [{"address": "banana"}]}, wire.INVALID_CONFIG, "banana"),
        ({"interfaces": [1]}, wire.INVALID_CONFIG, "prevResult.interfaces[0]"),
        ({"routes": "none"}, wire.INVALID_CONFIG, "prevResult.routes"),
        ({"dns": []}, wire.INVALID_CONFIG, "prevResult.dns"),
    ],
    ids=[
        "unknown-version",
        "ip4-string",
        "ips-object",
        "no-address",
        "ip-string",
        "bad-address",
        "iface-int",
        "routes-str",
        "dns-list",
    ],
)
def test_bad_prev_result(prev: dict[str, object], code: int, word: str) -> None:
    with pytest.raises(CniError) as caught:
        convert_result(prev, "0.3.1")
    assert caught.value.code == code
    assert word in caught.value.msg


def test_bad_prev_result_fails_add_even_when_pod_passes() -> None:
    conf = net_conf("0.4.0", prevResult={"ips": [{"address": 7}]}, exclude_namespaces=["default"])
    run = run_plugin(cni_env("ADD"), conf)
    assert run.code == 1 and run.out["code"] == wire.INVALID_CONFIG


@pytest.mark.parametrize("stdin_version", [None, ""], ids=["absent", "empty"])
def test_config_without_cni_version_is_0_1_0(stdin_version: str | None) -> None:
    """libcni hands "" to every plugin of a list without cniVersion; bridge then answers 0.1.0."""
    conf = net_conf("0.1.0", exclude_namespaces=["default"])
    if stdin_version is None:
        del conf["cniVersion"]
    else:
        conf["cniVersion"] = stdin_version
    del conf["prevResult"]["cniVersion"]  # bridge's 0.1.0 answer may come without one
    run = run_plugin(cni_env("ADD"), conf)
    assert run.code == 0, run.raw
    assert run.out == result_for("0.1.0")


def test_legacy_result_to_list_shape() -> None:
    out = convert_result(result_for("0.2.0"), "1.0.0")
    assert out == {
        "cniVersion": "1.0.0",
        "ips": [
            {"address": "10.1.0.5/24", "gateway": "10.1.0.1"},
            {"address": "fd00::5/64", "gateway": "fd00::1"},
        ],
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}],
        "dns": {"nameservers": ["10.96.0.10"]},
    }
    assert [ip["version"] for ip in convert_result(result_for("0.1.0"), "0.3.1")["ips"]] == [
        "4",
        "6",
    ]


def test_list_result_to_legacy_shape() -> None:
    prev = result_for("1.0.0")
    prev["ips"].append({"address": "10.1.0.6/24", "interface": 2})  # a second IPv4: not kept
    prev["routes"].append({"dst": "::/0", "gw": "fd00::1"})
    out = convert_result(prev, "0.2.0")
    assert out == {
        "cniVersion": "0.2.0",
        "ip4": {
            "ip": "10.1.0.5/24",
            "gateway": "10.1.0.1",
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}],
        },
        "ip6": {
            "ip": "fd00::5/64",
            "gateway": "fd00::1",
            "routes": [{"dst": "::/0", "gw": "fd00::1"}],
        },
        "dns": {"nameservers": ["10.96.0.10"]},
    }
