#!/usr/bin/env bash
# Builds kiln's wasm32-wasip2 plugin components (the proposers hill-climb, idea-branch,
# map-elites and example-minimal, and the plugin host's test plugins) and copies them to
# target/plugins/. The proposers are also installed by name as
# target/{debug,release}/proposers/NAME.wasm (kilnd looks for proposers/NAME.wasm beside
# its own executable, so `kiln search start --proposer hill-climb` finds them) and as
# target/proposers/NAME.wasm.
#
#   scripts/build-plugins.sh            # all of them
#   scripts/build-plugins.sh CRATE...   # only these packages
#
# Installs the wasm32-wasip2 target with rustup when it is missing. Uses its own target dir
# (target/plugin-guests), the same one the plugin host's tests build into, so the two
# share their work and never wait on the main build's lock.
# The tests build what they need themselves; set KILN_PLUGIN_WASM_DIR=target/plugins to
# make them use this script's output instead.
set -euo pipefail
cd "$(dirname "$0")/.."

crates=("$@")
if [ ${#crates[@]} -eq 0 ]; then
  crates=(kiln-hill-climb kiln-idea-branch kiln-map-elites kiln-example-minimal
          kiln-test-plugin-abuse kiln-test-plugin-snoop-fs kiln-test-plugin-snoop-net)
fi

# Test binaries that run at the same time (scripts/run-tests.py) each call this script:
# one at a time (the later ones then find everything built), and every file is installed
# by a rename, so a reader never sees half of one.
mkdir -p target
exec 9>target/build-plugins.lock
flock 9

# The wasm32-wasip2 target: installed here with rustup when it is missing (once, under the
# lock, so that callers at the same time do not run rustup together; a no-op after that),
# for the toolchain this directory uses.
if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip2; then
  if ! command -v rustup >/dev/null 2>&1; then
    echo "build-plugins: the wasm32-wasip2 target is missing and there is no rustup to install it;" \
         "install it for this toolchain (rustup target add wasm32-wasip2)" >&2
    exit 1
  fi
  echo "build-plugins: installing the wasm32-wasip2 target (rustup target add wasm32-wasip2)"
  rustup target add wasm32-wasip2
fi

args=()
for c in "${crates[@]}"; do args+=(-p "$c"); done
cargo build --release --locked --target wasm32-wasip2 --target-dir target/plugin-guests "${args[@]}"

mkdir -p target/plugins
for c in "${crates[@]}"; do
  f="target/plugin-guests/wasm32-wasip2/release/${c//-/_}.wasm"
  cp "$f" "target/plugins/$(basename "$f").tmp.$$" && mv "target/plugins/$(basename "$f").tmp.$$" "target/plugins/$(basename "$f")"
  echo "build-plugins: target/plugins/$(basename "$f") ($(stat -c %s "$f") bytes)"
  case "$c" in
    kiln-test-plugin-*) ;;
    kiln-*)
      name=${c#kiln-}
      for d in target/proposers target/debug/proposers target/release/proposers; do
        mkdir -p "$d"
        cp "$f" "$d/$name.wasm.tmp.$$" && mv "$d/$name.wasm.tmp.$$" "$d/$name.wasm"
      done
      echo "build-plugins: installed proposer $name (target/{debug,release}/proposers/$name.wasm)"
      ;;
  esac
done
