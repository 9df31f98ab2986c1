#!/bin/sh
# bench/run.sh - builds the benchmarks into build/bench/ and runs them.
#
#   sh bench/run.sh [--smoke] [batonbench options] [NAME...]
#
# `make bench` runs it after `make all`; `make bench-smoke` adds --smoke (tiny sizes, a
# few seconds, targets not enforced). BATOND overrides the server under test (default
# server/batond), CC the compiler. The flags are the Makefile's.
set -eu
cd "$(dirname "$0")/.."

CC=${CC:-cc}
OUT=build/bench
PKGS="libmicrohttpd jansson sqlite3 libcurl"
CFLAGS="-std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wformat=2 -Wshadow -Wstrict-prototypes
	-Wno-unused-parameter -O2 -g $(pkg-config --cflags $PKGS)"
LIBS="$(pkg-config --libs $PKGS) -lpthread -lm"
BATOND=${BATOND:-server/batond}

mkdir -p "$OUT"
# shellcheck disable=SC2086
$CC $CFLAGS -o "$OUT/batonbench" bench/main.c bench/common.c bench/load.c bench/floor.c \
	bench/steps.c bench/http.c bench/memory.c bench/recovery.c bench/calls.c $LIBS
# shellcheck disable=SC2086
$CC $CFLAGS -o "$OUT/minjson" bench/minjson.c $LIBS

if [ ! -x "$BATOND" ]; then
	echo "bench/run.sh: $BATOND is missing; run make first" >&2
	exit 2
fi
exec "$OUT/batonbench" --batond "$BATOND" --minjson "$OUT/minjson" "$@"
