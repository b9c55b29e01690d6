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
#   gpu-bundle/gpu-calls.sh   gpu-check.sh steps in one device call, results packed (scripts/gpu-calls.sh)
#   gpu-bundle/gpu-bundle-unpack.sh  unpacks binaries.tar.xz in place (see below)
#   gpu-bundle/timer-floor/   floor.cu + run.sh: the timer floor measured outside kiln
#   gpu-bundle/kiln_torch.py  the trusted torch runner (found beside kiln-worker)
#   gpu-bundle/BUILD-INFO     commit, rustc, glibc symbols the binary needs, how it was packed
#   (gpu-bundle/corpus-*/ and gpu-bundle/kb/, put there by hand, are kept across rebuilds)
# The binary loads libcuda/libnvrtc/libnvidia-ml at run time (dlopen), so it builds on a
# machine without CUDA. The bundle must stay under 64 MiB (the device tool's limit, which
# also counts the rest of the working tree that travels with it); the script prints each
# file's size and the room left.
#
# The binaries and proposers (about 63 MiB uncompressed, almost all of the bundle) travel
# as one xz archive, gpu-bundle/binaries.tar.xz (about 12 MiB): gpu-check.sh and
# gpu-check-multi.sh unpack it in place on the GPU host (gpu-bundle-unpack.sh), which
# gives the layout above. GPU_BUNDLE_COMPRESS=no ships them as plain files instead;
# GPU_BUNDLE_TESTS=no leaves the GPU test binaries out (gpu-check.sh then skips its
# tests step).
#
# On a fresh machine it installs what it lacks: the wasm32-wasip2 target (through
# scripts/build-plugins.sh, with rustup) and, as root with apt-get, the system tools it
# uses (python3, a C compiler, binutils' strip and objdump, flock).
#
# Usage: scripts/build-gpu-bundle.sh        then, on the GPU host: gpu-bundle/gpu-check.sh
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
out=$top/gpu-bundle
cd "$top"
say() { echo "build-gpu-bundle: $*"; }
compress=${GPU_BUNDLE_COMPRESS:-xz}
with_tests=${GPU_BUNDLE_TESTS:-yes}
case "$compress:$with_tests" in
    xz:yes | xz:no | no:yes | no:no) ;;
    *) echo "build-gpu-bundle: GPU_BUNDLE_COMPRESS is xz or no, GPU_BUNDLE_TESTS yes or no" >&2; exit 1 ;;
esac

# System tools: COMMAND PACKAGE (Debian/Ubuntu). What is missing is installed with apt-get
# when we are root and have it; otherwise the script stops and names the packages.
missing=()
for pair in python3:python3 cc:gcc strip:binutils objdump:binutils flock:util-linux; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
    mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "installing ${missing[*]} (apt-get)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
    else
        echo "build-gpu-bundle: missing tools; install the packages ${missing[*]}" >&2
        exit 1
    fi
fi
command -v cargo >/dev/null 2>&1 || {
    echo "build-gpu-bundle: no cargo: install Rust with rustup (README.md, \"What you need\")" >&2
    exit 1
}

# The proposers first: a short build, and it installs the wasm32-wasip2 target when it is
# missing, so a machine without it stops (or is fixed) before the long release build.
say "building the proposers (scripts/build-plugins.sh)"
scripts/build-plugins.sh kiln-hill-climb kiln-idea-branch kiln-map-elites kiln-example-minimal

say "building the release binaries"
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
if [ "$with_tests" = yes ]; then
    say "building the GPU test binaries (cargo test --release --no-run)"
    gpu_test=$(test_binary kiln-sandbox gpu)
    compile_test=$(test_binary kiln-sandbox cuda_compile)
    cxx_test=$(test_binary kiln-gpu cxx)
    for t in "$gpu_test" "$compile_test" "$cxx_test"; do
        [ -n "$t" ] || { echo "build-gpu-bundle: a GPU test binary was not found" >&2; exit 1; }
    done
fi

say "assembling $out"
# Data put into the bundle by hand (gpu-bundle/corpus-*: answers kept outside the project,
# gpu-bundle/kb: KernelBench problem files) survives a rebuild.
keep=$(mktemp -d)
for d in "$out"/corpus-* "$out"/kb; do
    if [ -d "$d" ]; then mv "$d" "$keep/"; fi
done
rm -rf "$out"
mkdir -p "$out"
for d in "$keep"/*; do
    if [ -d "$d" ]; then mv "$d" "$out/"; fi
done
rmdir "$keep"
cp target/release/examples/gpu_probe "$out/gpu_probe"
for b in kiln-worker kilnd kiln kiln-plugin-host; do cp "target/release/$b" "$out/$b"; done
for f in "$out/gpu_probe" "$out/kiln-worker" "$out/kilnd" "$out/kiln" "$out/kiln-plugin-host"; do
    strip "$f"
done
chmod +x "$out/gpu_probe" "$out/kiln-worker" "$out/kilnd" "$out/kiln" "$out/kiln-plugin-host"
if [ "$with_tests" = yes ]; then
    mkdir -p "$out/gpu-tests"
    cp "$gpu_test" "$out/gpu-tests/gpu"
    cp "$compile_test" "$out/gpu-tests/cuda_compile"
    cp "$cxx_test" "$out/gpu-tests/cxx"
    strip "$out"/gpu-tests/*
    chmod +x "$out"/gpu-tests/*
fi
cp -r problems "$out/problems"
# The C++ example candidates (template, namespace, cooperative, cluster, headers).
mkdir -p "$out/examples"
cp -r docs/examples/cxx "$out/examples/cxx"
# Honest candidates of KernelBench level-1 problems (docs/benchmarks.md).
cp -r docs/examples/kernelbench "$out/examples/kernelbench"
# The proposers (wasm components) for the search step, built above.
mkdir -p "$out/proposers"
for p in hill-climb idea-branch map-elites example-minimal; do
    cp "target/proposers/$p.wasm" "$out/proposers/"
done
cp scripts/gpu-check.sh scripts/gpu-check-multi.sh scripts/gpu-libs.sh scripts/gpu-bundle-unpack.sh scripts/gpu-calls.sh "$out/"
# The timer floor outside kiln (built with nvcc there, when the host has it).
cp -r scripts/timer-floor "$out/timer-floor"
# The trusted torch runner (torch baselines), found beside kiln-worker.
cp daemon/torch-runner/kiln_torch.py "$out/kiln_torch.py"
chmod +x "$out/timer-floor/run.sh" "$out/gpu-check.sh" "$out/gpu-check-multi.sh" "$out/gpu-bundle-unpack.sh"

# What gets packed, with each file's size before packing.
packed=(gpu_probe kiln-worker kilnd kiln kiln-plugin-host proposers)
[ "$with_tests" = yes ] && packed+=(gpu-tests)
echo
say "build outputs (bytes, stripped):"
(cd "$out" && find "${packed[@]}" -type f -printf '  %10s  %p\n')
if [ "$compress" = xz ]; then
    # One solid archive: the binaries share most of their code (tokio, serde, cudarc, ...),
    # so together they pack to about a fifth of their size, against a quarter one by one.
    say "packing them into binaries.tar.xz (xz -9; a minute or two here)"
    if command -v xz >/dev/null 2>&1; then
        tar -C "$out" -cf - "${packed[@]}" | xz -9 -T0 >"$out/binaries.tar.xz.tmp"
    else
        python3 - "$out" "$out/binaries.tar.xz.tmp" "${packed[@]}" <<'PY'
import sys, tarfile
out, dest, names = sys.argv[1], sys.argv[2], sys.argv[3:]
with tarfile.open(dest, "w:xz", preset=9) as tar:
    for n in names:
        tar.add(f"{out}/{n}", arcname=n)
PY
    fi
    mv "$out/binaries.tar.xz.tmp" "$out/binaries.tar.xz"
    (cd "$out" && rm -rf "${packed[@]}")
fi

# Sizes: every file of the bundle, largest first, and the room left under the device
# tool's 64 MiB for the working tree that travels beside it (tracked and untracked files
# that git does not ignore).
limit=$((64 * 1024 * 1024))
tree=0
if git rev-parse --show-toplevel >/dev/null 2>&1; then
    # (du complains of files deleted but still in the index; its total is still right)
    tree=$({ git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null || true; } | tail -1 | cut -f1)
fi
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
{
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (dirty tree)')"
    echo "rustc: $(rustc --version)"
    echo "gpu tests: $with_tests, compressed: $compress"
    echo "needs glibc: $(objdump -T target/release/examples/gpu_probe | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)"
} >"$out/BUILD-INFO"
size=$(du -sb "$out" | cut -f1)

echo
say "files (bytes), largest first:"
(cd "$out" && find . -type f -printf '%s %P\n' | sort -rn |
    awk 'NR <= 15 { printf "  %10d  %s\n", $1, $2; next } { n++; b += $1 }
         END { if (n) printf "  %10d  (%d smaller files)\n", b, n }')
echo
cat "$out/BUILD-INFO"
say "$(mib "$size") in $out; with the working tree that travels beside it ($(mib "$tree")):" \
    "$(mib $((size + tree))) of the device tool's 64 MiB, $(mib $((limit - size - tree))) left"
if [ "$size" -ge "$limit" ]; then
    echo "build-gpu-bundle: larger than 64 MiB; the device tool will refuse it" >&2
    exit 1
fi
if [ $((size + tree)) -ge "$limit" ]; then
    echo "build-gpu-bundle: with the working tree it is over 64 MiB; the device tool will refuse it" \
        "(carry less beside it, or GPU_BUNDLE_TESTS=no)" >&2
    exit 1
fi
