#!/usr/bin/env bash
# Validates the Kubernetes manifests in deploy/kubernetes/ against the API schemas of the
# Kubernetes versions we claim (strict: an unknown or misspelt field is an error), with
# kubernetes-validate (PyPI; it ships the schemas, so no cluster and no network is
# needed). Skips with a message when the validator is not installed, unless
# KILN_REQUIRE_K8S_VALIDATE=1 (CI sets it; .ci/run installs the validator).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
validator=${KILN_K8S_VALIDATE:-kubernetes-validate}
if ! command -v "$validator" >/dev/null 2>&1; then
    if [ "${KILN_REQUIRE_K8S_VALIDATE:-0}" = 1 ]; then
        echo "check-kubernetes: FAIL: $validator is not installed (pip install kubernetes-validate)"
        exit 1
    fi
    echo "check-kubernetes: $validator not found; skipping (pip install kubernetes-validate)"
    exit 0
fi
# The oldest version the DaemonSet's fields need (hostUsers, procMount, appArmorProfile:
# 1.30) and the validator's newest.
failed=0
for version in 1.30.0 1.37.0; do
    for f in "$top"/deploy/kubernetes/*.yaml; do
        if ! "$validator" --strict --quiet -k "$version" "$f"; then
            echo "check-kubernetes: FAIL: $(basename "$f") against Kubernetes $version"
            failed=1
        fi
    done
done
[ "$failed" = 0 ] && echo "check-kubernetes: $(ls "$top"/deploy/kubernetes/*.yaml | wc -l) manifests valid against Kubernetes 1.30 and 1.37"
exit "$failed"
