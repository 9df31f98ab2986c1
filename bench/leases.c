/*
 * leases.c - lease acquire+release pairs per second on one contended resource, against
 * the commit floor.
 *
 * LEASE_CLIENTS threads, each with its own keep-alive connection, loop on POST
 * /resources/bench-lock/leases (waiting in the queue) and DELETE /leases/{id} until the
 * run's pairs are done. With the resource always wanted, one commit carries a release
 * and the grant to the next waiter (and whatever else arrived meanwhile), so the figure
 * is bounded by the commit rate: the ratio says how close the HTTP layer, the queue and
 * the answers come to it. Commits per pair come from baton_commits_total.
 */
#include "bench.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEASE_CLIENTS 4

typedef struct lease_ctx {
	long pairs; /* per run */
} lease_ctx;

typedef struct lease_thread {
	int port;
	long *left;
	pthread_mutex_t *mu;
	long done, failed;
} lease_thread;

static int take_one(lease_thread *t)
{
	pthread_mutex_lock(t->mu);
	int more = *t->left > 0;
	*t->left -= more;
	pthread_mutex_unlock(t->mu);
	return more;
}

static void *lease_loop(void *arg)
{
	lease_thread *t = arg;
	char body[128], path[128];
	snprintf(body, sizeof body, "{\"holder\":\"bench-%p\",\"wait_ms\":300000}", (void *)t);
	while (take_one(t)) {
		char *resp = NULL;
		int st = http_do(t->port, "POST", "/resources/bench-lock/leases", body, &resp);
		json_t *j = st == 201 && resp ? json_loads(resp, 0, NULL) : NULL;
		const char *id = json_string_value(json_object_get(j, "id"));
		free(resp);
		if (!id) {
			t->failed++;
			json_decref(j);
			continue;
		}
		snprintf(path, sizeof path, "/leases/%s", id);
		json_decref(j);
		if (http_do(t->port, "DELETE", path, NULL, NULL) == 204)
			t->done++;
		else
			t->failed++;
	}
	return NULL;
}

static double commits_now(int port)
{
	return server_metric(port, "baton_commits_total");
}

static int lease_run(const server *s, int run, void *ctx, double *figure, double aux[2])
{
	lease_ctx *c = ctx;
	long left = c->pairs;
	pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	lease_thread t[LEASE_CLIENTS];
	pthread_t th[LEASE_CLIENTS];
	double c0 = commits_now(s->port), t0 = now_s();
	for (int i = 0; i < LEASE_CLIENTS; i++) {
		t[i] = (lease_thread){.port = s->port, .left = &left, .mu = &mu};
		if (pthread_create(&th[i], NULL, lease_loop, &t[i]) != 0)
			return -1;
	}
	long done = 0, failed = 0;
	for (int i = 0; i < LEASE_CLIENTS; i++) {
		pthread_join(th[i], NULL);
		done += t[i].done;
		failed += t[i].failed;
	}
	double secs = now_s() - t0, c1 = commits_now(s->port);
	if (failed || done == 0 || c0 < 0 || c1 < 0) {
		fprintf(stderr, "bench: leases: %ld pairs failed\n", failed);
		return -1;
	}
	*figure = (double)done / secs;
	aux[0] = (c1 - c0) / (double)done;
	printf("  run %d: %ld pairs in %.2f s: %.0f pairs/s, %.2f commits/pair\n", run + 1, done,
	       secs, *figure, aux[0]);
	return 0;
}

int bench_leases(void)
{
	const char *what = "lease pairs, one resource";
	char dir[BENCH_PATH_MAX];
	server s;
	paired_result pr;
	lease_ctx c = {opt.smoke ? 50 : 2000};
	int runs = opt.smoke ? 1 : 5;
	printf("\n== %s: %d clients, acquire (waiting) + release, %ld pairs, %d runs\n", what,
	       LEASE_CLIENTS, c.pairs, runs);
	if (server_setup(what, dir, sizeof dir, &s) != 0)
		return -1;
	int rc = paired_runs(&s, dir, runs, lease_run, &c, 0, &pr);
	server_stop(&s);
	tmpdir_remove(dir);
	if (rc) {
		table_fail(what, "a run failed (see above)");
		return -1;
	}
	row r = {.verdict = V_INFO};
	snprintf(r.what, sizeof r.what, "%s", what);
	snprintf(r.figure, sizeof r.figure, "%.0f pairs/s", pr.figure);
	snprintf(r.floor, sizeof r.floor, "%.0f commits/s", pr.floor_rate);
	snprintf(r.ratio, sizeof r.ratio, "%.2fx", pr.ratio);
	snprintf(r.target, sizeof r.target, "-");
	snprintf(r.note, sizeof r.note,
		 "medians of %d runs of %ld pairs by %d clients, each right after its floor; "
		 "%.2f commits/pair",
		 runs, c.pairs, LEASE_CLIENTS, pr.aux[0]);
	table_add(&r);
	return 0;
}
