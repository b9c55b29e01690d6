#!/usr/bin/env bash
# Compiles the published corpora of AI-generated CUDA kernels through kiln's candidate
# compile path (docs/corpus.md). The corpora stay outside the project: MIRRORS holds one
# bare git mirror per repository (owner+name/repo, as `git clone --mirror` makes them, or
# kiln's fetch tool), OUT receives the extracted candidates and the results.
#
#   scripts/corpus/run.sh MIRRORS OUT [corpus...]
#
# Needs NVRTC 13 and the CUDA 13 headers: by default those of torch's wheels under
# $KILN_PYTHON (or /opt/kiln-torch/bin/python); or set NVRTC_ROOT (a folder with lib/ and
# include/). COMPILE_CORPUS may name a compile_corpus binary to use instead of building one;
# CORPUS_REV a commit to read instead of each mirror's HEAD (with one corpus).
set -euo pipefail
cd "$(dirname "$0")/../.."
mirrors=${1:?usage: run.sh MIRRORS OUT [corpus...]}
out=${2:?usage: run.sh MIRRORS OUT [corpus...]}
shift 2
corpora=("$@")
[ ${#corpora[@]} -gt 0 ] || corpora=(good-kernels leaderboard robust-kbench cuda-l1 kernelbench-com)
declare -A repo=(
  [good-kernels]=ScalingIntelligence+good-kernels
  [leaderboard]=anneouyang+KernelBenchLeaderboard
  [robust-kbench]=SakanaAI+robust-kbench
  [cuda-l1]=deepreinforce-ai+CUDA-L1
  [kernelbench-com]=Infatoshi+kernelbench.com
)
if [ -z "${NVRTC_ROOT:-}" ]; then
  py=${KILN_PYTHON:-/opt/kiln-torch/bin/python}
  NVRTC_ROOT=$("$py" -c 'import nvidia, os
print(next(os.path.join(p, "cu13") for p in nvidia.__path__
           if os.path.isfile(os.path.join(p, "cu13", "lib", "libnvrtc.so.13"))))')
fi
mkdir -p "$out"
bin=${COMPILE_CORPUS:-}  # a compile_corpus binary built before (to compare two kilns)
if [ -z "$bin" ]; then
  cargo build -q -p kiln-gpu --example compile_corpus
  bin="${CARGO_TARGET_DIR:-target}/debug/examples/compile_corpus"
fi
for c in "${corpora[@]}"; do
  git_dir="$mirrors/${repo[$c]:?unknown corpus $c}/repo"
  [ -d "$git_dir" ] || git_dir="$mirrors/${repo[$c]}"
  python3 scripts/corpus/extract.py "$c" "$git_dir" "$out/$c.jsonl" ${CORPUS_REV:+"$CORPUS_REV"}
  LD_LIBRARY_PATH="$NVRTC_ROOT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" CUDA_HOME="$NVRTC_ROOT" \
    "$bin" "$out/$c.jsonl" > "$out/$c.results.jsonl" 2> "$out/$c.summary.txt"
done
python3 scripts/corpus/summarize.py "$out" "${corpora[@]}"
