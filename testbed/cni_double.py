"""Test doubles of providers' CNI plugins that cannot run here (calico, aws-cni, azure-vnet,
flannel's, AWS's egress-cni): an executable named after the provider's plugin `type`, so the
provider's conflist stays as that provider writes it, giving pods their network through Debian's
real `bridge` plugin.

    delegate   calico, aws-cni, azure-vnet: the conflist entry's own fields are ignored; the pod
               gets bridge + host-local on the node's bridge and pod subnet (cni.bridge_plugin),
               as the provider would give it an address and a default route.
    flannel    what flannel's plugin does: reads `subnetFile` (flanneld's subnet.env), builds a
               bridge delegate (its `delegate` fields over bridge cni0, host-local on
               FLANNEL_SUBNET, FLANNEL_MTU, ipMasq unless flanneld masquerades) and runs it.
    pass       egress-cni as AWS writes it (`"enabled": "false"`): hands the previous result on.

Each file is a Python script for Debian's /usr/bin/python3 (the node's, not the test's venv),
and says in its first lines that it is a test double.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

INTERPRETER = "/usr/bin/python3"

_SCRIPT = """#!{interpreter}
# TEST DOUBLE of the `{plugin_type}` CNI plugin ({mode}), written by the istio-cni test bed
# (testbed/cni_double.py): it keeps the provider's conflist and delegates to the real `bridge`.
import ipaddress, json, os, subprocess, sys

MODE = {mode!r}
DELEGATE = json.loads({delegate!r})


def fail(msg):
    print(json.dumps({{"cniVersion": "0.4.0", "code": 999, "msg": "{plugin_type} double: " + msg}}))
    sys.exit(1)


def flannel_delegate(conf):
    env = {{}}
    with open(conf.get("subnetFile", "/run/flannel/subnet.env")) as f:
        for line in f:
            key, _, value = line.strip().partition("=")
            env[key] = value
    out = {{"type": "bridge", "bridge": "cni0", "isGateway": True}}
    out.update(conf.get("delegate") or {{}})
    out["mtu"] = int(env["FLANNEL_MTU"])
    out["ipMasq"] = env.get("FLANNEL_IPMASQ") != "true"
    out["ipam"] = {{
        "type": "host-local",
        "ranges": [[{{"subnet": str(ipaddress.ip_network(env["FLANNEL_SUBNET"], strict=False))}}]],
        "routes": [{{"dst": env["FLANNEL_NETWORK"]}}],
    }}
    return out


command = os.environ.get("CNI_COMMAND", "")
if command == "VERSION":
    print(json.dumps({{"cniVersion": "1.0.0",
                      "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0"]}}))
    sys.exit(0)
conf = json.load(sys.stdin)
if MODE == "pass":
    if command == "ADD":
        result = dict(conf.get("prevResult") or fail("no prevResult to hand on"))
        result["cniVersion"] = conf["cniVersion"]
        print(json.dumps(result))
    sys.exit(0)
delegate = flannel_delegate(conf) if MODE == "flannel" else dict(DELEGATE)
delegate["cniVersion"] = conf["cniVersion"]
delegate["name"] = conf["name"]
for d in os.environ.get("CNI_PATH", "").split(":"):
    if d and os.access(os.path.join(d, "bridge"), os.X_OK):
        done = subprocess.run([os.path.join(d, "bridge")], input=json.dumps(delegate).encode())
        sys.exit(done.returncode)
fail("no bridge plugin in CNI_PATH")
"""


def write_double(
    bin_dir: Path, plugin_type: str, mode: str, delegate: dict[str, Any] | None = None
) -> Path:
    assert mode in ("delegate", "flannel", "pass"), mode
    path = bin_dir / plugin_type
    path.write_text(
        _SCRIPT.format(
            interpreter=INTERPRETER,
            plugin_type=plugin_type,
            mode=mode,
            delegate=json.dumps(delegate or {}),
        )
    )
    path.chmod(0o755)
    return path
