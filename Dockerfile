# The agent image: the node agent (Python), iptables (legacy and nft) and nftables, and the CNI
# plugin as a standalone executable in /opt/istio-cni/bin (Settings.pluginSourceDir), built by
# the same ci/build-plugin the tests build it with.
#   docker build -t <hub>/istio-cni:<tag> .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- The plugin: ci/build-plugin embeds this image's CPython 3.11 (built with --enable-shared,
# headers included) into an executable that needs no Python on the node. It needs a C compiler
# and strip for that, which the runtime image does not carry.
FROM ${PYTHON_IMAGE} AS plugin
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       gcc libc6-dev binutils \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY ci/lib.sh ci/build-plugin ci/
COPY ci/plugin/ ci/plugin/
COPY plugin/ plugin/
RUN ISTIO_CNI_BUILD_PYTHON=/usr/local/bin/python3.11 ISTIO_CNI_CACHE=/tmp/istio-cni-cache \
    ci/build-plugin /opt/istio-cni/bin \
    && test -x /opt/istio-cni/bin/istio-cni

# --- The agent.
FROM ${PYTHON_IMAGE}
# iptables brings iptables-legacy, iptables-nft and the libiptc/libxtables python-iptables loads;
# nftables for the nft backend; iproute2 for `ip netns` when debugging a node.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
       iptables nftables iproute2 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent/ agent/
COPY plugin/ plugin/
RUN pip install --no-cache-dir . \
    && cd / && rm -rf /src \
    && istio-cni-agent --help >/dev/null
COPY --from=plugin /opt/istio-cni/bin/ /opt/istio-cni/bin/
WORKDIR /
# The chart runs the container with a read-only root file system.
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ENTRYPOINT ["istio-cni-agent", "run"]
