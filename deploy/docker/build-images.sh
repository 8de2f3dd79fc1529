#!/usr/bin/env bash
# Builds the EASD runtime image: cargo build --release of the four binaries, then docker build
# on a staged context holding only those binaries.
#
# Usage: deploy/docker/build-images.sh [--tag TAG] [--base-image IMAGE] [--features LIST]
#                                      [--profile PROFILE] [--skip-cargo]
#   --tag          image tag (default easd:latest)
#   --base-image   base image (default easd-base:bookworm, built locally by build-base.sh when
#                  missing; any other value is used as given, e.g. debian:bookworm-slim)
#   --features     cargo features, package-qualified (e.g. easd-model/cuda)
#   --profile      cargo profile (default release)
#   --skip-cargo   reuse the binaries already in target/<profile>/
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tag="easd:latest"
base="easd-base:bookworm"
features=""
profile="release"
skip_cargo=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --tag) tag="$2"; shift 2 ;;
        --base-image) base="$2"; shift 2 ;;
        --features) features="$2"; shift 2 ;;
        --profile) profile="$2"; shift 2 ;;
        --skip-cargo) skip_cargo=1; shift ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "build-images.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done

binaries=(easd easd-draft easd-verifier easd-coordinator)
# By binary name, not package, so moving a binary between workspace packages needs no change.
targets=()
for bin in "${binaries[@]}"; do targets+=(--bin "$bin"); done

start=$(date +%s)
if [[ $skip_cargo -eq 0 ]]; then
    cargo_args=(build --profile "$profile" "${targets[@]}")
    [[ -n "$features" ]] && cargo_args+=(--features "$features")
    echo "build-images.sh: cargo ${cargo_args[*]}"
    (cd "$repo" && cargo "${cargo_args[@]}")
fi

# cargo puts the dev profile in target/debug; every other profile in target/<name>.
out_dir="$repo/target/$profile"
[[ "$profile" == "dev" ]] && out_dir="$repo/target/debug"
context=$(mktemp -d /tmp/easd-image.XXXXXX)
trap 'rm -rf "$context"' EXIT
mkdir "$context/bin"
for bin in "${binaries[@]}"; do
    if [[ ! -x "$out_dir/$bin" ]]; then
        echo "build-images.sh: $out_dir/$bin missing (build it, or drop --skip-cargo)" >&2
        exit 1
    fi
    cp "$out_dir/$bin" "$context/bin/"
done
# Debug info is kept in the release profile for profiling; the image does not need it.
if command -v strip >/dev/null 2>&1; then
    strip --strip-debug "$context"/bin/*
fi

if [[ "$base" == "easd-base:bookworm" ]]; then
    "$repo/deploy/docker/build-base.sh" --tag "$base"
fi

echo "build-images.sh: docker build -t $tag (base $base)"
docker build --quiet -t "$tag" --build-arg "BASE_IMAGE=$base" \
    -f "$repo/deploy/docker/Dockerfile" "$context" >/dev/null
echo "build-images.sh: built $tag in $(( $(date +%s) - start ))s" \
    "($(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}'))"
