/*
 * floor.c - the floor every figure is compared with: what the disk allows for one
 * durable commit. One small INSERT per transaction (BEGIN IMMEDIATE ... COMMIT, as
 * batond writes), WAL, synchronous=FULL, in DIR/floor.db, in the same directory (so on
 * the same file system and disk) as the database of the benchmark it stands beside.
 */
#include "bench.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int exec(sqlite3 *db, const char *sql)
{
	char *msg = NULL;
	if (sqlite3_exec(db, sql, NULL, NULL, &msg) == SQLITE_OK)
		return 0;
	fprintf(stderr, "bench: floor: %s: %s\n", sql, msg ? msg : "?");
	sqlite3_free(msg);
	return -1;
}

static void remove_db(const char *path)
{
	char p[BENCH_PATH_MAX + 32];
	unlink(path);
	snprintf(p, sizeof p, "%s-wal", path);
	unlink(p);
	snprintf(p, sizeof p, "%s-shm", path);
	unlink(p);
}

/* One run: commits/s over the run; every commit's latency goes into lat. */
static int floor_run(const char *path, long max_commits, double max_seconds, dvec *lat,
		     double *rate, long *commits)
{
	sqlite3 *db = NULL;
	sqlite3_stmt *begin = NULL, *ins = NULL, *commit = NULL;
	int rc = -1;
	remove_db(path);
	if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
		SQLITE_OK ||
	    exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;") ||
	    exec(db, "CREATE TABLE t (seq INTEGER PRIMARY KEY, ts INTEGER NOT NULL,"
		     " data TEXT NOT NULL)") ||
	    sqlite3_prepare_v2(db, "BEGIN IMMEDIATE", -1, &begin, NULL) != SQLITE_OK ||
	    sqlite3_prepare_v2(db, "INSERT INTO t (ts, data) VALUES (?, ?)", -1, &ins, NULL) !=
		SQLITE_OK ||
	    sqlite3_prepare_v2(db, "COMMIT", -1, &commit, NULL) != SQLITE_OK)
		goto out;
	/* A row of about the size of one of batond's event rows. */
	static const char data[] = "{\"step\":0,\"worker\":\"worker-A\",\"attempt\":1,"
				   "\"duration_ms\":0,\"result\":{\"workerId\":\"worker-A\"}}";
	double t0 = now_s(), deadline = t0 + max_seconds;
	long n = 0;
	while (n < max_commits && now_s() < deadline) {
		double a = now_s();
		sqlite3_bind_int64(ins, 1, (sqlite3_int64)(a * 1000));
		sqlite3_bind_text(ins, 2, data, -1, SQLITE_STATIC);
		if (sqlite3_step(begin) != SQLITE_DONE || sqlite3_step(ins) != SQLITE_DONE ||
		    sqlite3_step(commit) != SQLITE_DONE) {
			fprintf(stderr, "bench: floor: %s\n", sqlite3_errmsg(db));
			goto out;
		}
		sqlite3_reset(begin);
		sqlite3_reset(ins);
		sqlite3_reset(commit);
		dvec_push(lat, (now_s() - a) * 1000.0);
		n++;
	}
	*rate = (double)n / (now_s() - t0);
	*commits = n;
	rc = 0;
out:
	sqlite3_finalize(begin);
	sqlite3_finalize(ins);
	sqlite3_finalize(commit);
	sqlite3_close(db);
	remove_db(path);
	return rc;
}

int floor_measure(const char *dir, int runs, long max_commits, double max_seconds,
		  floor_result *out)
{
	char path[BENCH_PATH_MAX + 16];
	dvec lat = {0}, rates = {0};
	if (opt.store == STORE_POSTGRES)
		return pg_floor_measure(runs, max_commits, max_seconds, out);
	memset(out, 0, sizeof *out);
	snprintf(path, sizeof path, "%s/floor.db", dir);
	for (int i = 0; i < runs; i++) {
		double rate;
		long n;
		if (floor_run(path, max_commits, max_seconds, &lat, &rate, &n) != 0) {
			dvec_free(&lat);
			dvec_free(&rates);
			return -1;
		}
		dvec_push(&rates, rate);
		out->commits += n;
	}
	out->runs = runs;
	out->commits_per_s = median(rates.v, rates.n);
	out->commit_ms = median(lat.v, lat.n);
	out->p99_ms = percentile(lat.v, lat.n, 99);
	dvec_free(&lat);
	dvec_free(&rates);
	return 0;
}

/* ---- what the processes cost per unit of work ---- */

static run_costs cur_costs; /* the run in progress: costs_end fills it */

void costs_begin(const server *s, costs_snap *c)
{
	char *text = NULL;
	cpu_take(s->pid, &c->batond);
	if (opt.store == STORE_POSTGRES)
		pg_snap_take(&c->pg, 0);
	c->commits = c->commit_s = 0;
	if (http_do(s->port, "GET", "/metrics", NULL, &text) == 200 && text) {
		c->commits = metric_value(text, "baton_commits_total");
		c->commit_s = metric_value(text, "baton_commit_duration_seconds_sum");
	}
	free(text);
}

void costs_end(const server *s, const costs_snap *c0, double units, const char *unit, double wall_s)
{
	costs_snap c1;
	double busiest;
	costs_begin(s, &c1);
	double total = cpu_delta(&c0->batond, &c1.batond, &busiest);
	run_costs *k = &cur_costs;
	k->units = units;
	k->commits = c1.commits - c0->commits;
	k->commit_ms = k->commits > 0 ? (c1.commit_s - c0->commit_s) / k->commits * 1000 : 0;
	k->batond_us = total / units * 1e6;
	printf("         batond CPU %.0f us/%s (busiest thread %.0f us/%s, busy %.0f%% of the"
	       " time); %.0f commits of %.3f ms on average\n",
	       k->batond_us, unit, busiest / units * 1e6, unit, 100 * busiest / wall_s, k->commits,
	       k->commit_ms);
	if (opt.store != STORE_POSTGRES)
		return;
	double pbusy, pwaits;
	double ptotal =
	    pg_snap_delta(&c0->pg, &c1.pg, &pbusy, &pwaits, k->pg_busiest, sizeof k->pg_busiest);
	k->pg_us = ptotal / units * 1e6;
	k->pg_busiest_us = pbusy / units * 1e6;
	k->pg_waits = k->commits > 0 ? pwaits / k->commits : 0;
	printf("         PostgreSQL CPU %.0f us/%s (busiest process %.0f us/%s, busy %.0f%% of"
	       " the time, %.1f waits per batond commit: %s)\n",
	       k->pg_us, unit, k->pg_busiest_us, unit, 100 * pbusy / wall_s, k->pg_waits,
	       k->pg_busiest);
}

void costs_note(const paired_result *pr, const char *unit, char *buf, size_t len)
{
	const run_costs *k = &pr->costs;
	buf[0] = 0;
	if (k->units <= 0)
		return;
	if (opt.store != STORE_POSTGRES) {
		snprintf(buf, len, "; batond CPU %.0f us/%s; commits of %.3f ms", k->batond_us,
			 unit, k->commit_ms);
		return;
	}
	snprintf(buf, len,
		 "; CPU per %s: batond %.0f us, PostgreSQL %.0f us (busiest process %.0f us: %s);"
		 " batond's commits %.3f ms each, %.1f waits of that process per commit;"
		 " %.3f WAL syncs/%s of %.3f ms each",
		 unit, k->batond_us, k->pg_us, k->pg_busiest_us, k->pg_busiest, k->commit_ms,
		 k->pg_waits, k->wal_syncs, unit, k->wal_sync_ms);
}

/* On PostgreSQL: a fresh database and batond for the next run, and the WAL snapshot. */
static int pg_fresh_server(server *s, pg_snap *w0)
{
	server_stop(s);
	pg_snap_take(w0, 1);
	return server_start(s, s->dir, s->extra);
}

/* On PostgreSQL: stops the run's batond and reads the WAL syncs of its life. */
static void pg_run_syncs(server *s, const pg_snap *w0)
{
	pg_snap w1;
	server_stop(s);
	pg_snap_take(&w1, 1);
	double syncs = w1.wal_sync - w0->wal_sync;
	if (cur_costs.units > 0)
		cur_costs.wal_syncs = syncs / cur_costs.units;
	cur_costs.wal_sync_ms = syncs > 0 ? (w1.wal_sync_ms - w0->wal_sync_ms) / syncs : 0;
	printf("         PostgreSQL: %.0f WAL syncs (pg_stat_wal) of %.2f ms each over this"
	       " batond's life\n",
	       syncs, cur_costs.wal_sync_ms);
}

#define NCOSTS 9
static void costs_fields(run_costs *k, double **f)
{
	double *v[NCOSTS] = {&k->units,	    &k->commits,       &k->batond_us,
			     &k->pg_us,	    &k->pg_busiest_us, &k->pg_waits,
			     &k->commit_ms, &k->wal_syncs,     &k->wal_sync_ms};
	memcpy(f, v, sizeof v);
}

int paired_runs(server *s, const char *dir, int runs, run_fn fn, void *ctx, int latency,
		paired_result *out)
{
	dvec fig = {0}, ratio = {0}, rate = {0}, ms = {0}, aux0 = {0}, aux1 = {0};
	dvec costs[NCOSTS] = {{0}};
	int rc = 0;
	memset(out, 0, sizeof *out);
	for (int i = 0; i < runs && rc == 0; i++) {
		floor_result f;
		pg_snap w0;
		double v, aux[2] = {0, 0};
		memset(&cur_costs, 0, sizeof cur_costs);
		rc = floor_measure(dir, 1, opt.smoke ? 300 : 5000, opt.smoke ? 0.3 : 1.0, &f);
		if (rc == 0 && opt.store == STORE_POSTGRES)
			rc = pg_fresh_server(s, &w0);
		if (rc == 0)
			rc = fn(s, i, ctx, &v, aux);
		if (rc == 0 && opt.store == STORE_POSTGRES)
			pg_run_syncs(s, &w0);
		if (rc)
			break;
		double *cf[NCOSTS];
		costs_fields(&cur_costs, cf);
		for (int k = 0; k < NCOSTS; k++)
			dvec_push(&costs[k], *cf[k]);
		snprintf(out->costs.pg_busiest, sizeof out->costs.pg_busiest, "%s",
			 cur_costs.pg_busiest);
		double floor_ms = 1000.0 / f.commits_per_s;
		double r = latency ? v / floor_ms : v / f.commits_per_s;
		printf("         floor just before: %.0f commits/s (%.3f ms mean); ratio %.2f\n",
		       f.commits_per_s, floor_ms, r);
		dvec_push(&fig, v);
		dvec_push(&ratio, r);
		dvec_push(&rate, f.commits_per_s);
		dvec_push(&ms, floor_ms);
		dvec_push(&aux0, aux[0]);
		dvec_push(&aux1, aux[1]);
	}
	if (rc == 0) {
		out->runs = runs;
		out->figure = median(fig.v, fig.n);
		out->ratio = median(ratio.v, ratio.n);
		out->floor_rate = median(rate.v, rate.n);
		out->floor_ms = median(ms.v, ms.n);
		out->aux[0] = median(aux0.v, aux0.n);
		out->aux[1] = median(aux1.v, aux1.n);
		double *cf[NCOSTS];
		costs_fields(&out->costs, cf);
		for (int k = 0; k < NCOSTS; k++)
			*cf[k] = median(costs[k].v, costs[k].n);
	}
	for (int k = 0; k < NCOSTS; k++)
		dvec_free(&costs[k]);
	dvec_free(&fig);
	dvec_free(&ratio);
	dvec_free(&rate);
	dvec_free(&ms);
	dvec_free(&aux0);
	dvec_free(&aux1);
	return rc ? -1 : 0;
}
