#!/bin/sh
# Runs each test binary given on the command line (cmocka suites), prints their
# output, and closes with one line: "N passed, N failed, N skipped".
# A binary that crashes or exits non-zero without a cmocka summary counts as one failure.
set -u
passed=0
failed=0
skipped=0
log=$(mktemp)
trap 'rm -f "$log" "$log.rc"' EXIT
for t in "$@"; do
	echo "== $t"
	# As it goes (a torture run takes minutes), and kept for the counts.
	{
		"$t" 2>&1
		echo $? >"$log.rc"
	} | tee "$log"
	rc=$(cat "$log.rc")
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
		echo "$t: exited with status $rc"
		failed=$((failed + 1))
	fi
done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
