/*
 * http.c - the HTTP benchmarks: POST /workflows (accept) and GET /workflows/{id}
 * (read), each over 32 keep-alive connections in a closed loop (load.c).
 *
 * Accept: every POST submits a one-step zero-work workflow on one of 32 resources, so
 * the accepted workflows also run and finish while the load goes on: the figure is a
 * rate batond sustains, not one that grows a backlog. Its floor is the commit floor.
 *
 * Read: GET of one of 1,000 finished one-step workflows chosen at random, against the
 * same load on bench/minjson, a minimal libmicrohttpd JSON handler in the same
 * threading mode as batond (internal thread pool of --http-threads threads). The two
 * alternate, run after run, so that both see the same noise.
 */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#define CONNS 32

typedef struct accept_ctx {
	const char *prefix;
	int nres;
	char body[256];
} accept_ctx;

/* A one-step zero-work workflow on resource PREFIX-(n % nres). */
static int next_submit(void *ctx, long n, const char **method, char *path, size_t pathlen,
		       const char **body)
{
	accept_ctx *a = ctx;
	snprintf(a->body, sizeof a->body,
		 "{\"resource\":\"%s-%02ld\",\"workers\":[{\"name\":\"w\",\"work_ms\":0}]}",
		 a->prefix, n % a->nres);
	*method = "POST";
	snprintf(path, pathlen, "/workflows");
	*body = a->body;
	return 0;
}

static double rate_of(const load_result *lr)
{
	return lr->seconds > 0 ? (double)lr->ok / lr->seconds : 0;
}

static void free3(dvec *a, dvec *b, dvec *c)
{
	dvec_free(a);
	dvec_free(b);
	dvec_free(c);
}

typedef struct acc_run_ctx {
	double seconds;
	long total;
} acc_run_ctx;

static int accept_run(const server *s, int run, void *ctx, double *figure, double aux[2])
{
	acc_run_ctx *c = ctx;
	char prefix[16];
	snprintf(prefix, sizeof prefix, "acc%d", run);
	accept_ctx a = {.prefix = prefix, .nres = CONNS};
	load_result lr;
	costs_snap u0;
	/* Counted from what this batond has finished: on PostgreSQL each run has its own. */
	c->total = server_count(s->port, "completed");
	costs_begin(s, &u0);
	load_run(s->port, CONNS, 10000000, c->seconds, next_submit, &a, &lr);
	*figure = rate_of(&lr);
	aux[0] = percentile(lr.lat_ms.v, lr.lat_ms.n, 50);
	aux[1] = percentile(lr.lat_ms.v, lr.lat_ms.n, 99);
	printf("  run %d: %ld accepted in %.2f s: %.0f req/s, p50 %.2f ms, p99 %.2f ms,"
	       " %ld failed\n",
	       run + 1, lr.ok, lr.seconds, *figure, aux[0], aux[1], lr.failed);
	if (lr.ok)
		costs_end(s, &u0, (double)lr.ok, "request", lr.seconds);
	int rc = lr.failed || !lr.ok ? -1 : 0;
	if (rc)
		fprintf(stderr, "bench: accept: first failure: status %d\n", lr.first_status);
	c->total += lr.ok;
	load_result_free(&lr);
	/* The accepted workflows must also finish: the rate is one batond sustains. */
	if (rc == 0 && wait_finished(s->port, c->total, 120) != 0)
		rc = -1;
	return rc;
}

int bench_http_accept(void)
{
	const char *what = "HTTP accept";
	char dir[BENCH_PATH_MAX];
	server s;
	paired_result pr;
	acc_run_ctx c = {opt.smoke ? 0.5 : 5, 0};
	int runs = opt.smoke ? 1 : 3;
	printf("\n== %s: POST /workflows over %d connections, %d runs of %g s\n", what, CONNS, runs,
	       c.seconds);
	if (server_setup(what, dir, sizeof dir, &s) != 0)
		return -1;
	int rc = paired_runs(&s, dir, runs, accept_run, &c, 0, &pr);
	server_stop(&s);
	tmpdir_remove(dir);
	if (rc) {
		table_fail(what, "requests failed or workflows did not finish (see above)");
		return -1;
	}
	row r = {.verdict = pr.ratio >= 5 ? V_PASS : V_MISS};
	snprintf(r.what, sizeof r.what, "HTTP accept");
	snprintf(r.figure, sizeof r.figure, "%.0f req/s (p50 %.1f, p99 %.1f ms)", pr.figure,
		 pr.aux[0], pr.aux[1]);
	snprintf(r.floor, sizeof r.floor, "%.0f commits/s", pr.floor_rate);
	snprintf(r.ratio, sizeof r.ratio, "%.1fx", pr.ratio);
	snprintf(r.target, sizeof r.target, ">= 5x, p99 reported");
	char costs[300];
	costs_note(&pr, "request", costs, sizeof costs);
	snprintf(r.note, sizeof r.note,
		 "medians of %d runs of %g s over %d connections, each right after its floor;"
		 " one-step zero-work workflows on %d resources, all of which ran to completion%s",
		 runs, c.seconds, CONNS, CONNS, costs);
	table_add(&r);
	return 0;
}

/* ---- read ---- */

typedef struct read_ctx {
	long nwf;
	uint64_t rng;
} read_ctx;

static int next_read(void *ctx, long n, const char **method, char *path, size_t pathlen,
		     const char **body)
{
	read_ctx *r = ctx;
	(void)n;
	r->rng ^= r->rng << 13; /* xorshift64 */
	r->rng ^= r->rng >> 7;
	r->rng ^= r->rng << 17;
	*method = "GET";
	snprintf(path, pathlen, "/workflows/rd-%05ld", (long)(r->rng % (uint64_t)r->nwf));
	*body = NULL;
	return 0;
}

typedef struct id_ctx {
	char body[256];
	long n;
} id_ctx;

static int next_named(void *ctx, long n, const char **method, char *path, size_t pathlen,
		      const char **body)
{
	id_ctx *c = ctx;
	if (n >= c->n)
		return -1;
	snprintf(c->body, sizeof c->body,
		 "{\"id\":\"rd-%05ld\",\"resource\":\"rd-%02ld\",\"workers\":[{\"name\":\"w\","
		 "\"work_ms\":0}]}",
		 n, n % CONNS);
	*method = "POST";
	snprintf(path, pathlen, "/workflows");
	*body = c->body;
	return 0;
}

/* One timed run of GETs against port; adds its rate and latencies. */
static int read_run(int port, pid_t pid, long nwf, double seconds, dvec *rates, dvec *p50s,
		    dvec *p99s, const char *who, int run)
{
	read_ctx c = {nwf, 0x9e3779b97f4a7c15ULL + (uint64_t)run};
	load_result lr;
	cpu_snap u0, u1;
	double busiest;
	cpu_take(pid, &u0);
	load_run(port, CONNS, 100000000, seconds, next_read, &c, &lr);
	cpu_take(pid, &u1);
	double cpu = cpu_delta(&u0, &u1, &busiest);
	double p50 = percentile(lr.lat_ms.v, lr.lat_ms.n, 50);
	double p99 = percentile(lr.lat_ms.v, lr.lat_ms.n, 99);
	printf("  run %d %-8s %ld answers in %.2f s: %.0f req/s, p50 %.2f ms, p99 %.2f ms,"
	       " %ld failed\n",
	       run + 1, who, lr.ok, lr.seconds, rate_of(&lr), p50, p99, lr.failed);
	printf("         %s CPU %.1f us/request (%.2f cores)\n", who, cpu / (double)lr.ok * 1e6,
	       cpu / lr.seconds);
	int rc = lr.failed || !lr.ok ? -1 : 0;
	if (rc)
		fprintf(stderr, "bench: read: %s: first failure: status %d\n", who,
			lr.first_status);
	dvec_push(rates, rate_of(&lr));
	dvec_push(p50s, p50);
	dvec_push(p99s, p99);
	load_result_free(&lr);
	return rc;
}

static size_t body_size(int port, const char *path)
{
	char *text = NULL;
	size_t n = 0;
	if (http_do(port, "GET", path, NULL, &text) == 200 && text)
		n = strlen(text);
	free(text);
	return n;
}

int bench_http_read(void)
{
	const char *what = "HTTP read";
	char dir[BENCH_PATH_MAX];
	server s;
	pid_t mpid = 0;
	int mport = 0, runs = opt.smoke ? 1 : 3, failed = 0;
	long nwf = opt.smoke ? 100 : 1000;
	double seconds = opt.smoke ? 0.5 : 4;
	printf("\n== %s: GET /workflows/{id} over %d connections, %ld workflows, %d runs of"
	       " %g s each against batond and minjson, alternating\n",
	       what, CONNS, nwf, runs, seconds);
	if (tmpdir_new(dir, sizeof dir) != 0) {
		table_fail(what, "no temporary directory");
		return -1;
	}
	if (server_start(&s, dir, NULL) != 0 || minjson_start(dir, NULL, &mpid, &mport) != 0) {
		server_stop(&s);
		tmpdir_remove(dir);
		table_fail(what, "could not start batond or minjson");
		return -1;
	}
	id_ctx ic = {.n = nwf};
	load_result lr;
	load_run(s.port, CONNS, nwf, 120, next_named, &ic, &lr);
	failed = lr.ok != nwf || wait_finished(s.port, nwf, 120) != 0;
	load_result_free(&lr);
	dvec br = {0}, b50 = {0}, b99 = {0}, mr = {0}, m50 = {0}, m99 = {0};
	for (int i = 0; i < runs && !failed; i++)
		failed = read_run(s.port, s.pid, nwf, seconds, &br, &b50, &b99, "batond", i) ||
			 read_run(mport, mpid, nwf, seconds, &mr, &m50, &m99, "minjson", i);
	size_t bsize = body_size(s.port, "/workflows/rd-00000");
	size_t msize = body_size(mport, "/workflows/rd-00000");
	child_stop(mpid);
	server_stop(&s);
	tmpdir_remove(dir);
	if (!failed) {
		double b = median(br.v, br.n), m = median(mr.v, mr.n);
		row r = {.verdict = b >= 0.5 * m ? V_PASS : V_MISS};
		snprintf(r.what, sizeof r.what, "HTTP read");
		snprintf(r.figure, sizeof r.figure, "%.0f req/s (p50 %.1f, p99 %.1f ms)", b,
			 median(b50.v, b50.n), median(b99.v, b99.n));
		snprintf(r.floor, sizeof r.floor, "minjson %.0f req/s (p99 %.1f ms)", m,
			 median(m99.v, m99.n));
		snprintf(r.ratio, sizeof r.ratio, "%.0f%%", 100.0 * b / m);
		snprintf(r.target, sizeof r.target, ">= 50%%");
		snprintf(r.note, sizeof r.note,
			 "median of %d alternating runs of %g s over %d connections; bodies %zu"
			 " bytes (batond) and %zu bytes (minjson)",
			 runs, seconds, CONNS, bsize, msize);
		table_add(&r);
	} else {
		table_fail(what, "set-up or requests failed (see above)");
	}
	free3(&br, &b50, &b99);
	free3(&mr, &m50, &m99);
	return failed ? -1 : 0;
}
