/*
 * pg.c - the PostgreSQL side of the benchmarks: the floor over libpq, a fresh database
 * for every batond, and what the server did during a run (CPU of the postmaster and its
 * children from /proc, how often its busiest process waited, WAL syncs from pg_stat_wal).
 *
 * The server is one run.sh started with bench/pg.sh (or any PostgreSQL on this machine
 * given with --pg URL); its postmaster is found as the parent of this program's own
 * backend, so its processes can be read from /proc like batond's.
 *
 * pg_stat_wal is fed by each backend at most once a second while it works, and ten
 * seconds after it goes idle: a figure read while batond runs would miss its last
 * second. A backend that exits reports at once, so WAL syncs are read after batond has
 * stopped and its connections are gone (pg_wait_idle), and this program's own
 * connections ask for their report with pg_stat_force_next_flush().
 */
#include "bench.h"
#include "../common/proc_cpu.h"

#include <dirent.h>
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static PGconn *admin;
static pid_t postmaster;
static int ndb;

static PGconn *connect_url(const char *url)
{
	PGconn *c = PQconnectdb(url);
	if (PQstatus(c) != CONNECTION_OK) {
		fprintf(stderr, "bench: PostgreSQL: %s", PQerrorMessage(c));
		PQfinish(c);
		return NULL;
	}
	return c;
}

/* Runs sql (no parameters); 0 or -1 with the server's message on stderr. */
static int exec(PGconn *c, const char *sql)
{
	PGresult *r = PQexec(c, sql);
	ExecStatusType st = PQresultStatus(r);
	int ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
	if (!ok)
		fprintf(stderr, "bench: PostgreSQL: %s: %s", sql, PQerrorMessage(c));
	PQclear(r);
	return ok ? 0 : -1;
}

/* One integer from a one-row query; -1 on failure. */
static long long query_int(PGconn *c, const char *sql)
{
	PGresult *r = PQexec(c, sql);
	long long v = -1;
	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
		v = atoll(PQgetvalue(r, 0, 0));
	else
		fprintf(stderr, "bench: PostgreSQL: %s: %s", sql, PQerrorMessage(c));
	PQclear(r);
	return v;
}

/* Field 4 (ppid) of /proc/PID/stat; -1 when unreadable. */
static pid_t parent_of(pid_t pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	const char *p = proc_stat_fields(path, buf, sizeof buf);
	int ppid = -1;
	if (!p || sscanf(p, "%*c %d", &ppid) != 1)
		return -1;
	return ppid;
}

int pg_open(void)
{
	if (!(admin = connect_url(opt.pg_url)))
		return -1;
	long long me = query_int(admin, "SELECT pg_backend_pid()");
	postmaster = me > 0 ? parent_of((pid_t)me) : -1;
	if (postmaster <= 0) {
		fprintf(stderr, "bench: PostgreSQL at %s is not on this machine (no /proc/%lld)\n",
			opt.pg_url, me);
		pg_close();
		return -1;
	}
	return 0;
}

void pg_close(void)
{
	/* The databases of this run, so that a server given with --pg keeps nothing. */
	char sql[128];
	for (int i = 1; admin && i <= ndb; i++) {
		snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS baton_bench_%d_%d",
			 (int)getpid(), i);
		exec(admin, sql);
	}
	PQfinish(admin);
	admin = NULL;
}

const char *pg_version(void)
{
	static char v[64];
	snprintf(v, sizeof v, "PostgreSQL %d, libpq %d", admin ? PQserverVersion(admin) : 0,
		 PQlibVersion());
	return v;
}

/* ---- fresh databases ---- */

int pg_db_new(char *url, size_t len)
{
	char name[64], sql[128];
	snprintf(name, sizeof name, "baton_bench_%d_%d", (int)getpid(), ++ndb);
	snprintf(sql, sizeof sql, "CREATE DATABASE %s", name);
	if (exec(admin, sql) || exec(admin, "SELECT pg_stat_force_next_flush()"))
		return -1;
	/* The admin URL with its database name replaced; its parameters kept. */
	const char *scheme = strstr(opt.pg_url, "://");
	const char *slash = strchr(scheme ? scheme + 3 : opt.pg_url, '/');
	const char *params = strchr(opt.pg_url, '?');
	int head = slash ? (int)(slash - opt.pg_url) : (int)strlen(opt.pg_url);
	if (params && params < opt.pg_url + head)
		head = (int)(params - opt.pg_url);
	snprintf(url, len, "%.*s/%s%s", head, opt.pg_url, name, params ? params : "");
	return 0;
}

int pg_wait_idle(const char *url, double timeout_s)
{
	const char *name = strrchr(url, '/');
	char sql[256];
	snprintf(sql, sizeof sql, "SELECT count(*) FROM pg_stat_activity WHERE datname = '%.*s'",
		 (int)strcspn(name ? name + 1 : "", "?"), name ? name + 1 : "");
	double until = now_s() + timeout_s;
	while (now_s() < until) {
		long long n = query_int(admin, sql);
		if (n == 0)
			return 0;
		if (n < 0)
			return -1;
		sleep_ms(10);
	}
	fprintf(stderr, "bench: batond's connections to %s still open after %.0f s\n", url,
		timeout_s);
	return -1;
}

/* The backends connected to the database of url, with their application_name. */
int pg_backends(const char *url, pid_t *pid, char (*app)[64], int max)
{
	const char *name = strrchr(url, '/');
	char sql[256];
	snprintf(sql, sizeof sql,
		 "SELECT pid, application_name FROM pg_stat_activity WHERE datname = '%.*s'",
		 (int)strcspn(name ? name + 1 : "", "?"), name ? name + 1 : "");
	PGresult *r = PQexec(admin, sql);
	int n = -1;
	if (PQresultStatus(r) == PGRES_TUPLES_OK) {
		for (n = 0; n < PQntuples(r) && n < max; n++) {
			pid[n] = (pid_t)atoi(PQgetvalue(r, n, 0));
			snprintf(app[n], 64, "%s", PQgetvalue(r, n, 1));
		}
	} else {
		fprintf(stderr, "bench: PostgreSQL: %s: %s", sql, PQerrorMessage(admin));
	}
	PQclear(r);
	return n;
}

/* ---- what the server did ---- */

/* utime, stime and (with children) cutime, cstime of /proc/PID/stat in seconds. */
static double proc_cpu(pid_t pid, int children)
{
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	const char *p = proc_stat_fields(path, buf, sizeof buf);
	unsigned long long ut = 0, st = 0, cut = 0, cst = 0;
	if (!p || sscanf(p, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %llu %llu", &ut,
			 &st, &cut, &cst) != 4)
		return 0;
	return (double)(ut + st + (children ? cut + cst : 0)) / (double)sysconf(_SC_CLK_TCK);
}

/* voluntary_ctxt_switches of /proc/PID/status: each time the process waited. */
static unsigned long long proc_waits(pid_t pid)
{
	char path[64], line[128];
	unsigned long long v = 0;
	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "voluntary_ctxt_switches: %llu", &v) == 1)
			break;
	if (f)
		fclose(f);
	return v;
}

void pg_snap_take(pg_snap *out, int wal)
{
	memset(out, 0, sizeof *out);
	/* The postmaster with the children it reaped, and every live child. */
	out->total_s = proc_cpu(postmaster, 1);
	DIR *d = opendir("/proc");
	struct dirent *de;
	while (d && (de = readdir(d)) && out->n < PG_MAX_PROCS) {
		pid_t pid = (pid_t)atoi(de->d_name);
		if (pid <= 0 || parent_of(pid) != postmaster)
			continue;
		double s = proc_cpu(pid, 0);
		out->pid[out->n] = pid;
		out->s[out->n] = s;
		out->waits[out->n++] = proc_waits(pid);
		out->total_s += s;
	}
	if (d)
		closedir(d);
	if (!wal)
		return;
	PGresult *r = PQexec(admin, "SELECT wal_sync, wal_write, wal_sync_time FROM pg_stat_wal");
	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
		out->wal_sync = atof(PQgetvalue(r, 0, 0));
		out->wal_write = atof(PQgetvalue(r, 0, 1));
		out->wal_sync_ms = atof(PQgetvalue(r, 0, 2));
	}
	PQclear(r);
}

double pg_snap_delta(const pg_snap *a, const pg_snap *b, double *busiest_s, double *busiest_waits,
		     char *busiest_name, size_t namelen)
{
	int best = -1;
	double best_s = 0, best_r = 0;
	for (int i = 0; i < b->n; i++) {
		double s0 = 0, r0 = 0;
		for (int j = 0; j < a->n; j++)
			if (a->pid[j] == b->pid[i]) {
				s0 = a->s[j];
				r0 = (double)a->waits[j];
			}
		if (b->s[i] - s0 > best_s || best < 0) {
			best = i;
			best_s = b->s[i] - s0;
			best_r = (double)b->waits[i] - r0;
		}
	}
	*busiest_s = best_s;
	*busiest_waits = best_r;
	if (busiest_name && namelen) {
		busiest_name[0] = 0;
		char path[64];
		snprintf(path, sizeof path, "/proc/%d/cmdline", best >= 0 ? (int)b->pid[best] : 0);
		FILE *f = best >= 0 ? fopen(path, "r") : NULL;
		if (f) {
			size_t n = fread(busiest_name, 1, namelen - 1, f);
			fclose(f);
			busiest_name[n] = 0;
			/* "postgres: USER DB HOST(PORT) STATE": the backend's title, to its host.
			 */
			char *paren = strchr(busiest_name, '(');
			if (paren)
				*paren = 0;
			n = strlen(busiest_name);
			while (n && busiest_name[n - 1] == ' ')
				busiest_name[--n] = 0;
		}
	}
	return b->total_s - a->total_s;
}

/* ---- the floor ---- */

/* One run: single-row INSERTs, each its own transaction (autocommit: one round trip). */
static int pg_floor_run(PGconn *c, long max_commits, double max_seconds, dvec *lat, double *rate,
			long *commits)
{
	if (exec(c, "SET synchronous_commit = on") ||
	    exec(c, "SET client_min_messages = warning") ||
	    exec(c, "DROP TABLE IF EXISTS bench_floor") ||
	    exec(c, "CREATE TABLE bench_floor (seq bigserial PRIMARY KEY, ts bigint NOT NULL,"
		    " data text NOT NULL)"))
		return -1;
	PGresult *r =
	    PQprepare(c, "ins", "INSERT INTO bench_floor (ts, data) VALUES ($1, $2)", 2, NULL);
	int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
	PQclear(r);
	if (!ok) {
		fprintf(stderr, "bench: floor: prepare: %s", PQerrorMessage(c));
		return -1;
	}
	/* A row of about the size of one of batond's event rows, as in the SQLite floor. */
	static const char data[] = "{\"step\":0,\"worker\":\"worker-A\",\"attempt\":1,"
				   "\"duration_ms\":0,\"result\":{\"workerId\":\"worker-A\"}}";
	double t0 = now_s(), deadline = t0 + max_seconds;
	long n = 0;
	while (n < max_commits && now_s() < deadline) {
		double a = now_s();
		char ts[32];
		snprintf(ts, sizeof ts, "%lld", (long long)(a * 1000));
		const char *values[2] = {ts, data};
		r = PQexecPrepared(c, "ins", 2, values, NULL, NULL, 0);
		ok = PQresultStatus(r) == PGRES_COMMAND_OK;
		PQclear(r);
		if (!ok) {
			fprintf(stderr, "bench: floor: %s", PQerrorMessage(c));
			return -1;
		}
		dvec_push(lat, (now_s() - a) * 1000.0);
		n++;
	}
	*rate = (double)n / (now_s() - t0);
	*commits = n;
	r = PQexec(c, "DEALLOCATE ins");
	PQclear(r);
	return exec(c, "DROP TABLE bench_floor") || exec(c, "SELECT pg_stat_force_next_flush()");
}

int pg_floor_measure(int runs, long max_commits, double max_seconds, floor_result *out)
{
	dvec lat = {0}, rates = {0};
	int rc = 0;
	memset(out, 0, sizeof *out);
	PGconn *c = connect_url(opt.pg_url);
	if (!c)
		return -1;
	pg_snap a, b;
	double busiest, waits;
	pg_snap_take(&a, 0);
	for (int i = 0; i < runs && rc == 0; i++) {
		double rate = 0;
		long n = 0;
		rc = pg_floor_run(c, max_commits, max_seconds, &lat, &rate, &n);
		dvec_push(&rates, rate);
		out->commits += n;
	}
	pg_snap_take(&b, 0);
	PQfinish(c);
	if (out->commits > 0)
		out->server_us =
		    pg_snap_delta(&a, &b, &busiest, &waits, NULL, 0) / (double)out->commits * 1e6;
	out->runs = runs;
	out->commits_per_s = median(rates.v, rates.n);
	out->commit_ms = median(lat.v, lat.n);
	out->p99_ms = percentile(lat.v, lat.n, 99);
	dvec_free(&lat);
	dvec_free(&rates);
	return rc;
}
