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

int paired_runs(const server *s, const char *dir, int runs, run_fn fn, void *ctx, int latency,
		paired_result *out)
{
	dvec fig = {0}, ratio = {0}, rate = {0}, ms = {0}, aux0 = {0}, aux1 = {0};
	int rc = 0;
	memset(out, 0, sizeof *out);
	for (int i = 0; i < runs && rc == 0; i++) {
		floor_result f;
		double v, aux[2] = {0, 0};
		rc = floor_measure(dir, 1, opt.smoke ? 300 : 5000, opt.smoke ? 0.3 : 1.0, &f);
		if (rc == 0)
			rc = fn(s, i, ctx, &v, aux);
		if (rc)
			break;
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
	}
	dvec_free(&fig);
	dvec_free(&ratio);
	dvec_free(&rate);
	dvec_free(&ms);
	dvec_free(&aux0);
	dvec_free(&aux1);
	return rc ? -1 : 0;
}
