# Go builds of the pinned tools, for the ci/ scripts that build them: sourced after lib.sh.
# Set GOBUILD_WHO first: the word that starts each message (testbed, tools).
#   mod_version DIR MODULE              the version ci/go/DIR/go.mod requires of MODULE
#   go_build PART DIR PACKAGE OUT [LDFLAGS [SRC_DIR]]
#                                       go build PACKAGE with ci/go/DIR's go.mod into OUT,
#                                       unless OUT exists: OUT's path holds the version, so a
#                                       warm run reuses it and a new pin builds anew; SRC_DIR's
#                                       .go files (a main package of the repository's own) are
#                                       built beside that go.mod
GOBUILD_WHO=${GOBUILD_WHO:-go}
GO=${GO:-/usr/local/go/bin/go}
[[ -x $GO ]] || GO=$(command -v go) || die "$GOBUILD_WHO: Go toolchain not found (/usr/local/go/bin/go)"
# Reproducible, small, static binaries; never switch toolchains behind our back.
export GOFLAGS="-mod=mod -trimpath" GOTOOLCHAIN=local CGO_ENABLED=0

# A direct `require MODULE vX` line, or MODULE's line in a require block (a tidied go.mod).
mod_version() {
  sed -n "s#^\(require \|[[:space:]]*\)$2 \(v[^ ]*\).*\$#\2#p" "$REPO_ROOT/ci/go/$1/go.mod" | head -1
}

# Scratch dirs of builds in flight, removed however the script ends.
scratch=()
trap 'rm -rf "${scratch[@]}" 2>/dev/null || true' EXIT

# The go.mod dir is copied so a build never writes into the repository.
go_build() {
  local part=$1 dir=$2 pkg=$3 out=$4 ldflags=${5:-} src=${6:-} work log start lock
  # One build of a part at a time, whoever runs this script: a second run waits, then reuses it.
  exec {lock}>"$CACHE_DIR/build-$part.lock"
  flock "$lock"
  if [[ -x $out ]]; then
    step "$GOBUILD_WHO: $part cached at $out"
    exec {lock}>&-
    return
  fi
  step "$GOBUILD_WHO: building $part ($pkg) -> $out"
  start=$SECONDS
  work=$(mktemp -d "$CACHE_DIR/build-$part.XXXXXX")
  scratch+=("$work" "$out.tmp")
  log="$CACHE_DIR/build-$part.log"
  cp "$REPO_ROOT/ci/go/$dir/go.mod" "$work/"
  [[ -f $REPO_ROOT/ci/go/$dir/go.sum ]] && cp "$REPO_ROOT/ci/go/$dir/go.sum" "$work/"
  [[ -z $src ]] || cp "$REPO_ROOT/$src"/*.go "$work/"
  mkdir -p "$(dirname "$out")"
  if ! (cd "$work" && "$GO" build -ldflags="-s -w $ldflags" -o "$out.tmp" "$pkg") >"$log" 2>&1
  then
    tail -n 30 "$log" >&2
    die "$GOBUILD_WHO: build of $part failed (log: $log)"
  fi
  mv "$out.tmp" "$out"
  exec {lock}>&-
  step "$GOBUILD_WHO: built $part in $((SECONDS - start))s"
}
