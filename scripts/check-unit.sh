#!/usr/bin/env bash
# Checks the systemd packaging in daemon/packaging/:
#   1. kilnd.service's exposure score from `systemd-analyze security` stays at or
#      below 3.0 (override with KILN_UNIT_MAX_EXPOSURE, e.g. 2.5), alone and with the
#      cluster drop-in (kilnd-cluster.conf) applied;
#   2. kilnd.service, kilnd.socket and the example drop-ins (with every option
#      uncommented) parse without a single warning: systemd ignores a misspelt
#      directive with only a warning, which would silently drop a protection;
#   3. kiln.sysusers parses (when systemd-sysusers is installed).
# Exits 0 with a message when systemd-analyze is missing or too old (< 250, no
# --offline), so it can run anywhere. Needs neither root nor a running systemd.
set -u

top=$(cd "$(dirname "$0")/.." && pwd)
pkg=$top/daemon/packaging
unit=$pkg/kilnd.service
max=${KILN_UNIT_MAX_EXPOSURE:-3.0}

if ! command -v systemd-analyze >/dev/null 2>&1; then
    echo "check-unit: systemd-analyze not found; skipping (install systemd to run this check)"
    exit 0
fi
version=$(systemd-analyze --version | awk 'NR == 1 { print $2 }')
case $version in
    '' | *[!0-9]*) version=0 ;;
esac
if [ "$version" -lt 250 ]; then
    echo "check-unit: systemd $version has no 'security --offline'/--threshold (needs 250+); skipping"
    exit 0
fi

# --threshold counts in tenths: exposure 2.1 is 21, and the command fails only
# when the exposure is strictly above the threshold (2.1 passes 21, fails 20).
threshold=$(awk -v m="$max" 'BEGIN { printf "%d", m * 10 + 0.5 }')

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0

# --- 1. exposure score -------------------------------------------------------
systemd-analyze security --offline=yes --threshold="$threshold" --no-pager "$unit" \
    >"$work/security.out" 2>"$work/security.err"
rc=$?
score_line=$(grep 'Overall exposure level' "$work/security.out")
if [ -z "$score_line" ]; then
    echo "check-unit: FAIL: systemd-analyze security produced no score (exit $rc):"
    cat "$work/security.err" "$work/security.out"
    exit 1
fi
echo "check-unit: systemd $version: ${score_line#*→ }"
if [ "$rc" -ne 0 ]; then
    echo "check-unit: FAIL: exposure is above $max. Exposed items:"
    grep '✗' "$work/security.out"
    failed=1
fi
if [ -s "$work/security.err" ]; then
    echo "check-unit: FAIL: systemd warned while reading kilnd.service:"
    cat "$work/security.err"
    failed=1
fi

# --- 1b. exposure with the cluster drop-in -------------------------------------
# A cluster node runs the unit plus kilnd-cluster.conf (TCP to the database only):
# score the two together, the drop-in's settings appended as systemd would merge them.
{
    cat "$unit"
    sed -nE 's/^#?(\[[A-Za-z]+\]|[A-Z][A-Za-z]*=.*)$/\1/p' "$pkg/kilnd-cluster.conf" \
        | grep -v '^\[Unit\]$\|^Wants=\|^After=\|^EnvironmentFile='
} >"$work/kilnd-cluster-node.service"
systemd-analyze security --offline=yes --threshold="$threshold" --no-pager \
    "$work/kilnd-cluster-node.service" >"$work/cluster.out" 2>"$work/cluster.err"
rc=$?
cluster_line=$(grep 'Overall exposure level' "$work/cluster.out")
echo "check-unit: with kilnd-cluster.conf: ${cluster_line#*→ }"
if [ -z "$cluster_line" ] || [ "$rc" -ne 0 ]; then
    echo "check-unit: FAIL: a cluster node's unit scores above $max (exit $rc):"
    grep '✗' "$work/cluster.out"
    cat "$work/cluster.err"
    failed=1
fi

# --- 2. parse check of the units and example drop-ins ------------------------
# A copy whose ExecStart is /bin/true: verify would otherwise stop at the
# uninstalled /usr/bin/kilnd, which is the one complaint this check ignores.
sed 's#^ExecStart=[^ ]*#ExecStart=/bin/true#' "$unit" >"$work/kilnd.service"
cp "$pkg/kilnd.socket" "$work/kilnd.socket"
mkdir "$work/kilnd.service.d"
for dropin in "$pkg"/kilnd-*.conf; do
    # Uncomment "#Key=value" and "#[Section]" lines; prose comments stay out.
    sed -nE 's/^#?(\[[A-Za-z]+\]|[A-Z][A-Za-z]*=.*)$/\1/p' "$dropin" \
        >"$work/kilnd.service.d/$(basename "$dropin")"
done
systemd-analyze verify --no-pager "$work/kilnd.service" "$work/kilnd.socket" \
    >"$work/verify.out" 2>&1
rc=$?
if [ "$rc" -ne 0 ] || [ -s "$work/verify.out" ]; then
    echo "check-unit: FAIL: systemd-analyze verify (exit $rc) complained:"
    sed "s#$work/#daemon/packaging/(copy) #" "$work/verify.out"
    failed=1
else
    echo "check-unit: kilnd.service, kilnd.socket and $(ls "$pkg"/kilnd-*.conf | wc -l) example drop-ins parse cleanly"
fi

# --- 3. sysusers ---------------------------------------------------------------
if command -v systemd-sysusers >/dev/null 2>&1; then
    mkdir "$work/root"
    if systemd-sysusers --root="$work/root" --dry-run "$pkg/kiln.sysusers" \
        >"$work/sysusers.out" 2>&1 && ! grep -qiE 'warn|fail|ignor|invalid' "$work/sysusers.out"; then
        echo "check-unit: kiln.sysusers parses cleanly"
    else
        echo "check-unit: FAIL: systemd-sysusers rejected kiln.sysusers:"
        cat "$work/sysusers.out"
        failed=1
    fi
fi

exit "$failed"
