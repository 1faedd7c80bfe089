"""`ci/release` against a real OCI registry (testbed/registry.py: Debian's docker-registry with
TLS, reachable from this machine and the node), then the chart installed as a platform team
would: from the OCI reference and from the classic chart repository (served on loopback), with
nothing but the node's dirs set, so the image is the chart's default, pulled by the node's
containerd from the registry (never imported). Everything published is signed with a throwaway
cosign key and verified from the registry as a user would, each image's SBOM with it; an image
changed after signing is refused."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import io
import json
import os
import ssl
import subprocess
import tarfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed import chart as agent_mod
from testbed import elf, kubepods, podnet
from testbed.churn import Churn
from testbed.cosign import Cosign
from testbed.helm import Helm
from testbed.parts import REPO_ROOT
from testbed.realnode import RealCluster
from testbed.registry import Registry, running_registry

pytestmark = [pytest.mark.node, pytest.mark.release]

REGISTRY_PATH = "istio-cni"
"""The repository path under the registry's address (as an organisation on a public registry)."""


@contextlib.contextmanager
def served(directory: Path) -> Iterator[str]:
    """`directory` over HTTP on loopback; its base URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


ONCE = ("image", "platforms", "signed-list", "chart", "signed-chart", "repo")
PER_PLATFORM = ("signed", "sbom")


def release(
    registry: Registry, signer: Cosign, repo_dir: Path, repo_url: str, *extra: str
) -> dict[str, str]:
    """Run ci/release, signing with `signer`'s key; its printed artifacts by kind (image,
    platforms, ...), each platform's `signed` and `sbom` lines joined by spaces."""
    started = time.monotonic()
    done = subprocess.run(
        [
            str(REPO_ROOT / "ci" / "release"),
            "--registry",
            f"{registry.address}/{REGISTRY_PATH}",
            "--ca-file",
            str(registry.ca_file),
            "--repo-dir",
            str(repo_dir),
            "--repo-url",
            repo_url,
            "--cosign-key",
            str(signer.key),
            *extra,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
        env=signer.env,
    )
    assert done.returncode == 0, f"ci/release failed:\n{done.stderr[-4000:]}"
    print(f"ci/release {' '.join(extra)}: {time.monotonic() - started:.1f} s")
    print("\n".join(line for line in done.stderr.splitlines() if "SBOM" in line))
    lines = [line.split(" ", 1) for line in done.stdout.splitlines() if " " in line]
    kinds = [kind for kind, _ in lines]
    assert sorted(k for k in kinds if k in ONCE) == sorted(ONCE), done.stdout
    assert set(kinds) == {*ONCE, *PER_PLATFORM}, done.stdout
    printed: dict[str, str] = {}
    for kind, value in lines:
        printed[kind] = f"{printed[kind]} {value}" if kind in printed else value
    return printed


def test_nothing_is_published_unsigned(tmp_path: Path) -> None:
    """Without a key or --keyless ci/release stops before building or pushing anything."""
    env = {k: v for k, v in os.environ.items() if k != "COSIGN_KEY"}
    done = subprocess.run(
        [str(REPO_ROOT / "ci" / "release"), "--registry", "registry.invalid/istio-cni"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env=env,
    )
    assert done.returncode != 0 and not done.stdout, done.stdout
    assert "nothing to sign with: --cosign-key KEY" in done.stderr, done.stderr
    both = subprocess.run(
        [str(REPO_ROOT / "ci" / "release"), "--registry", "registry.invalid/x", "--keyless"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env=dict(env, COSIGN_KEY=str(tmp_path / "cosign.key")),
    )
    assert both.returncode != 0 and "choose one" in both.stderr, both.stderr


@dataclass(frozen=True)
class Published:
    registry: Registry
    signer: Cosign
    repo_dir: Path
    repo_url: str
    current: dict[str, str]
    previous: dict[str, str]
    chart_version: str
    app_version: str

    @property
    def chart_oci(self) -> str:
        return f"oci://{self.registry.address}/{REGISTRY_PATH}/charts/istio-cni"

    def image(self, tag: str) -> str:
        return f"{self.registry.address}/{REGISTRY_PATH}/istio-cni:{tag}"


PREVIOUS = ("0.0.1", "0.0.1")
"""(chart version, image tag) of the fixture release an upgrade starts from: this checkout
published under an older version (its image pinned by digest), so the upgrade rolls the
DaemonSet to another image."""


@pytest.fixture(scope="module")
def published(
    real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Published]:
    """A registry and a chart repository (on loopback) holding this checkout's release and the
    fixture previous one, for the module's tests."""
    base = tmp_path_factory.mktemp("release")
    repo_dir = base / "charts"
    meta = yaml.safe_load((REPO_ROOT / "charts/istio-cni/Chart.yaml").read_text())
    with running_registry(real_cluster, base / "registry") as registry, served(base) as url:
        signer = Cosign.with_new_key(base / "key", ca_file=registry.ca_file)
        repo_url = f"{url}/charts"
        current = release(registry, signer, repo_dir, repo_url)
        previous = release(
            registry,
            signer,
            repo_dir,
            repo_url,
            "--version",
            PREVIOUS[0],
            "--app-version",
            PREVIOUS[1],
            "--pin-digest",
        )
        yield Published(
            registry,
            signer,
            repo_dir,
            repo_url,
            current,
            previous,
            meta["version"],
            meta["appVersion"],
        )


class RegistryReader:
    """The registry's HTTP API (distribution v2) as a node's runtime reads it, over TLS with
    the test bed's CA: manifests by reference, blobs by digest."""

    ACCEPT = ", ".join(
        [
            "application/vnd.oci.image.index.v1+json",
            "application/vnd.docker.distribution.manifest.list.v2+json",
            "application/vnd.oci.image.manifest.v1+json",
            "application/vnd.docker.distribution.manifest.v2+json",
        ]
    )

    def __init__(self, registry: Registry, repository: str) -> None:
        self.base = f"https://{registry.address}/v2/{repository}"
        self.context = ssl.create_default_context(cafile=str(registry.ca_file))

    def _get(self, path: str, accept: str = "*/*") -> bytes:
        request = urllib.request.Request(f"{self.base}/{path}", headers={"Accept": accept})
        with urllib.request.urlopen(request, context=self.context, timeout=60) as response:
            return bytes(response.read())

    def manifest(self, reference: str) -> dict[str, Any]:
        return dict(json.loads(self._get(f"manifests/{reference}", self.ACCEPT)))

    def raw_manifest(self, reference: str) -> tuple[bytes, str]:
        """The manifest's exact bytes and media type, as pushed."""
        request = urllib.request.Request(
            f"{self.base}/manifests/{reference}", headers={"Accept": self.ACCEPT}
        )
        with urllib.request.urlopen(request, context=self.context, timeout=60) as response:
            return bytes(response.read()), str(response.headers["Content-Type"])

    def put_manifest(self, reference: str, body: bytes, media_type: str) -> str:
        """Push a manifest under a tag (the registry takes anonymous pushes); its digest."""
        request = urllib.request.Request(
            f"{self.base}/manifests/{reference}",
            data=body,
            method="PUT",
            headers={"Content-Type": media_type},
        )
        with urllib.request.urlopen(request, context=self.context, timeout=60) as response:
            return str(response.headers["Docker-Content-Digest"])

    def blob(self, digest: str) -> bytes:
        data = self._get(f"blobs/{digest}")
        assert "sha256:" + hashlib.sha256(data).hexdigest() == digest, f"blob {digest} corrupt"
        return data


def file_from_layers(reader: RegistryReader, manifest: dict[str, Any], path: str) -> bytes:
    """A file of the image as its layers leave it (the topmost layer holding it wins)."""
    found: bytes | None = None
    for layer in manifest["layers"]:
        with tarfile.open(fileobj=io.BytesIO(reader.blob(layer["digest"])), mode="r:*") as tar:
            for member in tar:
                if member.name.lstrip("./") == path and member.isfile():
                    extracted = tar.extractfile(member)
                    assert extracted is not None
                    found = extracted.read()
    assert found is not None, f"no {path} in the image's layers"
    return found


def node_dirs(cluster: RealCluster) -> dict[str, Any]:
    """Only what the node needs: the image stays the chart's default."""
    return {
        "cniBinDir": str(cluster.cni_bin_dir),
        "cniConfDir": str(cluster.cni_conf_dir),
        "cniNetnsDir": str(cluster.netns_dir),
        "cniAgentRunDir": str(cluster.agent_run_dir),
        "logLevel": "debug",
    }


def install_from(helm: Helm, chart: str, values: dict[str, Any], *extra: str) -> None:
    values_path = helm.home / "release-values.yaml"
    values_path.write_text(yaml.safe_dump(values))
    helm.run(
        "install",
        agent_mod.RELEASE,
        chart,
        "--namespace",
        agent_mod.AGENT_NAMESPACE,
        "--values",
        str(values_path),
        *extra,
    )
    helm.releases.append((agent_mod.RELEASE, agent_mod.AGENT_NAMESPACE))


def assert_serves_pods(core: Any, cluster: RealCluster, namespace: str, name: str) -> None:
    image = cluster.images["workload"].ref
    core.create_namespaced_pod(
        namespace, kubepods.pod_manifest(name, image, app_command=["sleep"], sidecar=True)
    )
    view = kubepods.wait_running(core, namespace, name)
    assert podnet.has_istio_rules(cluster.pod_netns(view.uid)), f"{name} started uncaptured"


def test_release_to_a_registry_then_install_from_oci_and_from_the_chart_repository(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    published: Published,
    workload_ns: str,
) -> None:
    registry, printed = published.registry, published.current
    chart_version, image = published.chart_version, published.image(published.app_version)
    image_ref, image_digest = printed["image"].split("@")
    assert image_ref == image and image_digest.startswith("sha256:"), printed
    assert printed["chart"].startswith(f"{published.chart_oci}:{chart_version}@sha256:"), printed
    package = published.repo_dir / f"istio-cni-{chart_version}.tgz"
    assert printed["repo"] == str(package) and package.exists()
    index = yaml.safe_load((published.repo_dir / "index.yaml").read_text())
    entries = {e["version"]: e for e in index["entries"]["istio-cni"]}
    assert set(entries) == {chart_version, PREVIOUS[0]}
    assert entries[chart_version]["urls"] == [f"{published.repo_url}/istio-cni-{chart_version}.tgz"]
    assert entries[chart_version]["appVersion"] == published.app_version

    # From the OCI reference: the default image is the one pushed, pulled by containerd.
    helm = node_helm("3")
    ca = ("--ca-file", str(registry.ca_file))
    shown = helm.run("show", "values", published.chart_oci, "--version", chart_version, *ca)
    assert yaml.safe_load(shown)["hub"] == f"{registry.address}/{REGISTRY_PATH}"
    install_from(
        helm, published.chart_oci, node_dirs(real_cluster), "--version", chart_version, *ca
    )
    agent = agent_mod.ready_agent(node_core, real_cluster)
    pod = node_core.read_namespaced_pod(agent.pod.name, agent_mod.AGENT_NAMESPACE)
    assert pod.spec.containers[0].image == image
    (status,) = [s for s in pod.status.container_statuses if s.name == agent_mod.AGENT_CONTAINER]
    assert status.image_id == f"{registry.address}/{REGISTRY_PATH}/istio-cni@{image_digest}"
    events = kubepods.pod_events(node_core, agent_mod.AGENT_NAMESPACE, agent.pod.name)
    assert "Successfully pulled image" in events, events
    assert_serves_pods(node_core, real_cluster, workload_ns, "from-oci")
    agent_mod.uninstall(helm, node_core)

    # From the classic chart repository, as `helm repo add` users and umbrella charts do.
    helm.run("repo", "add", "istio-cni-release", published.repo_url)
    found = json.loads(helm.run("search", "repo", "istio-cni-release/istio-cni", "-o", "json"))
    assert [(c["name"], c["version"]) for c in found] == [
        ("istio-cni-release/istio-cni", chart_version)
    ]
    install_from(helm, "istio-cni-release/istio-cni", node_dirs(real_cluster))
    agent = agent_mod.ready_agent(node_core, real_cluster)
    pod = node_core.read_namespaced_pod(agent.pod.name, agent_mod.AGENT_NAMESPACE)
    assert pod.spec.containers[0].image == image
    assert_serves_pods(node_core, real_cluster, workload_ns, "from-repo")
    agent_mod.uninstall(helm, node_core)


def test_the_image_is_published_for_amd64_and_arm64(
    published: Published, tmp_path: Path, record_property: Any
) -> None:
    """One manifest list, one image per platform, each configured for its machine; the arm64
    image's plugin (read from its layers as a node would unpack them) answers VERSION under
    qemu-user the same as the amd64 image's does natively."""
    assert published.current["platforms"] == "linux/amd64,linux/arm64", published.current
    reader = RegistryReader(published.registry, f"{REGISTRY_PATH}/istio-cni")
    ref, digest = published.current["image"].split("@")
    assert ref == published.image(published.app_version)
    index = reader.manifest(digest)
    assert reader.manifest(published.app_version) == index, "the tag names another list"
    by_platform = {
        f"{m['platform']['os']}/{m['platform']['architecture']}": m["digest"]
        for m in index["manifests"]
    }
    assert set(by_platform) == {"linux/amd64", "linux/arm64"}, index
    answers = {}
    for platform, instance in by_platform.items():
        arch = platform.split("/")[1]
        manifest = reader.manifest(instance)
        config = json.loads(reader.blob(manifest["config"]["digest"]))
        assert (config["os"], config["architecture"]) == ("linux", arch), config
        labels = config["config"]["Labels"]
        assert labels["org.opencontainers.image.version"] == published.app_version, labels
        compressed = sum(layer["size"] for layer in manifest["layers"])
        record_property(f"image_bytes_{arch}", compressed)
        print(f"{platform}: {compressed / 2**20:.1f} MiB compressed, {instance}")
        plugin = tmp_path / f"istio-cni-{arch}"
        plugin.write_bytes(file_from_layers(reader, manifest, "opt/istio-cni/bin/istio-cni"))
        plugin.chmod(0o755)
        assert elf.machine(plugin) == {"amd64": "x86_64", "arm64": "aarch64"}[arch]
        done = subprocess.run(
            [str(plugin)], env={"CNI_COMMAND": "VERSION"}, capture_output=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        answers[arch] = json.loads(done.stdout)
    assert answers["arm64"] == answers["amd64"] and "supportedVersions" in answers["arm64"]


def pinned(package: str) -> str:
    """The version requirements.lock pins `package` at (what the image's venv installs)."""
    for line in (REPO_ROOT / "requirements.lock").read_text().splitlines():
        if line.startswith(f"{package}=="):
            return line.split("==", 1)[1].split()[0]
    raise AssertionError(f"{package} not in requirements.lock")


def platform_digests(published: Published) -> dict[str, str]:
    reader = RegistryReader(published.registry, f"{REGISTRY_PATH}/istio-cni")
    index = reader.manifest(published.current["image"].split("@")[1])
    return {m["platform"]["architecture"]: m["digest"] for m in index["manifests"]}


def test_every_artifact_is_signed_and_each_image_carries_its_sbom(
    published: Published, tmp_path: Path, record_property: Any
) -> None:
    """What ci/release printed is what the registry holds, and a user with the public key
    verifies it there: each platform's image and the list (by tag, as `helm install` users
    name it), the chart, and each image's SBOM, which lists what the image ships."""
    printed, signer = published.current, published.signer
    repo = f"{published.registry.address}/{REGISTRY_PATH}/istio-cni"
    digests = platform_digests(published)
    expected = sorted(f"{repo}@{digest}" for digest in digests.values())
    assert sorted(printed["signed"].split()) == expected, printed
    assert sorted(printed["sbom"].split()) == expected, printed
    assert printed["signed-list"] == f"{repo}@{printed['image'].split('@')[1]}", printed

    started = time.monotonic()
    for ref in [*expected, published.image(published.app_version)]:
        done = signer.verify(ref)
        assert done.returncode == 0, f"cosign verify {ref}:\n{done.stderr}"
        (claim,) = json.loads(done.stdout)
        assert claim["critical"]["image"]["docker-manifest-digest"] in {
            *digests.values(),
            printed["image"].split("@")[1],
        }
        print(f"cosign verify {ref}: {verified_line(done.stderr)}")
    chart = f"{published.registry.address}/{REGISTRY_PATH}/charts/istio-cni"
    chart_ref = f"{chart}:{published.chart_version}"
    done = signer.verify(chart_ref)
    assert done.returncode == 0, f"cosign verify {chart_ref}:\n{done.stderr}"
    chart_digest = printed["chart"].rsplit("@", 1)[1]
    assert printed["signed-chart"] == f"{chart}@{chart_digest}"
    assert json.loads(done.stdout)[0]["critical"]["image"]["docker-manifest-digest"] == chart_digest

    # Another key verifies nothing.
    stranger = Cosign.with_new_key(tmp_path / "stranger", ca_file=published.registry.ca_file)
    refused = signer.verify(expected[0], public_key=stranger.public_key)
    assert refused.returncode != 0, refused.stdout
    print(f"a stranger's key: {refused.stderr.strip().splitlines()[-1]}")

    for arch, digest in digests.items():
        sbom = signer.sbom(f"{repo}@{digest}")
        packages = {(p["name"].lower(), p.get("versionInfo")) for p in sbom["packages"]}
        record_property(f"sbom_packages_{arch}", len(packages))
        print(f"linux/{arch} SBOM: {sbom['spdxVersion']}, {len(packages)} packages")
        for name in ("pyroute2", "kubernetes", "pyyaml"):
            found = sorted(str(v) for n, v in packages if n == name)
            assert (name, pinned(name)) in packages, f"{name}=={pinned(name)} not listed: {found}"
        assert any(name == "libc6" for name, _ in packages), "the Debian packages are listed"
    print(f"verified in {time.monotonic() - started:.1f} s")


def test_an_image_changed_after_signing_is_refused(published: Published) -> None:
    """The tag moved to an image with one layer swapped after signing: cosign refuses it,
    by tag and by digest; so it does when the original's signature is copied onto it. The tag is
    put back as published afterwards."""
    signer = published.signer
    reader = RegistryReader(published.registry, f"{REGISTRY_PATH}/istio-cni")
    repo = f"{published.registry.address}/{REGISTRY_PATH}/istio-cni"
    tag = published.app_version
    original, original_type = reader.raw_manifest(tag)
    digests = platform_digests(published)
    amd64_raw, amd64_type = reader.raw_manifest(digests["amd64"])
    amd64, arm64 = json.loads(amd64_raw), reader.manifest(digests["arm64"])
    # The topmost layer the two images do not share, swapped for the other's.
    theirs = [layer for layer in arm64["layers"] if layer not in amd64["layers"]]
    i = max(i for i, layer in enumerate(amd64["layers"]) if layer not in arm64["layers"])
    layers = list(amd64["layers"])
    layers[i] = theirs[-1]
    tampered = dict(amd64, layers=layers)
    try:
        tampered_digest = reader.put_manifest(tag, json.dumps(tampered).encode(), amd64_type)
        for ref in (published.image(tag), f"{repo}@{tampered_digest}"):
            done = signer.verify(ref)
            assert done.returncode != 0, f"cosign verified the tampered {ref}:\n{done.stdout}"
            print(f"cosign verify {ref} (tampered): {done.stderr.strip().splitlines()[-1]}")
            assert "no signatures found" in done.stderr or "no matching signatures" in done.stderr

        # The valid signature of the original, copied onto the tampered image's signature tag.
        signature, signature_type = reader.raw_manifest(sig_tag(digests["amd64"]))
        reader.put_manifest(sig_tag(tampered_digest), signature, signature_type)
        done = signer.verify(f"{repo}@{tampered_digest}")
        assert done.returncode != 0, f"a copied signature verified:\n{done.stdout}"
        print(f"copied signature: {done.stderr.strip().splitlines()[-1]}")
        assert "no matching signatures" in done.stderr, done.stderr
    finally:
        reader.put_manifest(tag, original, original_type)
    assert reader.raw_manifest(tag)[0] == original
    assert signer.verify(published.image(tag)).returncode == 0


def verified_line(stderr: str) -> str:
    """cosign's summary line of a verification (its warnings aside)."""
    return next((line for line in stderr.splitlines() if "Verification for" in line), stderr)


def sig_tag(digest: str) -> str:
    """Where cosign keeps an image's signatures: the tag sha256-<hex>.sig."""
    return digest.replace(":", "-") + ".sig"


def test_an_umbrella_chart_depends_on_it_by_repository_url(
    real_cluster: RealCluster, node_helm: Any, published: Published, tmp_path: Path
) -> None:
    """`dependencies[].repository` naming the chart repository, `helm dependency update`."""
    umbrella = tmp_path / "umbrella"
    (umbrella / "templates").mkdir(parents=True)
    (umbrella / "Chart.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": "mesh",
                "version": "1.0.0",
                "dependencies": [
                    {
                        "name": "istio-cni",
                        "version": published.chart_version,
                        "repository": published.repo_url,
                    }
                ],
            }
        )
    )
    helm = node_helm("3")
    helm.run("dependency", "update", str(umbrella))
    assert (umbrella / "charts" / f"istio-cni-{published.chart_version}.tgz").exists()
    rendered = yaml.safe_load_all(
        helm.run("template", "mesh", str(umbrella), "--namespace", agent_mod.AGENT_NAMESPACE)
    )
    (daemonset,) = [d for d in rendered if d and d["kind"] == "DaemonSet"]
    images = [c["image"] for c in daemonset["spec"]["template"]["spec"]["containers"]]
    assert images == [published.image(published.app_version)]


def test_upgrade_from_the_previous_release_under_pod_churn(
    real_cluster: RealCluster,
    node_helm: Any,
    node_core: Any,
    published: Published,
    workload_ns: str,
) -> None:
    """`helm upgrade` from the previous release to this one, both from the registry, while a
    meshed pod starts every second: no pod starts uncaptured, none stays stuck."""
    helm = node_helm("3")
    ca = ("--ca-file", str(published.registry.ca_file))
    values = node_dirs(real_cluster)
    install_from(helm, published.chart_oci, values, "--version", PREVIOUS[0], *ca)
    before = agent_mod.ready_agent(node_core, real_cluster)
    old = node_core.read_namespaced_pod(before.pod.name, agent_mod.AGENT_NAMESPACE)
    # Pinned: the tag for people, the digest ci/release pushed for the runtime.
    assert old.spec.containers[0].image == published.previous["image"]
    assert published.previous["image"].startswith(published.image(PREVIOUS[1]) + "@sha256:")

    image = real_cluster.images["workload"].ref
    values_path = helm.home / "release-values.yaml"
    with Churn(node_core, real_cluster, workload_ns, image) as churn:
        time.sleep(5)
        helm.run(
            "upgrade",
            agent_mod.RELEASE,
            published.chart_oci,
            "--namespace",
            agent_mod.AGENT_NAMESPACE,
            "--version",
            published.chart_version,
            "--values",
            str(values_path),
            *ca,
        )
        kubepods.wait_for(
            lambda: (
                new_agent_image(node_core, real_cluster) == published.image(published.app_version)
            ),
            "the upgraded agent Ready",
            120,
        )
        time.sleep(5)
    report = churn.report
    print(report.summary())
    assert not report.errors, report.errors
    assert not report.uncaptured, f"started without Istio's rules: {report.uncaptured}"
    assert not report.never_ran, report.never_ran
    assert len(report.pods) >= 8, report.summary()
    agent_mod.uninstall(helm, node_core)


def new_agent_image(core: Any, cluster: RealCluster) -> str | None:
    """The image of the agent pod on the node once it is Running and Ready (None before)."""
    for pod in agent_mod.agent_pods(core):
        view = kubepods.PodView.of(pod)
        if pod.metadata.deletion_timestamp or view.node != cluster.node_name:
            continue
        if view.phase == "Running" and view.ready:
            image: str = pod.spec.containers[0].image
            return image
    return None
