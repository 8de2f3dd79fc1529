#!/usr/bin/env bash
# Builds the runtime base image locally: a minimal Debian root made with debootstrap and turned
# into an image with `docker import`. This machine's Docker engine cannot pull images, so the base
# has to be made here; a user with a registry can skip this and pass a standard image instead
# (build-images.sh --base-image debian:bookworm-slim).
#
# Usage: deploy/docker/build-base.sh [--tag TAG] [--suite SUITE] [--force]
# Environment: DEBIAN_MIRROR overrides the package mirror; by default the first Debian mirror
# configured for this host's apt is used (the host is Debian, so that mirror is known to work).
set -euo pipefail

tag="easd-base:bookworm"
suite="bookworm"
force=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --tag) tag="$2"; shift 2 ;;
        --suite) suite="$2"; shift 2 ;;
        --force) force=1; shift ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) echo "build-base.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done

if [[ $force -eq 0 ]] && docker image inspect "$tag" >/dev/null 2>&1; then
    echo "build-base.sh: $tag already exists, skipping (use --force to rebuild)"
    exit 0
fi

for tool in debootstrap docker; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "build-base.sh: '$tool' not found (Debian: apt-get install debootstrap)" >&2
        exit 1
    fi
done
if [[ $(id -u) -ne 0 ]]; then
    echo "build-base.sh: debootstrap needs root" >&2
    exit 1
fi

host_mirror() {
    # deb822 sources first (Debian 12 default), then the one-line format.
    local uri
    uri=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -E '/debian/?$' | head -n1 || true)
    if [[ -z "$uri" ]]; then
        uri=$(grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
            | awk '{print $2}' | grep -E '/debian/?$' | head -n1 || true)
    fi
    echo "$uri"
}
mirror="${DEBIAN_MIRROR:-$(host_mirror)}"
if [[ -z "$mirror" ]]; then
    echo "build-base.sh: no Debian mirror found in apt sources; set DEBIAN_MIRROR" >&2
    exit 1
fi

rootfs=$(mktemp -d /tmp/easd-base.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT

start=$(date +%s)
echo "build-base.sh: debootstrap $suite (minbase) from $mirror"
# ca-certificates: the services may call HTTPS endpoints (an OTLP collector behind TLS).
debootstrap --variant=minbase --include=ca-certificates "$suite" "$rootfs" "$mirror" >"$rootfs.log" 2>&1 || {
    tail -n 30 "$rootfs.log" >&2
    rm -f "$rootfs.log"
    echo "build-base.sh: debootstrap failed" >&2
    exit 1
}
rm -f "$rootfs.log"

# The image only runs prebuilt binaries: drop caches and docs to keep it small.
chroot "$rootfs" apt-get clean
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* \
    "$rootfs"/usr/share/info/* "$rootfs"/var/cache/debconf/*-old "$rootfs"/var/log/*.log

tar -C "$rootfs" --numeric-owner -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' \
    - "$tag" >/dev/null
echo "build-base.sh: built $tag in $(( $(date +%s) - start ))s ($(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}'))"
