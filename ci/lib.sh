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
