/*
 * calls.c - the HTTP step benchmark: one workflow whose workers each make a GET to
 * bench/minjson (the minimal libmicrohttpd handler), so that the resource answers at
 * once and what remains is baton's own cost around a call: the checkpoint before the
 * next step, the thread hand-offs, and libcurl's request on a new connection.
 *
 * The figure is the time per step (last step's finished_at - first step's started_at,
 * over the steps) minus the time of the same GET made directly by this program, each on
 * a new connection as batond makes its calls, measured right after the run. That
 * difference is what baton adds to a call, and it is compared, like the step overhead,
 * with the floor's mean commit time. The issue sets no target for it: it is reported.
 */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

typedef struct calls_ctx {
	int workers;
	int mport; /* minjson's port */
} calls_ctx;

/* {"id", "resource", "call": {GET minjson}, "workers": ["w00000", ...]} (malloc'ed) */
static char *calls_body(const char *id, int workers, int mport)
{
	size_t cap = 256 + (size_t)workers * 12, len = 0;
	char *b = malloc(cap);
	if (!b)
		abort();
	len += (size_t)snprintf(b + len, cap - len,
				"{\"id\":\"%s\",\"resource\":\"%s\",\"call\":{\"url\":"
				"\"http://127.0.0.1:%d/calls\",\"method\":\"GET\"},\"workers\":[",
				id, id, mport);
	for (int i = 0; i < workers; i++)
		len += (size_t)snprintf(b + len, cap - len, "%s\"w%05d\"", i ? "," : "", i);
	snprintf(b + len, cap - len, "]}");
	return b;
}

static size_t discard(char *data, size_t size, size_t nmemb, void *ud)
{
	(void)data;
	(void)ud;
	return size * nmemb;
}

/* Mean time of n GETs to minjson in ms, each with a new handle and connection. */
static double bare_call_ms(int port, int n)
{
	char url[64];
	snprintf(url, sizeof url, "http://127.0.0.1:%d/calls", port);
	int ok = 0;
	double t0 = now_s();
	for (int i = 0; i < n; i++) {
		CURL *c = curl_easy_init();
		if (!c)
			return -1;
		curl_easy_setopt(c, CURLOPT_URL, url);
		curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
		curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10000L);
		curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
		long status = 0;
		if (curl_easy_perform(c) == CURLE_OK)
			curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
		ok += status == 200;
		curl_easy_cleanup(c);
	}
	double ms = (now_s() - t0) * 1000.0 / n;
	return ok == n ? ms : -1;
}

static int calls_run(const server *s, int run, void *ctx, double *figure, double aux[2])
{
	calls_ctx *c = ctx;
	char id[64];
	snprintf(id, sizeof id, "calls-%d", run);
	char *body = calls_body(id, c->workers, c->mport);
	/* Counted from what this batond has finished: on PostgreSQL each run has its own. */
	long before = server_count(s->port, "completed");
	int status = http_do(s->port, "POST", "/workflows", body, NULL);
	free(body);
	if (status != 201 || before < 0 || wait_finished(s->port, before + 1, 600) != 0) {
		fprintf(stderr,
			"bench: HTTP steps: POST answered %d, or the workflow did not end\n",
			status);
		return -1;
	}
	int64_t first, last;
	if (workflow_span(s->port, id, c->workers, "HTTP steps", &first, &last))
		return -1;
	double per_step = (double)(last - first) / (double)c->workers;
	double bare = bare_call_ms(c->mport, c->workers < 500 ? c->workers : 500);
	if (bare < 0) {
		fprintf(stderr, "bench: HTTP steps: minjson did not answer every direct GET\n");
		return -1;
	}
	*figure = per_step - bare;
	aux[0] = per_step;
	aux[1] = bare;
	printf("  run %d: %d steps in %lld ms: %.3f ms/step; a direct GET %.3f ms; baton adds"
	       " %.3f ms\n",
	       run + 1, c->workers, (long long)(last - first), per_step, bare, *figure);
	return 0;
}

int bench_http_steps(void)
{
	const char *what = "HTTP steps";
	char dir[BENCH_PATH_MAX], allow[64];
	server s;
	pid_t mpid;
	calls_ctx c = {opt.smoke ? 50 : 2000, 0};
	int runs = opt.smoke ? 1 : 3;
	printf("\n== %s: one workflow of %d workers, each a GET to minjson, %d runs\n", what,
	       c.workers, runs);
	if (tmpdir_new(dir, sizeof dir) != 0) {
		table_fail(what, "no temporary directory");
		return -1;
	}
	if (minjson_start(dir, NULL, &mpid, &c.mport) != 0) {
		table_fail(what, "could not start minjson");
		tmpdir_remove(dir);
		return -1;
	}
	snprintf(allow, sizeof allow, "http://127.0.0.1:%d/", c.mport);
	const char *const extra[] = {"--allow-call", allow, NULL};
	if (server_start(&s, dir, extra) != 0) {
		table_fail(what, "could not start batond");
		child_stop(mpid);
		tmpdir_remove(dir);
		return -1;
	}
	paired_result pr;
	int rc = paired_runs(&s, dir, runs, calls_run, &c, 1, &pr);
	server_stop(&s);
	child_stop(mpid);
	tmpdir_remove(dir);
	if (rc) {
		table_fail(what, "a run failed (see above)");
		return -1;
	}
	row r = {.verdict = V_INFO};
	snprintf(r.what, sizeof r.what, "HTTP step overhead");
	snprintf(r.figure, sizeof r.figure, "%.3f ms/step beyond the call", pr.figure);
	snprintf(r.floor, sizeof r.floor, "%.3f ms/commit", pr.floor_ms);
	snprintf(r.ratio, sizeof r.ratio, "%.2fx", pr.ratio);
	snprintf(r.target, sizeof r.target, "- (none set)");
	snprintf(r.note, sizeof r.note,
		 "medians of %d runs of %d steps: %.3f ms/step in all, a direct GET on a new"
		 " connection %.3f ms",
		 runs, c.workers, pr.aux[0], pr.aux[1]);
	table_add(&r);
	return 0;
}
