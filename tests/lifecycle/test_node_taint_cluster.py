"""The not-ready taint against the real kube-apiserver: Node objects with our taint and others,
the JSON patch's `test` failing on a concurrent change, and the agent process itself with the
setting on, off, and without the RBAC to do it.

These Node objects have no kubelet: the controller manager's node lifecycle controller adds its
own `node.kubernetes.io/not-ready` taint to them at any moment, a real concurrent writer, so the
assertions name the taints that must (not) be there rather than the whole list."""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from agent.errors import TaintChanged
from agent.kube import KubeClients, build_clients
from agent.node_taint import TAINT_KEY, NodeTaintRemover, TaintTiming, remove_taint
from testbed.agent_host import Node, agent_command, agent_env, http_get
from testbed.ports import free_port
from testbed.wait import wait_for

pytestmark = pytest.mark.cluster

OURS = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}
OTHER = {"key": "example.com/maintenance", "value": "planned", "effect": "NoSchedule"}
LIST = {"cniVersion": "0.4.0", "name": "net", "plugins": [{"type": "ptp"}]}
FAST = TaintTiming(ready_poll_seconds=0.05, initial_backoff_seconds=0.05)


@pytest.fixture
def clients(kube_config: str) -> Iterator[KubeClients]:
    made = build_clients()  # $KUBECONFIG points at the test bed's API server
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def make_node(kube_core: Any) -> Iterator[Callable[[list[dict[str, Any]]], str]]:
    """make_node(taints) -> the name of a new Node with those taints; deleted at the end."""
    made: list[str] = []

    def make(taints: list[dict[str, Any]]) -> str:
        name = f"taint-{secrets.token_hex(4)}"
        kube_core.create_node(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name},
                "spec": {"taints": taints},
            }
        )
        made.append(name)
        return name

    yield make
    for name in made:
        try:
            kube_core.delete_node(name)
        except ApiException as e:
            if e.status != 404:
                raise


def taints_of(core: Any, name: str) -> list[dict[str, Any]]:
    node = json.loads(core.read_node(name, _preload_content=False).data)
    found: list[dict[str, Any]] = node["spec"].get("taints") or []
    return found


def keys(taints: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(t["key"], t["effect"]) for t in taints]


# -- one removal ----------------------------------------------------------------------------


def test_removal_leaves_the_other_taints(
    clients: KubeClients, make_node: Callable[..., str]
) -> None:
    ours_execute = {**OURS, "effect": "NoExecute"}
    name = make_node([OURS, OTHER, ours_execute])
    assert remove_taint(clients.core, name) == ["NoSchedule", "NoExecute"]
    after = taints_of(clients.core, name)
    assert TAINT_KEY not in [t["key"] for t in after]
    assert (OTHER["key"], "NoSchedule") in keys(after)
    assert next(t for t in after if t["key"] == OTHER["key"])["value"] == "planned"


def test_missing_taint_is_no_write(
    clients: KubeClients, kube_core: Any, make_node: Callable[..., str]
) -> None:
    name = make_node([OTHER])
    before = kube_core.read_node(name).metadata.resource_version
    assert remove_taint(clients.core, name) == []
    assert kube_core.read_node(name).metadata.resource_version == before


def test_the_patch_fails_when_the_taints_changed_meanwhile(
    clients: KubeClients, kube_core: Any, make_node: Callable[..., str]
) -> None:
    """The API server itself refuses the patch (its `test` op) when the list is not the one
    read: the concurrent writer's taint is never dropped."""
    name = make_node([OURS])
    added = {"key": "example.com/added-meanwhile", "effect": "NoExecute"}
    core = _InterleavingCore(clients.core, lambda: _add_taint(kube_core, name, added))
    with pytest.raises(TaintChanged, match="HTTP 422"):
        remove_taint(core, name)
    after = keys(taints_of(clients.core, name))
    assert (TAINT_KEY, "NoSchedule") in after and (added["key"], "NoExecute") in after


def test_conflict_is_retried_and_keeps_the_concurrent_change(
    clients: KubeClients, kube_core: Any, make_node: Callable[..., str]
) -> None:
    name = make_node([OTHER, OURS])
    added = {"key": "example.com/added-meanwhile", "effect": "NoExecute"}
    core = _InterleavingCore(clients.core, lambda: _add_taint(kube_core, name, added))
    remover = NodeTaintRemover(core, name, is_ready=lambda: True, timing=FAST)
    remover.start()
    try:
        assert remover.done.wait(30)
    finally:
        remover.stop()
    assert remover.attempts == 2
    after = keys(taints_of(clients.core, name))
    assert (TAINT_KEY, "NoSchedule") not in after
    assert (OTHER["key"], "NoSchedule") in after and (added["key"], "NoExecute") in after


class _InterleavingCore:
    """CoreV1Api whose first patch_node lets another writer change the node first."""

    def __init__(self, core: Any, meanwhile: Callable[[], None]) -> None:
        self._core = core
        self._meanwhile: Callable[[], None] | None = meanwhile

    def read_node(self, *args: Any, **kwargs: Any) -> Any:
        return self._core.read_node(*args, **kwargs)

    def patch_node(self, *args: Any, **kwargs: Any) -> Any:
        if self._meanwhile is not None:
            meanwhile, self._meanwhile = self._meanwhile, None
            meanwhile()
        return self._core.patch_node(*args, **kwargs)


def _add_taint(core: Any, name: str, taint: dict[str, Any]) -> None:
    node = json.loads(core.read_node(name, _preload_content=False).data)
    core.patch_node(
        name,
        [
            {
                "op": "test",
                "path": "/metadata/resourceVersion",
                "value": node["metadata"]["resourceVersion"],
            },
            {
                "op": "replace",
                "path": "/spec/taints",
                "value": [*(node["spec"].get("taints") or []), taint],
            },
        ],
    )


# -- the agent process ----------------------------------------------------------------------


def _ready(port: int) -> bool:
    try:
        return http_get(port, "/readyz")[0] == 200
    except OSError:
        return False


class _Agent:
    def __init__(self, node: Node, node_name: str, kubeconfig: str, **config: Any) -> None:
        node.write_primary(LIST)
        self.port = free_port()
        path = node.write_config_yaml(metricsPort=self.port, uninstallOnStop="never", **config)
        env = agent_env(KUBECONFIG=kubeconfig, NODE_NAME=node_name)
        self.log_path: Path = node.root / "agent.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                agent_command("run", "--config", str(path)), env=env, stdout=log, stderr=log
            )

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def agent(node: Node) -> Iterator[Callable[..., _Agent]]:
    started: list[_Agent] = []

    def start(node_name: str, kubeconfig: str, **config: Any) -> _Agent:
        started.append(_Agent(node, node_name, kubeconfig, **config))
        return started[-1]

    yield start
    for a in started:
        a.stop()


def test_agent_removes_the_taint_once_ready(
    clients: KubeClients,
    kube_config: str,
    make_node: Callable[..., str],
    agent: Callable[..., _Agent],
) -> None:
    name = make_node([OURS, OTHER])
    a = agent(name, kube_config, removeNotReadyTaint=True)
    wait_for(lambda: _ready(a.port), "the agent to be ready")
    wait_for(
        lambda: TAINT_KEY not in [t["key"] for t in taints_of(clients.core, name)],
        "the taint to be removed",
    )
    assert (OTHER["key"], "NoSchedule") in keys(taints_of(clients.core, name))
    wait_for(lambda: "removed the not-ready taint from the node" in a.log(), "the log line")
    assert a.process.poll() is None


def test_agent_with_the_setting_off_never_touches_the_node(
    clients: KubeClients,
    kube_config: str,
    make_node: Callable[..., str],
    agent: Callable[..., _Agent],
) -> None:
    name = make_node([OURS, OTHER])
    a = agent(name, kube_config, removeNotReadyTaint=False)
    wait_for(lambda: _ready(a.port), "the agent to be ready")
    # The check itself: nothing may happen in 2 s, what an enabled agent needs many times over.
    time.sleep(2.0)
    after = keys(taints_of(clients.core, name))
    assert (TAINT_KEY, "NoSchedule") in after and (OTHER["key"], "NoSchedule") in after
    assert "not-ready taint" not in a.log()


@pytest.fixture
def pods_reader(kube_core: Any, random_namespace_function_scope: Any) -> Iterator[str]:
    """A ServiceAccount that may read pods (an ADD's lookups need that) and nothing else: no
    `nodes` patch. Its ClusterRole and binding are deleted at the end."""
    namespace = random_namespace_function_scope.name
    kube_core.create_namespaced_service_account(
        namespace, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "no-rbac"}}
    )
    rbac: Any = k8s.RbacAuthorizationV1Api(kube_core.api_client)  # JSON bodies, as the API takes
    name = f"pods-reader-{namespace}"
    role: dict[str, Any] = {
        "metadata": {"name": name},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
    }
    binding: dict[str, Any] = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "no-rbac", "namespace": namespace}],
    }
    rbac.create_cluster_role(role)
    try:
        rbac.create_cluster_role_binding(binding)
        yield namespace
    finally:
        for delete in (rbac.delete_cluster_role_binding, rbac.delete_cluster_role):
            try:
                delete(name)
            except ApiException as e:
                if e.status != 404:
                    raise


def test_agent_without_rbac_stays_ready_and_keeps_trying(
    kube_core: Any,
    kube_config: str,
    make_node: Callable[..., str],
    make_identity: Callable[..., Any],
    agent: Callable[..., _Agent],
    pods_reader: str,
) -> None:
    # Without the RBAC for the taint (`nodes` patch); with the pod reads every ADD needs, and
    # without which the agent is not Ready at all (its `api` readiness check).
    identity = make_identity(pods_reader, "no-rbac")
    name = make_node([OURS])
    a = agent(name, str(identity.kubeconfig), removeNotReadyTaint=True)
    wait_for(lambda: _ready(a.port), "the agent to be ready")
    wait_for(lambda: a.log().count("cannot remove the not-ready taint yet") >= 2, "two retries")
    assert "HTTP 403" in a.log()
    assert _ready(a.port) and a.process.poll() is None
    assert (TAINT_KEY, "NoSchedule") in keys(taints_of(kube_core, name))
