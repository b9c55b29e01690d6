#!/usr/bin/env bash
# Checks kiln's cuda backend on a GPU host, from binaries built elsewhere
# (scripts/build-gpu-bundle.sh). Read-only towards the GPU: nvidia-smi is only queried,
# and nothing here changes clocks, power limits or persistence mode.
#
#   1. nvidia-smi summary (query flags only);
#   2. the probe: gpu_probe (compile, resources, GPU inputs, correctness, timing with L2
#      flush and blocking kernel vs plain, NVML telemetry, faults in child processes,
#      invalid launches); its checks also go to $OUT/gpu-probe.json;
#   3. GPU tests, when the bundle has any (gpu-tests/*: test binaries, one test at a time,
#      with KILN_WORKER pointing at the bundled kiln-worker and KILN_PROBLEMS at problems/);
#   4. the bundled kilnd with a temporary socket and state directory (clock policy: the
#      default, observe): problems/ registered, the vecadd-cuda-1m seed submitted and
#      waited for, then `kiln doctor`.
#
#   5. (step `searches`) each proposer, offline, on the softmax and LayerNorm seed problems;
#   6. (step `bench`) `kiln bench throughput|latency|stability` on the cuda backend;
#   7. (step `agreement`, where the host has Nsight Compute) `kiln bench agreement`: kiln's
#      medians of the seed kernels against ncu's gpu__time_duration, one PASS/FAIL line each;
#   8. (step `triton`, where a python has triton: $KILN_TRITON_PYTHON, else
#      /opt/torch/.venv/bin/python3) the Triton seeds of vecadd-cuda-1m and
#      softmax-4096x65536 through kilnd, `kiln bench throughput --language triton` (compile
#      times cold and cached, candidates a minute), and a hill-climb search from the Triton
#      softmax seed. The GPU tests of Triton candidates are in step 3 (`triton::`).
#
# Steps run: $GPU_CHECK_STEPS (default "probe tests kilnd baselines searches bench
# agreement triton"); the GPU tests
# run are filtered by $GPU_TEST_FILTER (a libtest filter; default: all).
# Everything printed also goes to $OUT/gpu-check.log when $OUT is set.
# Usage: gpu-check.sh [BUNDLE_DIR]   (default: the directory of this script if it holds
#        gpu_probe, else <repo>/gpu-bundle)
# Exit status: 0 when every step passed, 1 otherwise (2 when CUDA is unavailable).
set -u

here=$(cd "$(dirname "$0")" && pwd)
if [ $# -ge 1 ]; then
    bundle=$(cd "$1" 2>/dev/null && pwd) || {
        echo "gpu-check: no bundle directory $1" >&2
        exit 1
    }
elif [ -x "$here/gpu_probe" ]; then
    bundle=$here
else
    bundle=$(cd "$here/.." && pwd)/gpu-bundle
fi

out=${OUT:-}
if [ -n "$out" ]; then
    mkdir -p "$out"
    exec > >(tee -a "$out/gpu-check.log") 2>&1
fi

status=0
section() { printf '\n=== %s === (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }
steps=" ${GPU_CHECK_STEPS:-probe tests kilnd baselines searches bench agreement triton} "
want() { case "$steps" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

section "host"
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "host: $(uname -srm)"
echo "bundle: $bundle"
[ -f "$bundle/BUILD-INFO" ] && sed 's/^/  /' "$bundle/BUILD-INFO"

section "nvidia-smi (read-only queries)"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L
    nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,persistence_mode,power.limit \
        --format=csv
    nvidia-smi --query-gpu=index,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu \
        --format=csv
    nvidia-smi --query-gpu=index,clocks_event_reasons.active --format=csv 2>/dev/null ||
        nvidia-smi --query-gpu=index,clocks_throttle_reasons.active --format=csv 2>/dev/null ||
        echo "(clock event reasons not queryable)"
    nvidia-smi --query-gpu=index,clocks.applications.graphics,clocks.default_applications.graphics \
        --format=csv 2>/dev/null || true
else
    echo "nvidia-smi not found"
fi

section "libraries"
# cudarc dlopens libcuda.so.1 and libnvrtc.so.13 by name, nvml-wrapper libnvidia-ml.so.1.
# When one is not on the loader path (the toolkit's lib64 is often unknown to ldconfig),
# add the usual places, then the pip wheel that PyTorch images carry (nvidia-cuda-nvrtc).
found() { # found LIBNAME: true if the loader would find it
    ldconfig -p 2>/dev/null | grep -q "$1" && return 0
    local IFS=: d
    for d in ${LD_LIBRARY_PATH:-}; do
        [ -n "$d" ] && [ -e "$d/$1" ] && return 0
    done
    return 1
}
add_dir() { export LD_LIBRARY_PATH="$1${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; }
for lib in libcuda.so.1 libnvidia-ml.so.1 libnvrtc.so.13; do
    found "$lib" && continue
    for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu \
        /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
        /usr/local/cuda-13*/lib64 /usr/local/cuda-13*/targets/x86_64-linux/lib; do
        if [ -e "$d/$lib" ]; then
            add_dir "$d"
            break
        fi
    done
done
if ! found libnvrtc.so.13 && command -v python3 >/dev/null 2>&1; then
    d=$(python3 - <<'PY' 2>/dev/null
import glob, os, site
dirs = site.getsitepackages() + [site.getusersitepackages()]
for base in dirs:
    for hit in glob.glob(os.path.join(base, "nvidia", "**", "libnvrtc.so.13"), recursive=True):
        print(os.path.dirname(hit))
        raise SystemExit
PY
    )
    [ -n "$d" ] && add_dir "$d"
fi
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
py=$(command -v python3 || true)
echo "python3: ${py:-not found}"
[ -n "$py" ] && "$py" -c 'import torch, sys; print("  torch", torch.__version__, "at", torch.__file__, "for", sys.executable)' 2>&1 | head -2
for lib in libcuda.so.1 libnvidia-ml.so.1 libnvrtc.so.13 libcupti.so.13; do
    if found "$lib"; then echo "  $lib: found"; else echo "  $lib: NOT FOUND"; fi
done
# libcupti (kernel times from CUPTI activity records) is optional: without it kiln times
# with CUDA events, and every GPU evaluation's timing.timer says so.

if want probe; then
section "gpu_probe"
if [ ! -x "$bundle/gpu_probe" ]; then
    echo "no gpu_probe in $bundle: run scripts/build-gpu-bundle.sh first"
    exit 1
fi
json_args=()
[ -n "$out" ] && json_args=(--json "$out/gpu-probe.json")
"$bundle/gpu_probe" "${json_args[@]}"
rc=$?
echo "gpu_probe exit status: $rc"
if [ $rc -eq 2 ]; then
    echo "CUDA is unavailable on this host (see the UNAVAILABLE line above)"
    exit 2
fi
[ $rc -ne 0 ] && status=1
fi

if want tests && [ -d "$bundle/gpu-tests" ]; then
    section "gpu tests"
    for t in "$bundle"/gpu-tests/*; do
        [ -x "$t" ] || continue
        echo "--- $(basename "$t")"
        KILN_WORKER="$bundle/kiln-worker" KILN_PROBLEMS="$bundle/problems" KILN_GPU_TESTS=1 \
            "$t" --test-threads=1 --nocapture ${GPU_TEST_FILTER:-} || status=1
    done
fi

triton_py=${KILN_TRITON_PYTHON:-}
[ -z "$triton_py" ] && [ -x /opt/torch/.venv/bin/python3 ] && triton_py=/opt/torch/.venv/bin/python3
if { want kilnd || want baselines || want searches || want bench || want agreement || want triton; } && [ -x "$bundle/kilnd" ] && [ -x "$bundle/kiln" ]; then
    section "kilnd end to end"
    tmp=$(mktemp -d /tmp/kiln-gpu-check.XXXXXX)
    export KILN_SOCKET="$tmp/kiln.sock"
    # Clock policy: the default, observe (never lock clocks on a shared GPU).
    cat >"$tmp/kiln.toml" <<TOML
[search]
proposers_dir = "$bundle/proposers"
queue_cap = 32
TOML
    if [ -n "$triton_py" ]; then
        printf '[triton]\npython = "%s"\n' "$triton_py" >>"$tmp/kiln.toml"
    fi
    "$bundle/kilnd" --socket "$KILN_SOCKET" --state-dir "$tmp/state" --config "$tmp/kiln.toml" >"$tmp/kilnd.log" 2>&1 &
    kilnd_pid=$!
    for _ in $(seq 1 100); do [ -S "$KILN_SOCKET" ] && break; sleep 0.1; done
    if [ -S "$KILN_SOCKET" ]; then
        "$bundle/kiln" problems add "$bundle/problems" || status=1
        if want kilnd; then
            section "kiln doctor"
            "$bundle/kiln" doctor || status=1
            for p in vecadd-cuda-1m softmax-4096x65536 layernorm-16x64x256x256; do
                "$bundle/kiln" submit --problem "$p" --seed --backend cuda --wait || status=1
            done
        fi
        if want baselines; then
            for p in softmax-4096x65536 layernorm-16x64x256x256 matmul-fp32-4096 conv2d-3to96-k11s4p2 conv2d-relu-maxpool; do
                section "baselines through kilnd: $p"
                "$bundle/kiln" problems baseline "$p" || status=1
                "$bundle/kiln" problems show "$p" || status=1
            done
            id=$("$bundle/kiln" submit --problem softmax-4096x65536 --seed --backend cuda -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])' 2>/dev/null)
            [ -n "$id" ] && "$bundle/kiln" show "$id" --wait 120
        fi
        if want searches; then
            for p in softmax-4096x65536 layernorm-16x64x256x256; do
                for prop in hill-climb idea-branch map-elites; do
                    section "search: $prop on $p (offline)"
                    "$bundle/kiln" search start --problem "$p" --proposer "$prop" \
                        --budget "${SEARCH_BUDGET:-24}" --time-limit 10m --seed 1 --wait || status=1
                    id=$("$bundle/kiln" search list -o json | python3 -c 'import json,sys; s=json.load(sys.stdin); s=s.get("searches", s); print(s[0]["id"] if s else "")' 2>/dev/null)
                    # One file for all searches (the device tool brings back few files).
                    [ -n "$id" ] && [ -n "$out" ] && "$bundle/kiln" search show "$id" -o json >>"$out/searches.jsonl" 2>/dev/null
                done
            done
        fi
        if want bench; then
            section "kiln bench"
            bench_out=${out:-$tmp}
            "$bundle/kiln" bench latency --problem vecadd-cuda-1m --backend cuda -o json >"$bench_out/bench-latency.json" || status=1
            "$bundle/kiln" bench throughput --problem softmax-4096x65536 --backend cuda -o json >"$bench_out/bench-throughput.json" || status=1
            "$bundle/kiln" bench throughput --problem softmax-4096x65536 --backend cuda --race --no-cached -o json >"$bench_out/bench-throughput-raced.json" || status=1
            "$bundle/kiln" bench stability --problem layernorm-16x64x256x256 --backend cuda --rounds 20 --interleave 1 -o json >"$bench_out/bench-stability.json" || status=1
            for f in latency throughput throughput-raced stability; do
                echo "--- bench $f"; cat "$bench_out/bench-$f.json"
            done
        fi
        if want agreement; then
            section "kiln bench agreement (Nsight Compute)"
            ncu_bin=$(command -v ncu 2>/dev/null || true)
            [ -z "$ncu_bin" ] && [ -x /usr/local/cuda/bin/ncu ] && ncu_bin=/usr/local/cuda/bin/ncu
            if [ -z "$ncu_bin" ]; then
                echo "SKIP agreement: no ncu on this host (PATH, /usr/local/cuda/bin)"
            else
                "$ncu_bin" --version | tail -1
                "$bundle/kiln" bench agreement --ncu "$ncu_bin" --launcher "$bundle/kiln-worker" \
                    ${AGREEMENT_ARGS:-} --report "${out:-$tmp}/bench-agreement.json" || status=1
            fi
        fi
        if want triton; then
            section "triton through kilnd"
            if [ -z "$triton_py" ] || ! "$triton_py" -c "import triton" >/dev/null 2>&1; then
                echo "SKIP triton: no python with triton (set KILN_TRITON_PYTHON)"
            else
                "$triton_py" -c 'import triton, sys; print("triton", triton.__version__, "in", sys.executable)'
                for p in vecadd-cuda-1m softmax-4096x65536; do
                    "$bundle/kiln" submit --problem "$p" --seed --backend triton --wait || status=1
                done
                bench_out=${out:-$tmp}
                # Compile times (stage percentiles, uncached and cached passes) and throughput.
                "$bundle/kiln" bench throughput --problem softmax-4096x65536 --language triton \
                    --count "${TRITON_BENCH_COUNT:-40}" -o json >"$bench_out/bench-throughput-triton.json" || status=1
                echo "--- bench throughput-triton"; cat "$bench_out/bench-throughput-triton.json"
                section "search: hill-climb on softmax-4096x65536 from the Triton seed (offline)"
                "$bundle/kiln" search start --problem softmax-4096x65536 --proposer hill-climb \
                    --config '{"language": "triton"}' --budget "${SEARCH_BUDGET:-24}" --time-limit 10m \
                    --seed 1 --wait || status=1
            fi
        fi
    else
        echo "kilnd did not start"
        status=1
    fi
    kill "$kilnd_pid" 2>/dev/null
    wait "$kilnd_pid" 2>/dev/null
    echo "--- kilnd log (tail)"
    tail -n 40 "$tmp/kilnd.log"
    [ -n "$out" ] && cp "$tmp/kilnd.log" "$out/kilnd.log"
    rm -rf "$tmp"
elif [ -x "$bundle/kiln" ]; then
    section "kiln doctor"
    "$bundle/kiln" doctor || status=1
fi

section "after"
command -v nvidia-smi >/dev/null 2>&1 &&
    nvidia-smi --query-gpu=index,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
echo "gpu-check: $([ $status -eq 0 ] && echo passed || echo FAILED)"
exit $status
