#!/usr/bin/env bash
# Checks kiln's cuda backend on a GPU host, from binaries built elsewhere
# (scripts/build-gpu-bundle.sh). Read-only towards the GPU: nvidia-smi is only queried,
# and nothing here changes clocks, power limits or persistence mode.
#
#   0. a packed bundle (binaries.tar.xz) unpacked in place, once (gpu-bundle-unpack.sh);
#   1. nvidia-smi summary (query flags only);
#   2. the probe: gpu_probe (compile, resources, GPU inputs, correctness, timing with L2
#      flush and blocking kernel vs plain, NVML telemetry, faults in child processes,
#      invalid launches); its checks also go to $OUT/gpu-probe.json;
#   3. GPU tests, when the bundle has any (gpu-tests/*: test binaries, one test at a time,
#      with KILN_WORKER pointing at the bundled kiln-worker and KILN_PROBLEMS at problems/):
#      gpu (the contract on the GPU; cxx_gpu_* for toolkit headers, C++ names, cooperative
#      and cluster launches), cuda_compile and cxx (NVRTC with the toolkit headers: every
#      header of issue #18, the suite's kernels, compile times per header);
#   4. the bundled kilnd with a temporary socket and state directory (clock policy: the
#      default, observe): problems/ registered, `kiln doctor` (with the CUDA headers it
#      found), three seeds and the C++ examples (examples/cxx: template, namespace,
#      cooperative, cluster, headers) submitted and waited for.
#
#   5. (step `searches`) each proposer, offline, on the softmax and LayerNorm seed problems;
#   6. (step `bench`) `kiln bench throughput|latency|stability` on the cuda backend (stability
#      also on the two small seeds, `stability-small`; and
#      throughput on kb-softmax-4096x65536, its torch reference, with KILN_PYTHON);
#   7. (step `agreement`, where the host has Nsight Compute) `kiln bench agreement`: kiln's
#      medians of the seed kernels against ncu's gpu__time_duration less the timer floor
#      (an empty kernel timed by both), one PASS/FAIL line each; where the host also has
#      nvcc, timer-floor/run.sh re-measures the floor outside kiln (its summary in the log);
#   8. (step `triton`, where a python has triton: $KILN_TRITON_PYTHON, else
#      /opt/torch/.venv/bin/python3) the Triton seeds of vecadd-cuda-1m and
#      softmax-4096x65536 through kilnd, `kiln bench throughput --language triton` (compile
#      times cold and cached, candidates a minute), and a hill-climb search from the Triton
#      softmax seed. The GPU tests of Triton candidates are in step 3 (`triton::`).
#  11. (step `hosted`, not in the default steps) hosted ModelNew files through kilnd:
#      kiln's own examples in docs/examples/hosted (with $KERNELBENCH_ROOT, KernelBench's
#      `KernelBench/` folder), each with the verdict it must get, and the published answers
#      of $HOSTED_CORPUS (scripts/hosted-check.py: verdicts, times, speedups);
#      ($HOSTED_ONLY: a regular expression on the example files to run; $HOSTED_CHECK_ARGS:
#      more arguments of hosted-check.py, e.g. "--parallel --no-baselines".) Each file's
#      line says what lifting it into a contract candidate came to (issue 29).
#      $HOSTED_EXAMPLES=0 skips kiln's own examples, $HOSTED_BENCH=0 the throughput.
#      With $KERNELBENCH_ROOT it also measures `kiln bench throughput --candidate` of the
#      load_inline GELU on level-1 88 ($HOSTED_BENCH_COUNT files, cold, then cached).
#  12. (step `kernelbench`, not in the default steps) `kiln kernelbench run` over every
#      level folder of $KB_ANSWERS (published answers, KernelBench's run names) against
#      $KERNELBENCH_ROOT/levelN: the table, and each level's page kernelbench-levelN.html.
#  10. (step `level1`, not in the default steps; with $KERNELBENCH_LEVEL1, KernelBench's
#      level1 folder, and KILN_PYTHON) every level-1 file imported and registered (or
#      refused at registration with the memory it needs), the honest candidates of
#      examples/kernelbench/ submitted against their torch references on the GPU, and
#      `kiln bench throughput --candidate` on GELU (88): docs/benchmarks.md's table.
#   9. (step `reports`) a short hill-climb search on softmax-4096x65536, its report and its
#      best candidate's report written to $OUT (report-cuda.html, candidate-cuda.html) and
#      checked: baseline and roofline-floor lines, the samples histogram and the NVML
#      telemetry plot (SM clock, power) present, nothing fetched from outside the page.
#
# Steps run: $GPU_CHECK_STEPS (default "probe tests kilnd baselines searches bench
# agreement triton reports"); the GPU tests run are filtered by $GPU_TEST_FILTER (libtest
# filters; default: all); the benchmarks of the bench step by $GPU_BENCH (default "latency
# throughput raced headers stability stability-small kb").
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
elif [ -x "$here/gpu_probe" ] || [ -f "$here/binaries.tar.xz" ]; then
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
steps=" ${GPU_CHECK_STEPS:-probe tests kilnd baselines searches bench agreement triton reports} "
want() { case "$steps" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
# Any step that needs the bundled kilnd.
want_kilnd() { want kilnd || want baselines || want searches || want bench || want agreement || want triton || want reports || want level1 || want hosted || want kernelbench; }

section "host"
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "host: $(uname -srm)"
echo "bundle: $bundle"
[ -f "$bundle/BUILD-INFO" ] && sed 's/^/  /' "$bundle/BUILD-INFO"

# A bundle ships its binaries, test binaries and proposers packed (binaries.tar.xz):
# unpacked in place, once, into the layout the steps below use.
if [ -f "$bundle/binaries.tar.xz" ]; then
    section "unpacking the bundle"
    bash "$here/gpu-bundle-unpack.sh" "$bundle" || {
        echo "gpu-check: could not unpack $bundle/binaries.tar.xz"
        exit 1
    }
fi

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
# shellcheck source=gpu-libs.sh
. "$here/gpu-libs.sh"

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

# The seed's five problems in KernelBench format, imported like any other (the GPU tests
# and the baselines step use problems/kb-*). Needs a python with torch: $KILN_PYTHON. The
# GPU tests' `torch_twins::` cases then run each hand-written seed kernel, renamed to the
# imported tensors, against the torch reference on the GPU and compare verdict and tier
# with its twin problem (GPU_TEST_FILTER=torch_twins runs only those).
# Only for the steps that use them (a hosted or kernelbench step alone imports its own).
if [ -x "$bundle/kiln" ] && [ -d "$bundle/problems/kernelbench-format/seed" ] &&
    { want tests || want kilnd || want baselines || want bench || want searches; }; then
    section "import: the seed's problems in KernelBench format"
    # Each with its twin's tolerance, so that a verdict differs only if the reference does:
    # the seed's 1e-2 (its harness's), softmax's tighter one (a zero passes 1e-2 there).
    # KernelBench's own 1e-4 fails honest fp32 kernels on near-zero outputs of a 4096-deep
    # reduction (problems/README.md).
    seed="$bundle/problems/kernelbench-format/seed"
    import_seed() {
        "$bundle/kiln" problems import kernelbench "$@" --out "$bundle/problems" \
            --python "${KILN_PYTHON:-python3}" --helper "$bundle/kiln_torch.py" || status=1
    }
    import_seed "$seed/matmul_fp32_4096.py" "$seed/conv2d_3to96_k11s4p2.py" \
        "$seed/conv2d_relu_maxpool.py" "$seed/layernorm_16x64x256x256.py" --atol 1e-2 --rtol 1e-2
    import_seed "$seed/softmax_4096x65536.py" --atol 1e-9 --rtol 1e-4
fi

if want tests && [ -d "$bundle/gpu-tests" ]; then
    section "gpu tests"
    for t in "$bundle"/gpu-tests/*; do
        [ -x "$t" ] || continue
        echo "--- $(basename "$t")"
        KILN_WORKER="$bundle/kiln-worker" KILN_PROBLEMS="$bundle/problems" KILN_GPU_TESTS=1 \
            "$t" --test-threads=1 --nocapture ${GPU_TEST_FILTER:-} || status=1
    done
elif want tests; then
    echo "(no gpu-tests/ in $bundle: built with GPU_BUNDLE_TESTS=no; tests step skipped)"
fi

triton_py=${KILN_TRITON_PYTHON:-}
[ -z "$triton_py" ] && [ -x /opt/torch/.venv/bin/python3 ] && triton_py=/opt/torch/.venv/bin/python3
if want_kilnd && [ -x "$bundle/kilnd" ] && [ -x "$bundle/kiln" ]; then
    section "kilnd end to end"
    tmp=$(mktemp -d /tmp/kiln-gpu-check.XXXXXX)
    export KILN_SOCKET="$tmp/kiln.sock"
    # Clock policy: the default, observe (never lock clocks on a shared GPU).
    cat >"$tmp/kiln.toml" <<TOML
[search]
proposers_dir = "$bundle/proposers"
queue_cap = 32
[gpu]
python = "${KILN_PYTHON:-python3}"
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
            # C++ kernels as people write them (issue #18): each must come out ok.
            for f in "$bundle"/examples/cxx/*.json; do
                [ -f "$f" ] || continue
                section "C++ candidate through kilnd: $(basename "$f")"
                "$bundle/kiln" submit "$f" --wait || status=1
            done
        fi
        if want baselines; then
            # kb-*: the seed's problems imported from KernelBench format (torch reference):
            # torch eager and torch.compile of their own module.
            for p in softmax-4096x65536 layernorm-16x64x256x256 matmul-fp32-4096 conv2d-3to96-k11s4p2 conv2d-relu-maxpool kb-softmax-4096x65536 kb-layernorm-16x64x256x256; do
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
        if want level1 && [ -n "${KERNELBENCH_LEVEL1:-}" ]; then
            section "KernelBench level 1: import (every file)"
            l1_out=${out:-$tmp}
            kb1="$tmp/kb-level1"
            timeout 1200 "$bundle/kiln" problems import kernelbench "$KERNELBENCH_LEVEL1" --out "$kb1" \
                --python "${KILN_PYTHON:-python3}" --helper "$bundle/kiln_torch.py" -o json \
                >"$l1_out/level1-import.json" || echo "(some files refused: see level1-import.json)"
            python3 - "$l1_out/level1-import.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit(f"no import report: {e}")
taken, refused = d.get("imported", []), d.get("refused", [])
print(f"imported {len(taken)}, refused {len(refused)}")
for r in refused:
    print("  refused:", r.get("file", r), "-", str(r.get("reason", ""))[:160])
PY
            section "KernelBench level 1: register (refused when too large for this GPU)"
            timeout 600 "$bundle/kiln" problems add "$kb1" >"$l1_out/level1-register.txt" 2>&1
            grep -c '^registered' "$l1_out/level1-register.txt" | sed 's/^/registered: /'
            grep '^refused' "$l1_out/level1-register.txt" || echo "refused: none"
            # LEVEL1_REGISTER_ONLY=1: import and register only (a whole level, quickly).
            [ -n "${LEVEL1_REGISTER_ONLY:-}" ] && kb_examples="" || kb_examples=$(ls "$bundle"/examples/kernelbench/*.json 2>/dev/null)
            for f in $kb_examples; do
                [ -f "$f" ] || continue
                section "KernelBench level 1: $(basename "$f") against its torch reference"
                started=$(date +%s.%N)
                timeout 900 "$bundle/kiln" submit "$f" --wait -o json >"$tmp/one.json" || status=1
                python3 - "$tmp/one.json" "$started" <<'PY' || status=1
import json, sys, time
r = json.load(open(sys.argv[1]))
e = (r.get("evaluation") or r.get("record", {}).get("evaluation") or {})
job = r.get("job") or r.get("record", {}).get("job") or {}
cand = r.get("candidate") or r.get("record", {}).get("candidate") or {}
print("SUMMARY", cand.get("problem"), e.get("verdict"), (e.get("message") or "")[:200],
      "median_us", (e.get("timing") or {}).get("median_us"), "job", job.get("state"), job.get("error"),
      "eval_ms", job.get("eval_ms"), "wall_s %.1f" % (time.time() - float(sys.argv[2])))
sys.exit(0 if e.get("verdict") == "ok" else 1)
PY
            done
            [ -z "$kb_examples" ] || section "KernelBench level 1: throughput of GELU (88), a candidate file varied by a comment tag"
            [ -z "$kb_examples" ] || timeout 900 "$bundle/kiln" bench throughput --candidate "$bundle/examples/kernelbench/gelu-88.json" \
                --count "${LEVEL1_BENCH_COUNT:-40}" --no-cached -o json >"$l1_out/bench-throughput-gelu.json" || status=1
            [ -z "$kb_examples" ] || python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps({k: d.get(k) for k in ("problem","passes","lanes")}, indent=1)[:3000])' \
                "$l1_out/bench-throughput-gelu.json" || true
        fi
        if want hosted; then
            # Hosted ModelNew files (issue 28): kiln's own examples (each with the verdict it
            # must get; $KERNELBENCH_ROOT is KernelBench's `KernelBench/` folder, for their
            # problems), then a corpus of published answers kept outside the project
            # ($HOSTED_CORPUS: manifest.json, the files, their problems).
            hosted_out=${out:-$tmp}
            here=$(cd "$(dirname "$0")" && pwd)
            if [ -n "${KERNELBENCH_ROOT:-}" ] && [ "${HOSTED_EXAMPLES:-1}" = 1 ]; then
                section "hosted: kiln's own ModelNew examples"
                timeout 1500 python3 "$here/../scripts/hosted-check.py" "$bundle/kiln" "$here/../docs/examples/hosted" \
                    --problems-root "$KERNELBENCH_ROOT" --helper "$bundle/kiln_torch.py" --out "$hosted_out" \
                    ${HOSTED_ONLY:+--only "$HOSTED_ONLY"} ${HOSTED_CHECK_ARGS:-} || status=1
            fi
            if [ -n "${HOSTED_CORPUS:-}" ]; then
                section "hosted: published ModelNew files ($HOSTED_CORPUS)"
                timeout 2400 python3 "$here/../scripts/hosted-check.py" "$bundle/kiln" "$HOSTED_CORPUS" \
                    --helper "$bundle/kiln_torch.py" --out "$hosted_out" ${HOSTED_CHECK_ARGS:-} || status=1
            fi
        fi
        if want hosted && [ -n "${KERNELBENCH_ROOT:-}" ] && [ "${HOSTED_BENCH:-1}" = 1 ]; then
            # Hosted throughput on KernelBench level-1 88 (GELU): kiln's load_inline example,
            # varied by a comment tag, so every variant is a new file (its library built
            # cold at its compile step), then the same files again (compile cache).
            section "hosted: throughput of a load_inline GELU on level-1 88, cold and cached"
            python3 - "$here/../docs/examples/hosted/gelu_cuda.py" "$tmp/gelu-hosted.json" <<'PY'
import json, sys
json.dump({"problem": "kb-l1-88-mingptnewgelu", "language": "modelnew",
           "source": open(sys.argv[1]).read()}, open(sys.argv[2], "w"))
PY
            timeout 900 "$bundle/kiln" bench throughput --candidate "$tmp/gelu-hosted.json" \
                --count "${HOSTED_BENCH_COUNT:-12}" -o json >"${out:-$tmp}/bench-throughput-hosted.json" || status=1
            python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps({k: d.get(k) for k in ("problem","passes","lanes")}, indent=1)[:4000])' \
                "${out:-$tmp}/bench-throughput-hosted.json" || true
        fi
        if want kernelbench && [ -n "${KB_ANSWERS:-}" ] && [ -n "${KERNELBENCH_ROOT:-}" ]; then
            # Whole levels of published answers (issue 30): $KB_ANSWERS holds one folder
            # per level (level1, level2, ...) of ModelNew files named as KernelBench names
            # its runs; $KERNELBENCH_ROOT the levels' problem files (KernelBench's
            # `KernelBench/` folder, or a folder of levelN/ with the answered files only).
            for dir in "$KB_ANSWERS"/level*; do
                [ -d "$dir" ] || continue
                n=${dir##*level}
                section "kiln kernelbench run --level $n ($dir)"
                started=$(date +%s)
                timeout "${KB_RUN_TIMEOUT:-1500}" "$bundle/kiln" kernelbench run --level "$n" --answers "$dir" \
                    --problems "$KERNELBENCH_ROOT/level$n" --helper "$bundle/kiln_torch.py" \
                    --out "$tmp/kb-run/level$n" --in-flight "${KB_IN_FLIGHT:-16}" \
                    --html "${out:-$tmp}/kernelbench-level$n.html" || status=1
                echo "level $n: wall $(( $(date +%s) - started )) s"
            done
        fi
        if want bench; then
            section "kiln bench"
            bench_out=${out:-$tmp}
            # $GPU_BENCH picks the benchmarks (default: all of them).
            benches=" ${GPU_BENCH:-latency throughput raced headers stability stability-small kb} "
            bench() { case "$benches" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
            ran=""
            if bench latency; then
                "$bundle/kiln" bench latency --problem vecadd-cuda-1m --backend cuda -o json >"$bench_out/bench-latency.json" || status=1
                ran="$ran latency"
            fi
            if bench throughput; then
                "$bundle/kiln" bench throughput --problem softmax-4096x65536 --backend cuda -o json >"$bench_out/bench-throughput.json" || status=1
                ran="$ran throughput"
            fi
            if bench raced; then
                "$bundle/kiln" bench throughput --problem softmax-4096x65536 --backend cuda --race --no-cached -o json >"$bench_out/bench-throughput-raced.json" || status=1
                ran="$ran throughput-raced"
            fi
            # Compiles that parse the toolkit headers (cuda_fp16, cooperative_groups, cub):
            # compile latency cold (first pass) and from the compile cache (second pass).
            if bench headers; then
                # $HEADERS_BENCH_COUNT candidates (default 30), $HEADERS_IN_FLIGHT in flight
                # (default the bench's 8): precompiled headers make the cold pass cheap.
                "$bundle/kiln" bench throughput --problem softmax-4096x65536 --backend cuda --variants headers \
                    --count "${HEADERS_BENCH_COUNT:-30}" ${HEADERS_IN_FLIGHT:+--in-flight "$HEADERS_IN_FLIGHT"} \
                    -o json >"$bench_out/bench-throughput-headers.json" || status=1
                ran="$ran throughput-headers"
            fi
            if bench stability; then
                "$bundle/kiln" bench stability --problem layernorm-16x64x256x256 --backend cuda --rounds 20 --interleave 1 -o json >"$bench_out/bench-stability.json" || status=1
                ran="$ran stability"
            fi
            # The same for the two small seeds, of about 5 µs: there the 0.5 % limit on the
            # CV of the medians is 25-30 ns of CUPTI kernel span.
            if bench stability-small; then
                for p in vecadd-cuda-1m rowsum-cuda-4096x1024; do
                    "$bundle/kiln" bench stability --problem "$p" --backend cuda --rounds 20 --interleave 1 -o json >"$bench_out/bench-stability-${p%%-*}.json" || status=1
                    ran="$ran stability-${p%%-*}"
                done
            fi
            # The torch-reference softmax (issue #17): the same seed, written against the
            # imported tensors (bench takes the twin's seed), beside bench-throughput.json's
            # uncached pass. Every check asks the lane's torch runner, 1 GiB each way through
            # the host, so one candidate takes tens of seconds: $KB_BENCH_COUNT (default 3).
            if bench kb && [ -n "${KILN_PYTHON:-}" ] && "$bundle/kiln" problems show kb-softmax-4096x65536 >/dev/null 2>&1; then
                "$bundle/kiln" bench throughput --problem kb-softmax-4096x65536 --backend cuda --count "${KB_BENCH_COUNT:-3}" --no-cached -o json >"$bench_out/bench-throughput-kb.json" || status=1
                ran="$ran throughput-kb"
            fi
            for f in $ran; do
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
                # The same floor measured outside kiln (CUPTI and ncu in one CUDA program):
                # informational, it does not change the status.
                nvcc_bin=$(command -v nvcc 2>/dev/null || true)
                [ -z "$nvcc_bin" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc_bin=/usr/local/cuda/bin/nvcc
                if [ -n "$nvcc_bin" ] && [ -x "$bundle/timer-floor/run.sh" ]; then
                    echo "--- timer floor outside kiln (timer-floor/run.sh)"
                    NCU="$ncu_bin" CUDA_HOME=$(dirname "$(dirname "$nvcc_bin")") PROBLEMS="$bundle/problems" \
                        "$bundle/timer-floor/run.sh" "$tmp/timer-floor" 30 ||
                        echo "NOTE timer-floor/run.sh failed (informational)"
                else
                    echo "SKIP timer floor outside kiln: no nvcc (or no timer-floor/ in the bundle)"
                fi
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
        if want reports; then
            section "reports: a short search on softmax-4096x65536 and its best candidate"
            rep_out=${out:-$tmp}
            # The search page draws the problem's baselines: measure them (a no-op when the
            # baselines step already did).
            "$bundle/kiln" problems baseline softmax-4096x65536 >/dev/null || status=1
            "$bundle/kiln" search start --problem softmax-4096x65536 --proposer hill-climb \
                --budget 8 --time-limit 5m --seed 3 --wait >/dev/null || status=1
            id=$("$bundle/kiln" search list -o json | python3 -c 'import json,sys; s=json.load(sys.stdin)["searches"]; print(s[0]["id"] if s else "")' 2>/dev/null)
            best=$("$bundle/kiln" search show "$id" -o json | python3 -c 'import json,sys; s=json.load(sys.stdin)["search"]; print((s.get("summary") or {}).get("best") or (s.get("best") or [""])[0])' 2>/dev/null)
            if [ -n "$id" ] && [ -n "$best" ]; then
                "$bundle/kiln" search report "$id" --out "$rep_out/report-cuda.html" || status=1
                "$bundle/kiln" show "$best" --report --out "$rep_out/candidate-cuda.html" || status=1
                python3 - "$rep_out/report-cuda.html" "$rep_out/candidate-cuda.html" <<'PY' || status=1
import re, sys
search, cand = (open(p, encoding="utf-8").read() for p in sys.argv[1:3])
ok = True
def check(name, cond, detail=""):
    global ok
    print(("PASS " if cond else "FAIL ") + name + (": " + detail if detail else ""))
    ok = ok and cond
for name, page in (("search", search), ("candidate", cand)):
    bad = [p for p in ("://", "<script", "<link", "<img", "<iframe", "@import", "url(") if p in page.lower()]
    check(name + " page is self-contained", not bad, ", ".join(bad))
lines = re.findall(r">\n([^<\n]+ [0-9.]+ (?:µs|ms|s))\n</text>", search)
check("search page draws reference lines", any("roofline floor" in l for l in lines), "; ".join(sorted(set(lines))))
check("search page draws baselines", any(l.startswith(("reference", "cublas", "cudnn", "torch")) for l in lines))
check("candidate page has the samples histogram and the telemetry plot", cand.count("<svg") == 2, "%d plots" % cand.count("<svg"))
check("candidate page shows SM clock and power", "SM clock (MHz)" in cand and "board power (W)" in cand)
m = re.search(r"(\d+) NVML readings over the timing window", cand)
check("telemetry readings kept", bool(m) and int(m.group(1)) > 1, m.group(0) if m else "none")
sys.exit(0 if ok else 1)
PY
            else
                echo "FAIL no search or best candidate for the report check"
                status=1
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
elif want_kilnd && [ -x "$bundle/kiln" ]; then
    # A kilnd step was asked for, but the bundle has no kilnd.
    echo "FAIL no kilnd in $bundle for the kilnd steps"
    status=1
fi

section "after"
command -v nvidia-smi >/dev/null 2>&1 &&
    nvidia-smi --query-gpu=index,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
echo "gpu-check: $([ $status -eq 0 ] && echo passed || echo FAILED)"
exit $status
