from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import Settings, load_settings
from agent.errors import ConfigError


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    assert load_settings(write(tmp_path, "")) == Settings()


def test_defaults_match_the_design_contract() -> None:
    s = Settings()
    assert (s.cniBinDir, s.cniConfDir, s.cniConfFileName) == ("/opt/cni/bin", "/etc/cni/net.d", "")
    assert s.chained is True and s.logLevel == "info"
    assert s.excludeNamespaces == ("istio-system", "kube-system")
    assert (s.mountedCniBinDir, s.mountedCniConfDir) == ("/host/opt/cni/bin", "/host/etc/cni/net.d")


def test_values_are_read_and_nested_repair_applies(tmp_path: Path) -> None:
    s = load_settings(
        write(
            tmp_path,
            "cniBinDir: /home/kubernetes/bin\nchained: false\nexcludeNamespaces: [a, b]\n"
            "logLevel: debug\nrepair: {mode: delete}\nmetricsPort: 9000\n",
        )
    )
    assert s.cniBinDir == "/home/kubernetes/bin"
    assert s.chained is False
    assert s.excludeNamespaces == ("a", "b")
    assert s.logLevel == "debug"
    assert s.repair.mode == "delete" and s.repair.enabled is True
    assert s.metricsPort == 9000


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("cniBinDri: /x\n", "unknown key cniBinDri"),
        ("chained: 'yes'\n", "key chained must be true or false"),
        ("logLevel: verbose\n", "key logLevel: level 'verbose' in 'verbose' is not one of none"),
        ("logLevel: 'default:info,cni-plugin:loud'\n", "level 'loud'"),
        ("logLevel: 'default:info,,repair:warn'\n", "empty entry"),
        ("logLevel: 'Big Scope:debug'\n", "scope 'Big Scope'"),
        ("logLevel: 3\n", "key logLevel must be a string"),
        ("excludeNamespaces: kube-system\n", "key excludeNamespaces must be a list of strings"),
        ("cniConfDir: etc/cni\n", "key cniConfDir must be an absolute path"),
        ("metricsPort: 70000\n", "key metricsPort must be a port number"),
        ("metricsPort: true\n", "key metricsPort must be an integer"),
        ("metricsAddress: node-1\n", "key metricsAddress must be an IP address, or empty"),
        ("repair: {mode: fix}\n", "key repair.mode must be one of"),
        ("repair: {colour: red}\n", "unknown key repair.colour"),
        ("cniConfFileName: ../x.conf\n", "key cniConfFileName must be a file name"),
        (
            "kubeApi: {lookupTimeoutSeconds: 0}\n",
            "key kubeApi.lookupTimeoutSeconds must be a positive",
        ),
        ("- a\n- b\n", "top level must be a mapping"),
        ("a: [\n", "not valid YAML"),
    ],
    ids=[
        "unknown-key",
        "bool-type",
        "log-level",
        "log-level-scope-level",
        "log-level-empty",
        "log-level-scope-name",
        "log-level-type",
        "list-type",
        "relative-dir",
        "port-range",
        "bool-as-int",
        "metrics-address",
        "repair-mode",
        "repair-unknown",
        "file-name",
        "kube-api-timeout",
        "not-mapping",
        "bad-yaml",
    ],
)
def test_bad_config_names_key_and_file(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    assert expected in str(err.value)
    assert path in str(err.value)


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_settings(str(tmp_path / "nope.yaml"))


@pytest.mark.parametrize(
    ("spec", "default", "scopes"),
    [
        ("debug", "debug", {}),
        ("none", "none", {}),
        ("default:warn", "warn", {}),
        (
            "default:info,cni-plugin:debug,repair:warn",
            "info",
            {"cni-plugin": "debug", "repair": "warn"},
        ),
        (" cni-agent:error , info ", "info", {"cni-agent": "error"}),
        ("repair:debug,all:warn", "warn", {"repair": "warn"}),
        ("all:error,repair:debug", "error", {"repair": "debug"}),
    ],
)
def test_log_level_takes_a_level_or_istios_scope_list(
    tmp_path: Path, spec: str, default: str, scopes: dict[str, str]
) -> None:
    s = load_settings(write(tmp_path, f"logLevel: '{spec}'\n"))
    assert s.logLevel == spec
    assert s.log_levels.default == default and dict(s.log_levels.scopes) == scopes
    assert s.log_levels.plugin == scopes.get("cni-plugin", default)


def test_unknown_scopes_are_accepted_and_named() -> None:
    levels = Settings(logLevel="default:info,ambient:debug,galley:warn,zz:error").log_levels
    assert levels.unknown_scopes == ("galley", "zz")
    assert levels.level_of("galley") == "warn" and levels.level_of("install") == "info"


def test_log_keys_of_the_chart(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, "logAsJson: true\ndaemonSetName: istio-cni-node\n"))
    assert s.logAsJson is True and s.daemonSetName == "istio-cni-node"
    assert Settings().logAsJson is False and Settings().daemonSetName == ""
    with pytest.raises(ConfigError, match="key logAsJson must be true or false"):
        load_settings(write(tmp_path, "logAsJson: 'yes'\n"))


def test_the_exclude_default_that_differs_from_istios_is_documented() -> None:
    """Istio's chart excludes only kube-system; ours also istio-system (the configuration
    contract), which keeps ambient pods there out of the mesh: the README's list of differences
    says so, with both defaults and how to align."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    differences = readme.split("What differs between Istio's node agent and this one", 1)[1]
    differences = differences.split("\n\n", 2)[1]  # the table
    [row] = [line for line in differences.splitlines() if "`excludeNamespaces` default" in line]
    assert "`[kube-system]`" in row and "`[istio-system, kube-system]`" in row
    assert Settings().excludeNamespaces == ("istio-system", "kube-system")
