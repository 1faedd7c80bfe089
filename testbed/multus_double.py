"""A test double of Multus's thin CNI plugin (the `multus` binary OpenShift runs from
/var/lib/cni/bin): Multus cannot be built here (its module is not served by the Go module proxy).

What it does, as Multus does for what OpenShift's Istio needs:
    ADD   runs the default network (`delegates[0]`, a conf or a conflist) with the runtime's
          CNI_IFNAME; reads the pod's `k8s.v1.cni.cncf.io/networks` annotation from the API
          server (`kubeconfig`: JSON here, the double reads no YAML), both forms
          (`[ns/]name[@if]` comma list, or a JSON list); enforces `namespaceIsolation` with
          `globalNamespaces`; for each NetworkAttachmentDefinition uses its spec.config, or
          without one the file in `confDir` whose config `name` is the NAD's; runs it with
          CNI_IFNAME net1, net2... (or @if); on any failure deletes what it added and fails
          naming the NAD. What it added is cached under /var/lib/cni/multus for DEL. Prints the
          default network's result.
    DEL   the cached networks in reverse, then the default network (never needs the API).
Not done: network-status annotations, runtimeConfig, defaultNetworks, readiness files.

The file is a Python script for Debian's /usr/bin/python3 and says in its first lines that it
is a test double.
"""

# The script keeps Multus's own error wording on one line each.
# ruff: noqa: E501
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

INTERPRETER = "/usr/bin/python3"

_SCRIPT = r'''#!/usr/bin/python3
# TEST DOUBLE of Multus's thin CNI plugin, written by the istio-cni test bed
# (testbed/multus_double.py): NetworkAttachmentDefinitions from the pod's
# k8s.v1.cni.cncf.io/networks annotation, run after the default network.
import json, os, re, ssl, subprocess, sys, urllib.error, urllib.request

CACHE_DIR = "/var/lib/cni/multus"
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
conf = {}


class Fail(Exception):
    def __init__(self, msg, code=999):
        super().__init__(msg)
        self.code = code


def log(line):
    path = conf.get("logFile")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def find_plugin(kind):
    dirs = [conf.get("binDir") or "/opt/cni/bin"]
    dirs += [d for d in os.environ.get("CNI_PATH", "").split(":") if d]
    for d in dirs:
        path = os.path.join(d, kind)
        if os.access(path, os.X_OK):
            return path
    raise Fail(f'failed to find plugin "{kind}" in path {dirs}')


def exec_plugin(config, command, ifname, prev=None):
    config = dict(config)
    if prev is not None:
        config["prevResult"] = prev
    env = dict(os.environ, CNI_COMMAND=command, CNI_IFNAME=ifname)
    done = subprocess.run([find_plugin(config["type"])], input=json.dumps(config).encode(),
                          env=env, capture_output=True, timeout=120)
    if done.returncode != 0:
        try:
            msg = json.loads(done.stdout)["msg"]
        except (ValueError, KeyError, TypeError):
            msg = (done.stdout or done.stderr).decode(errors="replace").strip()[-500:]
        raise Fail(f"{config['type']} {command}: {msg}")
    if command == "ADD":
        try:
            return json.loads(done.stdout)
        except ValueError:
            raise Fail(f"{config['type']} ADD printed no result")
    return None


def run_network(network, command, ifname, prev=None):
    """libcni's AddNetworkList/AddNetwork: a list runs plugin by plugin, prevResult chained."""
    if "plugins" not in network:
        return exec_plugin(network, command, ifname, prev)
    plugins = network["plugins"]
    if command == "DEL":
        plugins = list(reversed(plugins))
    result = prev
    errors = []
    for plugin in plugins:
        config = dict(plugin, name=network["name"], cniVersion=network["cniVersion"])
        try:
            out = exec_plugin(config, command, ifname, result if command != "DEL" else prev)
        except Fail as e:
            if command != "DEL":
                raise
            errors.append(str(e))
            continue
        if command == "ADD":
            result = out
    if errors:
        raise Fail("; ".join(errors))
    return result


def k8s_args():
    out = {}
    for pair in os.environ.get("CNI_ARGS", "").split(";"):
        key, _, value = pair.partition("=")
        if key:
            out[key] = value
    return out


def api_get(path):
    with open(conf["kubeconfig"]) as f:
        try:
            kube = json.load(f)
        except ValueError:
            raise Fail(f"kubeconfig {conf['kubeconfig']} is not JSON (this double reads no YAML)")
    context = next(c["context"] for c in kube["contexts"] if c["name"] == kube["current-context"])
    cluster = next(c["cluster"] for c in kube["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in kube["users"] if u["name"] == context["user"])
    tls = ssl.create_default_context(cafile=cluster["certificate-authority"])
    headers = {"Accept": "application/json"}
    if "client-certificate" in user:
        tls.load_cert_chain(user["client-certificate"], user["client-key"])
    elif "token" in user:
        headers["Authorization"] = "Bearer " + user["token"]
    request = urllib.request.Request(cluster["server"] + path, headers=headers)
    try:
        with urllib.request.urlopen(request, context=tls, timeout=10) as response:
            return json.load(response)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise Fail(f"GET {path}: HTTP {e.code}")
    except OSError as e:
        raise Fail(f"GET {path}: {e}")


def parse_networks(text, pod_ns):
    """[(namespace, name, interface or None)] of the annotation; a pod owner wrote it."""
    text = text.strip()
    if not text:
        return []
    if text.startswith("["):
        try:
            items = json.loads(text)
        except ValueError as e:
            raise Fail(f"parsePodNetworkAnnotation: failed to parse pod Network Attachment Selection Annotation JSON format: {e}")
        if not all(isinstance(i, dict) for i in items):
            raise Fail("parsePodNetworkAnnotation: each network must be a JSON object")
        out = [(i.get("namespace") or pod_ns, i.get("name"), i.get("interface")) for i in items]
    else:
        out = []
        for item in text.split(","):
            item = item.strip()
            ref, _, iface = item.partition("@")
            ns, _, name = ref.rpartition("/")
            out.append((ns or pod_ns, name, iface or None))
    for ns, name, iface in out:
        for what, value in (("namespace", ns), ("name", name)):
            if not isinstance(value, str) or not NAME.match(value):
                raise Fail(f"parsePodNetworkAnnotation: invalid network {what} {value!r} in {text!r}")
        if iface is not None and (not isinstance(iface, str) or not 0 < len(iface) <= 15
                                  or "/" in iface or iface in (".", "..")):
            raise Fail(f"parsePodNetworkAnnotation: invalid interface name {iface!r}")
    return out


def delegate_config(ns, name):
    nad = api_get(f"/apis/k8s.cni.cncf.io/v1/namespaces/{ns}/network-attachment-definitions/{name}")
    if nad is None:
        raise Fail(f"cannot find a network-attachment-definition ({name}) in namespace ({ns})")
    text = (nad.get("spec") or {}).get("config") or ""
    if text.strip():
        try:
            return json.loads(text)
        except ValueError:
            raise Fail(f"net-attach-def {ns}/{name}: spec.config is not JSON")
    conf_dir = conf.get("confDir") or "/etc/cni/multus/net.d"
    try:
        files = sorted(os.listdir(conf_dir))
    except OSError:
        files = []
    for file in files:
        if not file.endswith((".conf", ".conflist", ".json")):
            continue
        try:
            with open(os.path.join(conf_dir, file)) as f:
                config = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(config, dict) and config.get("name") == name:
            return config
    raise Fail(f"net-attach-def {ns}/{name} has no spec.config and no config named {name!r} is in {conf_dir}")


def cache_path():
    return os.path.join(CACHE_DIR, os.environ.get("CNI_CONTAINERID", "none"))


def write_cache(added):
    os.makedirs(CACHE_DIR, exist_ok=True)
    tmp = cache_path() + ".tmp"
    with open(tmp, "w") as f:
        json.dump(added, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, cache_path())


def cmd_add():
    default = conf["delegates"][0]
    ifname = os.environ.get("CNI_IFNAME", "eth0")
    args = k8s_args()
    pod_ns, pod_name = args.get("K8S_POD_NAMESPACE", ""), args.get("K8S_POD_NAME", "")
    result = run_network(default, "ADD", ifname)
    added = []
    try:
        pod = api_get(f"/api/v1/namespaces/{pod_ns}/pods/{pod_name}") if pod_name else None
        notes = ((pod or {}).get("metadata") or {}).get("annotations") or {}
        networks = parse_networks(notes.get("k8s.v1.cni.cncf.io/networks", ""), pod_ns)
        global_ns = {n.strip() for n in (conf.get("globalNamespaces") or "").split(",") if n.strip()}
        for index, (ns, name, iface) in enumerate(networks, start=1):
            if conf.get("namespaceIsolation") and ns != pod_ns and ns not in global_ns:
                raise Fail(f"namespace isolation enabled, annotation violates permission, pod is in namespace {pod_ns} but refers to target namespace {ns}")
            config = delegate_config(ns, name)
            net_if = iface or f"net{index}"
            try:
                run_network(config, "ADD", net_if)
            except Fail as e:
                raise Fail(f"[{pod_ns}/{pod_name}/{args.get('K8S_POD_UID', '')}:{name}]: error adding container to network \"{name}\": {e}")
            added.append({"network": f"{ns}/{name}", "config": config, "ifname": net_if})
            log(f"ADD {pod_ns}/{pod_name} {ns}/{name} {net_if}")
        write_cache({"default": default, "ifname": ifname, "added": added})
    except Exception:
        for entry in reversed(added):
            try:
                run_network(entry["config"], "DEL", entry["ifname"])
            except Fail:
                pass
        try:
            run_network(default, "DEL", ifname)
        except Fail:
            pass
        raise
    print(json.dumps(result))


def cmd_del():
    cached = None
    try:
        with open(cache_path()) as f:
            cached = json.load(f)
    except (OSError, ValueError):
        pass
    errors = []
    if cached:
        for entry in reversed(cached.get("added", [])):
            try:
                run_network(entry["config"], "DEL", entry["ifname"])
            except Fail as e:
                errors.append(str(e))
    try:
        run_network(conf["delegates"][0], "DEL", os.environ.get("CNI_IFNAME", "eth0"))
    except Fail as e:
        errors.append(str(e))
    try:
        os.unlink(cache_path())
    except OSError:
        pass
    if errors:
        raise Fail(errors[0])


def main():
    global conf
    command = os.environ.get("CNI_COMMAND", "")
    if command == "VERSION":
        print(json.dumps({"cniVersion": "1.0.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0"]}))
        return
    conf = json.load(sys.stdin)
    if not conf.get("delegates"):
        raise Fail("multus config has no delegates (the default network)")
    if command == "ADD":
        cmd_add()
    elif command == "DEL":
        cmd_del()
    elif command == "CHECK":
        run_network(conf["delegates"][0], "CHECK", os.environ.get("CNI_IFNAME", "eth0"), conf.get("prevResult"))


try:
    main()
except Fail as e:
    print(json.dumps({"cniVersion": conf.get("cniVersion", "0.3.1"), "code": e.code, "msg": "multus double: " + str(e)}))
    sys.exit(1)
except Exception as e:  # a bug of the double still answers as a CNI error
    print(json.dumps({"cniVersion": conf.get("cniVersion", "0.3.1"), "code": 999, "msg": f"multus double: {type(e).__name__}: {e}"}))
    sys.exit(1)
'''


def write_multus_double(bin_dir: Path) -> Path:
    """bin_dir/multus, executable, written atomically."""
    path = bin_dir / "multus"
    tmp = bin_dir / ".multus.tmp"
    tmp.write_text(_SCRIPT)
    tmp.chmod(0o755)
    os.replace(tmp, path)
    return path


def nad_crd() -> dict[str, Any]:
    """The NetworkAttachmentDefinition CRD as Multus's deployment installs it."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "network-attachment-definitions.k8s.cni.cncf.io"},
        "spec": {
            "group": "k8s.cni.cncf.io",
            "scope": "Namespaced",
            "names": {
                "plural": "network-attachment-definitions",
                "singular": "network-attachment-definition",
                "kind": "NetworkAttachmentDefinition",
                "shortNames": ["net-attach-def"],
            },
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": {
                                    "type": "object",
                                    "properties": {"config": {"type": "string"}},
                                },
                            },
                        }
                    },
                }
            ],
        },
    }
