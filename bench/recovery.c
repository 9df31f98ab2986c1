/*
 * recovery.c - how long batond takes to be ready again after kill -9 with 10,000
 * unfinished workflows: 100 resources, each held by one long step (one hour of
 * simulated work) with 99 more workflows queued behind it. Time is measured from the
 * fork of the new process to the first 200 of GET /readyz (polled every millisecond),
 * and checked: every one of the workflows is still unfinished afterwards.
 *
 * The floor is the same measurement on an empty database: what starting batond costs
 * before it has anything to recover.
 */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NRES 100

typedef struct rec_ctx {
	char body[256];
} rec_ctx;

static int next_long(void *ctx, long n, const char **method, char *path, size_t pathlen,
		     const char **body)
{
	rec_ctx *c = ctx;
	snprintf(c->body, sizeof c->body,
		 "{\"id\":\"rec-%05ld\",\"resource\":\"rec-%03ld\",\"workers\":[{\"name\":\"w\","
		 "\"work_ms\":3600000}]}",
		 n, n % NRES);
	*method = "POST";
	snprintf(path, pathlen, "/workflows");
	*body = c->body;
	return 0;
}

/* Seconds from the fork to /readyz answering 200; -1 on failure. */
static double restart_until_ready(server *s)
{
	if (server_spawn(s, NULL) != 0 || server_wait_listening(s, 60) != 0)
		return -1;
	double until = now_s() + 60;
	while (now_s() < until) {
		if (http_do(s->port, "GET", "/readyz", NULL, NULL) == 200)
			return now_s() - s->started_at;
		sleep_ms(1);
	}
	return -1;
}

static long unfinished(int port)
{
	long p = server_count(port, "pending"), r = server_count(port, "running");
	return p < 0 || r < 0 ? -1 : p + r;
}

/* Median start-up time on an empty database, over `runs` starts. */
static double empty_start(const char *dir, int runs)
{
	server s;
	dvec t = {0};
	memset(&s, 0, sizeof s);
	snprintf(s.dir, sizeof s.dir, "%s", dir);
	snprintf(s.db, sizeof s.db, "%s/empty.db", dir);
	for (int i = 0; i < runs; i++) {
		double v = restart_until_ready(&s);
		server_stop(&s);
		if (v < 0)
			break;
		dvec_push(&t, v);
	}
	double m = t.n == (size_t)runs ? median(t.v, t.n) : -1;
	dvec_free(&t);
	return m;
}

int bench_recovery(void)
{
	const char *what = "recovery";
	char dir[BENCH_PATH_MAX];
	server s;
	long nwf = opt.smoke ? 500 : 10000;
	int runs = opt.smoke ? 1 : 3;
	printf("\n== %s: kill -9 with %ld unfinished workflows on %d resources, restart,"
	       " time to /readyz 200, %d runs\n",
	       what, nwf, NRES, runs);
	if (tmpdir_new(dir, sizeof dir) != 0) {
		table_fail(what, "no temporary directory");
		return -1;
	}
	double ref = empty_start(dir, 3);
	if (ref < 0 || server_start(&s, dir, NULL) != 0) {
		table_fail(what, "could not start batond");
		tmpdir_remove(dir);
		return -1;
	}
	rec_ctx c;
	load_result lr;
	double t0 = now_s();
	load_run(s.port, 32, nwf, 600, next_long, &c, &lr);
	int failed = lr.ok != nwf || unfinished(s.port) != nwf;
	printf("  %ld workflows submitted in %.1f s; %ld unfinished\n", lr.ok, now_s() - t0,
	       unfinished(s.port));
	load_result_free(&lr);
	dvec t = {0};
	for (int i = 0; i < runs && !failed; i++) {
		server_kill9(&s);
		double v = restart_until_ready(&s);
		long left = v < 0 ? -1 : unfinished(s.port);
		printf("  run %d: ready %.3f s after the fork; %ld unfinished\n", i + 1, v, left);
		failed = v < 0 || left != nwf;
		dvec_push(&t, v);
	}
	server_kill9(&s);
	tmpdir_remove(dir);
	if (failed) {
		table_fail(what, "set-up failed, or the restart lost or finished workflows");
		dvec_free(&t);
		return -1;
	}
	double m = median(t.v, t.n);
	row r = {.verdict = m < 2.0 ? V_PASS : V_MISS};
	snprintf(r.what, sizeof r.what, "recovery");
	snprintf(r.figure, sizeof r.figure, "%.3f s to ready (%ldk unfinished)", m, nwf / 1000);
	snprintf(r.floor, sizeof r.floor, "%.3f s (empty database)", ref);
	snprintf(r.ratio, sizeof r.ratio, "%.1fx", m / ref);
	snprintf(r.target, sizeof r.target, "< 2 s");
	snprintf(r.note, sizeof r.note,
		 "median of %d kill -9 and restart cycles; %d resources, each held by a one-hour"
		 " step with the rest queued",
		 runs, NRES);
	table_add(&r);
	dvec_free(&t);
	return 0;
}
