#!/bin/sh
# bench/instructions.sh - instructions per step, counted by valgrind's callgrind.
#
#   sh bench/instructions.sh [--accept] [BATOND]     (default server/batond)
#   KEEP=DIR sh bench/instructions.sh                also copies callgrind's outputs to DIR
#
# Wall time on this shared machine moves with the neighbours; instruction counts do not.
# This runs BATOND under callgrind (one output per thread) on a fresh database, posts 20
# workflows of 100 zero-work steps on 20 resources (the group-commit shape, smaller),
# waits until all have completed, stops batond with SIGTERM and prints, per thread kind,
# the instructions executed per step. HTTP threads serve the polling too, so their figure
# is given but is not a cost of the steps. With --accept: 2,048 one-step zero-work
# workflows posted over 32 keep-alive connections on 32 resources (the HTTP-accept shape),
# per workflow. Needs valgrind and curl; talks to 127.0.0.1.
set -eu
cd "$(dirname "$0")/.."
ACCEPT=0
if [ "${1:-}" = --accept ]; then
	ACCEPT=1
	shift
fi
BATOND=${1:-server/batond}
if [ $ACCEPT = 1 ]; then
	NWF=2048 STEPS=1 CONNS=32
else
	NWF=20 STEPS=100
fi
DIR=$(mktemp -d "${TMPDIR:-/tmp}/baton-instr.XXXXXX")
VG=
trap '[ -z "$VG" ] || kill $VG 2>/dev/null || true; rm -rf "$DIR"' EXIT

valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$DIR/cg.out" \
	"$BATOND" --listen 127.0.0.1:0 --db "$DIR/baton.db" 2>"$DIR/batond.log" &
VG=$!
i=0
until URL=$(sed -n 's|.*listening on \(http://127.0.0.1:[0-9]*\).*|\1|p' "$DIR/batond.log") &&
	[ -n "$URL" ] && curl -sf "$URL/readyz" >/dev/null 2>&1; do
	i=$((i + 1))
	[ $i -lt 600 ] || { echo "instructions.sh: batond did not start" >&2; exit 2; }
	sleep 0.1
done

workers=$(awk -v n=$STEPS 'BEGIN { printf "["; for (i = 0; i < n; i++)
	printf "%s{\"name\":\"w%d\",\"work_ms\":0}", i ? "," : "", i; printf "]" }')
pids=
if [ $ACCEPT = 1 ]; then
	# each curl posts NWF/CONNS workflows in turn on one keep-alive connection
	per=$((NWF / CONNS))
	urls=$(awk -v n=$per -v u="$URL/workflows" 'BEGIN { for (i = 0; i < n; i++) print u }')
	for k in $(seq 1 "$CONNS"); do
		# shellcheck disable=SC2086
		curl -sf -X POST -H 'Content-Type: application/json' \
			-d "{\"resource\":\"r$k\",\"workers\":$workers}" $urls >/dev/null &
		pids="$pids $!"
	done
else
	for k in $(seq 1 $NWF); do
		curl -sf -o /dev/null -X POST -H 'Content-Type: application/json' \
			-d "{\"id\":\"i$k\",\"resource\":\"r$k\",\"workers\":$workers}" \
			"$URL/workflows" &
		pids="$pids $!"
	done
fi
for p in $pids; do wait "$p"; done

i=0
while :; do
	done_n=$(curl -sf "$URL/metrics" | awk '/^baton_workflows\{status="completed"\}/ { print $2 }')
	[ "${done_n:-0}" -lt $NWF ] || break
	i=$((i + 1))
	[ $i -lt 600 ] || { echo "instructions.sh: only $done_n of $NWF completed" >&2; exit 2; }
	sleep 1
done
kill -TERM $VG
wait $VG || true

total=$((NWF * STEPS))
unit=step
[ $ACCEPT = 0 ] || unit=workflow
if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$DIR"/cg.out* "$KEEP"/; fi
echo "instructions per $unit ($NWF workflows x $STEPS zero-work steps, $BATOND):"
for f in "$DIR"/cg.out*; do
	ir=$(awk '/^summary:/ { print $2 }' "$f")
	[ -n "$ir" ] || continue
	if grep -q 'engine_main' "$f"; then kind=engine
	elif grep -q 'checkpoint_main' "$f"; then kind=checkpoint
	elif grep -q 'run_step_job' "$f"; then kind=step
	elif grep -q 'MHD_' "$f" || grep -q 'libmicrohttpd' "$f"; then kind=http
	else kind=other; fi
	echo "$kind $ir"
done | awk -v n=$total '{ s[$1] += $2; all += $2 } END {
	for (k in s) printf "  %-10s %10.0f\n", k, s[k] / n
	printf "  %-10s %10.0f\n", "all", all / n }' | sort
