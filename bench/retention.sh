#!/bin/sh
# bench/retention.sh - does the SQLite file stop growing under a steady load once
# retention applies? Runs batond twice on a fresh database, without retention and with
# --retention RETENTION, each for SECONDS under the same steady load (RATE workflows of
# three steps per second, over one keep-alive connection), and prints the sizes of the
# database file and its WAL every STEP seconds, side by side. Timing never enters
# `make test`; figures go to bench/README.md ("Retention").
#
#   sh bench/retention.sh [SECONDS [RETENTION [RATE [STEP]]]]   # defaults: 120 20s 100 10
#   BATOND=/path/to/batond sh bench/retention.sh
set -eu
BATOND=${BATOND:-./server/batond}
secs=${1:-120}
retention=${2:-20s}
rate=${3:-100}
step=${4:-10}
work=$(mktemp -d "${TMPDIR:-/tmp}/baton-retention-XXXXXX")
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"' EXIT

# run LABEL RETENTION: one batond under load; prints "t db_bytes wal_bytes" per step.
run() {
	db="$work/$1.db"
	"$BATOND" --listen 127.0.0.1:0 --db "$db" --retention "$2" >"$work/$1.log" 2>&1 &
	pid=$!
	port=""
	for _ in $(seq 1 200); do
		port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/$1.log")
		[ -n "$port" ] && break
		sleep 0.05
	done
	[ -n "$port" ] || { echo "batond did not start:" >&2; cat "$work/$1.log" >&2; exit 2; }
	python3 - "$port" "$db" "$secs" "$rate" "$step" >"$work/$1.sizes" <<'PY'
import http.client, json, os, sys, time
port, db, secs, rate, step = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=30)
body = json.dumps({"resource": "", "workers": [{"name": "a", "work_ms": 0},
       {"name": "b", "work_ms": 0}, {"name": "c", "work_ms": 0}]})
size = lambda p: os.path.getsize(p) if os.path.exists(p) else 0
start = time.monotonic()
sent, next_print = 0, 0
while True:
    t = time.monotonic() - start
    if t >= next_print:
        print(f"{next_print} {size(db)} {size(db + '-wal')}", flush=True)
        next_print += step
    if t >= secs:
        break
    if sent >= t * rate:
        time.sleep(0.002)
        continue
    b = body.replace('"resource": ""', f'"resource": "r{sent % 8}"')
    conn.request("POST", "/workflows", b, {"Content-Type": "application/json"})
    r = conn.getresponse()
    r.read()
    if r.status != 201:
        sys.exit(f"POST /workflows answered {r.status}")
    sent += 1
PY
	kill "$pid"
	wait "$pid" || true
	pid=""
}

run forever 0
run kept "$retention"
printf '%s s of %s workflows/s (3 steps each); retention %s on the right\n' "$secs" "$rate" "$retention"
printf '%6s %14s %12s   %14s %12s\n' t db_forever wal_forever db_retention wal_retention
join "$work/forever.sizes" "$work/kept.sizes" |
	awk '{ printf "%6s %14d %12d   %14d %12d\n", $1, $2, $3, $4, $5 }'
