/*
 * steps.c - the benchmarks of the engine through its API: the overhead of one durable
 * step, group commit across many workflows, and handoffs on one contended resource.
 *
 * Times are the server's own: the started_at and finished_at it records for workflows
 * (a workflow's started_at is its first step's grant, its finished_at its last step's
 * end), so client-side polling adds nothing to the figures. Commits per step come from
 * the deltas of baton_commits_total and baton_checkpoints_total in GET /metrics.
 */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A body for workflow id on resource with `workers` zero-work workers (malloc'ed). */
static char *workflow_body(const char *id, const char *resource, int workers, long work_ms)
{
	size_t cap = 256 + (size_t)workers * 48, len = 0;
	char *b = malloc(cap);
	if (!b)
		abort();
	len += (size_t)snprintf(b + len, cap - len,
				"{\"id\":\"%s\",\"resource\":\"%s\",\"workers\":[", id, resource);
	for (int i = 0; i < workers; i++)
		len +=
		    (size_t)snprintf(b + len, cap - len, "%s{\"name\":\"w%05d\",\"work_ms\":%ld}",
				     i ? "," : "", i, work_ms);
	snprintf(b + len, cap - len, "]}");
	return b;
}

static int post_workflow(int port, const char *body)
{
	int status = http_do(port, "POST", "/workflows", body, NULL);
	if (status != 201 && status != 200) {
		fprintf(stderr, "bench: POST /workflows answered %d\n", status);
		return -1;
	}
	return 0;
}

/* Commits and checkpoints so far, from /metrics. */
static int counters(int port, double *commits, double *checkpoints)
{
	char *text = NULL;
	int rc = -1;
	if (http_do(port, "GET", "/metrics", NULL, &text) == 200 && text) {
		*commits = metric_value(text, "baton_commits_total");
		*checkpoints = metric_value(text, "baton_checkpoints_total");
		rc = *commits < 0 || *checkpoints < 0 ? -1 : 0;
	}
	free(text);
	return rc;
}

/* Summaries of the newest workflows on resource (NULL: any), as a JSON array. */
static json_t *list_workflows(int port, const char *resource)
{
	char path[256], *text = NULL;
	snprintf(path, sizeof path, "/workflows?limit=1000%s%s", resource ? "&resource=" : "",
		 resource ? resource : "");
	json_t *list = NULL;
	if (http_do(port, "GET", path, NULL, &text) == 200 && text) {
		json_t *doc = json_loads(text, 0, NULL);
		list = json_incref(json_object_get(doc, "workflows"));
		json_decref(doc);
	}
	free(text);
	return list;
}

static int64_t time_field(const json_t *o, const char *key)
{
	return rfc3339_ms(json_string_value(json_object_get(o, key)));
}

/* Runs the paired runs, stops the server, removes the directory; 0 when all ran. */
static int run_all(const char *what, char *dir, server *s, int runs, run_fn fn, void *ctx,
		   int latency, paired_result *pr)
{
	int rc = paired_runs(s, dir, runs, fn, ctx, latency, pr);
	server_stop(s);
	tmpdir_remove(dir);
	if (rc)
		table_fail(what, "a run failed (see above)");
	return rc;
}

/* ---- step overhead: one workflow of many zero-work workers ---- */

static int one_long_workflow(const server *s, int run, int workers, double *per_step_ms,
			     double *commits_per_step)
{
	char id[64];
	int port = s->port;
	double c0, k0, c1, k1;
	costs_snap u0;
	long before = server_count(port, "completed");
	costs_begin(s, &u0);
	snprintf(id, sizeof id, "so-%d", run);
	char *body = workflow_body(id, id, workers, 0);
	int rc = before < 0 || counters(port, &c0, &k0) || post_workflow(port, body) ||
		 wait_finished(port, before + 1, 600) || counters(port, &c1, &k1);
	free(body);
	if (rc)
		return -1;
	int64_t first, last;
	if (workflow_span(port, id, workers, "step overhead", &first, &last))
		return -1;
	*per_step_ms = (double)(last - first) / (double)workers;
	*commits_per_step = (c1 - c0) / (k1 - k0);
	printf("  run %d: %d steps in %lld ms: %.3f ms/step, %.2f commits/step\n", run + 1, workers,
	       (long long)(last - first), *per_step_ms, *commits_per_step);
	costs_end(s, &u0, workers, "step", (double)(last - first) / 1000.0);
	return 0;
}

typedef struct so_ctx {
	int workers;
} so_ctx;

static int so_run(const server *s, int run, void *ctx, double *figure, double aux[2])
{
	so_ctx *c = ctx;
	return one_long_workflow(s, run, c->workers, figure, &aux[0]);
}

int bench_step_overhead(void)
{
	const char *what = "step overhead";
	char dir[BENCH_PATH_MAX];
	server s;
	paired_result pr;
	so_ctx c = {opt.smoke ? 200 : 10000};
	int runs = opt.smoke ? 1 : 3;
	printf("\n== %s: one workflow of %d zero-work workers, %d runs\n", what, c.workers, runs);
	if (server_setup(what, dir, sizeof dir, &s) ||
	    run_all(what, dir, &s, runs, so_run, &c, 1, &pr))
		return -1;
	row r = {.verdict = pr.ratio <= 1.5 ? V_PASS : V_MISS};
	snprintf(r.what, sizeof r.what, "step overhead");
	snprintf(r.figure, sizeof r.figure, "%.3f ms/step", pr.figure);
	snprintf(r.floor, sizeof r.floor, "%.3f ms/commit", pr.floor_ms);
	snprintf(r.ratio, sizeof r.ratio, "%.2fx", pr.ratio);
	snprintf(r.target, sizeof r.target, "<= 1.5x");
	char costs[300];
	costs_note(&pr, "step", costs, sizeof costs);
	snprintf(r.note, sizeof r.note,
		 "medians of %d runs of %d steps, each right after its floor; %.2f commits/step%s",
		 runs, c.workers, pr.aux[0], costs);
	table_add(&r);
	return 0;
}

/* ---- group commit: many workflows on many resources at once ---- */

typedef struct posts {
	char **bodies;
	long n;
} posts;

static int next_post(void *ctx, long n, const char **method, char *path, size_t pathlen,
		     const char **body)
{
	posts *p = ctx;
	if (n >= p->n)
		return -1;
	*method = "POST";
	snprintf(path, pathlen, "/workflows");
	*body = p->bodies[n];
	return 0;
}

static void posts_free(posts *p)
{
	for (long i = 0; i < p->n; i++)
		free(p->bodies[i]);
	free(p->bodies);
}

/* Span from the first start to the last end of the workflows whose id has prefix. */
static int span_of(int port, const char *resource, const char *prefix, long want, int64_t *first,
		   int64_t *last)
{
	json_t *list = list_workflows(port, resource), *w;
	size_t i;
	long seen = 0;
	*first = INT64_MAX;
	*last = 0;
	json_array_foreach(list, i, w)
	{
		const char *id = json_string_value(json_object_get(w, "id"));
		if (!id || strncmp(id, prefix, strlen(prefix)) != 0)
			continue;
		int64_t a = time_field(w, "started_at"), b = time_field(w, "finished_at");
		if (a < 0 || b < 0)
			continue;
		seen++;
		if (a < *first)
			*first = a;
		if (b > *last)
			*last = b;
	}
	json_decref(list);
	if (seen != want) {
		fprintf(stderr, "bench: %ld of %ld workflows %s* finished\n", seen, want, prefix);
		return -1;
	}
	return 0;
}

static int group_run(const server *s, int run, int nwf, int steps, double *rate, double *cps)
{
	int port = s->port;
	costs_snap u0;
	posts p = {calloc((size_t)nwf, sizeof(char *)), nwf};
	char prefix[32];
	snprintf(prefix, sizeof prefix, "gc%d-", run);
	for (int i = 0; i < nwf; i++) {
		char id[64];
		snprintf(id, sizeof id, "%s%03d", prefix, i);
		p.bodies[i] = workflow_body(id, id, steps, 0);
	}
	double c0, k0, c1, k1;
	load_result lr;
	int64_t first, last;
	long before = server_count(port, "completed");
	costs_begin(s, &u0);
	int rc = counters(port, &c0, &k0) || load_run(port, nwf, nwf, 60, next_post, &p, &lr);
	posts_free(&p);
	if (rc == 0 && lr.ok != nwf) {
		fprintf(stderr, "bench: group commit: %ld of %d submissions failed (status %d)\n",
			lr.failed, nwf, lr.first_status);
		rc = -1;
	}
	load_result_free(&lr);
	if (rc || wait_finished(port, before + nwf, 600) || counters(port, &c1, &k1))
		return -1;
	if (span_of(port, NULL, prefix, nwf, &first, &last))
		return -1;
	double total = (double)nwf * steps;
	*rate = total / ((double)(last - first) / 1000.0);
	*cps = (c1 - c0) / (k1 - k0);
	printf("  run %d: %.0f steps in %lld ms: %.0f steps/s, %.3f commits/step\n", run + 1, total,
	       (long long)(last - first), *rate, *cps);
	costs_end(s, &u0, total, "step", (double)(last - first) / 1000.0);
	return 0;
}

typedef struct gc_ctx {
	int nwf, steps;
} gc_ctx;

static int gc_run(const server *s, int run, void *ctx, double *figure, double aux[2])
{
	gc_ctx *c = ctx;
	return group_run(s, run, c->nwf, c->steps, figure, &aux[0]);
}

int bench_group_commit(void)
{
	const char *what = "group commit";
	char dir[BENCH_PATH_MAX];
	server s;
	paired_result pr;
	gc_ctx c = {opt.smoke ? 10 : 100, opt.smoke ? 10 : 100};
	int runs = opt.smoke ? 1 : 3;
	printf("\n== %s: %d workflows on %d resources, %d zero-work steps each, all at once,"
	       " %d runs\n",
	       what, c.nwf, c.nwf, c.steps, runs);
	if (server_setup(what, dir, sizeof dir, &s) ||
	    run_all(what, dir, &s, runs, gc_run, &c, 0, &pr))
		return -1;
	row r = {.verdict = pr.ratio >= 10 ? V_PASS : V_MISS};
	snprintf(r.what, sizeof r.what, "group commit");
	snprintf(r.figure, sizeof r.figure, "%.0f steps/s", pr.figure);
	snprintf(r.floor, sizeof r.floor, "%.0f commits/s", pr.floor_rate);
	snprintf(r.ratio, sizeof r.ratio, "%.1fx", pr.ratio);
	snprintf(r.target, sizeof r.target, ">= 10x");
	char costs[300];
	costs_note(&pr, "step", costs, sizeof costs);
	snprintf(r.note, sizeof r.note,
		 "medians of %d runs, each right after its floor; %.3f commits/step%s", runs,
		 pr.aux[0], costs);
	table_add(&r);
	return 0;
}

/* ---- one contended resource: handoffs ---- */

/* u0: the costs snapshot taken when the blocker ends (the handoffs begin). */
static int contended_run(const server *s, int run, int nwf, long blocker_ms, double *rate,
			 costs_snap *u0)
{
	int port = s->port;
	char resource[32], blocker[48], prefix[48];
	snprintf(resource, sizeof resource, "ct%d", run);
	snprintf(blocker, sizeof blocker, "ct%d-blocker", run);
	snprintf(prefix, sizeof prefix, "ct%d-w", run);
	/* The blocker holds the resource while the others are queued, so the handoffs are
	 * measured on a full queue and not at the pace of the submissions. */
	char *b = workflow_body(blocker, resource, 1, blocker_ms);
	long before = server_count(port, "completed");
	int rc = post_workflow(port, b);
	double blocker_ends = now_s() + (double)blocker_ms / 1000.0;
	free(b);
	if (rc)
		return -1;
	posts p = {calloc((size_t)nwf, sizeof(char *)), nwf};
	for (int i = 0; i < nwf; i++) {
		char id[64];
		snprintf(id, sizeof id, "%s%04d", prefix, i);
		p.bodies[i] = workflow_body(id, resource, 1, 0);
	}
	load_result lr;
	load_run(port, 32, nwf, 60, next_post, &p, &lr);
	posts_free(&p);
	long ok = lr.ok;
	load_result_free(&lr);
	json_t *bw = get_workflow(port, blocker);
	const char *bstatus = json_string_value(json_object_get(bw, "status"));
	int queued_in_time = bstatus && strcmp(bstatus, "running") == 0;
	json_decref(bw);
	/* The costs from just before the blocker ends: the handoffs and 50 ms of idling. */
	double idle_s = blocker_ends - 0.05 - now_s();
	if (queued_in_time && idle_s > 0)
		sleep_ms((int)(idle_s * 1000));
	costs_begin(s, u0);
	if (ok != nwf || wait_finished(port, before + nwf + 1, 600))
		return -1;
	if (!queued_in_time) {
		fprintf(stderr, "bench: contended: the blocker ended before all were queued\n");
		return -1;
	}
	bw = get_workflow(port, blocker);
	int64_t start = time_field(bw, "finished_at"), first, last;
	json_decref(bw);
	if (start < 0 || span_of(port, resource, prefix, nwf, &first, &last))
		return -1;
	*rate = (double)nwf / ((double)(last - start) / 1000.0);
	printf("  run %d: %d handoffs in %lld ms: %.0f handoffs/s\n", run + 1, nwf,
	       (long long)(last - start), *rate);
	return 0;
}

typedef struct ct_ctx {
	int nwf;
	long blocker_ms;
} ct_ctx;

static int ct_run(const server *s, int run, void *ctx, double *figure, double aux[2])
{
	ct_ctx *c = ctx;
	double c0, k0, c1, k1;
	costs_snap u0;
	/* The handoffs only: from the blocker's end, when the queue is full (the commits of
	 * the submissions before it are counted in commits/step, not here). */
	int rc = counters(s->port, &c0, &k0) ||
		 contended_run(s, run, c->nwf, c->blocker_ms, figure, &u0) ||
		 counters(s->port, &c1, &k1);
	aux[0] = rc ? 0 : (c1 - c0) / (k1 - k0);
	if (rc == 0)
		costs_end(s, &u0, c->nwf, "handoff", c->nwf / *figure);
	return rc ? -1 : 0;
}

int bench_contended(void)
{
	const char *what = "one contended resource";
	char dir[BENCH_PATH_MAX];
	server s;
	paired_result pr;
	ct_ctx c = {opt.smoke ? 100 : 1000, opt.smoke ? 1000 : 3000};
	int runs = opt.smoke ? 1 : 5;
	printf("\n== %s: %d one-step zero-work workflows queued on one resource, %d runs\n", what,
	       c.nwf, runs);
	if (server_setup(what, dir, sizeof dir, &s) ||
	    run_all(what, dir, &s, runs, ct_run, &c, 0, &pr))
		return -1;
	row r = {.verdict = pr.ratio >= 1 ? V_PASS : V_MISS};
	char costs[300];
	costs_note(&pr, "handoff", costs, sizeof costs);
	snprintf(r.what, sizeof r.what, "one contended resource");
	snprintf(r.figure, sizeof r.figure, "%.0f handoffs/s", pr.figure);
	snprintf(r.floor, sizeof r.floor, "%.0f commits/s", pr.floor_rate);
	snprintf(r.ratio, sizeof r.ratio, "%.2fx", pr.ratio);
	snprintf(r.target, sizeof r.target, ">= 1x");
	snprintf(r.note, sizeof r.note,
		 "medians of %d runs of %d handoffs, each right after its floor; %.2f commits/step"
		 " (the blocker's and the submissions' commits included)%s",
		 runs, c.nwf, pr.aux[0], costs);
	table_add(&r);
	return 0;
}
