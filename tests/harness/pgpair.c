/*
 * pgpair.c - a PostgreSQL primary and its streaming standby, started by a test (see
 * pgpair.h).
 */
#include "pgpair.h"
#include "pg.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <libpq-fe.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PAIR_WAIT_MS 60000

/* The PostgreSQL binaries and, as root, the user that runs them (pg.sh's choice). */
const char *pg_bin(void)
{
	const char *b = getenv("PG_BIN");
	return b && *b ? b : "/usr/lib/postgresql/15/bin";
}

const char *as_owner(void)
{
	if (geteuid() != 0)
		return "";
	return getpwnam("postgres") ? "runuser -u postgres -- " : "runuser -u baton-pg -- ";
}

const char *owner_name(void)
{
	return getpwnam("postgres") ? "postgres" : "baton-pg";
}

/* Runs a shell command (bounded by timeout(1)); 0 when it exited with 0. */
int shell(const char *fmt, ...)
{
	char cmd[2048], full[2100];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof cmd, fmt, ap);
	va_end(ap);
	snprintf(full, sizeof full, "timeout 120 sh -c '%s' 1>&2", cmd);
	int rc = system(full);
	if (rc != 0)
		fprintf(stderr, "pgpair: `%s` failed (%d)\n", cmd, rc);
	return rc == 0 ? 0 : -1;
}

const char *pg_script(void)
{
	const char *s = getenv("BATON_PG_SCRIPT");
	return s && *s ? s : "scripts/pg.sh";
}

int node_start(pg_node *n)
{
	if (shell("sh %s start %s >/dev/null", pg_script(), n->dir))
		return -1;
	char path[200];
	snprintf(path, sizeof path, "%s/port", n->dir);
	FILE *f = fopen(path, "r");
	n->port = 0;
	if (f) {
		if (fscanf(f, "%d", &n->port) != 1)
			n->port = 0;
		fclose(f);
	}
	return n->port > 0 ? 0 : -1;
}

void node_stop(pg_node *n)
{
	if (n->dir[0])
		shell("sh %s stop %s >/dev/null", pg_script(), n->dir);
}

/* A crash: no shutdown checkpoint, nothing more sent to the standby. */
void node_crash(pg_node *n)
{
	assert_int_equal(shell("%s%s/pg_ctl -D %s/data -m immediate -w stop >/dev/null", as_owner(),
			       pg_bin(), n->dir),
			 0);
}

void node_promote(pg_node *n)
{
	assert_int_equal(shell("%s%s/pg_ctl -D %s/data -w -t 60 promote >/dev/null", as_owner(),
			       pg_bin(), n->dir),
			 0);
}

void node_url(const pg_node *n, char *out, size_t size)
{
	snprintf(out, size, "postgresql://postgres@127.0.0.1:%d/baton", n->port);
}

/* The first value of sql on the database baton of n, as an integer; -1 on failure. */
long long node_value(const pg_node *n, const char *sql)
{
	char url[128];
	node_url(n, url, sizeof url);
	return pg_db_count(url, sql);
}

/* Waits until the standby has replayed everything the primary wrote so far. */
void wait_caught_up(const pair *p)
{
	long long want = node_value(&p->n[0], "SELECT pg_current_wal_lsn() - '0/0'");
	assert_true(want > 0);
	int64_t deadline = hs_mono_ms() + PAIR_WAIT_MS;
	while (node_value(&p->n[1], "SELECT coalesce(pg_last_wal_replay_lsn() - '0/0', 0)") <
	       want) {
		if (hs_mono_ms() > deadline)
			fail_msg("the standby did not catch up within %d ms", PAIR_WAIT_MS);
		hs_pause_ms(20);
	}
}

int make_dir(pg_node *n)
{
	snprintf(n->dir, sizeof n->dir, "/tmp/baton-fo-XXXXXX");
	if (!mkdtemp(n->dir)) {
		n->dir[0] = 0;
		return -1;
	}
	return 0;
}

/* Appends a line to n's postgresql.conf. 0 or -1. */
int append_conf(const pg_node *n, const char *fmt, ...)
{
	char path[200];
	snprintf(path, sizeof path, "%s/data/postgresql.conf", n->dir);
	FILE *f = fopen(path, "a");
	if (!f)
		return -1;
	va_list ap;
	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	return fclose(f) == 0 ? 0 : -1;
}

/* The primary with a database "baton", and a standby streaming from it. */
int start_servers(pair *p)
{
	if (make_dir(&p->n[0]) || node_start(&p->n[0]))
		return -1;
	char url[128];
	snprintf(url, sizeof url, "postgresql://postgres@127.0.0.1:%d/postgres", p->n[0].port);
	if (pg_db_count(url, "SELECT count(*) FROM (SELECT 1) x") < 0 ||
	    shell(
		"%s%s/psql -q -h 127.0.0.1 -p %d -U postgres -c \"CREATE DATABASE baton\" postgres",
		as_owner(), pg_bin(), p->n[0].port))
		return -1;
	if (make_dir(&p->n[1]))
		return -1;
	if (geteuid() == 0 && shell("chown %s %s", owner_name(), p->n[1].dir))
		return -1;
	if (shell(
		"%s%s/pg_basebackup -h 127.0.0.1 -p %d -U postgres -D %s/data -R -X stream -c fast",
		as_owner(), pg_bin(), p->n[0].port, p->n[1].dir) ||
	    append_conf(&p->n[1], "unix_socket_directories = '%s'\n", p->n[1].dir) ||
	    node_start(&p->n[1]))
		return -1;
	return 0;
}

/* cmocka runs no teardown after a failed setup: what was started is stopped here. */
int pair_setup(void **state)
{
	pair *p = calloc(1, sizeof *p);
	*state = p;
	if (!p || !hs_store_is_pg())
		return p ? 0 : -1;
	if (start_servers(p) == 0)
		return 0;
	pair_teardown(state);
	*state = NULL;
	return -1;
}

int pair_teardown(void **state)
{
	pair *p = *state;
	if (p->node)
		hs_close(p->node);
	if (p->s)
		hs_close(p->s);
	for (int i = 0; i < 2; i++) {
		node_stop(&p->n[i]);
		if (p->n[i].dir[0] && !getenv("BATON_TEST_KEEP"))
			shell("rm -rf %s", p->n[i].dir);
	}
	free(p);
	return 0;
}

/* Runs sql (no transaction block: ALTER SYSTEM) as the superuser on the server of n. */
int node_sql(const pg_node *n, const char *sql)
{
	char url[128];
	node_url(n, url, sizeof url);
	PGconn *c = PQconnectdb(url);
	PGresult *r = PQstatus(c) == CONNECTION_OK ? PQexec(c, sql) : NULL;
	ExecStatusType st = PQresultStatus(r);
	int rc = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK ? 0 : -1;
	if (rc)
		fprintf(stderr, "pgpair: %s: %s", sql, PQerrorMessage(c));
	PQclear(r);
	PQfinish(c);
	return rc;
}
