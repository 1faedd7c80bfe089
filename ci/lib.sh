# Shared helpers for ci/ scripts: sourced, not run.
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE_DIR=${ISTIO_CNI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/istio-cni}
VENV=${ISTIO_CNI_VENV:-$REPO_ROOT/.venv}
mkdir -p "$CACHE_DIR"
step() { printf '\n==> %s\n' "$*" >&2; }
die() { printf 'ci: FAILED: %s\n' "$*" >&2; exit 1; }
# The istio.io/istio version ci/go/istio/go.mod pins (its require block lists it `// indirect`).
istio_version() {
  sed -n 's#^[[:space:]]*istio.io/istio \(v[^ ]*\).*$#\1#p' "$REPO_ROOT/ci/go/istio/go.mod"
}
# Machines the plugin and the image are built for, by their OCI/Debian architecture name.
host_arch() {
  case $(uname -m) in x86_64) echo amd64 ;; aarch64) echo arm64 ;; *) uname -m ;; esac
}
# The GNU triplet's first part (gcc-<it>-linux-gnu, /usr/lib/<it>-linux-musl).
arch_triplet() {
  case $1 in amd64) echo x86_64 ;; arm64) echo aarch64 ;; *) return 1 ;; esac
}
host_arch_triplet() { arch_triplet "$(host_arch)"; }
# What `readelf -h` calls that machine.
elf_machine() {
  case $1 in amd64) echo "Advanced Micro Devices X86-64" ;; arm64) echo AArch64 ;; *) return 1 ;; esac
}
# require_elf_machine FILE ARCH: dies unless FILE is an executable for ARCH.
require_elf_machine() {
  local machine
  machine=$(readelf -hW "$1" | sed -n 's/^ *Machine: *//p')
  [[ $machine == "$(elf_machine "$2")" ]] || die "$1 was built for '$machine', not $2"
}
# Whether this machine runs executables of that machine (its own, or qemu-user by binfmt_misc).
can_run_arch() {
  [[ $1 == "$(host_arch)" ]] && return 0
  local t
  t=$(arch_triplet "$1") || return 1
  grep -qs '^enabled' "/proc/sys/fs/binfmt_misc/qemu-$t"
}
