#!/usr/bin/env bash
# deploy/container/make_base.sh - a Debian 12 base image made from Debian's
# own packages, for machines that reach a Debian mirror but no image
# registry.
#
#   deploy/container/make_base.sh [IMAGE]     (default localhost/paged-base:bookworm)
#
# mmdebstrap writes a minbase root file system to build/container/base.tar
# (kept: a second run reuses it), `podman import` turns it into IMAGE.
# PODMAN_FLAGS (e.g. "--storage-driver vfs") is passed to podman.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
IMAGE=${1:-localhost/paged-base:bookworm}
TAR=$ROOT/build/container/base.tar
# shellcheck disable=SC2086
if podman ${PODMAN_FLAGS:-} image exists "$IMAGE"; then
    echo "make_base: $IMAGE exists"
    exit 0
fi
mkdir -p "$(dirname "$TAR")"
if [ ! -s "$TAR" ]; then
    echo "make_base: mmdebstrap bookworm -> $TAR"
    # minbase: essential packages + apt; no documentation, no apt caches.
    mmdebstrap --variant=minbase --format=tar --quiet \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        bookworm "$TAR.tmp" && mv "$TAR.tmp" "$TAR"
fi
# shellcheck disable=SC2086
podman ${PODMAN_FLAGS:-} import --change 'CMD ["/bin/bash"]' "$TAR" "$IMAGE"
echo "make_base: imported $IMAGE"
