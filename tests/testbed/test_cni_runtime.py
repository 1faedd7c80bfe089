"""The CNI runtime of the test bed: cnitool driving Debian's reference plugins (bridge +
host-local + portmap) inside a node netns for pod netns, as a container runtime does."""

from __future__ import annotations

import ipaddress
import json
import textwrap
from pathlib import Path

import pytest

from testbed import netns, parts
from testbed.cni import CniNode

pytestmark = pytest.mark.netns


def _addresses(ns: str, dev: str) -> list[str]:
    return [
        f"{a['local']}/{a['prefixlen']}"
        for link in netns.ip_json("addr", "show", "dev", dev, netns=ns)
        for a in link.get("addr_info", [])
        if a.get("family") == "inet"
    ]


def _links(ns: str) -> list[str]:
    return [link["ifname"] for link in netns.ip_json("link", "show", netns=ns)]


def test_add_check_del_of_the_reference_chain(cni_node: CniNode) -> None:
    sandbox = cni_node.new_sandbox("web-0", "shop")
    result = cni_node.add(sandbox)

    ips = [ipaddress.ip_interface(i["address"]) for i in result["ips"]]
    assert [ip.ip in ipaddress.ip_network(cni_node.subnet) for ip in ips] == [True]
    assert _addresses(sandbox.netns_name, "eth0") == [str(ips[0])]
    routes = netns.ip_json("route", "show", "default", netns=sandbox.netns_name)
    gateway = str(ipaddress.ip_network(cni_node.subnet)[1])
    assert [(r["dst"], r.get("gateway"), r["dev"]) for r in routes] == [
        ("default", gateway, "eth0")
    ]
    # The bridge and the host end of the veth live in the node netns, not on the machine.
    assert cni_node.bridge in _links(cni_node.netns_name)
    assert not Path(f"/sys/class/net/{cni_node.bridge}").exists()

    cni_node.check(sandbox)

    cni_node.delete(sandbox)
    assert "eth0" not in _links(sandbox.netns_name)
    assert not list((cni_node.workdir / "ipam" / cni_node.network).glob("10.*"))


def test_cni_args_reach_every_plugin_in_the_chain(cni_node: CniNode, tmp_path: Path) -> None:
    # A recording plugin appended to the chain, on purpose: it shows what the runtime passes.
    record = tmp_path / "recorded.json"
    recorder = cni_node.bin_dir / "record-env"
    recorder.write_text(
        textwrap.dedent(f"""\
        #!/usr/bin/env python3
        import json, os, sys
        conf = json.load(sys.stdin)
        keys = ("CNI_COMMAND", "CNI_ARGS", "CNI_IFNAME", "CNI_NETNS", "CNI_CONTAINERID")
        with open({str(record)!r}, "a") as f:
            f.write(json.dumps({{k: os.environ.get(k) for k in keys}}) + "\\n")
        if os.environ["CNI_COMMAND"] == "ADD":
            json.dump(conf["prevResult"], sys.stdout)
        """)
    )
    recorder.chmod(0o755)
    conflist = cni_node.reference_conflist()
    conflist["plugins"].append({"type": "record-env"})
    cni_node.conflist_path.write_text(json.dumps(conflist))

    sandbox = cni_node.new_sandbox("db-0", "shop", pod_uid="2b1c7e0e-5d40-4f55-9d0c-2b8b6c1d9a11")
    cni_node.add(sandbox)
    cni_node.check(sandbox)
    cni_node.delete(sandbox)

    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert [c["CNI_COMMAND"] for c in calls] == ["ADD", "CHECK", "DEL"]
    args = dict(pair.split("=", 1) for pair in calls[0]["CNI_ARGS"].split(";"))
    assert args["K8S_POD_NAMESPACE"] == "shop"
    assert args["K8S_POD_NAME"] == "db-0"
    assert args["K8S_POD_UID"] == "2b1c7e0e-5d40-4f55-9d0c-2b8b6c1d9a11"
    assert args["K8S_POD_INFRA_CONTAINER_ID"] == sandbox.infra_container_id
    assert calls[0]["CNI_NETNS"] == str(sandbox.netns_path)
    assert calls[0]["CNI_IFNAME"] == "eth0"


def test_failing_plugin_returns_the_cni_error(cni_node: CniNode) -> None:
    conflist = cni_node.reference_conflist()
    conflist["plugins"][0]["ipam"]["ranges"] = [[{"subnet": "not-a-subnet"}]]
    cni_node.conflist_path.write_text(json.dumps(conflist))
    sandbox = cni_node.new_sandbox("bad-0", "shop")
    result = cni_node.run("ADD", sandbox, check=False)
    assert not result.ok
    assert "not-a-subnet" in result.stdout + result.stderr


def test_close_removes_every_namespace_and_link(tmp_path: Path) -> None:
    node = CniNode(tmp_path / "node", parts.cnitool().require(), parts.cni_plugins_dir())
    try:
        node.start()
        sandboxes = [node.new_sandbox(f"p{i}", "shop") for i in range(2)]
        node.add(sandboxes[0])  # one attached, one never attached
    finally:
        node.close()
    assert not netns.exists(node.netns_name)
    assert not any(netns.exists(s.netns_name) for s in sandboxes)
    assert not list(Path("/var/lib/cni/results").glob(f"{node.network}-*"))
