#!/bin/sh
# Runs one test binary against a PostgreSQL server of its own: started in a new directory
# under /tmp (scripts/pg.sh), named to the binary in BATON_TEST_PG, BATON_TEST_PG_DIR and
# BATON_PG_SCRIPT, and stopped when the binary ends, also when it fails or the run is
# interrupted. test-stores.sh runs the suites that stop or restart their server this way,
# two at a time, so that none of them restarts a server another one uses.
#
#   with-pg.sh BINARY
set -u
here=$(cd "$(dirname "$0")" && pwd)
[ $# -eq 1 ] || {
	echo "usage: with-pg.sh BINARY" >&2
	exit 2
}
pgdir=$(mktemp -d /tmp/baton-pg-XXXXXX)
stop_pg() {
	sh "$here/pg.sh" stop "$pgdir" >/dev/null ||
		echo "with-pg: could not stop the PostgreSQL server of $pgdir" >&2
	rm -rf "$pgdir"
}
trap stop_pg EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
if ! url=$(sh "$here/pg.sh" start "$pgdir"); then
	echo "with-pg: PostgreSQL did not start in $pgdir"
	exit 1
fi
echo "with-pg: PostgreSQL $url in $pgdir"
BATON_TEST_PG="$url" BATON_TEST_PG_DIR="$pgdir" BATON_PG_SCRIPT="$here/pg.sh" "$1"
