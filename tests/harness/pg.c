/*
 * pg.c - the harness on PostgreSQL (see pg.h and harness.h): databases created and
 * dropped through libpq on the server named by BATON_TEST_PG, one-integer reads of them,
 * and scripts/pg.sh run on BATON_TEST_PG_DIR for the tests that stop or restart that
 * server under batond.
 */
#include "pg.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "harness.h"

/* pg.sh bounds each of its waits by 30 s; a restart is a stop and a start. */
#define SCRIPT_TIMEOUT_MS 90000

int hs_store_is_pg(void)
{
	const char *url = getenv("BATON_TEST_PG");
	return url && *url;
}

int pg_url_with_db(const char *base, const char *name, char *out, size_t size)
{
	const char *sep = strstr(base, "://");
	if (!sep)
		return -1;
	const char *host = sep + 3;
	const char *path = host + strcspn(host, "/?"); /* after [user@]host[:port] */
	const char *query = strchr(path, '?');
	int n =
	    snprintf(out, size, "%.*s/%s%s", (int)(path - base), base, name, query ? query : "");
	return n > 0 && (size_t)n < size ? 0 : -1;
}

/* libpq prints notices (DROP ... IF EXISTS of nothing) to stderr by default. */
static void quiet(void *arg, const char *message)
{
	(void)arg;
	(void)message;
}

/* A connection to `url`, or NULL after printing why. */
static PGconn *connect_to(const char *url)
{
	/* dbname is expanded as a URI; the later connect_timeout bounds the wait. */
	const char *const keys[] = {"dbname", "connect_timeout", NULL};
	const char *const values[] = {url, "10", NULL};
	PGconn *c = PQconnectdbParams(keys, values, 1);
	if (c && PQstatus(c) == CONNECTION_OK) {
		PQsetNoticeProcessor(c, quiet, NULL);
		return c;
	}
	fprintf(stderr, "harness: cannot connect to %s: %s", url,
		c ? PQerrorMessage(c) : "out of memory\n");
	PQfinish(c);
	return NULL;
}

/* Runs one statement (not in a transaction) on the server of BATON_TEST_PG. 0 or -1. */
static int admin(const char *sql)
{
	PGconn *c = connect_to(getenv("BATON_TEST_PG"));
	if (!c)
		return -1;
	PGresult *r = PQexec(c, sql);
	int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
	if (!ok)
		fprintf(stderr, "harness: %s: %s", sql, PQresultErrorMessage(r));
	PQclear(r);
	PQfinish(c);
	return ok ? 0 : -1;
}

int pg_db_drop(const char *name)
{
	char sql[160];
	snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS \"%s\" WITH (FORCE)", name);
	return admin(sql);
}

/* The server was stopped by hs_pg_stop and not started again (a test that failed while it
 * was down): the next database is made only after it is started. */
static int stopped;

int pg_db_create(const char *name)
{
	if (stopped && hs_pg_start() != 0)
		return -1;
	char sql[160];
	snprintf(sql, sizeof sql, "CREATE DATABASE \"%s\"", name);
	return pg_db_drop(name) == 0 && admin(sql) == 0 ? 0 : -1;
}

long long pg_db_count(const char *url, const char *sql)
{
	PGconn *c = connect_to(url);
	if (!c)
		return -1;
	long long value = -1;
	PGresult *r = PQexec(c, sql);
	if (PQresultStatus(r) != PGRES_TUPLES_OK)
		fprintf(stderr, "harness: %s on %s: %s", sql, url, PQresultErrorMessage(r));
	else if (PQntuples(r) < 1 || PQnfields(r) < 1 || PQgetisnull(r, 0, 0))
		fprintf(stderr, "harness: %s on %s: no value\n", sql, url);
	else
		value = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
	PQclear(r);
	PQfinish(c);
	return value;
}

void *pg_db_hold(const char *url, const char *sql)
{
	PGconn *c = connect_to(url);
	if (!c)
		return NULL;
	PGresult *r = PQexec(c, "BEGIN");
	int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
	PQclear(r);
	r = ok ? PQexec(c, sql) : NULL;
	ok = ok && (PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK);
	if (!ok) {
		fprintf(stderr, "harness: %s on %s: %s", sql, url, PQerrorMessage(c));
		PQclear(r);
		PQfinish(c);
		return NULL;
	}
	PQclear(r);
	return c;
}

void pg_db_unhold(void *session)
{
	if (!session)
		return;
	PQclear(PQexec(session, "ROLLBACK"));
	PQfinish(session);
}

/* ---- the server itself: scripts/pg.sh ---------------------------------------------- */

/* $BATON_PG_SCRIPT, else scripts/pg.sh of the tree this file was compiled in. */
static void script_path(char *out, size_t size)
{
	const char *env = getenv("BATON_PG_SCRIPT");
	if (env && *env) {
		snprintf(out, size, "%s", env);
		return;
	}
	static const char self[] = "tests/harness/pg.c";
	size_t len = strlen(__FILE__), tail = sizeof self - 1;
	size_t root = len >= tail && strcmp(__FILE__ + len - tail, self) == 0 ? len - tail : 0;
	snprintf(out, size, "%.*sscripts/pg.sh", (int)root, __FILE__);
}

/* Runs `sh pg.sh verb $BATON_TEST_PG_DIR` to its end (bounded). 0 or -1. */
static int run_script(const char *verb)
{
	const char *dir = getenv("BATON_TEST_PG_DIR");
	if (!hs_store_is_pg() || !dir || !*dir) {
		fprintf(stderr, "harness: pg.sh %s needs BATON_TEST_PG and BATON_TEST_PG_DIR\n",
			verb);
		return -1;
	}
	char script[PATH_MAX];
	script_path(script, sizeof script);
	pid_t pid = fork();
	if (pid < 0) {
		fprintf(stderr, "harness: fork: %s\n", strerror(errno));
		return -1;
	}
	if (pid == 0) {
		/* start prints the URL; the test's stdout is its cmocka report. */
		dup2(STDERR_FILENO, STDOUT_FILENO);
		execl("/bin/sh", "sh", script, verb, dir, (char *)NULL);
		_exit(127);
	}
	int status = 0;
	int64_t deadline = hs_mono_ms() + SCRIPT_TIMEOUT_MS;
	while (waitpid(pid, &status, WNOHANG) == 0) {
		if (hs_mono_ms() >= deadline) {
			fprintf(stderr, "harness: %s %s %s still ran after %d ms; killed\n", script,
				verb, dir, SCRIPT_TIMEOUT_MS);
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			return -1;
		}
		hs_pause_ms(HS_POLL_MS);
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return 0;
	fprintf(stderr, "harness: %s %s %s failed (wait status 0x%x)\n", script, verb, dir,
		(unsigned)status);
	return -1;
}

int hs_pg_restart(void)
{
	int rc = run_script("restart");
	stopped = rc != 0;
	return rc;
}

int hs_pg_stop(void)
{
	stopped = 1;
	return run_script("stop");
}

int hs_pg_start(void)
{
	int rc = run_script("start");
	stopped = rc != 0;
	return rc;
}
