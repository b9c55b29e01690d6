#!/usr/bin/env bash
# The whole test suite: formatting, lints, every Rust test, the Python client's tests.
# Run from anywhere; CI runs exactly this (see .ci/run). The tests of Triton candidates'
# compile path run when KILN_TRITON_PYTHON names a python with triton (.ci/run installs
# one); without it they say they skip.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== systemd unit (hardening score must stay at 3.0 or better, also for a cluster node)"
scripts/check-unit.sh

echo "== kubernetes manifests (deploy/kubernetes, schema-validated)"
scripts/check-kubernetes.sh

echo "== problem suite (problem.toml, launch plans, knob grammar)"
python3 scripts/check-problems.py

echo "== torch baseline helper (no torch needed)"
python3 -m unittest discover -s scripts/tests -t scripts/tests

echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== cargo test (triton: ${KILN_TRITON_PYTHON:-none, its tests skip})"
cargo build --workspace --locked
cargo test --workspace --locked

if [ -d sdk/python/tests ]; then
  echo "== python client tests"
  KILND_BIN="$PWD/target/debug/kilnd" python3 -m unittest discover -s sdk/python/tests -t sdk/python -v
fi
