#!/usr/bin/env bash
# Test-only: build apexrl's images with podman on a machine where no image registry is
# reachable (see tests/e2e/test_kubernetes.py and .ci/run).
#
#   deploy/podman/build_images.sh            # from anywhere; idempotent
#
# 1. The base image localhost/debian:bookworm is debootstrapped (minbase) into a cache
#    folder and imported, once; the Dockerfile's runtime stage then installs python3 from Debian.
# 2. Every target of deploy/Dockerfile is built and tagged as the manifests name it
#    (podman stores a short name as localhost/apexrl/<service>:<tag>; a short name in a
#    manifest resolves to it). The learner is built for CPU (no CUDA wheel can be had here)
#    and tagged <version>-cpu, the tag deploy/kustomize/overlays/cpu-only runs.
# torch comes from the wheel folder pip is configured with (find-links), bind-mounted into
# the build; everything else from PyPI, verified with the host's CA bundle.
# 3. An image this script built from the same inputs (itself, the Dockerfile, pyproject.toml,
#    README.md, services/ without __pycache__, the base image, the wheel folder's listing)
#    and still tagged is kept: podman's layer cache would reuse every layer too, but takes
#    ~15 s an image to find that out (it hashes the 1.3 GB /opt/venv of COPY --from). PyPI
#    is not asked again either way. The record is $cache/<target>.built ("inputs image-id"):
#    not an image label, since a build whose steps all hit the cache keeps the old labels.
#    APEXRL_REBUILD=1 builds regardless.
#
# Environment: APEXRL_PODMAN_CACHE (default /var/cache/apexrl-podman), APEXRL_TARGETS
# (default "replay relay actor evaluator learner"), BASE_IMAGE (default localhost/debian:bookworm),
# APEXRL_WHEELS (the wheel folder), APEXRL_REBUILD=1 (build even when up to date).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
cache=${APEXRL_PODMAN_CACHE:-/var/cache/apexrl-podman}
base=${BASE_IMAGE:-localhost/debian:bookworm}
targets=${APEXRL_TARGETS:-replay relay actor evaluator learner}
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n1)
ca=/etc/ssl/certs/ca-certificates.crt
now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

if ! podman image exists "$base"; then
  t0=$(now)
  mirror=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  rootfs="$cache/bookworm-rootfs"
  if [ ! -x "$rootfs/usr/bin/apt-get" ]; then
    rm -rf "$rootfs"
    mkdir -p "$cache"
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$cache/debootstrap.log" 2>&1 \
      || { tail -n 20 "$cache/debootstrap.log" >&2; exit 1; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  fi
  tar -C "$rootfs" -c . | podman import - "$base" >/dev/null 2>"$cache/import.log" \
    || { cat "$cache/import.log" >&2; exit 1; }
  echo "base image $base: $(took "$t0")"
fi

# torch's wheel folder: the find-links folder pip is configured with (one is enough).
wheels=$(pip config list 2>/dev/null | sed -n "s/^global\.find-links='\([^' ]*\).*/\1/p" | head -n1)
wheels=${APEXRL_WHEELS:-${wheels:-/opt/wheels}}
[ -d "$wheels" ] || { echo "no wheel folder $wheels (set APEXRL_WHEELS)" >&2; exit 1; }

common=(
  -f deploy/Dockerfile
  --build-arg "BASE_IMAGE=$base"
  --build-arg CPU_TORCH_INDEX_URL=
  --build-arg TORCH_INDEX_URL=
  --build-arg PIP_FIND_LINKS=/wheels
  --build-arg PIP_CERT=/etc/apexrl-build/ca.crt
  -v "$wheels:/wheels:ro"
  -v "$ca:/etc/apexrl-build/ca.crt:ro"
  --layers
)
inputs=$(
  {
    cat deploy/podman/build_images.sh deploy/Dockerfile pyproject.toml README.md
    find services -type f -not -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
    podman image inspect "$base" --format '{{.Id}}'
    ls -l "$wheels"
  } | sha256sum | cut -c1-32
)
total0=$(now)
for target in $targets; do
  tag="apexrl/$target:$version"
  extra=()
  if [ "$target" = learner ]; then
    tag="apexrl/learner:$version-cpu"
    extra=(--build-arg LEARNER_TORCH=cpu)
  fi
  record="$cache/$target.built"
  id=$(podman image inspect "$tag" --format '{{.Id}}' 2>/dev/null || true)
  if [ -n "$id" ] && [ "$(cat "$record" 2>/dev/null)" = "$inputs $id" ] \
      && [ "${APEXRL_REBUILD:-0}" != 1 ]; then
    echo "image $tag: up to date (build inputs $inputs)"
    continue
  fi
  t0=$(now)
  log="$cache/build-$target.log"
  mkdir -p "$cache"
  rm -f "$record"
  podman build "${common[@]}" "${extra[@]}" --target "$target" -t "$tag" . >"$log" 2>&1 \
    || { tail -n 40 "$log" >&2; echo "podman build --target $target failed: $log" >&2; exit 1; }
  echo "$inputs $(podman image inspect "$tag" --format '{{.Id}}')" >"$record"
  size=$(podman image inspect "$tag" --format '{{.Size}}' | awk '{ printf "%.0f MB", $1 / 1e6 }')
  echo "image $tag: $(took "$t0") ($size)"
done
echo "all images: $(took "$total0")"
