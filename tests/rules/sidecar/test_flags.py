"""istio-iptables flag syntax, environment precedence and refusal of bad values."""

from __future__ import annotations

import pytest

from agent.errors import ConfigError
from agent.rules.sidecar.flags import FLAGS, HOST_FLAGS, parse_flags, request_from_flags
from tests.rules.conftest import run_rules

ALL = FLAGS + HOST_FLAGS


def config(argv: list[str], env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    environ = env or {}
    parsed = parse_flags(argv, ALL, environ)
    return request_from_flags(parsed, environ, ipv6=False, dns_servers=["10.0.0.10"]).config


def test_long_short_and_separate_values_are_equivalent() -> None:
    forms = [
        ["--envoy-port=16001", "--istio-inbound-ports=80,443"],
        ["--envoy-port", "16001", "--istio-inbound-ports", "80,443"],
        ["-p", "16001", "-b", "80,443"],
        ["-p=16001", "-b=80,443"],
        ["-p16001", "-b80,443"],
    ]
    results = {config(argv) for argv in forms}
    assert len(results) == 1
    only = results.pop()
    assert only is not None
    assert only.proxy_port == "16001" and only.inbound_ports_include == ("80", "443")


def test_bare_bool_flag_means_true_and_go_spellings_parse() -> None:
    assert config(["--drop-invalid"]).drop_invalid is True  # type: ignore[union-attr]
    assert config(["--drop-invalid=T"]).drop_invalid is True  # type: ignore[union-attr]
    assert config(["--drop-invalid=0"]).drop_invalid is False  # type: ignore[union-attr]


def test_precedence_flag_over_additional_env_over_primary_env() -> None:
    env = {"REDIRECT_DNS": "false", "ISTIO_META_DNS_CAPTURE": "true"}
    assert config([], env).redirect_dns is True  # type: ignore[union-attr]
    assert config(["--redirect-dns=false"], env).redirect_dns is False  # type: ignore[union-attr]
    assert config([], {"REDIRECT_DNS": "true"}).redirect_dns is True  # type: ignore[union-attr]
    assert config([], {"INVALID_DROP": "true", "DROP_INVALID": "false"}).drop_invalid is True  # type: ignore[union-attr]


def test_envoy_port_has_no_environment_variable() -> None:
    assert config([], {"ENVOY_PORT": "9999"}).proxy_port == "15001"  # type: ignore[union-attr]


def test_primary_env_vars_feed_flags() -> None:
    got = config([], {"ISTIO_INBOUND_PORTS": "*", "ISTIO_SERVICE_CIDR": "10.0.0.0/8"})
    assert got is not None
    assert got.inbound_ports_include == "*"
    assert got.outbound_ip_ranges_include == ("10.0.0.0/8",)


def test_proxy_gid_defaults_to_proxy_uid() -> None:
    got = config(["--proxy-uid=7,8"])
    assert got is not None and got.proxy_gids == ("7", "8")


def test_env_only_settings() -> None:
    got = config(
        [],
        {
            "ISTIO_OUTBOUND_OWNER_GROUPS": "java,202",
            "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR": "127.0.0.1/8",
        },
    )
    assert got is not None
    assert got.owner_groups_include == ("java", "202")
    assert got.host_ipv4_loopback_cidr == "127.0.0.1/8"


def test_dns_servers_only_used_when_redirecting_without_capture_all() -> None:
    assert config(["--redirect-dns"]).dns_servers_v4 == ("10.0.0.10",)  # type: ignore[union-attr]
    assert config([]).dns_servers_v4 == ()  # type: ignore[union-attr]
    assert config(["--redirect-dns", "--capture-all-dns"]).dns_servers_v4 == ()  # type: ignore[union-attr]


def test_skip_rule_apply_and_cleanup_only_program_nothing() -> None:
    assert config(["--skip-rule-apply"]) is None
    assert config(["--cleanup-only"]) is None


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["--istio-service-cidr=10.0.0.0/33"], {}, "--istio-service-cidr"),
        (["--istio-service-cidr=bogus"], {}, "bogus"),
        (["--istio-service-exclude-cidr=*"], {}, "--istio-service-exclude-cidr"),
        (["--istio-inbound-ports=70000"], {}, "70000"),
        (["--envoy-port=http"], {}, "--envoy-port"),
        (["-m", "NONE"], {}, "interception mode"),
        (["--istio-inbound-tproxy-mark=x"], {}, "--istio-inbound-tproxy-mark"),
        (["--kube-virt-interfaces=a/b"], {}, "a/b"),
        (["--dry-run=maybe"], {}, "--dry-run"),
        (["--probe-timeout=5 seconds"], {}, "--probe-timeout"),
        (["--iptables-probe-port=70000"], {}, "--iptables-probe-port"),
        (["--force-iptables-binary=other"], {}, "--force-iptables-binary"),
        (["--no-such-flag"], {}, "--no-such-flag"),
        (["-Z"], {}, "-Z"),
        (["--envoy-port"], {}, "needs a value"),
        (["stray"], {}, "stray"),
        ([], {"ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR": "10.0.0.1/32"}, "loopback"),
        ([], {"ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR": "127.0.0.1/4"}, "8 to 32"),
        ([], {"ISTIO_OUTBOUND_OWNER_GROUPS": ",".join(str(i) for i in range(65))}, "64"),
        (["--redirect-dns"], {"_DNS": "x"}, ""),
    ],
)
def test_bad_values_are_clear_errors(argv: list[str], env: dict[str, str], needle: str) -> None:
    if env.get("_DNS"):
        parsed = parse_flags(argv, ALL, {})
        with pytest.raises(ConfigError, match="--dns-servers"):
            request_from_flags(parsed, {}, ipv6=False, dns_servers=["not-an-ip"])
        return
    with pytest.raises(ConfigError) as err:
        config(argv, env)
    assert needle in str(err.value)


def test_cli_reports_bad_flag_and_exits_2() -> None:
    got = run_rules(["--istio-service-cidr=10.0.0.0/99", "--ipv6=false", "--dns-servers="])
    assert got.code == 2
    assert "--istio-service-cidr" in got.stderr and "10.0.0.0/99" in got.stderr
    assert got.stdout == ""


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({"REDIRECT_DNS": "perhaps"}, "false"),
        ({"REDIRECT_DNS": "true", "ISTIO_META_DNS_CAPTURE": "perhaps"}, "true"),
        ({"REDIRECT_DNS": "perhaps", "ISTIO_META_DNS_CAPTURE": "1"}, "true"),
    ],
    ids=["ignored", "additional-ignored-primary-kept", "primary-ignored-additional-set"],
)
def test_unparsable_env_values_are_ignored_as_istio_does(env: dict[str, str], want: str) -> None:
    """istio-iptables sets a flag from its variable with `_ = fs.Set(...)`: a value that does not
    parse leaves the flag as it was."""
    assert parse_flags([], ALL, env).values["redirect-dns"] == want


def test_short_flag_with_bare_equals_is_the_value_equals() -> None:
    """pflag reads `-p=` through its `-pvalue` form: the value is "="."""
    assert parse_flags(["-p="], ALL, {}).values["envoy-port"] == "="
