"""The image builds: what ci/build-testbed-images and ci/build-image write, their cache, and the
agent image's configuration and contents (read from the docker-archive the node imports)."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from testbed import envoy
from testbed.istio_binaries import bootstrap_template
from testbed.parts import REPO_ROOT
from testbed.parts import envoy as envoy_part
from tests.image.archive import Archive
from tests.image.conftest import BuildRun, Built, built, manifest, run_build

pytestmark = pytest.mark.node

TAG = re.compile(r"^[0-9a-f]{12}$")
REGISTRY_HOSTS = ("docker.io", "registry-1.docker.io", "ghcr.io", "gcr.io", "quay.io", "k8s.io/")
AGENT_MODULES = sorted(
    ".".join(p.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__")
    for p in (REPO_ROOT / "agent").rglob("*.py")
)


def test_manifest_names_every_image_with_a_content_tag(images: dict[str, Built]) -> None:
    for name, image in images.items():
        repo, tag = image.ref.rsplit(":", 1)
        assert repo == f"localhost/testbed/{name}", image.ref
        assert TAG.match(tag), f"{image.ref}: the tag is not a content hash"
        assert image.archive.name == f"{name}-{tag}.tar"
        assert Archive(image.archive).manifest["RepoTags"] == [image.ref]
    agent = images["istio-cni"].entry
    assert (agent["hub"], agent["tag"]) == ("localhost/testbed", images["istio-cni"].ref[-12:])


def test_scripts_print_the_refs(build_runs: dict[str, BuildRun], images: dict[str, Built]) -> None:
    printed = build_runs["ci/build-testbed-images"].stdout + build_runs["ci/build-image"].stdout
    for name, image in images.items():
        assert f"{name} {image.ref} {image.archive}" in printed.splitlines()


def test_second_build_is_a_cache_hit(images: dict[str, Built]) -> None:
    for script in ("ci/build-testbed-images", "ci/build-image"):
        start = time.monotonic()
        again = run_build(script, timeout=120)
        took = time.monotonic() - start
        assert took < 30, f"{script} took {took:.0f}s with unchanged inputs: no cache hit"
        assert "cached" in again.stderr, again.stderr
    assert {k: v["ref"] for k, v in manifest().items() if k in images} == {
        k: v.ref for k, v in images.items()
    }


def test_extra_tag_for_an_upgrade(images: dict[str, Built]) -> None:
    agent = images["istio-cni"]
    run = run_build("ci/build-image", "--tag", "upgrade-test", timeout=300)
    entry = manifest()["istio-cni"]
    extra = entry["tags"]["upgrade-test"]
    assert extra["ref"] == "localhost/testbed/istio-cni:upgrade-test"
    assert extra["id"] == entry["id"]
    assert entry["ref"] == agent.ref, "an extra tag must not change the content-tagged ref"
    assert f"istio-cni {extra['ref']} {extra['archive']}" in run.stdout
    assert Archive(Path(extra["archive"])).manifest["RepoTags"] == [extra["ref"]]


def test_agent_image_config(agent_archive: Archive) -> None:
    cfg = agent_archive.config["config"]
    assert cfg["Entrypoint"] == ["istio-cni-agent", "run"]
    assert not cfg.get("Cmd")
    env = dict(e.split("=", 1) for e in cfg["Env"])
    assert env["PATH"].startswith("/opt/istio-cni/venv/bin:")
    assert env["PYTHONDONTWRITEBYTECODE"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    assert cfg.get("User", "") in ("", "0", "root"), "the chart runs the agent as root"
    assert cfg["Labels"]["org.opencontainers.image.title"] == "istio-cni"
    # the base is the local Debian image, and nothing in the image names a registry
    text = json.dumps(agent_archive.config) + json.dumps(agent_archive.manifest)
    for host in REGISTRY_HOSTS:
        assert host not in text, f"the image config names {host}"


def test_envoy_image_runs_the_sidecar_bootstrap_as_the_proxy(
    build_runs: dict[str, BuildRun],
) -> None:
    image = built("envoy", "ci/build-testbed-images")
    assert f"envoy {image.ref} {image.archive}" in build_runs["ci/build-testbed-images"].stdout
    archive = Archive(image.archive)
    cfg = archive.config["config"]
    assert cfg["User"] == f"{envoy.PROXY_UID}:{envoy.PROXY_GID}", cfg.get("User")
    assert cfg["Entrypoint"][:3] == [
        "/usr/local/bin/envoy",
        "--config-path",
        "/etc/istio/proxy/envoy.json",
    ]
    # The bootstrap in the image is testbed/envoy.py's, access logs on stdout.
    bootstrap = json.loads(archive.read_file("/etc/istio/proxy/envoy.json"))
    assert bootstrap == envoy.sidecar_config(log_dir=None)
    assert archive.files["usr/local/bin/envoy"].mode & 0o111


def test_proxy_envoy_image_runs_pilot_agent_with_the_real_envoy(
    build_runs: dict[str, BuildRun],
) -> None:
    image = built("proxy-envoy", "ci/build-testbed-images")
    assert (
        f"proxy-envoy {image.ref} {image.archive}" in build_runs["ci/build-testbed-images"].stdout
    )
    archive = Archive(image.archive)
    assert archive.config["config"]["Entrypoint"] == ["/usr/local/bin/pilot-agent"]
    # The binary itself, not the double's symlink of the proxy image beneath.
    entry = archive.files["usr/local/bin/envoy"]
    assert entry.isfile() and entry.mode & 0o111, (entry.type, oct(entry.mode))
    binary = envoy_part().require()
    assert entry.size == binary.stat().st_size
    assert archive.read_file("/usr/local/bin/envoy") == binary.read_bytes()
    template = archive.read_file("/var/lib/istio/envoy/envoy_bootstrap_tmpl.json")
    assert template == bootstrap_template().read_bytes()


def test_agent_image_has_few_layers(agent_archive: Archive, images: dict[str, Built]) -> None:
    # the Debian base, then one layer (buildah commits each stage once; `docker build` makes two:
    # the packages and /opt/istio-cni)
    layers = agent_archive.config["rootfs"]["diff_ids"]
    assert len(layers) == 2, layers
    # the base layer is the one the workload image has too: a node stores it once
    assert Archive(images["workload"].archive).config["rootfs"]["diff_ids"][0] == layers[0]


def test_plugin_is_one_static_executable(agent_archive: Archive) -> None:
    files = agent_archive.files
    in_bin = sorted(n for n in files if n.startswith("opt/istio-cni/bin/"))
    assert in_bin == ["opt/istio-cni/bin/istio-cni"], in_bin
    elf = agent_archive.read_file("/opt/istio-cni/bin/istio-cni")
    assert elf[:4] == b"\x7fELF"
    assert files["opt/istio-cni/bin/istio-cni"].mode & 0o111
    assert not _elf_has_interp(elf), "the plugin is dynamically linked (has PT_INTERP)"


def test_bytecode_compiled_for_every_module(agent_archive: Archive) -> None:
    """The root file system is read-only: every .py the agent may import has its .pyc."""
    files = agent_archive.files
    site = "opt/istio-cni/venv/lib/python3.11/site-packages/"
    missing = []
    for name in files:
        if name.endswith(".py") and (name.startswith(site) or name.startswith("usr/lib/python3")):
            d, base = name.rsplit("/", 1)
            if f"{d}/__pycache__/{base[:-3]}.cpython-311.pyc" not in files:
                missing.append(name)
    assert not missing, f"{len(missing)} modules without bytecode, e.g. {missing[:5]}"
    assert any(n.startswith(site + "agent/") for n in files), "the agent is not in the venv"
    shipped = {n.removeprefix(site).split("/", 1)[0] for n in files if n.startswith(site)}
    assert not shipped & {"pip", "setuptools"}, "pip/setuptools are shipped in the venv"


def _elf_has_interp(elf: bytes) -> bool:
    import struct

    assert elf[4] == 2, "not a 64-bit ELF"
    phoff = struct.unpack_from("<Q", elf, 0x20)[0]
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    return any(
        struct.unpack_from("<I", elf, phoff + i * phentsize)[0] == 3  # PT_INTERP
        for i in range(phnum)
    )


@pytest.mark.parametrize("by_tag", ["BASE_IMAGE", "BUILD_BASE_IMAGE"])
def test_a_base_image_without_a_digest_is_refused(images: dict[str, Built], by_tag: str) -> None:
    """BASE_IMAGE and BUILD_BASE_IMAGE (the plugin stage's) must name their digests: the local
    base by tag fails the build at once, naming the argument (ci/build-image passes both as
    localhost/testbed/debian...@sha256:...)."""
    by_digest = "BUILD_BASE_IMAGE" if by_tag == "BASE_IMAGE" else "BASE_IMAGE"
    script = (
        "source ci/image/lib.sh; image_lock; base=$(ci/image/build-base --print-ref); "
        "digest=$(bah inspect --type image --format '{{.FromImageDigest}}' \"$base\"); "
        "bah bud --isolation chroot --pull=never --layers=false --force-rm --target plugin "
        f'--build-arg {by_tag}="$base" --build-arg {by_digest}="${{base%:*}}@$digest" '
        "-f Dockerfile ."
    )
    done = subprocess.run(
        ["bash", "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode != 0, done.stdout[-2000:]
    output = done.stderr + done.stdout
    assert "give base images by digest (NAME@sha256:DIGEST)" in output, output[-2000:]
    assert f"{by_tag}=localhost/testbed/debian:" in output, output[-2000:]
