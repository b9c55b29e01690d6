#!/usr/bin/env bash
# Compiles corpora already extracted by extract.py (IN/<corpus>.jsonl or .jsonl.gz) with a
# compile_corpus binary built elsewhere, in parallel shards: for a GPU host, which has the
# toolkit kilnd uses there but neither cargo nor the mirrors (docs/corpus.md, "On the H200").
#
#   scripts/corpus/compile-sharded.sh COMPILE_CORPUS IN OUT [corpus...]
#
# CUDA_HOME (default /usr/local/cuda) gives NVRTC (lib64/ or lib/) and the headers; JOBS
# (default: the CPU count less one) the shards run at once. Results as run.sh writes them
# (OUT/<corpus>.results.jsonl), then summarize.py's summary.
set -euo pipefail
bin=${1:?usage: compile-sharded.sh COMPILE_CORPUS IN OUT [corpus...]}
in=${2:?usage: compile-sharded.sh COMPILE_CORPUS IN OUT [corpus...]}
out=${3:?usage: compile-sharded.sh COMPILE_CORPUS IN OUT [corpus...]}
shift 3
corpora=("$@")
[ ${#corpora[@]} -gt 0 ] || corpora=(good-kernels leaderboard robust-kbench cuda-l1 kernelbench-com)
here=$(cd "$(dirname "$0")" && pwd)
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export LD_LIBRARY_PATH=$CUDA_HOME/lib64:$CUDA_HOME/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
jobs=${JOBS:-$(( $(nproc) > 1 ? $(nproc) - 1 : 1 ))}
mkdir -p "$out/shards"
for c in "${corpora[@]}"; do
  if [ -f "$in/$c.jsonl.gz" ]; then
    gunzip -c "$in/$c.jsonl.gz" > "$out/$c.jsonl"
  else
    cp "$in/$c.jsonl" "$out/$c.jsonl"
  fi
  # Round-robin, so that the slow files of a corpus spread over the shards.
  split -n "r/$jobs" -d -a 3 "$out/$c.jsonl" "$out/shards/$c."
done
find "$out/shards" -type f ! -name '*.*.*' -print0 |
  xargs -0 -P "$jobs" -I{} sh -c '"$1" "$2" > "$2.results" 2> "$2.err"' _ "$bin" {}
for c in "${corpora[@]}"; do
  cat "$out/shards/$c".[0-9][0-9][0-9].results > "$out/$c.results.jsonl"
done
python3 "$here/summarize.py" "$out" "${corpora[@]}"
