#!/bin/sh
# Runs each test binary given on the command line (cmocka suites), prints their
# output, and closes with one line: "N passed, N failed, N skipped".
# A binary that crashes or exits non-zero without a cmocka summary counts as one failure.
#
# JOBS=N runs up to N binaries at once (default 1: one at a time, printed as it goes).
# With more, each binary writes to its own log and the logs are printed whole, in the
# order given, so the output reads as a serial run. The suites are independent (each
# starts its own batond on its own port and database), but the PostgreSQL ones share one
# server that some of them restart: test-stores.sh runs those one at a time.
set -u
jobs=${JOBS:-1}
[ $# -gt 1 ] || jobs=1
passed=0
failed=0
skipped=0
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# Runs binary number $1 ($2): its output to $dir/$1.log, "status seconds" to $dir/$1.rc.
run() {
	t0=$(date +%s)
	"$2" >"$dir/$1.log" 2>&1
	echo "$? $(($(date +%s) - t0))" >"$dir/$1.rc"
}

# Adds up the counts of binary number $1 ($2), whose output was printed.
count() {
	log=$dir/$1.log
	read -r rc secs <"$dir/$1.rc"
	echo "== $2: $secs s"
	p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -n 1)
	f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -n 1)
	s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | tail -n 1)
	# Scripts close with the plain line "N passed, N failed" (", N skipped" may follow).
	if [ -z "$p$f" ]; then
		line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
		p=$(echo "$line" | sed -n 's/^\([0-9]*\) passed.*/\1/p')
		f=$(echo "$line" | sed -n 's/^[0-9]* passed, \([0-9]*\) failed.*/\1/p')
		s=$(echo "$line" | sed -n 's/.*, \([0-9]*\) skipped.*/\1/p')
	fi
	passed=$((passed + ${p:-0}))
	failed=$((failed + ${f:-0}))
	skipped=$((skipped + ${s:-0}))
	if [ "$rc" -ne 0 ] && [ "${f:-0}" -eq 0 ]; then
		echo "$2: exited with status $rc"
		failed=$((failed + 1))
	fi
}

# Prints the logs of the binaries that ended, in the order given, up to the first one
# still running, and counts them.
collect() {
	while [ "$next" -le "$i" ] && [ -f "$dir/$next.rc" ]; do
		eval "wait \$pid_$next; tn=\$name_$next"
		echo "== $tn"
		cat "$dir/$next.log"
		count "$next" "$tn"
		next=$((next + 1))
	done
}

i=0
next=1
for t in "$@"; do
	i=$((i + 1))
	if [ "$jobs" -le 1 ]; then
		echo "== $t"
		# As it goes (a torture run takes minutes).
		: >"$dir/$i.log"
		run "$i" "$t" &
		tail -s 0.2 -n +1 -f --pid=$! "$dir/$i.log"
		wait $!
		count "$i" "$t"
		continue
	fi
	# A free slot: fewer than $jobs started binaries without a status file.
	while [ "$(($(ls "$dir" | grep -c '\.pid$') - $(ls "$dir" | grep -c '\.rc$')))" -ge "$jobs" ]; do
		sleep 0.2
	done
	run "$i" "$t" &
	eval "pid_$i=\$! name_$i=\$t"
	: >"$dir/$i.pid"
	collect
done
while [ "$jobs" -gt 1 ] && [ "$next" -le "$i" ]; do
	sleep 0.2
	collect
done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
