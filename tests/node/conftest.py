"""Fixtures of the `node` tier: one real single-node cluster for the session (testbed/
realnode.py), Helm bound to it, the chart's values for its node, per-test namespaces whose
pods are gone when the test ends, Istio's control plane beside it (testbed/istiod.py), and the
node on containerd 2 for the modules that ask (on_containerd2), on Debian's 1.6 for the rest."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testbed import chart as agent_mod
from testbed import diagnose, images, kubepods, wait
from testbed.chart import AGENT_NAMESPACE, wait_agent_gone
from testbed.helm import Helm, uninstall_all
from testbed.istiod import Istiod
from testbed.parts import MissingPartError, helm_binaries
from testbed.platforms import RUNTIME_VARIANTS
from testbed.process import PartFailedError
from testbed.realnode import RealCluster


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """A control plane and one node run by kubelet and containerd, Ready; removed at the end
    of the session. A missing part fails the tests needing it, naming it."""
    yield from started(lambda: RealCluster(tmp_path_factory.mktemp("realnode")))


@pytest.fixture(scope="module")
def services_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """A cluster like `real_cluster` whose node also routes Services (kube-proxy) and answers
    cluster DNS (CoreDNS): testbed/services.py. One per module that asks for it, gone after it
    (the rest of the session does not run beside a second node)."""
    yield from started(lambda: RealCluster(tmp_path_factory.mktemp("servicesnode"), services=True))


def started(make: Callable[[], RealCluster]) -> Iterator[RealCluster]:
    """The cluster `make` builds, started and stopped at the end; a missing or failed part
    fails the tests needing it, naming it."""
    try:
        cluster = make()
    except MissingPartError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        cluster.start()
        yield cluster
    except (PartFailedError, MissingPartError) as e:
        pytest.fail(str(e), pytrace=False)
    finally:
        cluster.stop()


@contextlib.contextmanager
def agent_on(
    cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory, image: str
) -> Iterator[Any]:
    """The chart installed with Helm 4 on `cluster` (its own node, not the session's), the
    image named `image` imported there first; yields the API's core client. At the end the
    release goes and the node's conflist is checked as `node_helm` checks it."""
    core = cluster.core()
    try:
        cluster.import_image(images.image(image))
    except MissingPartError as e:
        pytest.fail(str(e), pytrace=False)
    helm = Helm(
        binary=helm_by_major("4"),
        kubeconfig=cluster.kubeconfig,
        home=tmp_path_factory.mktemp("helm"),
    )
    with contextlib.ExitStack() as stack:
        stack.callback(release_node, cluster, core, [helm], cluster.primary_conflist())
        agent_mod.install(helm, cluster, core, cluster.images["istio-cni"])
        yield core


@pytest.fixture(autouse=True)
def cluster_on_timeout(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every wait of a test on the real node reports, on timeout, the cluster's DaemonSets,
    pods, Nodes and the controller manager's and scheduler's log tails."""
    name = next((n for n in ("real_cluster", "services_cluster") if n in request.fixturenames), "")
    if not name:
        yield
        return
    cluster: RealCluster = request.getfixturevalue(name)
    with wait.diagnostics(diagnose.for_cluster(cluster)):
        yield


@pytest.fixture(scope="session")
def node_core(real_cluster: RealCluster) -> Any:
    return real_cluster.core()


@pytest.fixture(scope="session")
def agent_image(real_cluster: RealCluster) -> images.Image:
    image = real_cluster.images["istio-cni"]
    assert image.ref == f"{image.hub}/istio-cni:{image.tag}", (
        f"{image.ref}: the chart names its image <hub>/istio-cni:<tag>"
    )
    return image


def helm_by_major(major: str) -> Path:
    found = {v: p for v, p in helm_binaries().items() if v.split(".")[0] == major}
    if not found:
        pytest.fail(
            f"no Helm {major}.x among {sorted(helm_binaries())}; run ci/setup-helm", pytrace=False
        )
    return found[max(found, key=lambda v: tuple(int(x) for x in v.split(".")))]


@pytest.fixture
def node_helm(
    real_cluster: RealCluster, node_core: Any, tmp_path: Path
) -> Iterator[Callable[[str], Helm]]:
    """helm_for("3" | "4") -> Helm bound to the cluster. Releases left installed are uninstalled
    at the end and their agent pods waited away, so the next test starts from a clean node."""
    made: list[Helm] = []
    reference = real_cluster.primary_conflist()

    def helm_for(major: str) -> Helm:
        home = tmp_path / f"helm-{len(made)}"
        home.mkdir()
        try:
            binary = helm_by_major(major)
        except MissingPartError as e:
            pytest.fail(str(e), pytrace=False)
        made.append(Helm(binary=binary, kubeconfig=real_cluster.kubeconfig, home=home))
        return made[-1]

    layout, files = real_cluster.platform, node_files(real_cluster)
    yield helm_for
    # A test that laid the node out anew judges that layout's files itself: the files taken
    # when it began may since hold another layout's config (the same platform's root).
    relaid = real_cluster.platform != layout
    release_node(real_cluster, node_core, made, reference, files, check_files=not relaid)


def release_node(
    real_cluster: RealCluster,
    core: Any,
    made: list[Helm],
    reference: str,
    files: tuple[Path, Path] | None = None,
    *,
    check_files: bool = True,
) -> None:
    """Uninstall what `made` installed, wait the agent pods away and put the node's own CNI
    config (`reference`) back if the agent left its entry; raise naming what went wrong.
    `files`: (conflist, plugin binary) as the machine sees them, taken when the test began (a
    test may lay the node out anew meanwhile); the node's current ones by default. Without
    `check_files` the files are left to the test."""
    errors = uninstall_all(made)
    with contextlib.suppress(AssertionError):
        wait_agent_gone(core)
    conflist, plugin = files or node_files(real_cluster)
    # The next test starts from the node's own CNI config even when this one left the agent no
    # chance to remove itself (say, its image was off the node).
    if check_files and made and conflist.read_text() != reference:
        conflist.write_text(reference)
        plugin.unlink(missing_ok=True)
        errors.append("the node's conflist kept the agent's entry after the uninstall: restored")
    if errors:
        raise RuntimeError("helm uninstall at teardown: " + "; ".join(errors))


def node_files(cluster: RealCluster) -> tuple[Path, Path]:
    """(the node's primary conflist, our plugin's binary there) as the machine sees them, in the
    node's current layout."""
    return cluster.conflist_path, cluster.host_path(cluster.node_dirs.cni_bin) / "istio-cni"


CONTAINERD2 = RUNTIME_VARIANTS["kind-on-containerd2"]
"""The layout of the modules on containerd 2: kind's (kind's node image runs containerd 2.x)."""


@dataclass
class Layouts:
    left_on_containerd2: RealCluster | None = None
    """The session's node, while the modules on containerd 2 before left it laid out so."""


@pytest.fixture(scope="session")
def node_layouts() -> Layouts:
    return Layouts()


@pytest.fixture(scope="module")
def on_containerd2(real_cluster: RealCluster, node_layouts: Layouts) -> RealCluster:
    """The module's tests run on containerd 2 (testbed/containerd2.py): the node laid out as
    kind's. A module asks for it by `pytest.mark.usefixtures`, so that it comes before the
    module's other fixtures (its istiod). The layout is left for the next module on containerd
    2 (tests/conftest.py runs them one after another); the first module after them that is not
    lays the test bed's own back (own_layout)."""
    if real_cluster.platform is not CONTAINERD2:
        node_layouts.left_on_containerd2 = real_cluster  # laid back even if this fails
        began = time.monotonic()
        real_cluster.relayout(CONTAINERD2)
        print(f"\nthe node laid out on containerd 2 in {time.monotonic() - began:.1f}s")
    return real_cluster


@pytest.fixture(scope="module", autouse=True)
def own_layout(request: pytest.FixtureRequest, node_layouts: Layouts) -> None:
    """Every other module starts on the test bed's own layout (Debian's containerd 1.6), laid
    back when the modules before it left the node on containerd 2."""
    cluster = node_layouts.left_on_containerd2
    if cluster is not None and "on_containerd2" not in request.fixturenames:
        node_layouts.left_on_containerd2 = None
        began = time.monotonic()
        cluster.relayout(None)
        print(f"\nthe node laid back on containerd 1.6 in {time.monotonic() - began:.1f}s")


@contextlib.contextmanager
def istiod_running(
    real_cluster: RealCluster,
    workdir: Path,
    *,
    values: Mapping[str, Any] | None = None,
    base_values: Mapping[str, Any] | None = None,
    for_pods: bool = False,
) -> Iterator[Istiod]:
    """istiod for the `istiod` tier (testbed/istiod.py): the proxy image on the node, Istio's
    charts installed with the test bed's values and `values` / `base_values` merged over them,
    istiod Ready; all it made removed at the end. A missing part or a failed start fails the
    tests needing it, naming it. `for_pods`: pods reach it at its Service (testbed/istiod.py)."""
    try:
        proxy = images.image("proxy")
        real_cluster.import_image(proxy)
        helm = Helm(
            binary=helm_by_major("4"), kubeconfig=real_cluster.kubeconfig, home=workdir / "helm"
        )
        control = Istiod(
            real_cluster,
            helm,
            proxy,
            workdir,
            values=values,
            base_values=base_values,
            for_pods=for_pods,
        )
    except MissingPartError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        control.start()
        yield control
    except PartFailedError as e:
        pytest.fail(str(e), pytrace=False)
    finally:
        control.stop()


@pytest.fixture(scope="module")
def istiod(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Istiod]:
    """One istiod for the test module, with the test bed's values and its node untaint
    controller on, watching the agent's namespace (it acts only on nodes with the taint)."""
    untaint = {"taint": {"enabled": True, "namespace": AGENT_NAMESPACE}}
    with istiod_running(real_cluster, tmp_path_factory.mktemp("istiod"), values=untaint) as control:
        yield control


@pytest.fixture
def workload_ns(node_core: Any) -> Iterator[str]:
    """A fresh namespace for the test's pods; deleted (and its pods waited away) at the end."""
    with kubepods.pod_namespace(node_core, "work") as name:
        yield name


@pytest.fixture
def ztunnel_socket(real_cluster: RealCluster) -> Iterator[Path]:
    """The ZDS socket's node path: under the test node's own dir rather than the default
    /var/run/ztunnel, so that node tiers of other checkouts on this machine cannot meet it.
    The dir (kubelet makes it for the hostPath) is removed at the end, whatever happened."""
    path = real_cluster.base / "run" / "ztunnel" / "ztunnel.sock"
    assert not path.exists(), f"{path} exists before the test"
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.parent.rmdir()
