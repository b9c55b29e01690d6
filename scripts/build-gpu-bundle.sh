#!/usr/bin/env bash
# Builds what a GPU host needs to check kiln's cuda backend, here (no GPU needed), into
# gpu-bundle/ (gitignored):
#   gpu-bundle/gpu_probe      release build of sandbox/cuda/examples/gpu_probe.rs, stripped
#   gpu-bundle/gpu-check.sh   the runner (a copy of scripts/gpu-check.sh)
#   gpu-bundle/BUILD-INFO     commit, rustc, glibc symbols the binary needs
# The binary loads libcuda/libnvrtc/libnvidia-ml at run time (dlopen), so it builds on a
# machine without CUDA. The bundle must stay under 64 MiB (the device tool's limit).
#
# Usage: scripts/build-gpu-bundle.sh        then, on the GPU host: gpu-bundle/gpu-check.sh
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
out=$top/gpu-bundle
cd "$top"

cargo build --release -p kiln-cuda --example gpu_probe
mkdir -p "$out"
cp target/release/examples/gpu_probe "$out/gpu_probe"
strip "$out/gpu_probe" 2>/dev/null || true
cp scripts/gpu-check.sh "$out/gpu-check.sh"
chmod +x "$out/gpu_probe" "$out/gpu-check.sh"

{
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (dirty tree)')"
    echo "rustc: $(rustc --version)"
    if command -v objdump >/dev/null 2>&1; then
        echo "needs glibc: $(objdump -T "$out/gpu_probe" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
    fi
} >"$out/BUILD-INFO"

size=$(du -sb "$out" | cut -f1)
limit=$((64 * 1024 * 1024))
echo "gpu-bundle: $(du -sh "$out" | cut -f1) in $out"
cat "$out/BUILD-INFO"
if [ "$size" -ge "$limit" ]; then
    echo "gpu-bundle: larger than 64 MiB; the device tool will refuse it" >&2
    exit 1
fi
