#!/bin/sh
# A throwaway PostgreSQL 15 server for the tests, everything of it in one directory.
#
#   pg.sh start DIR     create the cluster in DIR/data if there is none, start it, wait
#                       until it accepts connections, print its URL
#   pg.sh stop DIR      stop exactly the server of DIR (fast shutdown with a deadline,
#                       then SIGKILL of the postmaster named by DIR/data/postmaster.pid)
#   pg.sh restart DIR   stop, then start on the same port and data
#   pg.sh url DIR       print postgresql://postgres@127.0.0.1:PORT/postgres
#
# The server listens on 127.0.0.1 only, on a random free port chosen at the first start
# and kept in DIR/port; its unix socket is in DIR, its log is DIR/postgres.log. Anyone
# on loopback may connect as any user without a password (trust): it is for tests.
# fsync and synchronous_commit keep their defaults (on), so it is as durable as a real
# server. PostgreSQL refuses to run as root: as root, the server runs as Debian's
# `postgres` user (or `baton-pg`, created when there is no `postgres`) and DIR is handed
# to it, so DIR's parents must let that user through (mktemp -d under /tmp does).
# PG_BIN overrides /usr/lib/postgresql/15/bin; PG_DEADLINE_S (default 30) bounds each wait.
set -eu

bin=${PG_BIN:-/usr/lib/postgresql/15/bin}
deadline_s=${PG_DEADLINE_S:-30}

usage() {
	echo "usage: pg.sh start|stop|restart|url DIR" >&2
	exit 2
}

[ $# -eq 2 ] || usage
cmd=$1
dir=$2
case $dir in /*) ;; *) dir=$(pwd)/$dir ;; esac
data=$dir/data

# Runs a command as the server's user: ourselves unless we are root.
as_owner() {
	if [ -n "$owner" ]; then
		runuser -u "$owner" -- "$@"
	else
		"$@"
	fi
}

pick_owner() {
	owner=""
	[ "$(id -u)" -eq 0 ] || return 0
	if id postgres >/dev/null 2>&1; then
		owner=postgres
	else
		id baton-pg >/dev/null 2>&1 ||
			useradd --system --no-create-home --shell /usr/sbin/nologin baton-pg
		owner=baton-pg
	fi
}

# Whether some socket listens on TCP port $1 (IPv4 or IPv6), from /proc/net.
port_in_use() {
	hex=$(printf ':%04X ' "$1")
	cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk '$4 == "0A" {print $2 " "}' |
		grep -q "$hex"
}

random_port() {
	while :; do
		p=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
		p=$((20000 + p % 40000))
		port_in_use "$p" || break
	done
	echo "$p"
}

url() {
	[ -s "$dir/port" ] || {
		echo "pg.sh: no server was started in $dir" >&2
		exit 1
	}
	echo "postgresql://postgres@127.0.0.1:$(cat "$dir/port")/postgres"
}

init_cluster() {
	mkdir -p "$dir"
	[ -z "$owner" ] || chown "$owner" "$dir"
	chmod 700 "$dir"
	as_owner "$bin/initdb" -D "$data" -U postgres --auth=trust --encoding=UTF8 \
		--locale=C >"$dir/initdb.log" 2>&1 || {
		cat "$dir/initdb.log" >&2
		exit 1
	}
	# Loopback only: the unix socket in DIR and 127.0.0.1; replication too, for the
	# standbys that tests/http/test_failover.c copies from it with pg_basebackup.
	cat >"$data/pg_hba.conf" <<-EOF
		local all all trust
		host all all 127.0.0.1/32 trust
		host replication all 127.0.0.1/32 trust
	EOF
	cat >>"$data/postgresql.conf" <<-EOF

		# scripts/pg.sh
		listen_addresses = '127.0.0.1'
		unix_socket_directories = '$dir'
		max_connections = 200
		fsync = on
		synchronous_commit = on
		logging_collector = off
	EOF
	[ -z "$owner" ] || chown "$owner" "$data/pg_hba.conf" "$data/postgresql.conf"
}

# Starts the server on port $1 (pg_ctl waits until it accepts connections): 0 or 1.
try_start() {
	as_owner "$bin/pg_ctl" -D "$data" -l "$dir/postgres.log" -o "-p $1" -w \
		-t "$deadline_s" start >"$dir/pg_ctl.log" 2>&1
}

start() {
	pick_owner
	[ -f "$data/PG_VERSION" ] || init_cluster
	if [ -f "$data/postmaster.pid" ] && postmaster_alive; then
		echo "pg.sh: a server already runs in $dir (pid $(head -n 1 "$data/postmaster.pid"))" >&2
		exit 1
	fi
	if [ -s "$dir/port" ]; then
		try_start "$(cat "$dir/port")" || {
			cat "$dir/pg_ctl.log" >&2
			tail -n 20 "$dir/postgres.log" >&2
			exit 1
		}
	else
		# Another process may take the port between our look and the bind: try again.
		tries=0
		while :; do
			port=$(random_port)
			try_start "$port" && break
			tries=$((tries + 1))
			if [ "$tries" -ge 5 ] || ! grep -q "could not bind" "$dir/postgres.log"; then
				cat "$dir/pg_ctl.log" >&2
				tail -n 20 "$dir/postgres.log" >&2
				exit 1
			fi
		done
		echo "$port" >"$dir/port"
	fi
	# pg_ctl -w says it runs; a query over TCP says the URL works.
	port=$(cat "$dir/port")
	end=$(($(date +%s) + deadline_s))
	until as_owner "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres; do
		if [ "$(date +%s)" -ge "$end" ]; then
			echo "pg.sh: the server in $dir does not accept connections on port $port" >&2
			exit 1
		fi
		sleep 0.1
	done
	url
}

# Whether the pid in postmaster.pid is a live postgres process.
postmaster_alive() {
	pid=$(head -n 1 "$data/postmaster.pid" 2>/dev/null || true)
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null &&
		tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q postgres
}

stop() {
	pick_owner
	[ -f "$data/postmaster.pid" ] || return 0
	pid=$(head -n 1 "$data/postmaster.pid")
	postmaster_alive || return 0
	as_owner "$bin/pg_ctl" -D "$data" -m fast -w -t "$deadline_s" stop \
		>"$dir/pg_ctl.log" 2>&1 && return 0
	echo "pg.sh: fast shutdown of pid $pid did not finish within ${deadline_s}s; SIGKILL" >&2
	kill -KILL "$pid" 2>/dev/null || true
	end=$(($(date +%s) + deadline_s))
	while kill -0 "$pid" 2>/dev/null; do
		if [ "$(date +%s)" -ge "$end" ]; then
			echo "pg.sh: pid $pid survived SIGKILL" >&2
			exit 1
		fi
		sleep 0.1
	done
}

case $cmd in
start) start ;;
stop) stop ;;
restart)
	stop
	start
	;;
url) url ;;
*) usage ;;
esac
