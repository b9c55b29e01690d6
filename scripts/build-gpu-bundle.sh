#!/usr/bin/env bash
# Builds what a GPU host needs to check kiln's cuda backend, here (no GPU needed), into
# gpu-bundle/ (gitignored):
#   gpu-bundle/gpu_probe      release build of sandbox/gpu/examples/gpu_probe.rs, stripped
#   gpu-bundle/kiln-worker, kilnd, kiln, kiln-plugin-host   release builds, stripped
#   gpu-bundle/gpu-tests/gpu  the GPU test binary (sandbox/tests/gpu.rs), release, stripped
#   gpu-bundle/gpu-tests/cuda_compile, cxx   the NVRTC tests (sandbox/tests/cuda_compile.rs,
#                             sandbox/gpu/tests/cxx.rs): headers, C++ names, compile times
#   gpu-bundle/problems/      a copy of problems/
#   gpu-bundle/examples/cxx/  the C++ example candidates of docs/examples/cxx
#   gpu-bundle/examples/kernelbench/  honest candidates of KernelBench level-1 problems
#   gpu-bundle/proposers/     the proposers (scripts/build-plugins.sh)
#   gpu-bundle/gpu-check.sh   the runner (a copy of scripts/gpu-check.sh)
#   gpu-bundle/gpu-check-multi.sh  the multi-GPU checks (scripts/gpu-check-multi.sh)
#   gpu-bundle/gpu-libs.sh    what both source to find the CUDA libraries
#   gpu-bundle/timer-floor/   floor.cu + run.sh: the timer floor measured outside kiln
#   gpu-bundle/BUILD-INFO     commit, rustc, glibc symbols the binary needs
#   (gpu-bundle/corpus-*/ and gpu-bundle/kb/, put there by hand, are kept across rebuilds)
# The binary loads libcuda/libnvrtc/libnvidia-ml at run time (dlopen), so it builds on a
# machine without CUDA. The bundle must stay under 64 MiB (the device tool's limit).
#
# Usage: scripts/build-gpu-bundle.sh        then, on the GPU host: gpu-bundle/gpu-check.sh
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
out=$top/gpu-bundle
cd "$top"

cargo build --release -p kiln-gpu --example gpu_probe
cargo build --release -p kiln-sandbox -p kiln-daemon -p kiln-cli -p kiln-plugin-host --bins
# A test binary (PACKAGE TEST): its path comes from cargo's JSON messages.
test_binary() {
    cargo test --release -p "$1" --test "$2" --no-run --message-format=json |
        python3 -c 'import json,sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == sys.argv[1] and m.get("executable"):
        print(m["executable"])' "$2"
}
gpu_test=$(test_binary kiln-sandbox gpu)
compile_test=$(test_binary kiln-sandbox cuda_compile)
cxx_test=$(test_binary kiln-gpu cxx)
for t in "$gpu_test" "$compile_test" "$cxx_test"; do
    [ -n "$t" ] || { echo "build-gpu-bundle: a GPU test binary was not found" >&2; exit 1; }
done
# Data put into the bundle by hand (gpu-bundle/corpus-*: answers kept outside the project,
# gpu-bundle/kb: KernelBench problem files) survives a rebuild.
keep=$(mktemp -d)
for d in "$out"/corpus-* "$out"/kb; do
    [ -d "$d" ] && mv "$d" "$keep/"
done
rm -rf "$out"
mkdir -p "$out/gpu-tests"
for d in "$keep"/*; do
    [ -d "$d" ] && mv "$d" "$out/"
done
rmdir "$keep"
cp target/release/examples/gpu_probe "$out/gpu_probe"
for b in kiln-worker kilnd kiln kiln-plugin-host; do cp "target/release/$b" "$out/$b"; done
cp "$gpu_test" "$out/gpu-tests/gpu"
cp "$compile_test" "$out/gpu-tests/cuda_compile"
cp "$cxx_test" "$out/gpu-tests/cxx"
for f in "$out/gpu_probe" "$out/kiln-worker" "$out/kilnd" "$out/kiln" "$out/kiln-plugin-host" "$out"/gpu-tests/*; do
    strip "$f" 2>/dev/null || true
done
cp -r problems "$out/problems"
# The C++ example candidates (template, namespace, cooperative, cluster, headers).
mkdir -p "$out/examples"
cp -r docs/examples/cxx "$out/examples/cxx"
# Honest candidates of KernelBench level-1 problems (docs/benchmarks.md).
cp -r docs/examples/kernelbench "$out/examples/kernelbench"
# The proposers (wasm components) for the search step.
scripts/build-plugins.sh >/dev/null
mkdir -p "$out/proposers"
cp target/proposers/*.wasm "$out/proposers/"
cp scripts/gpu-check.sh scripts/gpu-check-multi.sh scripts/gpu-libs.sh "$out/"
# The timer floor outside kiln (built with nvcc there, when the host has it).
cp -r scripts/timer-floor "$out/timer-floor"
# The trusted torch runner (torch baselines), found beside kiln-worker.
cp daemon/torch-runner/kiln_torch.py "$out/kiln_torch.py"
chmod +x "$out/timer-floor/run.sh" "$out/gpu_probe" "$out/gpu-check.sh" "$out/gpu-check-multi.sh" "$out/kiln-worker" "$out/kilnd" "$out/kiln" "$out/kiln-plugin-host" "$out"/gpu-tests/*

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
