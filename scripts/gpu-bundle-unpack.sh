#!/usr/bin/env bash
# Unpacks a GPU bundle in place (scripts/build-gpu-bundle.sh ships its binaries as one
# xz archive, binaries.tar.xz, to stay well under the device tool's 64 MiB): gpu_probe,
# kilnd, kiln, kiln-worker, kiln-plugin-host, gpu-tests/ and proposers/ come out where an
# uncompressed bundle has them, and the archive is removed. gpu-check.sh and
# gpu-check-multi.sh run this first; run it yourself before using the bundle's binaries
# directly. Idempotent: without an archive (already unpacked, or built with
# GPU_BUNDLE_COMPRESS=no) it does nothing. Needs python3 (its lzma module), or tar and xz.
#
# Usage: gpu-bundle-unpack.sh [BUNDLE_DIR]   (default: the directory of this script)
set -euo pipefail

bundle=$(cd "${1:-$(dirname "$0")}" && pwd)
archive=$bundle/binaries.tar.xz
if [ ! -f "$archive" ]; then
    echo "gpu-bundle-unpack: $bundle is unpacked (no binaries.tar.xz)"
    exit 0
fi
echo "gpu-bundle-unpack: unpacking $archive ($(stat -c %s "$archive") bytes)"
# Into a folder beside the bundle's files first, then moved into place, so that a failed
# unpack leaves the archive and no half of its files.
tmp=$(mktemp -d "$bundle/.unpack.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if ! python3 - "$archive" "$tmp" <<'PY'; then
import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as tar:
    if hasattr(tarfile, "data_filter"):
        tar.extractall(sys.argv[2], filter="data")
    else:
        tar.extractall(sys.argv[2])
PY
    echo "gpu-bundle-unpack: python3 could not unpack it; trying tar and xz" >&2
    rm -rf "${tmp:?}"/*
    tar -xJf "$archive" -C "$tmp"
fi
for entry in "$tmp"/*; do
    name=$(basename "$entry")
    rm -rf "${bundle:?}/$name"
    mv "$entry" "$bundle/$name"
done
rm -f "$archive"
echo "gpu-bundle-unpack: done, $(du -sh "$bundle" | cut -f1) in $bundle"
