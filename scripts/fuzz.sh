#!/bin/sh
# Runs each libFuzzer target for SECONDS on a scratch copy of its corpus. Seeds and
# regression cases live in tests/fuzz/corpus/NAME; a crash leaves its input in
# build/fuzz/NAME-crashes/ (add it to the corpus once fixed). Closes with
# "N passed, N failed".
set -u
secs=$1
shift
passed=0
failed=0
for t in "$@"; do
	work=build/fuzz/$t-corpus
	crashes=build/fuzz/$t-crashes
	rm -rf "$work" && mkdir -p "$work" "$crashes"
	cp tests/fuzz/corpus/"$t"/* "$work"/
	echo "== fuzz_$t for ${secs}s"
	if build/fuzz/fuzz_"$t" -max_total_time="$secs" -max_len=65536 -timeout=10 \
		-artifact_prefix="$crashes"/ -print_final_stats=1 "$work" >build/fuzz/"$t".log 2>&1; then
		tail -n 12 build/fuzz/"$t".log | grep -E 'stat::number_of_executed_units|Done' || true
		passed=$((passed + 1))
	else
		tail -n 40 build/fuzz/"$t".log
		failed=$((failed + 1))
	fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
