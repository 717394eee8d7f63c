#!/usr/bin/env bash
# make test-stress: run the test suites RUNS times with HOGS busy-loop
# processes beside them, then print how often each test failed.
#
# A deadline in a test is a bound on "this never happens"; this is how we
# check that the bounds hold on a 2-core machine that is also doing other
# work. The hogs are `yes` processes this script starts and stops by PID,
# bounded by `timeout` so they end even if the script is killed; --foreground
# keeps them in the script's process group, so a kill of the group (Ctrl-C)
# reaches them at once.
#
#   RUNS=10 HOGS=2 test/stress.sh [make target, default: test]
set -uo pipefail
cd "$(dirname "$0")/.."

runs=${RUNS:-5}
hogs=${HOGS:-2}
target=${1:-test}
logdir=${STRESS_LOGS:-$(mktemp -d /tmp/overlay-stress.XXXXXX)}
mkdir -p "$logdir"
case "$runs$hogs" in *[!0-9]*) echo "RUNS and HOGS must be whole numbers" >&2; exit 2 ;; esac

pids=()
stop_hogs() {
	for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
	for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
	pids=()
}
trap stop_hogs EXIT
trap 'exit 130' INT TERM

for _ in $(seq "$hogs"); do
	timeout --foreground 6h yes >/dev/null &
	pids+=($!)
done
echo "stress: $runs run(s) of make $target with $hogs CPU hog(s) (PIDs ${pids[*]:-none}); logs in $logdir"

passed=0 failed=0
for i in $(seq "$runs"); do
	log="$logdir/run-$i.log"
	start=$(date +%s)
	if make "$target" >"$log" 2>&1; then
		passed=$((passed + 1)); verdict=PASS
	else
		failed=$((failed + 1)); verdict=FAIL
	fi
	echo "run $i: $verdict in $(( $(date +%s) - start )) s ($log)"
	# The failing tests and packages, for the summary below.
	grep -oE -- '--- FAIL: [^ ]+|^FAIL[[:space:]]+[^ ]+' "$log" | sed -E 's/^--- FAIL: //; s/^FAIL[[:space:]]+/package /' | sort -u >"$log.failures"
done
stop_hogs

echo
echo "failures per test over $runs run(s):"
if cat "$logdir"/run-*.log.failures 2>/dev/null | grep -q .; then
	cat "$logdir"/run-*.log.failures | sort | uniq -c | sort -rn | sed 's/^/  /'
else
	echo "  none"
fi
echo "stress: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
