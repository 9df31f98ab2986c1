#!/bin/sh
# bench/run.sh - builds the benchmarks into build/bench/ and runs them.
#
#   sh bench/run.sh [--smoke] [--store sqlite|postgres|both] [batonbench options] [NAME...]
#
# `make bench` runs it after `make all`; `make bench-smoke` adds --smoke (tiny sizes, a
# few seconds, targets not enforced). BATOND overrides the server under test (default
# server/batond), CC the compiler. The flags are the Makefile's.
#
# --store (default both): with postgres, a throwaway PostgreSQL 15 is started first with
# bench/pg.sh in a directory of its own under $TMPDIR (or /tmp), its URL handed to
# batonbench with --pg, and that server (and only it) is stopped at the end, also when
# a benchmark fails or the run is interrupted. PGBIN overrides where PostgreSQL is;
# --pg URL uses a server of yours instead (on this machine: its processes are read in
# /proc), on which batonbench creates and drops databases baton_bench_PID_N.
#
# lockpath (selected by name, or by selecting nothing) sets etcd beside batond: Debian's
# etcd-server is installed first through scripts/install-deps.sh (BATON_EXTRA_PKGS),
# which does nothing when it is there. When it cannot be installed, the etcd rows say so
# and everything else runs. batonbench starts that etcd itself and stops it by its pid.
set -eu
cd "$(dirname "$0")/.."

CC=${CC:-cc}
OUT=build/bench
PKGS="libmicrohttpd jansson sqlite3 libcurl libpq"
CFLAGS="-std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wformat=2 -Wshadow -Wstrict-prototypes
	-Wno-unused-parameter -O2 -g $(pkg-config --cflags $PKGS)"
LIBS="$(pkg-config --libs $PKGS) -lpthread -lm"
BATOND=${BATOND:-server/batond}

# --store is this script's; the rest goes to batonbench (--pg URL: a server of yours).
store=both
keep=
pg_given=
skip=
etcd=
named=
value=
n=$#
for a in "$@"; do
	if [ -n "$skip" ]; then
		store=$a
		skip=
		continue
	fi
	if [ -n "$value" ]; then # the value of one of batonbench's options, not a name
		value=
		set -- "$@" "$a"
		continue
	fi
	case $a in
	--store) skip=1 ;;
	--keep) keep=1 ;;
	--pg) pg_given=1 value=1 ;;
	--batond | --minjson | --dir | --threads | --http-threads) value=1 ;;
	lockpath) etcd=1 named=1 ;;
	-*) ;;
	*) named=1 ;;
	esac
	[ "$a" = --store ] || set -- "$@" "$a"
done
shift "$n"
case $store in
sqlite | postgres | both) ;;
*)
	echo "bench/run.sh: --store sqlite|postgres|both" >&2
	exit 2
	;;
esac

# Every benchmark runs when none is named, lockpath among them.
[ -n "$named" ] || etcd=1
if [ -n "$etcd" ] && ! BATON_EXTRA_PKGS=etcd-server sh scripts/install-deps.sh; then
	echo "bench/run.sh: etcd-server could not be installed; the etcd rows will say so" >&2
fi

mkdir -p "$OUT"
# shellcheck disable=SC2086
$CC $CFLAGS -o "$OUT/batonbench" bench/main.c bench/common.c bench/load.c bench/floor.c \
	bench/pg.c bench/steps.c bench/http.c bench/memory.c bench/recovery.c bench/calls.c \
	bench/leases.c bench/permits.c bench/cluster.c bench/failover.c bench/lockpath.c bench/etcd.c common/rfc3339.c common/batond.c common/curl_body.c \
	common/curl_req.c common/proc_cpu.c $LIBS
# shellcheck disable=SC2086
$CC $CFLAGS -o "$OUT/minjson" bench/minjson.c $LIBS

if [ ! -x "$BATOND" ]; then
	echo "bench/run.sh: $BATOND is missing; run make first" >&2
	exit 2
fi

pgdir=
bench=
cleanup() {
	if [ -n "$bench" ]; then
		kill "$bench" 2>/dev/null || true
		wait "$bench" 2>/dev/null || true
	fi
	if [ -n "$pgdir" ]; then
		sh bench/pg.sh stop "$pgdir"
		if [ -n "$keep" ]; then echo "bench: kept $pgdir" >&2; else rm -rf "$pgdir"; fi
	fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

set -- --store "$store" "$@"
if [ "$store" != sqlite ] && [ -z "$pg_given" ]; then
	pgdir=$(mktemp -d "${TMPDIR:-/tmp}/baton-bench-pg.XXXXXX")
	chmod 755 "$pgdir" # the server's user (postgres when we are root) must reach it
	if [ "$(id -u)" = 0 ] && ! runuser -u postgres -- test -x "$pgdir"; then
		rm -rf "$pgdir" # a TMPDIR under a private directory (/root/tmp): /tmp then
		pgdir=$(mktemp -d /tmp/baton-bench-pg.XXXXXX)
		chmod 755 "$pgdir"
	fi
	if ! url=$(sh bench/pg.sh start "$pgdir" $$); then
		echo "bench/run.sh: could not start PostgreSQL (PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin})" >&2
		exit 2
	fi
	set -- --pg "$url" "$@"
fi

# In the background, so that a signal to this script is acted on at once (cleanup).
status=0
"$OUT/batonbench" --batond "$BATOND" --minjson "$OUT/minjson" "$@" &
bench=$!
wait "$bench" || status=$?
bench=
exit "$status"
