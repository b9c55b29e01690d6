#!/usr/bin/env bash
# One device call of gpu-check.sh steps, its results packed for a tool that brings back few
# files ($OUT/call.log and $OUT/all.tar.gz). Run from the bundle (gpu-bundle/gpu-calls.sh),
# with KernelBench's problem files in gpu-bundle/kb/KernelBench. STEPS, in order:
#   T  the probe and the GPU tests of the GPU targets (seeds, red team, CUPTI, torch twins;
#      $T_FILTER overrides), within $T_LIMIT s
#   H  kiln's hosted examples (docs/examples/hosted, the 2026 hacks included) through
#      kilnd, no baselines ($H_ONLY: a regular expression on the files), within $H_LIMIT s
#   B  hosted with baselines: the reference renamed and the load_inline GELU on four sizes
#      (the same-harness check; $B_ONLY overrides), within $B_LIMIT s
# Example: STEPS="T H" OUT=/tmp/out bash gpu-bundle/gpu-calls.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
log=$OUT/call.log
t0=$(date +%s)
say() { echo "$* t=$(( $(date +%s) - t0 ))" | tee -a "$log"; }
say "start $(date -u +%H:%M:%S)"
bash "$here/gpu-bundle-unpack.sh" >>"$log" 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv >>"$log" 2>&1
py=$(command -v python3)
for p in /opt/torch/.venv/bin/python3 /usr/bin/python3; do [ -x "$p" ] && "$p" -c 'import torch' 2>/dev/null && py=$p && break; done
export KILN_PYTHON=$py
export KERNELBENCH_ROOT=$here/kb/KernelBench
for s in ${STEPS:-T}; do
  case $s in
    T) mkdir -p "$OUT/T"; OUT="$OUT/T" GPU_CHECK_STEPS="probe tests" \
         GPU_TEST_FILTER="${T_FILTER:-gpu_seed_vecadd gpu_seed_softmax gpu_seed_layernorm gpu_seed_matmul_fp32_4096 redteam_gpu_ cupti_gpu torch_twins}" \
         timeout "${T_LIMIT:-300}" bash "$here/gpu-check.sh" >/dev/null 2>&1; say "T rc=$?";;
    H) mkdir -p "$OUT/H"; OUT="$OUT/H" GPU_CHECK_STEPS="hosted" HOSTED_BENCH=0 HOSTED_CHECK_ARGS="--parallel --no-baselines" \
         ${H_ONLY:+HOSTED_ONLY="$H_ONLY"} timeout "${H_LIMIT:-280}" bash "$here/gpu-check.sh" >/dev/null 2>&1; say "H rc=$?";;
    B) mkdir -p "$OUT/B"; OUT="$OUT/B" GPU_CHECK_STEPS="hosted" HOSTED_BENCH=0 HOSTED_CHECK_ARGS="--parallel" \
         HOSTED_ONLY="${B_ONLY:-gelu_reference_renamed|gelu_cuda}" timeout "${B_LIMIT:-400}" bash "$here/gpu-check.sh" >/dev/null 2>&1; say "B rc=$?";;
  esac
done
grep -h "^SUMMARY\|^COUNTS\|^LIFTS\|UNMET\|unmet\|PASS\|FAIL\|test result" "$OUT"/*/gpu-check.log "$OUT"/*/hosted-check.log 2>/dev/null | cut -c1-600 | tail -120
say "end"
# At most 8 files come back: everything else in one archive.
(cd "$OUT" && tar -czf all.tar.gz --exclude=all.tar.gz --exclude=call.log . && find . -mindepth 1 -maxdepth 1 ! -name all.tar.gz ! -name call.log -exec rm -rf {} +)
