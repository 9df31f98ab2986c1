#!/bin/sh
# Runs the distributed-mutex demo: `make demo` / `make demo-crash`.
#
#   sh scripts/demo.sh BATOND CLIENT [--crash]
#
# If a batond already answers GET URL/healthz, URL one of $BATON_SERVER's (or of its
# older name $BATON_URL; default http://127.0.0.1:8080), the demo runs against them. Otherwise this script starts BATOND on a free loopback port
# with a database in a fresh temporary directory, waits for its "listening on
# http://HOST:PORT" log line, runs `CLIENT --server URL demo [--crash]`, then stops the
# server (SIGTERM) and removes the directory. Exits with the client's status.
set -u

usage() {
	echo "usage: sh scripts/demo.sh BATOND CLIENT [--crash]" >&2
	exit 2
}
[ $# -ge 2 ] || usage
batond=$1
client=$2
shift 2
case "${1:-}" in "" | --crash) ;; *) usage ;; esac

START_TIMEOUT=60 # seconds for batond to bind its port
STOP_TIMEOUT=20  # seconds for batond to exit after SIGTERM

# BATON_SERVER, as the client reads it (BATON_URL is its older name): one URL, or a list.
named=${BATON_SERVER:-${BATON_URL:-}}
url=${named:-http://127.0.0.1:8080}
for one in $(echo "$url" | tr ',' ' '); do
	if curl -fsS --max-time 2 -o /dev/null "${one%/}/healthz" 2>/dev/null; then
		exec "$client" --server "$url" demo "$@"
	fi
done
if [ -n "$named" ]; then
	echo "demo: no batond answers at $url; running against one of its own" >&2
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/baton-demo.XXXXXX") || exit 1
log=$tmp/batond.log
pid=

# Stops batond (SIGTERM, then SIGKILL if it outlives STOP_TIMEOUT) and removes $tmp.
# shellcheck disable=SC2317 # called through the EXIT trap
cleanup() {
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null
		i=0
		while kill -0 "$pid" 2>/dev/null && [ "$i" -lt $((STOP_TIMEOUT * 20)) ]; do
			sleep 0.05
			i=$((i + 1))
		done
		if kill -0 "$pid" 2>/dev/null; then
			echo "demo: batond did not stop within ${STOP_TIMEOUT}s; killing it" >&2
			kill -KILL "$pid" 2>/dev/null
		fi
		wait "$pid" 2>/dev/null
	fi
	pid=
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Created first: the background job opens it for itself, maybe after our first look.
: >"$log"
"$batond" --listen 127.0.0.1:0 --db "$tmp/baton.db" 2>>"$log" &
pid=$!

# Wait for the log line that names the bound port: bounded by START_TIMEOUT, and cut
# short if batond exits.
server=
deadline=$(($(date +%s) + START_TIMEOUT))
while [ -z "$server" ]; do
	server=$(sed -n 's|.*listening on \(http://[^ /]*:[0-9][0-9]*\).*|\1|p' "$log" | head -n 1)
	[ -n "$server" ] && break
	if ! kill -0 "$pid" 2>/dev/null; then
		wait "$pid"
		echo "demo: batond exited with status $? before listening:" >&2
		cat "$log" >&2
		pid=
		exit 1
	fi
	if [ "$(date +%s)" -ge "$deadline" ]; then
		echo "demo: batond did not log 'listening on http://...' within ${START_TIMEOUT}s:" >&2
		cat "$log" >&2
		exit 1
	fi
	sleep 0.05
done

"$client" --server "$server" demo "$@"
rc=$?
if [ $rc -ne 0 ]; then
	echo "demo: client exited with status $rc; batond's log:" >&2
	cat "$log" >&2
fi
exit $rc
