#!/usr/bin/env bash
# Checks kiln on a host with several GPUs (one lane each), from binaries built elsewhere
# (scripts/build-gpu-bundle.sh), and prints one PASS/FAIL/SKIP line per check:
#
#   doctor      `kiln doctor` lists every GPU with a lane, and the known kernel is ok on
#               every lane;
#   devices     `[gpu] devices` by UUID and by index selects those GPUs, in NVML's order;
#               a name that is no GPU here (a UUID, an index past the last), or one GPU
#               named twice, stops kilnd with a message saying so;
#   throughput  `kiln bench throughput` with N lanes gives >= 0.9 x N x one lane's
#               candidates per minute, every lane busy >= 80 % (the CPU count is printed:
#               compiles run on the CPUs);
#   lanes       `kiln bench lanes`: the same kernel on every GPU, each lane's evaluations
#               on its own GPU (their telemetry's device UUID), medians within 1 % of
#               each other, or each GPU's factor against lane 0 reported;
#   isolation   `kiln bench lanes --isolation`: red-team kernels fault and time out on the
#               other lanes while lane 0 times the kernel: lane 0's medians within the
#               noise rule, and only the faulting lanes' workers replaced;
#   search      a search's candidates are evaluated on every lane.
#
# On a host with one GPU it runs what one GPU allows and says "single GPU: multi-lane
# checks skipped": doctor (the GPU listed with lane 0, the known kernel ok on it),
# devices (by UUID, by index, the three refusals), lanes (lane 0's evaluations on its
# own GPU; SKIP for the comparison), isolation in its one-lane form (red-team faults and
# timeouts queued on lane 0 between the kernel's evaluations: one worker replaced per
# fault, lane 0 ok after, its medians within the noise; this is recovery, not isolation
# between lanes), one lane's throughput (SKIP with its figures); search SKIP.
#
# Read-only towards the GPUs (clock policy observe). kiln uses no NCCL, but NVLink
# multicast stays off for anything started from here, as the GPU machines require.
# Everything printed also goes to $OUT/gpu-check-multi.log, and each report to
# $OUT/multi-*.json, when $OUT is set.
# Usage: gpu-check-multi.sh [BUNDLE_DIR]   (default: as gpu-check.sh)
# Environment: MULTI_PROBLEM (default softmax-4096x65536), MULTI_COUNT (candidates per
# lane in the throughput runs, default 40).
# Exit status: 0 when no check failed, 1 otherwise, 2 when no GPU is found.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

here=$(cd "$(dirname "$0")" && pwd)
if [ $# -ge 1 ]; then
    bundle=$(cd "$1" 2>/dev/null && pwd) || {
        echo "gpu-check-multi: no bundle directory $1" >&2
        exit 1
    }
elif [ -x "$here/kilnd" ] || [ -f "$here/binaries.tar.xz" ]; then
    bundle=$here
else
    bundle=$(cd "$here/.." && pwd)/gpu-bundle
fi
# A packed bundle (binaries.tar.xz, scripts/build-gpu-bundle.sh) is unpacked in place first.
if [ -f "$bundle/binaries.tar.xz" ]; then
    bash "$here/gpu-bundle-unpack.sh" "$bundle" || {
        echo "gpu-check-multi: could not unpack $bundle/binaries.tar.xz" >&2
        exit 1
    }
fi
for b in kilnd kiln kiln-worker; do
    [ -x "$bundle/$b" ] || {
        echo "gpu-check-multi: no $b in $bundle: run scripts/build-gpu-bundle.sh first" >&2
        exit 1
    }
done

out=${OUT:-}
if [ -n "$out" ]; then
    mkdir -p "$out"
    exec > >(tee -a "$out/gpu-check-multi.log") 2>&1
fi
work=$(mktemp -d /tmp/kiln-gpu-multi.XXXXXX)
reports=${out:-$work}
# Overrides, for trying the script itself without GPUs (host backend, a host problem):
backend=${MULTI_BACKEND:-cuda}
problem=${MULTI_PROBLEM:-softmax-4096x65536}
per_lane=${MULTI_COUNT:-40}
start_limit=${MULTI_START_TIMEOUT:-60}

section() { printf '\n=== %s === (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }
fails=0
result() { # result PASS|FAIL|SKIP CHECK DETAIL
    echo "$1 $2: $3"
    [ "$1" = FAIL ] && fails=$((fails + 1))
    return 0
}
kiln() { "$bundle/kiln" "$@"; }
# judge CHECK FILE PYTHON: runs PYTHON with `r` the JSON in FILE; it prints
# "PASS|FAIL|SKIP detail" as its last line.
judge() {
    local line
    line=$(python3 - "$2" "$1" <<PY 2>&1 | tail -n 1
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("FAIL no report (%s)" % e); raise SystemExit
$3
PY
    )
    result "${line%% *}" "$1" "${line#* }"
}

section "host"
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "host: $(uname -srm), $(nproc) CPUs"
echo "bundle: $bundle"
[ -f "$bundle/BUILD-INFO" ] && sed 's/^/  /' "$bundle/BUILD-INFO"
echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS"
if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "nvidia-smi not found: no GPU here"
    exit 2
fi
nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,clocks.sm,clocks.max.sm --format=csv
mapfile -t uuids < <(nvidia-smi --query-gpu=uuid --format=csv,noheader | tr -d ' ')
ngpu=${#uuids[@]}
echo "GPUs: $ngpu"
[ "$ngpu" -ge 1 ] || exit 2
[ "$ngpu" -ge 2 ] || echo "single GPU: multi-lane checks skipped"

section "libraries"
# shellcheck source=gpu-libs.sh
. "$here/gpu-libs.sh"

# start_kilnd NAME DEVICES: a kilnd on its own socket and state with `[gpu] devices =
# DEVICES` (a TOML array), the bundle's problems registered. Sets KILN_SOCKET, kilnd_pid.
start_kilnd() {
    local dir=$work/$1
    mkdir -p "$dir"
    export KILN_SOCKET=$dir/kiln.sock
    cat >"$dir/kiln.toml" <<TOML
[evaluation]
run_timeout_ms = 2000
[search]
proposers_dir = "$bundle/proposers"
queue_cap = $((4 * ngpu))
[gpu]
devices = $2
TOML
    "$bundle/kilnd" --socket "$KILN_SOCKET" --state-dir "$dir/state" --config "$dir/kiln.toml" \
        >"$dir/kilnd.log" 2>&1 &
    kilnd_pid=$!
    for _ in $(seq 1 300); do
        [ -S "$KILN_SOCKET" ] && break
        kill -0 "$kilnd_pid" 2>/dev/null || break
        sleep 0.1
    done
    if [ ! -S "$KILN_SOCKET" ]; then
        echo "kilnd ($1) did not start:"
        tail -n 20 "$dir/kilnd.log"
        return 1
    fi
    kiln problems add "$bundle/problems" >/dev/null || return 1
}
stop_kilnd() {
    kill "$kilnd_pid" 2>/dev/null
    wait "$kilnd_pid" 2>/dev/null
    [ -n "$out" ] && cp "$work/$1/kilnd.log" "$out/multi-kilnd-$1.log"
}
# refused NAME DEVICES EXPECT: kilnd must refuse to start, saying EXPECT.
refused() {
    local dir=$work/$1 rc
    mkdir -p "$dir"
    printf '[gpu]\ndevices = %s\n' "$2" >"$dir/kiln.toml"
    timeout "$start_limit" "$bundle/kilnd" --socket "$dir/kiln.sock" --state-dir "$dir/state" \
        --config "$dir/kiln.toml" >"$dir/kilnd.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "$3" "$dir/kilnd.log"; then
        result PASS devices "devices = $2 refused at start: $(grep -o "\[gpu\] devices names.*" "$dir/kilnd.log" | head -1)"
    else
        result FAIL devices "devices = $2: kilnd exit $rc, log: $(tail -n 3 "$dir/kilnd.log" | tr '\n' ' ')"
    fi
}
lane_json() { kiln -o json status | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["info"]["lanes"]))'; }

section "kilnd with every GPU"
if start_kilnd all "[]"; then
    section "doctor"
    kiln doctor
    kiln doctor -o json >"$reports/multi-doctor.json"
    judge doctor "$reports/multi-doctor.json" "
n = $ngpu
gpus = r.get('gpus') or []
laned = [g for g in gpus if g.get('lane') is not None]
runs = [k for k in r.get('known_kernels', []) if k.get('backend') == 'cuda']
ok = sorted(k.get('lane') for k in runs if k.get('ok'))
if len(gpus) == n and len(laned) == n and ok == list(range(n)):
    print('PASS %d GPUs listed, each with a lane; the known kernel ok on lanes %s' % (n, ok))
else:
    print('FAIL %d GPUs listed, %d with a lane (want %d); known kernel ok on lanes %s' % (len(gpus), len(laned), n, ok))
"

    section "lanes: the same kernel on every GPU"
    kiln bench lanes --problem "$problem" --backend "$backend" --rounds 8 --isolation -o json >"$reports/multi-lanes.json"
    python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1])).get("per_lane"), indent=1))' "$reports/multi-lanes.json" 2>/dev/null | head -80
    judge lanes "$reports/multi-lanes.json" "
c = r['comparison']
med = ', '.join('lane %s %.2f us' % (l['lane'], l['median_us']) for l in r['per_lane'])
f = ', '.join('%s: %.4f' % kv for kv in sorted(c['factor_vs_lane0'].items()))
wrong = [(l['lane'], l['devices_seen']) for l in r['per_lane'] if l['devices_seen'] != [l['label']]]
if '$backend' == 'cuda' and wrong:
    print('FAIL lanes whose evaluations ran on another GPU than their own: %s' % wrong)
elif r['lanes'] < 2:
    print('SKIP single GPU (%s)' % med)
elif c['within_1pct']:
    print('PASS medians within 1 %% (spread %.3f %%): %s' % (c['spread'] * 100, med))
else:
    print('PASS spread %.3f %% over 1 %%, factors vs lane 0 reported: %s (%s)' % (c['spread'] * 100, f, med))
"
    judge isolation "$reports/multi-lanes.json" "
i = r.get('isolation') or {}
if 'skipped' in i:
    print('SKIP ' + i['skipped']); raise SystemExit
n = i['noise']
lanes = i['lanes']
single = i.get('single_lane') is True
own = all(l['only_its_own'] for l in lanes)
rec = all(l['recovered'] in (None, 'ok') for l in lanes) and (not single or lanes[0]['recovered'] == 'ok')
faults = sum(l['faults_and_timeouts'] for l in (lanes if single else lanes[1:]))
replaced = ', '.join('lane %s: %s of %s' % (l['lane'], l['workers_replaced'], l['faults_and_timeouts']) for l in lanes)
where = 'after each of' if single else 'beside'
detail = 'lane %s mean median %.2f us alone, %.2f us %s %d faults/timeouts (delta %.3f %%, allowed %.3f %%); workers replaced (lane: replaced of faults) %s' % (i['timed_lane'], n['alone_mean_us'], n['during_mean_us'], where, faults, n['delta'] * 100, n['allowed'] * 100, replaced)
if single:
    detail = 'single GPU, faults on lane 0 itself (recovery only, not isolation between lanes): ' + detail
print(('PASS ' if n['within'] and own and rec and faults > 0 else 'FAIL ') + detail)
"

    section "search over every lane"
    if [ "$ngpu" -ge 2 ]; then
        lane_json >"$work/lanes-before.json"
        kiln search start --problem "$problem" --proposer hill-climb --budget $((8 * ngpu)) \
            --time-limit 10m --seed 1 --wait || echo "(the search ended with an error)"
        lane_json >"$work/lanes-after.json"
        python3 - "$work/lanes-before.json" "$work/lanes-after.json" "$backend" >"$reports/multi-search.json" <<'PY'
import json, sys
b, a = (json.load(open(p)) for p in sys.argv[1:3])
backend = sys.argv[3]
before = {l["lane"]: l["busy_s"] for l in b if l["backend"] == backend}
print(json.dumps({"per_lane": {l["lane"]: round(l["busy_s"] - before.get(l["lane"], 0.0), 3) for l in a if l["backend"] == backend}}))
PY
        judge search "$reports/multi-search.json" "
d = r['per_lane']
if d and all(v > 0 for v in d.values()):
    print('PASS the search kept every lane busy (seconds per lane: %s)' % d)
else:
    print('FAIL busy seconds per lane during the search: %s' % d)
"
    else
        result SKIP search "single GPU"
    fi

    if [ "$ngpu" -ge 2 ]; then
        section "throughput with $ngpu lanes"
        kiln bench throughput --problem "$problem" --backend "$backend" --count $((per_lane * ngpu)) \
            --in-flight $((8 * ngpu)) --no-cached -o json >"$reports/multi-throughput-all.json"
    fi
    stop_kilnd all
else
    result FAIL doctor "kilnd did not start with every GPU"
fi

section "throughput with one lane"
if start_kilnd one '["0"]'; then
    lane_json >"$reports/multi-devices-index.json"
    kiln bench throughput --problem "$problem" --backend "$backend" --count "$per_lane" \
        --in-flight 8 --no-cached -o json >"$reports/multi-throughput-one.json"
    stop_kilnd one
    judge devices "$reports/multi-devices-index.json" "
got = [l['label'] for l in r if l['backend'] == '$backend']
want = ['${uuids[0]}']
print(('PASS ' if got == want else 'FAIL ') + 'devices = [\"0\"] (by index) gives lanes %s (want %s)' % (got, want))
"
else
    result FAIL devices "kilnd did not start with devices = [\"0\"]"
fi
python3 - "$reports/multi-throughput-one.json" "$reports/multi-throughput-all.json" >"$reports/multi-throughput.json" <<'PY'
import json, sys
def load(p):
    try:
        return json.load(open(p))
    except Exception:
        return None
print(json.dumps({"one": load(sys.argv[1]), "all": load(sys.argv[2])}))
PY
judge throughput "$reports/multi-throughput.json" "
one, all_ = r['one'], r['all']
if not one:
    print('FAIL the one-lane throughput run gave no report'); raise SystemExit
p1 = one['passes'][0]
detail = 'one lane %.1f /min (busy %.1f %%), %s CPUs' % (p1['per_minute'], (p1['busy_fraction'] or 0) * 100, one['cpus'])
if $ngpu < 2:
    print('SKIP single GPU: ' + detail); raise SystemExit
if not all_:
    print('FAIL the %d-lane throughput run gave no report; ' % $ngpu + detail); raise SystemExit
pn, n = all_['passes'][0], all_['lanes']
busy = pn['lane_busy_fraction']
detail += '; %d lanes %.1f /min = %.2f x N x one lane, lanes busy %s; %.1f CPUs per lane' % (
    n, pn['per_minute'], pn['per_minute'] / max(n * p1['per_minute'], 1e-9),
    ', '.join('%s %.1f %%' % (k, v * 100) for k, v in sorted(busy.items())), all_['cpus_per_lane'] or 0)
ok = n == $ngpu and pn['per_minute'] >= 0.9 * n * p1['per_minute'] and min(busy.values()) >= 0.8
print(('PASS ' if ok else 'FAIL ') + detail)
"

section "[gpu] devices"
if [ "$ngpu" -ge 2 ]; then
    subset="[\"${uuids[$((ngpu - 1))]}\", \"0\"]"
    want="[\"${uuids[0]}\", \"${uuids[$((ngpu - 1))]}\"]"
else
    subset="[\"${uuids[0]}\"]"
    want="[\"${uuids[0]}\"]"
fi
if start_kilnd subset "$subset"; then
    lane_json >"$reports/multi-devices.json"
    stop_kilnd subset
    judge devices "$reports/multi-devices.json" "
got = [l['label'] for l in r if l['backend'] == '$backend']
want = $want
print(('PASS ' if got == want else 'FAIL ') + 'devices = %s gives lanes %s (want %s)' % ('''$subset''', got, want))
"
else
    result FAIL devices "kilnd did not start with devices = $subset"
fi
refused unknown-uuid '["GPU-00000000-0000-0000-0000-000000000000"]' "not a GPU of this host"
refused unknown-index "[\"$ngpu\"]" "not a GPU of this host"
refused twice "[\"0\", \"${uuids[0]}\"]" "twice"

section "after"
nvidia-smi --query-gpu=index,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
rm -rf "$work"
echo "gpu-check-multi: $ngpu GPU(s), $fails check(s) failed"
[ "$fails" -eq 0 ]
