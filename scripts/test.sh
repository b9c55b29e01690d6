#!/usr/bin/env bash
# The whole test suite: formatting, lints, every Rust test, the Python client's tests.
# Run from anywhere; CI runs exactly this (see .ci/run). The tests of Triton candidates'
# compile path run when KILN_TRITON_PYTHON names a python with triton (.ci/run installs
# one); without it they say they skip.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each stage says how long it took; the last line gives the whole run's time.
suite_start=$SECONDS
stage_name=""
stage_start=$SECONDS
stage() {
  if [ -n "$stage_name" ]; then
    echo "-- $stage_name: $((SECONDS - stage_start)) s"
  fi
  stage_name=$1
  stage_start=$SECONDS
  [ -n "$1" ] && echo "== $1"
  return 0
}
finish() {
  local rc=$?
  stage ""
  echo "-- test suite: $((SECONDS - suite_start)) s in all (exit $rc)"
}
trap finish EXIT

stage "cargo fmt --check"
cargo fmt --all -- --check

stage "systemd unit (hardening score must stay at 3.0 or better, also for a cluster node)"
scripts/check-unit.sh

stage "kubernetes manifests (deploy/kubernetes, schema-validated)"
scripts/check-kubernetes.sh

# The torch-reference and KernelBench-import tests need a python with torch (.ci/run
# installs one); without it they print SKIP.
if [ -z "${KILN_PYTHON:-}" ] && [ -x /opt/kiln-torch/bin/python ]; then
  export KILN_PYTHON=/opt/kiln-torch/bin/python
fi
echo "== torch for the torch-reference tests: ${KILN_PYTHON:-none (those tests skip)}"

stage "script tests (the corpus extractor; every path the docs name exists) and the torch runner's (torch-free, and with KILN_PYTHON one with torch)"
python3 -m unittest discover -s scripts/tests -t scripts/tests
python3 -m unittest discover -s daemon/torch-runner/tests -t daemon/torch-runner/tests
python3 -m unittest discover -s sandbox/hosted/tests -t sandbox/hosted/tests

stage "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

# The test binaries are built once (cargo test --no-run: the same features a plain
# `cargo test` uses; a separate `cargo build` would build most crates a second time with
# other features), kilnd and kiln-worker with them.
stage "cargo test --no-run (build every test binary, and the binaries the tests start)"
cargo test --workspace --locked --no-run
# The static checks of the problem suite, with the kiln just built (kiln-cli's integration
# tests make cargo build it): no daemon, compiler or GPU.
stage "problem suite (kiln problems check: problem.toml, launch plans, knob grammar, source rules)"
target/debug/kiln problems check problems
stage "cargo test (triton: ${KILN_TRITON_PYTHON:-none, its tests skip}; test binaries run ${KILN_TEST_JOBS:-2} at a time)"
# scripts/run-tests.py runs the binaries just built several at a time (each as cargo
# would, one process per binary), every one even when another fails, and prints each
# binary's time.
python3 scripts/run-tests.py -- --workspace --locked

# The NVRTC-backed tests (kernels by C++ name, the toolkit headers inside the compile jail,
# macro and template bombs) need libnvrtc, which the workspace run above lacks (its tests
# of a machine without NVRTC run there instead). torch's CUDA 13 wheels ship it
# (nvidia/cu13/lib, headers in nvidia/cu13/include; .ci/run adds the nvidia-cuda-crt wheel
# mma.h needs): with KILN_PYTHON's, the same binaries run once more against it, as an
# operator would point kilnd at it (LD_LIBRARY_PATH; the headers are found beside it).
# The variables reach the test processes only: cudarc's build script watches CUDA_HOME,
# so passing it to cargo would rebuild every crate above cudarc.
nvrtc_root=""
if [ -n "${KILN_PYTHON:-}" ]; then
  nvrtc_root=$("$KILN_PYTHON" -c 'import nvidia, os
print(next((os.path.join(p, "cu13") for p in nvidia.__path__
            if os.path.isfile(os.path.join(p, "cu13", "lib", "libnvrtc.so.13"))), ""))' 2>/dev/null || true)
fi
if [ -n "$nvrtc_root" ]; then
  stage "NVRTC tests (NVRTC and headers from $nvrtc_root)"
  python3 scripts/run-tests.py --no-doc \
    --env "LD_LIBRARY_PATH=$nvrtc_root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" --env "CUDA_HOME=$nvrtc_root" \
    --only kiln-gpu:lib --only kiln-gpu:cxx --only kiln-sandbox:cuda_compile --only kiln-sandbox:pch -- --workspace --locked
else
  echo "== NVRTC tests: skipped (no libnvrtc.so.13 in KILN_PYTHON's nvidia wheels)"
fi

if [ -d sdk/python/tests ]; then
  stage "python client tests"
  KILND_BIN="$PWD/target/debug/kilnd" python3 -m unittest discover -s sdk/python/tests -t sdk/python -v
fi
