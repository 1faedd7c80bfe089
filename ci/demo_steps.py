"""The steps of the live demo (ci/demo.py runs them in order, then `Demo.cleanup()`).

Each step drives real parts through the test bed and end-to-end harness modules and prints, in
a few plain lines, what it did and what it saw. A step that finds something wrong raises
StepError saying what; the runner names the step.
"""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.e2e.daemon import DaemonAgent
from tests.e2e.harness import RELEASE, ChartOnNode, Installed, wait_for
from tests.e2e.podnet import OUTBOUND_PORT, connect, proxy_in
from tests.testbed import netns, parts
from tests.testbed.cni import CniNode, Sandbox
from tests.testbed.controlplane import Binaries, ControlPlane
from tests.testbed.helm import Helm
from tests.testbed.identity import Identity, service_account_identity
from tests.testbed.node import NodePods, new_core, register_node

REPO_ROOT = Path(__file__).resolve().parents[1]
NODE_NAME = "demo-node"
CHART_NAMESPACE = "kube-system"  # where the README installs the chart
APP_NAMESPACE = "demo"
# TEST-NET-3 (RFC 5737): an address no network routes. The redirect keeps the connection inside
# the pod; without it the packet ends in the demo's node namespace, which has no route out.
OUTSIDE = ("203.0.113.10", 80)
SIDECAR: dict[str, Any] = {
    "annotations": {"sidecar.istio.io/status": '{"containers":["istio-proxy"]}'},
    "containers": [{"name": "app", "image": "registry.invalid/demo/app:1"},
                   {"name": "istio-proxy", "image": "registry.invalid/demo/proxy:1"}],
}
SAVE_COMMANDS = {
    "iptables-nft": ["iptables-nft-save"],
    "iptables-legacy": ["iptables-legacy-save"],
    "python-iptables": ["iptables-legacy-save"],  # python-iptables programs the legacy tables
    "nftables": ["nft", "list", "ruleset"],
}
WIDTH = 100


class StepError(Exception):
    """A step found something wrong; the message says what."""


class Console:
    """Short lines for the reader on `out`; the same plus command details in demo.log."""

    def __init__(self, out: TextIO, log_path: Path) -> None:
        self.out = out
        self._log = log_path.open("a")

    def line(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()
        self.log(text)

    def say(self, text: str) -> None:
        """A sentence, wrapped to WIDTH under the step's title."""
        for row in textwrap.wrap(text, WIDTH, initial_indent="    ",
                                 subsequent_indent="      ", break_on_hyphens=False):
            self.line(row)

    def block(self, text: str) -> None:
        """Verbatim lines (rules, JSON), indented."""
        for row in text.splitlines():
            self.line(f"        {row}")

    def log(self, text: str) -> None:
        if not self._log.closed:
            self._log.write(text + "\n")
            self._log.flush()

    def close(self) -> None:
        self._log.close()


@dataclass
class Pod:
    namespace: str
    name: str
    sandbox: Sandbox
    ip: str


@dataclass
class Demo:
    """The demo's state; each step is a method, `cleanup()` undoes whatever was done."""

    workdir: Path
    console: Console
    plane: ControlPlane | None = None
    core: Any = None
    cni_node: CniNode | None = None
    node_pods: NodePods | None = None
    chart: ChartOnNode | None = None
    helm: Helm | None = None
    installed: Installed | None = None
    agent: DaemonAgent | None = None
    pods: dict[str, Pod] = field(default_factory=dict)
    backend: str = ""
    made_netns: list[str] = field(default_factory=list)
    """Every network namespace the demo made, to prove at the end that none is left."""

    # -- steps -------------------------------------------------------------------------------

    def start_control_plane(self) -> None:
        self.plane = ControlPlane(self.workdir / "controlplane", Binaries.from_cache())
        began = time.monotonic()
        self.plane.start()
        self.core = new_core(str(self.plane.kubeconfig))
        version = k8s.VersionApi(self.core.api_client).get_code().git_version
        self.console.say(f"etcd, kube-apiserver {version} and kube-controller-manager on "
                         f"127.0.0.1, ready in {time.monotonic() - began:.1f} s; API server "
                         f"{self.plane.server}")

    def register_node(self) -> None:
        assert self.plane is not None
        register_node(self.core, NODE_NAME)
        self.node_pods = NodePods(self.core, NODE_NAME)
        self.console.say(f"Node {NODE_NAME} is Ready. No kubelet runs: the demo binds pods to "
                         "it and makes the CNI calls its container runtime would.")

    def prepare_node(self) -> None:
        node = CniNode(self.workdir / "node", parts.cnitool().require(), parts.cni_plugins_dir(),
                       netns_name=netns.unique_name("demo-node"),
                       network=netns.unique_name("demo"))
        self.cni_node = node
        self.made_netns.append(node.netns_name)
        node.start()
        say = self.console.say
        say(f"network namespace {node.netns_name} is the node's network: bridge {node.bridge}, "
            f"pods in {node.subnet}")
        say(f"CNI bin dir {node.bin_dir} (Debian's reference plugins), conf dir {node.conf_dir}")
        say(f"{node.conflist_path.name}: {self._chain()}")

    def build_plugin(self) -> None:
        out = self.workdir / "image"
        done = subprocess.run([str(REPO_ROOT / "ci" / "build-plugin"), str(out)],
                              capture_output=True, text=True, check=False)
        self.console.log(done.stderr)
        if done.returncode != 0:
            raise StepError(f"ci/build-plugin failed:\n{done.stderr[-2000:]}")
        names = sorted(p.name for p in out.iterdir())
        self.console.say(f"ci/build-plugin: {', '.join(names)}, what the image ships in "
                         "/opt/istio-cni/bin (compiled once, then cached)")

    def helm_install(self) -> None:
        assert self.plane is not None and self.cni_node is not None
        binaries = parts.helm_binaries()
        version = max(binaries, key=_version_key)
        self.helm = Helm(binary=binaries[version], kubeconfig=self.plane.kubeconfig,
                         home=self.workdir / "helm")
        self.chart = ChartOnNode(
            core=self.core, apps=k8s.AppsV1Api(self.core.api_client), node_name=NODE_NAME,
            cni_node=self.cni_node, plugin_build=self.workdir / "image",
            make_identity=self._identity, workdir=self.workdir / "agent")
        self.installed = self.chart.install(self.helm, CHART_NAMESPACE)
        manifest = self.helm.run("get", "manifest", RELEASE, "--namespace", CHART_NAMESPACE)
        kinds = [f"{d['kind']}" for d in yaml.safe_load_all(manifest) if d]
        config = yaml.safe_load(self.installed.config_yaml(self.core))
        say = self.console.say
        say(f"helm {self.helm.version()} install {RELEASE} charts/istio-cni -n "
            f"{CHART_NAMESPACE}: created {', '.join(kinds)} (all named {RELEASE})")
        say(f"config.yaml in the ConfigMap: chained: {str(config['chained']).lower()}, "
            f"excludeNamespaces: [{', '.join(config['excludeNamespaces'])}], ruleBackend: "
            f"{config['ruleBackend']}, repair: {config['repair']['mode']}")
        say(f"no DaemonSet controller runs here: the demo made the DaemonSet's pod for "
            f"{NODE_NAME}, {CHART_NAMESPACE}/{self.installed.agent_pod}")

    def start_agent(self) -> None:
        assert self.chart is not None and self.installed is not None
        self.agent = self.chart.start_agent(self.installed)
        began = time.monotonic()
        self.agent.wait_ready(timeout=60)
        say = self.console.say
        say(f"istio-cni-agent run (pid {self.agent.proc.pid}) with the ConfigMap's config.yaml, "
            f"NODE_NAME={NODE_NAME} POD_NAME={self.installed.agent_pod} "
            f"POD_NAMESPACE={CHART_NAMESPACE}, a token of ServiceAccount "
            f"{CHART_NAMESPACE}/{RELEASE}, and the node's CNI dirs mounted where the DaemonSet "
            "mounts them (/host/opt/cni/bin, /host/etc/cni/net.d)")
        say(f"GET /readyz on 127.0.0.1:{self.agent.metrics_port}: 200 after "
            f"{time.monotonic() - began:.1f} s")

    def show_conflist(self) -> None:
        assert self.cni_node is not None
        plugins = json.loads(self.cni_node.conflist_path.read_text())["plugins"]
        if plugins[-1].get("type") != "istio-cni":
            raise StepError(f"{self.cni_node.conflist_path}: istio-cni is not chained last: "
                            f"{self._chain()}")
        say = self.console.say
        say(f"{self.cni_node.conflist_path.name}: {self._chain()} (our entry, chained last):")
        self.console.block(json.dumps(plugins[-1], indent=2))
        copied = sorted(p.name for p in self.cni_node.bin_dir.glob("istio-cni*"))
        say(f"bin dir: {', '.join(copied)} copied in by the agent")

    def start_sidecar_pod(self) -> None:
        pod = self._start_pod(APP_NAMESPACE, "app-with-sidecar", **SIDECAR)
        self.backend = self._backend_from_agent_log()
        rules = _rules_only(self._saved_rules(pod))
        if f"--to-ports {OUTBOUND_PORT}" not in rules:
            raise StepError(f"no redirect to {OUTBOUND_PORT} in pod {pod.name}'s netns:\n{rules}")
        self.console.say(f"the agent programmed its netns (backend {self.backend}); "
                         f"{' '.join(SAVE_COMMANDS[self.backend])} there shows:")
        self.console.block(rules)

    def start_plain_pods(self) -> None:
        excluded = self._start_pod(CHART_NAMESPACE, "excluded-by-namespace", **SIDECAR)
        plain = self._start_pod(APP_NAMESPACE, "app-without-sidecar")
        save = " ".join(SAVE_COMMANDS[self.backend])
        for pod, why in ((excluded, f"{CHART_NAMESPACE} is in excludeNamespaces, so the plugin "
                                    "let it pass without asking the agent"),
                         (plain, "it has no istio-proxy container, so the agent skipped it")):
            rules = _rules_only(self._saved_rules(pod))
            if "ISTIO" in rules:
                raise StepError(f"pod {pod.namespace}/{pod.name} has rules of ours:\n{rules}")
            self.console.say(f"{pod.name}: {why}; {save} in its netns prints "
                             f"{'nothing' if not rules else 'no rules of ours'}")

    def show_redirect(self) -> None:
        say = self.console.say
        target = f"{OUTSIDE[0]}:{OUTSIDE[1]}"
        say(f"in each pod a listener on port {OUTBOUND_PORT}, the sidecar's outbound port, "
            "answers with the connection's original destination (SO_ORIGINAL_DST)")
        sidecar = self.pods["app-with-sidecar"]
        reply = self._connect(sidecar)
        if reply != f"outbound|{target}":
            raise StepError(f"the connection from {sidecar.name} to {target} was not delivered "
                            f"to port {OUTBOUND_PORT} (got {reply!r})")
        say(f"{sidecar.name} ({sidecar.ip}) -> {target}: delivered to port {OUTBOUND_PORT} in "
            f"the pod; SO_ORIGINAL_DST = {reply.split('|')[1]}")
        plain = self.pods["app-without-sidecar"]
        reply = self._connect(plain)
        if reply.startswith("outbound|"):
            raise StepError(f"a connection from {plain.name} reached port {OUTBOUND_PORT}")
        say(f"{plain.name} ({plain.ip}) -> {target}: not redirected; it left the pod and "
            f"failed in the node namespace, which has no route out ({reply.split('|')[-1]})")

    def uninstall(self) -> None:
        assert self.helm is not None and self.agent is not None and self.cni_node is not None
        assert self.chart is not None and self.installed is not None
        say = self.console.say
        for pod in list(self.pods.values()):
            self._remove_pod(pod)
        say("pods removed as the kubelet would: CNI DEL through the chain, netns deleted, pod "
            "deleted in the API")
        self.helm.uninstall(RELEASE, namespace=CHART_NAMESPACE)
        wait_for(self._agent_pod_terminating, "the garbage collector to delete the agent's pod")
        say(f"helm uninstall {RELEASE}: DaemonSet, RBAC and ServiceAccount deleted; the "
            "garbage collector deleted the agent's pod, so the kubelet sends SIGTERM")
        code = self.agent.stop()
        self.chart.release_agent_pod(CHART_NAMESPACE, self.installed.agent_pod)
        say(f"the agent exited {code}; its log:")
        self.console.block("\n".join(_short_log(line) for line in self.agent.logs().splitlines()
                                     if "uninstall" in line or "keeping" in line))
        left = sorted(p.name for p in self.cni_node.bin_dir.glob("istio-cni*"))
        say(f"{self.cni_node.conflist_path.name}: {self._chain()}; bin dir: "
            f"{', '.join(left) or 'no istio-cni files'}")
        if code != 0 or left or "istio-cni" in self._chain():
            raise StepError("the agent did not remove its plugin and entry on SIGTERM")

    # -- cleanup -----------------------------------------------------------------------------

    def cleanup(self) -> list[str]:
        """Undo everything, in reverse; keep going past failures and return them."""
        errors: list[str] = []

        def attempt(what: str, action: Callable[[], object]) -> None:
            try:
                action()
            except Exception as e:  # the rest must still be cleaned up
                errors.append(f"{what}: {e}")

        if self.agent is not None and self.agent.proc.poll() is None:
            attempt("stop the agent", self.agent.stop)
        if self.chart is not None:
            attempt("the agent's pod and /host", self.chart.close)
        if self.node_pods is not None:
            attempt("pods", self.node_pods.close)
        if self.helm is not None:
            for release, namespace in list(self.helm.releases):
                attempt(f"helm uninstall {release}",
                        partial(self.helm.uninstall, release, namespace=namespace))
        if self.cni_node is not None:
            attempt("network namespaces", self.cni_node.close)
        if self.core is not None:
            attempt("API client", self.core.api_client.close)
        if self.plane is not None:
            attempt("control plane", self.plane.stop)
        return errors

    # -- helpers -----------------------------------------------------------------------------

    def _identity(self, namespace: str, service_account: str) -> Identity:
        """A TokenRequest token of the ServiceAccount, as the kubelet mounts it for the pod."""
        assert self.plane is not None
        (self.workdir / "agent").mkdir(exist_ok=True)
        return service_account_identity(
            self.core, namespace=namespace, service_account=service_account,
            server=self.plane.server, ca_file=self.plane.ca_file,
            path=self.workdir / "agent" / f"{namespace}-{service_account}.kubeconfig")

    def _chain(self) -> str:
        assert self.cni_node is not None
        plugins = json.loads(self.cni_node.conflist_path.read_text())["plugins"]
        return " -> ".join(p["type"] + (" (+ host-local)" if "ipam" in p else "")
                           for p in plugins)

    def _start_pod(self, namespace: str, name: str, **options: Any) -> Pod:
        assert self.node_pods is not None and self.cni_node is not None
        self._ensure_namespace(namespace)
        created = self.node_pods.create(namespace, name, **options)
        sandbox = self.cni_node.new_sandbox(name, namespace, created["metadata"]["uid"])
        self.made_netns.append(sandbox.netns_name)
        result = self.cni_node.add(sandbox)
        ip = str(result["ips"][0]["address"]).split("/")[0]
        self.pods[name] = Pod(namespace, name, sandbox, ip)
        self.node_pods.set_running(namespace, name, ip)
        self.console.say(f"pod {namespace}/{name} created in the API; cnitool add in netns "
                         f"{sandbox.netns_name} ran the chain: IP {ip}")
        return self.pods[name]

    def _remove_pod(self, pod: Pod) -> None:
        assert self.cni_node is not None and self.node_pods is not None
        self.cni_node.delete(pod.sandbox)
        self.cni_node.remove_sandbox(pod.sandbox)
        self.node_pods.delete(pod.namespace, pod.name)
        del self.pods[pod.name]

    def _ensure_namespace(self, namespace: str) -> None:
        try:
            self.core.create_namespace({"metadata": {"name": namespace}})
        except ApiException as e:
            if e.status != 409:
                raise

    def _agent_pod_terminating(self) -> bool:
        assert self.installed is not None
        pod = self.core.read_namespaced_pod(self.installed.agent_pod, CHART_NAMESPACE)
        return pod.metadata.deletion_timestamp is not None

    def _backend_from_agent_log(self) -> str:
        assert self.agent is not None
        found = re.findall(r'msg="applied redirect rules".* backend=(\S+)', self.agent.logs())
        if not found or found[-1] not in SAVE_COMMANDS:
            raise StepError(f"the agent logged no 'applied redirect rules' ({self.agent.log_path})")
        return str(found[-1])

    def _saved_rules(self, pod: Pod) -> str:
        argv = ["ip", "netns", "exec", pod.sandbox.netns_name, *SAVE_COMMANDS[self.backend]]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            raise StepError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
        return done.stdout

    def _connect(self, pod: Pod) -> str:
        with proxy_in(pod.sandbox):
            reply = connect(pod.sandbox.netns_name, *OUTSIDE)
        self.console.log(f"{pod.name} -> {OUTSIDE[0]}:{OUTSIDE[1]}: {reply}")
        return reply


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)) or (0,)


def _rules_only(saved: str) -> str:
    """The save output without its comment lines (timestamps, generator)."""
    return "\n".join(line for line in saved.splitlines() if not line.startswith("#")).strip()


def _short_log(line: str) -> str:
    """An agent log line without its time and logger fields."""
    return re.sub(r"^time=\S+ level=\S+ logger=\S+ ", "", line)
