#!/bin/sh
# Runs the test binaries against each store and closes with one line over all of them:
# "N passed, N failed, N skipped".
#
#   test-stores.sh [ONCE ...] -- EACH ...
#
# ONCE runs once, on SQLite (the unit tests, the OpenAPI check); EACH runs on every store
# that STORE names: sqlite, postgres, or both (the default). For PostgreSQL a throwaway
# server is started in a new directory (scripts/pg.sh) and the binaries get its URL in
# BATON_TEST_PG and its directory in BATON_TEST_PG_DIR (tests/harness/harness.h); it is
# stopped at the end, also when a test fails or the run is interrupted. With STORE=postgres
# only EACH runs. The suites that stop or restart their PostgreSQL server get one of their
# own each (with-pg.sh) and run after the others, two at a time. Each run goes through scripts/run-tests.sh, whose own closing lines
# are summed here.
set -u
here=$(cd "$(dirname "$0")" && pwd)
store=${STORE:-both}
case $store in
sqlite | postgres | both) ;;
*)
	echo "test-stores: STORE is sqlite, postgres or both, not \"$store\"" >&2
	exit 2
	;;
esac
once=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
	once="$once $1"
	shift
done
[ $# -gt 0 ] && shift

# Test binaries run JOBS at a time (scripts/run-tests.sh; default 2): most of a suite's
# time is waiting for batond, and this machine has two cores (CI runs 4: make test left
# the cores 62% idle at 2). The suites that restart their PostgreSQL server run two at a
# time whatever JOBS says: each runs a cluster of its own.
export JOBS="${JOBS:-2}"
passed=0
failed=0
skipped=0
log=$(mktemp)
pgdir=""
wrapdir=""

stop_pg() {
	[ -n "$pgdir" ] || return 0
	sh "$here/pg.sh" stop "$pgdir" >/dev/null ||
		echo "test-stores: could not stop the PostgreSQL server of $pgdir" >&2
	rm -rf "$pgdir"
	pgdir=""
}
trap 'stop_pg; rm -f "$log" "$log.rc"; [ -z "$wrapdir" ] || rm -rf "$wrapdir"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# Runs run-tests.sh on the binaries given, as it goes, and adds up its closing line.
stage() {
	name=$1
	shift
	[ $# -gt 0 ] || return 0
	echo "=== $name"
	{
		sh "$here/run-tests.sh" "$@"
		echo $? >"$log.rc"
	} | tee "$log"
	line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
	p=$(echo "$line" | sed -n 's/^\([0-9]*\) passed.*/\1/p')
	f=$(echo "$line" | sed -n 's/^[0-9]* passed, \([0-9]*\) failed.*/\1/p')
	s=$(echo "$line" | sed -n 's/.*, \([0-9]*\) skipped.*/\1/p')
	if [ "$(cat "$log.rc")" -ne 0 ] && [ "${f:-0}" -eq 0 ]; then
		f=1
	fi
	passed=$((passed + ${p:-0}))
	failed=$((failed + ${f:-0}))
	skipped=$((skipped + ${s:-0}))
	echo "=== $name: ${p:-0} passed, ${f:-0} failed, ${s:-0} skipped"
}

# EACH in reverse order: the suites sort by name, and the longest (test_workflows) would
# otherwise start last and run alone at the end; the suites that start PostgreSQL servers
# of their own and fail them over (test_failover, minutes long) go first for the same reason.
each=""
first=""
for t in "$@"; do
	case ${t##*/} in
	test_failover) first="$first $t" ;;
	*) each="$t $each" ;;
	esac
done
each="$first $each"
# shellcheck disable=SC2086 # paths without blanks
set -- $each

if [ "$store" != postgres ]; then
	export BATON_TEST_PG="" BATON_TEST_PG_DIR=""
	# shellcheck disable=SC2086 # the ONCE list is paths without blanks
	stage "sqlite" $once "$@"
fi
if [ "$store" != sqlite ] && [ $# -gt 0 ]; then
	# Under /tmp, not $TMPDIR: the server's user (postgres, when we are root) must reach it.
	pgdir=$(mktemp -d /tmp/baton-pg-XXXXXX)
	if url=$(sh "$here/pg.sh" start "$pgdir"); then
		echo "=== PostgreSQL $url in $pgdir"
		export BATON_TEST_PG="$url" BATON_TEST_PG_DIR="$pgdir" BATON_PG_SCRIPT="$here/pg.sh"
		# The suites that stop or restart the server run after the others, each on a
		# server of its own (with-pg.sh), two at a time: a wrapper named after each.
		shared=""
		alone=""
		wrapdir=$(mktemp -d)
		for t in "$@"; do
			case ${t##*/} in
			test_faults | test_postgres | test_cluster | test_lockfaults | torture)
				w="$wrapdir/${t##*/}"
				printf '#!/bin/sh\nexec sh "%s/with-pg.sh" "%s"\n' "$here" \
					"$(cd "$(dirname "$t")" && pwd)/${t##*/}" >"$w"
				chmod +x "$w"
				alone="$alone $w"
				;;
			*) shared="$shared $t" ;;
			esac
		done
		# shellcheck disable=SC2086 # paths without blanks
		stage "postgres" $shared
		stop_pg
		jobs=$JOBS
		[ "$JOBS" -le 2 ] || JOBS=2
		# shellcheck disable=SC2086
		stage "postgres, restarting the server" $alone
		JOBS=$jobs
		rm -rf "$wrapdir"
	else
		echo "test-stores: PostgreSQL did not start in $pgdir"
		failed=$((failed + 1))
	fi
	stop_pg
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
