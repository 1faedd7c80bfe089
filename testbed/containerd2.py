"""containerd 2 (built by ci/setup-testbed from its module) with its CRI plugins and runc 1.5 (built
there too: Debian's 1.1 has no idmapped mounts, which a user-namespaced pod's volumes need), as a
real node's container runtime: the `containerd2` runtime of a layout (testbed/platforms.py).

It runs as containerd 1.6 does (testbed/containerd.py: the same dirs below its own base, the same
ctr commands, pod netns under its state dir or in /var/run/netns), from a config of version 3:
the CRI plugin of 1.6 (`io.containerd.grpc.v1.cri`) is split into `io.containerd.cri.v1.images`
(snapshotter, the sandbox image as a pinned image, registry hosts), `io.containerd.cri.v1.runtime`
(runtimes, CNI, the kernel's limits) and `io.containerd.grpc.v1.cri` (the streaming server only).
Its CRI Status calls the CNI STATUS verb of every plugin of the loaded conflist when its
cniVersion is 1.1.0 or later (go-cni's Status, libcni's GetStatusNetworkList): an error there is
the node's NetworkReady false.
"""

from __future__ import annotations

from pathlib import Path

from testbed import parts
from testbed.containerd import SNAPSHOTTER, Containerd, ContainerdDirs

# Plugins that would reach outside the test bed's dir (NRI's socket in /var/run/nri) or log
# errors here (erofs needs mkfs.erofs), and tracing nobody collects.
DISABLED_PLUGINS = (
    "io.containerd.nri.v1.nri",
    "io.containerd.snapshotter.v1.erofs",
    "io.containerd.differ.v1.erofs",
    "io.containerd.snapshotter.v1.blockfile",
    "io.containerd.tracing.processor.v1.otlp",
    "io.containerd.internal.v1.tracing",
)


def render_config(
    dirs: ContainerdDirs,
    *,
    sandbox_image: str,
    cni_bin_dir: Path,
    cni_conf_dir: Path,
    shim: Path,
    runc: Path,
    netns_under_state: bool = True,
) -> str:
    """config.toml (version 3) for a node of the test bed, the same node as 1.6's config makes
    (testbed/containerd.py render_config) in containerd 2's sections. The shim and runc are named:
    the machine's PATH has 1.6's shim."""
    disabled = ", ".join(f'"{p}"' for p in DISABLED_PLUGINS)
    images = 'plugins."io.containerd.cri.v1.images"'
    runtime = 'plugins."io.containerd.cri.v1.runtime"'
    return f"""version = 3
root = "{dirs.root}"
state = "{dirs.state}"
disabled_plugins = [{disabled}]

[grpc]
  address = "{dirs.socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{dirs.base / "opt"}"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[{images}]
  snapshotter = "{SNAPSHOTTER}"

[{images}.pinned_images]
  sandbox = "{sandbox_image}"

[{images}.registry]
  config_path = "{dirs.base / "certs.d"}"

[{runtime}]
  # As for 1.6: CAP_SYS_RESOURCE withheld here, no AppArmor in the kernel.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = {"true" if netns_under_state else "false"}
  disable_apparmor = true

[{runtime}.cni]
  bin_dirs = ["{cni_bin_dir}"]
  conf_dir = "{cni_conf_dir}"
  max_conf_num = 1

[{runtime}.containerd]
  default_runtime_name = "runc"

[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  runtime_path = "{shim}"

[{runtime}.containerd.runtimes.runc.options]
  BinaryName = "{runc}"
  Root = "{dirs.runc_root}"
  SystemdCgroup = false
"""


class Containerd2(Containerd):
    """containerd 2 in place of 1.6: its own binaries and config, the rest as Containerd."""

    def binaries(self) -> tuple[Path, Path]:
        self.shim = parts.containerd2("containerd-shim-runc-v2").require()
        self.runc = parts.runc().require()
        return parts.containerd2("containerd").require(), parts.containerd2("ctr").require()

    def render_config(self) -> str:
        return render_config(
            self.dirs,
            sandbox_image=self.sandbox_image,
            cni_bin_dir=self.cni_bin_dir,
            cni_conf_dir=self.cni_conf_dir,
            shim=self.shim,
            runc=self.runc,
            netns_under_state=self.netns_under_state,
        )
