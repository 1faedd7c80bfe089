# The agent image: the node agent (Debian's Python 3.11 and a venv with the project), iptables
# (legacy and nft), nftables and iproute2, and the CNI plugin as ONE static executable in
# /opt/istio-cni/bin (Settings.pluginSourceDir), built by the same ci/build-plugin the tests use.
#   docker build -t <hub>/istio-cni:<tag> .
#   docker buildx build --platform linux/amd64,linux/arm64 -t <hub>/istio-cni:<tag> .
# Multi-platform: the plugin stage runs on the build machine (BUILDPLATFORM) and cross-compiles
# the plugin for TARGETARCH; the venv and agent stages are the target's own (RUN steps of another
# machine run under qemu-user, where they are short: apt and pip, no compiling of CPython).
# BASE_IMAGE: a Debian bookworm image named by its digest (<name>@sha256:<64 hex>), so every build
# starts from the same bytes whatever a tag points at later; a name without a digest is refused.
# The default is debian:bookworm-slim's multi-platform index of 2026-08-03 (as docker-library's
# repo-info recorded it); `docker buildx imagetools inspect debian:bookworm-slim` prints today's.
# ci/build-image passes the local base it built with debootstrap, by its digest.
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim@sha256:abd67ffcfa541b485a3dff59865ab629aa048a6c613e639d36e7456b0b229241
# BUILD_BASE_IMAGE: the plugin stage's base, on the build machine. The default, BASE_IMAGE, is a
# multi-platform index from which --platform=$BUILDPLATFORM picks the build machine's image;
# ci/build-image, whose local bases are one platform each, passes its own machine's.
ARG BUILD_BASE_IMAGE=${BASE_IMAGE}

# --- The plugin: CPython 3.11 from Debian's source package built statically against musl, the
# plugin frozen into it (ci/build-plugin). Needs the Debian packages in ci/plugin/build-deps and
# deb-src entries; the compilers stay in this stage.
FROM --platform=$BUILDPLATFORM ${BUILD_BASE_IMAGE} AS plugin
ARG BASE_IMAGE
ARG BUILD_BASE_IMAGE
# The machine the plugin runs on; empty (a builder without multi-platform arguments): this one.
ARG TARGETARCH
RUN for arg in "BASE_IMAGE=$BASE_IMAGE" "BUILD_BASE_IMAGE=$BUILD_BASE_IMAGE"; do \
      case "${arg#*=}" in \
        *@sha256:????????????????????????????????????????????????????????????????) ;; \
        *) echo "$arg: give base images by digest (NAME@sha256:DIGEST)" >&2; exit 1 ;; \
      esac; \
    done
COPY ci/plugin/build-deps /tmp/build-deps
# deb-src entries (deb822 sources of bookworm images, or a classic sources.list), then the
# packages. Not for the security archive: CPython's orig tarball is the same in every suite, and
# not every mirror carries the security archive's sources. For another TARGETARCH, the cross
# compiler and Debian's musl of that machine (dpkg multiarch).
RUN set -eu; \
    build=$(dpkg --print-architecture); target=${TARGETARCH:-$build}; cross=""; \
    if [ "$target" != "$build" ]; then \
      case "$target" in \
        amd64) gnu=x86-64 ;; arm64) gnu=aarch64 ;; \
        *) echo "TARGETARCH=$target: the plugin is built for amd64 and arm64" >&2; exit 1 ;; \
      esac; \
      dpkg --add-architecture "$target"; \
      cross="gcc-$gnu-linux-gnu musl-dev:$target"; \
    fi; \
    f=/etc/apt/sources.list.d/debian.sources; \
    if [ -f $f ]; then \
      awk 'BEGIN { RS = ""; ORS = "\n\n" } \
           !/-security/ { sub(/Types: deb\n/, "Types: deb deb-src\n") } { print }' $f >$f.new; \
      mv $f.new $f; \
    fi; \
    if [ -f /etc/apt/sources.list ]; then \
      sed -n '/security/!s/^deb /deb-src /p' /etc/apt/sources.list \
        >/etc/apt/sources.list.d/deb-src.list; \
    fi; \
    apt-get update; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      $(grep -v '^#' /tmp/build-deps) $cross; \
    rm -f /tmp/build-deps
# (the apt lists stay: ci/build-plugin fetches CPython's source with `apt-get source`)
WORKDIR /src
COPY ci/lib.sh ci/build-plugin ci/
COPY ci/plugin/ ci/plugin/
COPY plugin/ plugin/
# ci/build-plugin's cache (the built CPython): ci/build-image points it at a mounted cache.
ARG ISTIO_CNI_CACHE=/var/cache/istio-cni
RUN ci/build-plugin --arch "${TARGETARCH:-$(dpkg --print-architecture)}" /opt/istio-cni/bin \
    && test -x /opt/istio-cni/bin/istio-cni

# --- The agent's venv, built with pip from PyPI; pip and the compiler stay in this stage
# (python-iptables is a source distribution with a small C library, libxtwrapper). Every package
# is one of requirements.lock, checked against its sha256 there (ci/lock-deps writes the locks
# from pyproject.toml); the build back end (setuptools, wheel) comes the same way from
# requirements-build.lock and builds python-iptables and the project without build isolation,
# so nothing is taken from the index unchecked.
# A venv rather than `pip --break-system-packages`: the project's dependencies never mix with
# Debian's python3-* packages, and the whole install is one directory to copy.
FROM ${BASE_IMAGE} AS venv
# For a PyPI mirror or a TLS-intercepting proxy: --build-arg PIP_INDEX_URL=... / PIP_CERT=FILE.
ARG PIP_INDEX_URL
ARG PIP_CERT
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       python3 python3-venv gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml requirements.lock requirements-build.lock ./
# pyproject.toml names README.md as the long description; nothing in the image reads it, and an
# empty one keeps a documentation change from rebuilding the image.
RUN : >README.md
COPY agent/ agent/
COPY plugin/ plugin/
# The root file system is read-only at run time: bytecode is compiled here, with hashes rather
# than timestamps so it stays valid whatever the copy does to mtimes; tests are not shipped.
# The agent uses the synchronous Kubernetes client only: kubernetes.aio (68 MB with its bytecode)
# and the packages only it imports (aiohttp & co., 12 MB) are removed.
ARG ASYNC_ONLY="aiohttp aiohttp-retry yarl multidict frozenlist aiosignal propcache aiohappyeyeballs"
ARG PIP="/opt/istio-cni/venv/bin/pip --disable-pip-version-check --no-cache-dir"
RUN python3 -m venv /opt/istio-cni/venv \
    && $PIP install --require-hashes --no-deps --no-compile -r requirements-build.lock \
    && $PIP install --require-hashes --no-deps --no-compile --no-build-isolation \
       -r requirements.lock \
    && $PIP install --no-index --no-deps --no-compile --no-build-isolation . \
    && $PIP check \
    && $PIP uninstall -y $ASYNC_ONLY pip setuptools wheel packaging \
    && cd /opt/istio-cni/venv/lib/python3.11/site-packages \
    && rm -rf kubernetes/aio */tests kubernetes/test kubernetes/e2e_test \
    && find /opt/istio-cni/venv -depth -name __pycache__ -type d -exec rm -rf {} + \
    && /opt/istio-cni/venv/bin/python -m compileall -q -j0 --invalidation-mode unchecked-hash \
       /opt/istio-cni/venv/lib \
    && cd / && rm -rf /src \
    && /opt/istio-cni/venv/bin/istio-cni-agent --help >/dev/null \
    && /opt/istio-cni/venv/bin/python -c 'import kubernetes.client, kubernetes.watch'
COPY --from=plugin /opt/istio-cni/bin/ /opt/istio-cni/bin/

# --- The agent.
FROM ${BASE_IMAGE}
# python3: Debian's 3.11, which the venv links to (its postinst compiles the standard library);
# iptables brings iptables-legacy, iptables-nft and the libiptc/libxtables python-iptables loads;
# nftables for the nft backend; iproute2 for `ip netns` when debugging a node.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       python3 iptables nftables iproute2 \
    && rm -rf /var/lib/apt/lists/* /var/log/apt /var/log/dpkg.log /var/cache/debconf/*-old
COPY --from=venv /opt/istio-cni/ /opt/istio-cni/
ENV PATH=/opt/istio-cni/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
LABEL org.opencontainers.image.title="istio-cni" \
      org.opencontainers.image.description="Istio CNI node agent (istio-cni-agent) and the istio-cni CNI plugin" \
      org.opencontainers.image.licenses="Apache-2.0"
# The chart runs it as root with a read-only root file system and an emptyDir on /tmp.
ENTRYPOINT ["istio-cni-agent", "run"]
