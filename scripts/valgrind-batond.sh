#!/bin/sh
# batond under valgrind, for the HTTP tests (BATOND=scripts/valgrind-batond.sh): any
# memory error or definite leak makes batond exit 99, which the harness reports when it
# stops the server. The real binary is $VALGRIND_BATOND (default: server/batond here).
here=$(cd "$(dirname "$0")/.." && pwd)
exec valgrind --quiet --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
	--show-leak-kinds=definite --trace-children=no \
	"${VALGRIND_BATOND:-$here/server/batond}" "$@"
