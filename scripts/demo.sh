#!/usr/bin/env bash
# The main job, end to end on whatever this machine has: build everything, start a
# throwaway kilnd, register the problem suite, and evaluate on the best backend here
# (cuda with a GPU, host otherwise). When proposers are built, it runs a real search;
# before that, it evaluates every problem's seed kernel.
#
#   scripts/demo.sh                 # defaults
#   KILN_DEMO_PROBLEM=layernorm-128x4096 KILN_DEMO_BUDGET=30 scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# The proposers are wasm32-wasip2 components: make sure the target is there before the long
# build, installing it with rustup when rustup manages this toolchain. Without it the demo
# still runs, evaluating the seed kernels instead of searching.
plugins=yes
if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2; then
  if command -v rustup >/dev/null 2>&1; then
    echo "== installing the wasm32-wasip2 target (rustup target add wasm32-wasip2)"
    if ! rustup target add wasm32-wasip2; then
      echo "demo: could not install wasm32-wasip2; continuing without proposers" >&2
      plugins=no
    fi
  else
    echo "demo: no rustup here and no wasm32-wasip2 target: the proposers are not built;" \
         "the demo evaluates the seed kernels instead" >&2
    plugins=no
  fi
fi

echo "== building (release)"
cargo build --release --workspace --locked
if [ "$plugins" = yes ] && [ -x scripts/build-plugins.sh ]; then
  scripts/build-plugins.sh
fi
bin="$PWD/target/release"

work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-demo.XXXXXX")
export KILN_SOCKET="$work/kiln.sock"
cleanup() {
  if [ -n "${kilnd_pid:-}" ]; then
    kill -TERM "$kilnd_pid" 2>/dev/null || true
    wait "$kilnd_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

cat > "$work/kiln.toml" <<TOML
[search]
proposers_dir = "$PWD/target/proposers"
TOML

echo "== starting kilnd (log: $work/kilnd.log)"
"$bin/kilnd" --socket "$KILN_SOCKET" --state-dir "$work/state" --config "$work/kiln.toml" 2>"$work/kilnd.log" &
kilnd_pid=$!
for _ in $(seq 1 100); do
  [ -S "$KILN_SOCKET" ] && break
  sleep 0.1
done
echo "== registering problems"
"$bin/kiln" problems add problems/
"$bin/kiln" doctor

# The cuda backend where there is a GPU (the seed's softmax), the host backend elsewhere.
if "$bin/kiln" doctor --no-run -o json | tr -d ' \n' | grep -q '"usable_backends":\[[^]]*"cuda"'; then
  default_problem=softmax-4096x65536
else
  default_problem=softmax-256x4096
fi
problem=${KILN_DEMO_PROBLEM:-$default_problem}
budget=${KILN_DEMO_BUDGET:-24}
proposer=${KILN_DEMO_PROPOSER:-hill-climb}
if [ -f "$PWD/target/proposers/$proposer.wasm" ]; then
  echo "== searching: $proposer on $problem, budget $budget"
  "$bin/kiln" search start --problem "$problem" --proposer "$proposer" --budget "$budget" --time-limit 15m --seed 1 --wait
else
  echo "== no proposers built yet: evaluating each problem's seed kernel"
  for dir in problems/*/; do
    name=$(basename "$dir")
    "$bin/kiln" submit --problem "$name" --seed --wait || true
  done
fi
