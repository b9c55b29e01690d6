#!/usr/bin/env bash
# The timer floor, measured outside kiln (docs/benchmarks.md, "The timer floor"): builds
# floor.cu with nvcc for this GPU, runs it under CUPTI, then under Nsight Compute three
# times (--cache-control all; none; all with the clock metrics), and prints medians per
# kernel and phase. Clocks are only read (--clock-control none), never set.
# Needs a GPU host with nvcc, CUPTI, ncu and python3; about 25 s on an H200.
# Usage: scripts/timer-floor/run.sh OUTDIR [SAMPLES]   (NCU=, CUDA_HOME=, ARCH=sm_NN, PROBLEMS=)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# The seeds it links in: $PROBLEMS, else the checkout's problems/ (the GPU bundle passes its own).
problems=${PROBLEMS:-$(cd "$here/../.." && pwd)/problems}
out=${1:?OUTDIR}
n=${2:-30}
mkdir -p "$out"
arch=${ARCH:-sm_$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)}
cuda=${CUDA_HOME:-/usr/local/cuda}
ncu=${NCU:-$cuda/bin/ncu}
cupti_inc=$(dirname "$(find "$cuda"/ "$cuda"/extras/CUPTI -maxdepth 4 -name cupti.h 2>/dev/null | head -1)")
cupti_lib=$(dirname "$(find -L "$cuda"/ -maxdepth 5 -name 'libcupti.so' 2>/dev/null | head -1)")
echo "cupti.h in $cupti_inc, libcupti.so in $cupti_lib"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem --format=csv
"$cuda/bin/nvcc" -O3 -arch="$arch" -I"$cupti_inc" -o "$out/floor" "$here/floor.cu" \
    "$problems/vecadd-cuda-1m/seed.cu" "$problems/rowsum-cuda-4096x1024/seed.cu" \
    -L"$cupti_lib" -Xlinker -rpath="$cupti_lib" -lcupti || exit 1
"$out/floor" cupti "$n" 2>&1 | tee "$out/cupti.txt"
summ() { # summ CSV N: medians per kernel of the rows after each kernel's first (warm-up)
    python3 - "$1" "$2" <<'PY'
import csv, sys, statistics as st
path, n = sys.argv[1], int(sys.argv[2])
lines = open(path, errors="replace").read().splitlines()
i = next(k for k, l in enumerate(lines) if '"Kernel Name"' in l and '"Metric Value"' in l)
rows = list(csv.DictReader(lines[i:]))
by = {}
for r in rows:
    v = float(r["Metric Value"].replace(",", ""))
    by.setdefault((r["Kernel Name"], r["Metric Name"]), []).append((int(r["ID"]), v))
for (k, m), vals in sorted(by.items()):
    vals = [v for _, v in sorted(vals)][1:]
    cold, warm = vals[:n], vals[n:2 * n]
    f = (lambda x: x / 1000) if m.startswith("gpu__time_duration") else (lambda x: x)
    print(f"  {k:8s} {m:40s} cold median {f(st.median(cold)):10.3f}  warm median {f(st.median(warm)) if warm else float('nan'):10.3f}")
PY
}
ncu_run() { # ncu_run TAG CACHE METRICS
    echo "== ncu --cache-control $2 --metrics $3"
    timeout 120 "$ncu" --clock-control none --cache-control "$2" --metrics "$3" --csv \
        --print-units base --kernel-name-base function \
        --kernel-name 'regex:^(k_empty|k_one|vecadd|rowsum)$' \
        --log-file "$out/ncu-$1.log" "$out/floor" plain "$n" >"$out/ncu-$1.csv" 2>&1
    echo "   rc $?"
    summ "$out/ncu-$1.log" "$n" || summ "$out/ncu-$1.csv" "$n" || tail -5 "$out/ncu-$1.log"
}
ncu_run all all gpu__time_duration.sum
ncu_run none none gpu__time_duration.sum
ncu_run clocks all gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,dram__cycles_elapsed.avg.per_second,gpc__cycles_elapsed.max,sm__cycles_active.max
