"""pytest fixtures of the test bed (a plugin module: tests/conftest.py lists it in
`pytest_plugins`, so every test directory can use them).

Session: `control_plane` (etcd + kube-apiserver + kube-controller-manager; sets KUBECONFIG),
`kube_config` (its admin kubeconfig; also feeds pytest-helm-charts' `kube_cluster` and namespace
fixtures), `kube_core`, `kube_apps`, `sim_node`.
Per test: `node_pods`, `make_identity`, `cni_node`, `pod_netns`, `pod_namespaces`,
`helm_binaries`, `helm_releases`, `fake_api` (a strict fake API server on loopback) and
`fake_api_clients` (the agent's clients pointed at it).
A part that is missing or does not start fails the test with a message naming the part.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from agent.kube import KubeClients, build_clients
from testbed import netns, parts
from testbed.cni import CniNode
from testbed.controlplane import Binaries, ControlPlane
from testbed.fakeapi import FakeApiServer
from testbed.helm import Helm, uninstall_all
from testbed.identity import Identity, service_account_identity
from testbed.node import NodePods, TerminationFinisher, register_node
from testbed.podnetns import PodNamespaces
from testbed.process import PartFailedError

NODE_NAME = "node-1"


def _require(get: Callable[[], Any]) -> Any:
    """Call a part lookup; a missing part fails (never skips) the test that needs it."""
    try:
        return get()
    except parts.MissingPartError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    binaries = _require(Binaries.from_cache)
    plane = ControlPlane(tmp_path_factory.mktemp("controlplane"), binaries)
    with pytest.MonkeyPatch.context() as mp:
        try:
            plane.start()
            mp.setenv("KUBECONFIG", str(plane.kubeconfig))
            yield plane
        except PartFailedError as e:
            pytest.fail(str(e), pytrace=False)
        finally:
            plane.stop()


@pytest.fixture(scope="session")
def kube_config(control_plane: ControlPlane) -> str:
    """The admin kubeconfig. Same name as pytest-helm-charts' fixture on purpose: this one
    overrides it, so its `kube_cluster` and namespace fixtures talk to the test bed."""
    return str(control_plane.kubeconfig)


@pytest.fixture(scope="session")
def kube_core(kube_config: str) -> Iterator[Any]:
    """kubernetes.client.CoreV1Api as cluster admin."""
    api = k8s_config.new_client_from_config(config_file=kube_config)
    try:
        yield k8s.CoreV1Api(api)
    finally:
        api.close()


@pytest.fixture(scope="session")
def kube_apps(kube_config: str) -> Iterator[Any]:
    """kubernetes.client.AppsV1Api as cluster admin (the test's own writes; the agent's calls
    go through agent.kube)."""
    api = k8s_config.new_client_from_config(config_file=kube_config)
    try:
        yield k8s.AppsV1Api(api)
    finally:
        api.close()


@pytest.fixture(scope="session")
def sim_node(kube_core: Any, kube_config: str) -> Iterator[str]:
    """The name of a registered, Ready Node no kubelet runs on. Pods on it that are deleted
    gracefully are removed as its kubelet would once their containers stopped."""
    register_node(kube_core, NODE_NAME)
    # Its own client: the finisher's watch runs in another thread.
    finisher_api = k8s_config.new_client_from_config(config_file=kube_config)
    finisher = TerminationFinisher(k8s.CoreV1Api(finisher_api), NODE_NAME)
    finisher.start()
    try:
        yield NODE_NAME
    finally:
        finisher.stop()
        finisher_api.close()
    try:
        kube_core.delete_node(NODE_NAME)
    except ApiException as e:
        if e.status != 404:
            raise


@pytest.fixture
def node_pods(kube_core: Any, sim_node: str) -> Iterator[NodePods]:
    """Creates pods bound to `sim_node`; deletes them at the end of the test."""
    pods = NodePods(kube_core, sim_node)
    try:
        yield pods
    finally:
        pods.close()


@pytest.fixture
def make_identity(
    kube_core: Any, control_plane: ControlPlane, tmp_path: Path
) -> Callable[..., Identity]:
    """make_identity(namespace, service_account, bound_pod=None) -> Identity with a kubeconfig
    holding a TokenRequest token for that ServiceAccount."""

    def make(namespace: str, service_account: str, **options: Any) -> Identity:
        path = tmp_path / f"{namespace}-{service_account}.kubeconfig"
        return service_account_identity(
            kube_core,
            namespace=namespace,
            service_account=service_account,
            server=control_plane.server,
            ca_file=control_plane.ca_file,
            path=path,
            **options,
        )

    return make


@pytest.fixture
def cni_node(tmp_path: Path) -> Iterator[CniNode]:
    """A node for the CNI runtime: its own netns, conf dir with the reference conflist, bin dir
    with the reference plugins, and cnitool. Everything is removed at the end."""
    cnitool = _require(lambda: parts.cnitool().require())
    plugins = _require(parts.cni_plugins_dir)
    node = CniNode(tmp_path / "cni-node", cnitool, plugins)
    try:
        node.start()
        yield node
    finally:
        node.close()


@pytest.fixture
def pod_netns() -> Iterator[Path]:
    """A fresh named network namespace (lo up, nothing else), deleted after the test: its path."""
    name = netns.unique_name("podns")
    path = netns.add(name)
    try:
        yield path
    finally:
        netns.delete(name)


@pytest.fixture
def pod_namespaces() -> Iterator[PodNamespaces]:
    """Simulated pods' named namespaces and sandbox processes, all removed after the test."""
    made = PodNamespaces()
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(scope="session")
def helm_binaries() -> dict[str, Path]:
    """Every Helm binary ci/setup-helm installed, by version."""
    found: dict[str, Path] = _require(parts.helm_binaries)
    return found


@pytest.fixture
def helm_releases(kube_config: str, tmp_path: Path) -> Iterator[Callable[[Path], Helm]]:
    """helm_for(binary) -> Helm bound to the test bed; every release it installed is
    uninstalled at the end of the test."""
    made: list[Helm] = []

    def helm_for(binary: Path) -> Helm:
        home = tmp_path / f"helm-{len(made)}"
        home.mkdir()
        made.append(Helm(binary=binary, kubeconfig=Path(kube_config), home=home))
        return made[-1]

    yield helm_for
    errors = uninstall_all(made)
    if errors:
        raise RuntimeError("helm uninstall at teardown: " + "; ".join(errors))


@pytest.fixture
def fake_api(tmp_path: Path) -> Iterator[FakeApiServer]:
    """A strict fake API server on loopback (testbed.fakeapi), stopped after the test."""
    with FakeApiServer(tmp_path) as fake:
        yield fake


@pytest.fixture
def fake_api_clients(fake_api: FakeApiServer) -> Iterator[KubeClients]:
    """The agent's own clients, pointed at `fake_api` by its kubeconfig; closed after the test."""
    made = build_clients({"KUBECONFIG": str(fake_api.kubeconfig())})
    try:
        yield made
    finally:
        made.close()
