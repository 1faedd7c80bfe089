# Shared helpers for the image scripts (ci/build-image, ci/build-testbed-images): sourced, not run.
# Every image is built with buildah in a private storage under $CACHE_DIR/buildah (vfs driver,
# chroot isolation), so nothing global is touched and no registry is ever contacted; each image is
# written as a docker-archive under $CACHE_DIR/images, named by its inputs' hash and shared by
# every checkout on the machine. What a checkout built is recorded for that checkout alone, in
# $CACHE_DIR/images/checkouts/<key>/manifest.json (<key>: 12 hex digits of the sha256 of the
# checkout's real path; testbed/images.py computes the same), beside a file `checkout` naming it:
# two checkouts building different images never run each other's (a single machine-wide record
# made the last build win for everyone).
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
IMAGE_DIR="$REPO_ROOT/ci/image"
IMAGES_OUT="$CACHE_DIR/images"
CHECKOUT=$(cd "$REPO_ROOT" && pwd -P)
RECORD_DIR="$IMAGES_OUT/checkouts/$(printf '%s' "$CHECKOUT" | sha256sum | cut -c1-12)"
MANIFEST="$RECORD_DIR/manifest.json"
BUILDAH_ROOT="$CACHE_DIR/buildah"
TESTBED_HUB=localhost/testbed
mkdir -p "$IMAGES_OUT" "$RECORD_DIR" "$BUILDAH_ROOT"
[[ $(cat "$RECORD_DIR/checkout" 2>/dev/null) == "$CHECKOUT" ]] \
  || { printf '%s\n' "$CHECKOUT" >"$RECORD_DIR/checkout.tmp" && mv -f "$RECORD_DIR/checkout.tmp" "$RECORD_DIR/checkout"; } \
  || die "write $RECORD_DIR/checkout"

for tool in buildah jq sha256sum flock; do
  command -v "$tool" >/dev/null || die "no $tool on PATH: run ci/setup-apt"
done

# buildah with the private storage and no registry: short names never resolve to a registry.
bah() {
  buildah --root "$BUILDAH_ROOT/storage" --runroot "$BUILDAH_ROOT/run" --storage-driver vfs \
    --registries-conf "$IMAGE_DIR/registries.conf" "$@"
}

# One image build at a time per cache dir (the node tier and a developer may call in parallel).
image_lock() {
  exec {IMAGE_LOCK_FD}>"$IMAGES_OUT/.lock"
  if ! flock -n "$IMAGE_LOCK_FD"; then
    printf 'image: waiting for another image build (%s)\n' "$IMAGES_OUT/.lock" >&2
    flock "$IMAGE_LOCK_FD"
  fi
  # Holding the lock, no build runs: working containers left by an interrupted one go.
  bah rm --all >/dev/null 2>&1 || true
}

# content_tag FILE|DIR...: 12 hex digits over the paths' names and contents (sorted), plus stdin.
content_tag() {
  { cat
    local p
    for p in "$@"; do
      if [[ -d $p ]]; then
        (cd "$p" && find . -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z \
          | xargs -0 -r sha256sum)
      elif [[ -e $p ]]; then
        printf '%s ' "$(basename "$p")"; sha256sum <"$p"
      else
        printf 'absent %s\n' "$(basename "$p")"
      fi
    done; } | sha256sum | cut -c1-12
}

image_exists() { bah inspect --type image "$1" >/dev/null 2>&1; }
image_id() { bah inspect --type image --format '{{.FromImageID}}' "$1"; }

# write_archive REF FILE: docker-archive (what `ctr images import` loads), atomically.
write_archive() {
  local ref=$1 file=$2
  [[ -s $file ]] && return 0
  rm -f "$file.tmp"
  bah push --quiet "$ref" "docker-archive:$file.tmp:$ref" >/dev/null || die "buildah push $ref to $file"
  mv -f "$file.tmp" "$file"
}

# manifest_set NAME JSON: sets manifest.json[NAME] = JSON (atomically; caller holds the lock).
manifest_set() {
  local cur='{}'
  [[ -s $MANIFEST ]] && cur=$(cat "$MANIFEST")
  jq --arg k "$1" --argjson v "$2" '.[$k] = $v' <<<"$cur" >"$MANIFEST.tmp" || die "update $MANIFEST"
  mv -f "$MANIFEST.tmp" "$MANIFEST"
}

# The archives some checkout's record names (one per line); a checkout whose dir is gone names none.
recorded_archives() {
  local dir
  for dir in "$IMAGES_OUT"/checkouts/*/; do
    [[ -s $dir/manifest.json && -d $(cat "$dir/checkout" 2>/dev/null) ]] || continue
    jq -r '.. | objects | .archive? // empty' "$dir/manifest.json" 2>/dev/null || true
  done
}

# prune_old NAME N [REPO]: remove the archives NAME-<12 hex>.tar past the newest N, except those a
# checkout's record names (another checkout's build is not ours to remove), and with REPO, the
# image REPO:<12 hex> of each.
prune_old() {
  local name=$1 keep=${2:-3} repo=${3:-} f recorded
  recorded=$(recorded_archives)
  ls -1t "$IMAGES_OUT/$name"-????????????.tar 2>/dev/null | tail -n +$((keep + 1)) | while read -r f; do
    grep -qxF -- "$f" <<<"$recorded" && continue
    local t=${f##*/"$name"-}; t=${t%.tar}
    rm -f "$f"
    [[ -z $repo ]] || bah rmi -f "$repo:$t" >/dev/null 2>&1 || true
  done
}

# progress WHAT LOG CMD...: runs CMD with its output in LOG, printing a line every 30 s while it
# runs; on failure prints the end of LOG.
progress() {
  local what=$1 log=$2; shift 2
  local start=$SECONDS pid rc=0
  "$@" >"$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && printf '    %s: still running (%ds): %s\n' "$what" \
      $((SECONDS - start)) "$(tail -n1 "$log" | LC_ALL=C tr -cd '\40-\176' | cut -c1-100)" >&2
  done
  wait "$pid" || rc=$?
  ((rc == 0)) || { tail -n 25 "$log" >&2; printf '    (full log: %s)\n' "$log" >&2; }
  return "$rc"
}
