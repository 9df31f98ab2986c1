#!/bin/sh
# docker/postgres-entrypoint.sh - PID 1 of docker/postgres.Dockerfile's image.
#
# First start on an empty $PGDATA: initdb, the settings batond relies on, the role
# $POSTGRES_USER (password $POSTGRES_PASSWORD, or trust when it is empty) and the
# database $POSTGRES_DB it owns. That setup runs on a server that listens only on the
# Unix socket, so nothing reaches it over the network (and the HEALTHCHECK does not
# pass) before the role exists. Every start then execs postgres in the foreground.
# Arguments are passed to postgres (`-c name=value`).
set -eu

PGDATA=${PGDATA:-/var/lib/postgresql/data}
POSTGRES_USER=${POSTGRES_USER:-baton}
POSTGRES_DB=${POSTGRES_DB:-baton}
POSTGRES_PASSWORD=${POSTGRES_PASSWORD:-}
PGHOST=${PGHOST:-/tmp}
export PGDATA PGHOST

say() { echo "baton-postgres: $*" >&2; }

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	if [ -n "$(ls -A "$PGDATA" 2>/dev/null)" ]; then
		say "$PGDATA is not empty but holds no cluster (no PG_VERSION); refusing to initdb"
		exit 1
	fi
	case $POSTGRES_USER in
	postgres | '')
		say "POSTGRES_USER must name a role of its own, not the superuser"
		exit 1
		;;
	esac
	if [ -n "$POSTGRES_PASSWORD" ]; then auth=scram-sha-256; else auth=trust; fi
	say "initializing a new cluster in $PGDATA (network auth for $POSTGRES_USER: $auth)"
	# The superuser is postgres, reachable only through the local socket (peer).
	initdb -D "$PGDATA" --username=postgres --encoding=UTF8 --no-locale \
		--auth-local=peer --auth-host=reject >/dev/null

	cat >>"$PGDATA/postgresql.conf" <<EOF

# ---- written by baton-postgres-entrypoint at initdb
listen_addresses = '*'
unix_socket_directories = '${PGHOST:-/tmp}'
password_encryption = scram-sha-256
# batond acknowledges a step once its commit returns: keep commits durable.
fsync = on
synchronous_commit = on
full_page_writes = on
EOF
	# Over the network, only the role batond uses, only on its database; initdb's own
	# lines follow (local: peer, so the superuser only through the socket; host: reject).
	{
		echo "# ---- written by baton-postgres-entrypoint at initdb"
		echo "host \"$POSTGRES_DB\" \"$POSTGRES_USER\" all $auth"
		grep -v '^[[:space:]]*\(#\|$\)' "$PGDATA/pg_hba.conf"
	} >"$PGDATA/pg_hba.conf.new"
	mv "$PGDATA/pg_hba.conf.new" "$PGDATA/pg_hba.conf"

	pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w -t 60 -s start
	psql -X -q -v ON_ERROR_STOP=1 --username=postgres --dbname=postgres \
		-v user="$POSTGRES_USER" -v db="$POSTGRES_DB" -v pw="$POSTGRES_PASSWORD" <<'SQL'
SELECT :'pw' <> '' AS has_pw \gset
\if :has_pw
CREATE ROLE :"user" LOGIN PASSWORD :'pw';
\else
CREATE ROLE :"user" LOGIN;
\endif
CREATE DATABASE :"db" OWNER :"user";
SQL
	pg_ctl -D "$PGDATA" -m fast -w -t 60 -s stop
	say "cluster ready: role $POSTGRES_USER, database $POSTGRES_DB"
fi

exec postgres -D "$PGDATA" "$@"
