#!/bin/sh
# bench/pg.sh - a throwaway PostgreSQL for the benchmarks, in a directory of its own.
#
#   sh bench/pg.sh start DIR [WATCH_PID]   initdb DIR/data, start the server, print its URL
#   sh bench/pg.sh url DIR                 postgresql://postgres@127.0.0.1:PORT/postgres
#   sh bench/pg.sh stop DIR                stop that server (by its pid) and its watchdog
#   sh bench/pg.sh standby DIR PORT [WATCH_PID]  a streaming standby of the server on PORT
#                                          (pg_basebackup -R into DIR/data), started; its URL
#   sh bench/pg.sh crash DIR               pg_ctl stop -m immediate (no shutdown checkpoint)
#   sh bench/pg.sh promote DIR             pg_ctl promote, waited for
#
# The server: Debian's PostgreSQL 15 (PGBIN, default /usr/lib/postgresql/15/bin), trust
# authentication, listen_addresses=127.0.0.1 on a random free port, its unix sockets in
# DIR, fsync and synchronous_commit on (the defaults, set explicitly: the floor and
# batond's commits must be durable ones). PostgreSQL refuses to run as root, so as root
# (CI) it runs as the unprivileged user `postgres` through runuser, and DIR is given to
# that user; otherwise it runs as the caller.
#
# Only the server started here is ever stopped: its pid comes from DIR/data/postmaster.pid
# as read after the start, and stop sends it SIGINT (fast shutdown), then SIGQUIT and
# SIGKILL if it is still there after 30 s. With WATCH_PID, a watchdog stops the server
# when that process is gone and removes DIR, so an interrupted or killed benchmark leaves
# nothing running.
# (scripts/pg.sh on another branch does the same for the tests; they will be unified.)
set -eu

PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
# On one line: pg_ctl hands these to a shell.
PGOPTS="-c fsync=on -c synchronous_commit=on -c max_connections=200 -c track_wal_io_timing=on"
# PGEXTRA: more server options, for profiling (e.g. -c shared_preload_libraries=pg_stat_statements).
PGOPTS="$PGOPTS ${PGEXTRA:-}"
cmd=${1:-}
dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then
	echo "usage: sh bench/pg.sh start DIR [WATCH_PID] | url DIR | stop DIR" >&2
	exit 2
fi

as_pg() {
	if [ "$(id -u)" = 0 ]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Stops the server whose pid is in DIR/pg.pid; waits for it to be gone.
stop_server() {
	[ -f "$dir/pg.pid" ] || return 0
	pid=$(cat "$dir/pg.pid")
	for sig in INT QUIT KILL; do
		kill -"$sig" "$pid" 2>/dev/null || break
		i=0
		while kill -0 "$pid" 2>/dev/null && [ $i -lt 300 ]; do
			sleep 0.1
			i=$((i + 1))
		done
		kill -0 "$pid" 2>/dev/null || break
		echo "bench/pg.sh: PostgreSQL $pid still running after SIG$sig" >&2
	done
	rm -f "$dir/pg.pid"
}

# DIR, made the server's.
make_dir() {
	mkdir -p "$dir"
	[ "$(id -u)" = 0 ] && chown postgres "$dir"
	if ! as_pg test -w "$dir"; then
		echo "bench/pg.sh: $dir is not writable by the server's user (its parents must be searchable)" >&2
		exit 2
	fi
}

# Starts the server of DIR/data on a free port, with a watchdog on $1 when given; prints
# its URL.
run() {
	watch=${1:-}
	# A free port can be taken between the probe and the bind: a few attempts.
	for attempt in 1 2 3 4 5; do
		port=$(free_port)
		if as_pg "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
			-o "-c listen_addresses=127.0.0.1 -p $port -k $dir $PGOPTS" \
			start >/dev/null 2>&1; then
			head -n 1 "$dir/data/postmaster.pid" >"$dir/pg.pid"
			echo "$port" >"$dir/pg.port"
			break
		fi
		if [ $attempt = 5 ]; then
			echo "bench/pg.sh: PostgreSQL did not start; $dir/postgres.log:" >&2
			tail -n 20 "$dir/postgres.log" >&2
			exit 2
		fi
	done
	if [ -n "$watch" ]; then
		# The watchdog: a bounded poll that ends when either process is gone.
		(
			pg=$(cat "$dir/pg.pid")
			while kill -0 "$watch" 2>/dev/null && kill -0 "$pg" 2>/dev/null; do
				sleep 1
			done
			kill -0 "$pg" 2>/dev/null && sh "$0" stop "$dir" >/dev/null 2>&1
			# Its owner is gone and will not remove the directory: the watchdog does.
			kill -0 "$watch" 2>/dev/null || rm -rf "$dir"
		) </dev/null >/dev/null 2>&1 &
		echo $! >"$dir/watchdog.pid"
	fi
	echo "postgresql://postgres@127.0.0.1:$port/postgres"
}

case $cmd in
start)
	make_dir
	as_pg "$PGBIN/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --no-locale \
		>"$dir/initdb.log" 2>&1 || {
		cat "$dir/initdb.log" >&2
		exit 2
	}
	run "${3:-}"
	;;
standby)
	make_dir
	# initdb's pg_hba.conf lets 127.0.0.1 replicate (trust).
	as_pg "$PGBIN/pg_basebackup" -h 127.0.0.1 -p "${3:?PORT}" -U postgres -D "$dir/data" \
		-R -X stream -c fast >"$dir/basebackup.log" 2>&1 || {
		cat "$dir/basebackup.log" >&2
		exit 2
	}
	run "${4:-}"
	;;
crash)
	as_pg "$PGBIN/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null
	;;
promote)
	as_pg "$PGBIN/pg_ctl" -D "$dir/data" -w -t 60 promote >/dev/null
	;;
url)
	echo "postgresql://postgres@127.0.0.1:$(cat "$dir/pg.port")/postgres"
	;;
stop)
	stop_server
	if [ -f "$dir/watchdog.pid" ]; then
		w=$(cat "$dir/watchdog.pid")
		rm -f "$dir/watchdog.pid"
		# Not when it is the watchdog itself that runs this stop.
		[ "$w" != "${PPID:-}" ] && kill "$w" 2>/dev/null || true
	fi
	;;
*)
	echo "bench/pg.sh: unknown command $cmd" >&2
	exit 2
	;;
esac
