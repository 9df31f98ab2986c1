/*
 * test_ops.c - batond's operations features over HTTP, against the real binary: the
 * Prometheus exposition (checked by a strict parser of the text format 0.0.4, prom.h,
 * and its values as workflows run), the health checks, /readyz while the disk fails,
 * SIGTERM with and without a shutdown timeout (and the log lines that say what it waits
 * for, until when, and that it stopped), a second SIGTERM that exits at once and says so,
 * a second batond refused on the same database, the pid file (--pid-file: written,
 * 0600, removed at every stop but SIGKILL), the start-up line (retention on or off),
 * JSON logs, --listen :PORT on every
 * interface, and HEAD wherever GET is served. Bearer-token access control
 * is tested in test_auth.c, the event streams in test_streams.c.
 *
 * Each test starts its own batond on a fresh temporary database (harness.h). The one
 * helper thread (hs_stop during a drain) only records results, which the test thread
 * asserts after joining it.
 */
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libgen.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "../harness/faulty.h"
#include "../harness/calls.h"
#include "../harness/harness.h"
#include "../harness/prom.h"
#include "../harness/sse.h"

#define WAIT_MS 30000

/* ---- fixtures ---------------------------------------------------------------------- */

static int open_with(void **state, const char *const *args)
{
	hs_server *s = hs_open(args);
	*state = s;
	return s ? 0 : -1;
}

static int setup(void **state)
{
	return open_with(state, NULL);
}

static int setup_json_log(void **state)
{
	static const char *const args[] = {"--log-format", "json", NULL};
	return open_with(state, args);
}

/* ---- small helpers ----------------------------------------------------------------- */

/* A workflow `id` on `resource` whose workers w0, w1 ... take work_ms[i] each. */
static void submit(const hs_server *s, const char *id, const char *resource, const int *work_ms,
		   size_t n)
{
	json_t *workers = json_array();
	for (size_t i = 0; i < n; i++) {
		char name[32];
		snprintf(name, sizeof name, "w%zu", i);
		json_array_append_new(workers,
				      json_pack("{s:s, s:i}", "name", name, "work_ms", work_ms[i]));
	}
	json_decref(hs_create_workflow(
	    s, json_pack("{s:s, s:s, s:o}", "id", id, "resource", resource, "workers", workers)));
}

static bool log_has(const hs_server *s, const char *needle)
{
	char *log = hs_log_text(s);
	bool hit = log && strstr(log, needle);
	free(log);
	return hit;
}

/* Fails, showing the log, unless the server's log holds `needle`. */
static void assert_logged(const hs_server *s, const char *needle, bool want)
{
	if (log_has(s, needle) == want)
		return;
	hs_dump_log(s, 4000);
	fail_msg("the log %s \"%s\"", want ? "lacks" : "has", needle);
}

/* The last line of the server's log (a static copy, without its newline). */
static const char *last_log_line(const hs_server *s)
{
	static char line[1024];
	char *log = hs_log_text(s);
	size_t n = log ? strlen(log) : 0;
	while (n > 0 && log[n - 1] == '\n')
		n--;
	size_t start = n;
	while (start > 0 && log[start - 1] != '\n')
		start--;
	snprintf(line, sizeof line, "%.*s", (int)(n - start), log ? log + start : "");
	free(log);
	return line;
}

/* Fails unless the log's last line ends with `tail`. */
static void assert_log_ends_with(const hs_server *s, const char *tail)
{
	const char *line = last_log_line(s);
	size_t n = strlen(line), t = strlen(tail);
	if (n < t || strcmp(line + n - t, tail) != 0) {
		hs_dump_log(s, 4000);
		fail_msg("the log's last line is \"%s\", expected it to end with \"%s\"", line,
			 tail);
	}
}

/* ---- metrics and health --------------------------------------------------------- */

/*
 * The parser itself refuses what a scraper would: without this, the exposition test
 * could pass with a parser that accepts anything.
 */
static void test_metrics_parser_is_strict(void **state)
{
	(void)state;
	static const char good[] =
	    "# HELP a_total Things.\n# TYPE a_total counter\na_total 3\n"
	    "# HELP h Times.\n# TYPE h histogram\nh_bucket{r=\"x\",le=\"0.5\"} 1\n"
	    "h_bucket{r=\"x\",le=\"+Inf\"} 2\nh_sum{r=\"x\"} 1.5\nh_count{r=\"x\"} 2\n"
	    "# TYPE g gauge\ng{s=\"a\\\"b\\\\c\\n\"} -1e-3 1700000000000\ng{s=\"b\",} NaN\n";
	static const char *const bad[] = {
	    "a_total 1\n",			      /* no TYPE */
	    "# TYPE a_total counter\na_total 1",      /* no final newline */
	    "# TYPE 1a gauge\n",		      /* bad name */
	    "# TYPE g gauge\ng{1x=\"a\"} 1\n",	      /* bad label name */
	    "# TYPE g gauge\ng{__x=\"a\"} 1\n",	      /* reserved label */
	    "# TYPE g gauge\ng{x=\"a\\t\"} 1\n",      /* bad escape */
	    "# TYPE g gauge\ng{x=\"a\"  1\n",	      /* unclosed labels */
	    "# TYPE g gauge\ng{x=\"a\",x=\"b\"} 1\n", /* label twice */
	    "# TYPE g gauge\ng 1\ng 2\n",	      /* series twice */
	    "# TYPE g gauge\ng one\n",		      /* bad value */
	    "# TYPE g gauge\ng 0x10\n",		      /* bad value */
	    "# TYPE g gauge\ng 1 2 3\n",	      /* trailing junk */
	    "# TYPE g gauge\ng  1\n",		      /* two spaces */
	    "# TYPE g gauge\n# TYPE g gauge\n",	      /* TYPE twice */
	    "# TYPE g gauge\ng 1\n# HELP g late\n",   /* HELP after samples */
	    "# TYPE g lever\n",			      /* unknown type */
	    "# TYPE c counter\nc 1\n",		      /* counter not _total */
	    "# TYPE c_total counter\nc_total -1\n",   /* negative counter */
	    "# TYPE g gauge\ng{a=\"1\"} 1\n# TYPE f gauge\nf 1\ng{a=\"2\"} 1\n", /* split */
	    "# TYPE h histogram\nh 1\n", /* bare histogram */
	    "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\n"
	    "h_sum 1\nh_count 1\n", /* decreasing */
	    "# TYPE h histogram\nh_bucket{le=\"2\"} 1\nh_bucket{le=\"1\"} 1\n"
	    "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",		      /* le not ascending */
	    "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n", /* no +Inf */
	    "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 3\n", /* != count */
	    "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_count 2\n",		 /* no _sum */
	    "# TYPE h histogram\nh_bucket{le=\"x\"} 2\nh_sum 1\nh_count 2\n",	 /* bad le */
	    "# TYPE h histogram\nh_sum{le=\"1\"} 1\n",				 /* le on _sum */
	};
	json_t *doc = NULL;
	char err[512];
	if (prom_parse(good, &doc, err, sizeof err) != 0)
		fail_msg("the parser refuses a valid exposition: %s", err);
	prom_assert_metric(doc, "h_count", "r=x", 2);
	assert_true(isnan(prom_metric(doc, "g", "s=b")));
	assert_true(prom_metric(doc, "g", "s=a\"b\\c\n") == -1e-3);
	assert_true(isnan(prom_metric(doc, "g", "s=c")));
	json_decref(doc);
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		doc = NULL;
		if (prom_parse(bad[i], &doc, err, sizeof err) == 0) {
			json_decref(doc);
			fail_msg("the parser accepts invalid exposition #%zu:\n%s", i, bad[i]);
		}
	}
}

static const char *const FAMILIES[][2] = {
    {"baton_workflows", "gauge"},
    {"baton_steps_completed_total", "counter"},
    {"baton_steps_failed_total", "counter"},
    {"baton_steps_retried_total", "counter"},
    {"baton_commits_total", "counter"},
    {"baton_checkpoints_total", "counter"},
    {"baton_commit_duration_seconds", "histogram"},
    {"baton_checkpoints_per_commit", "histogram"},
    {"baton_resource_queue_depth", "gauge"},
    {"baton_resource_held", "gauge"},
    {"baton_lock_wait_seconds", "histogram"},
    {"baton_lock_hold_seconds", "histogram"},
    {"baton_http_requests_total", "counter"},
    {"baton_http_request_duration_seconds", "histogram"},
    {"baton_event_streams", "gauge"},
};

/* Sum of the integer member `key` of the resource's events of `type`, in seconds. */
static double events_seconds(const json_t *events, const char *type, const char *key)
{
	double sum = 0;
	size_t i;
	json_t *ev;
	json_array_foreach(events, i, ev)
	{
		if (strcmp(hs_str(ev, "type"), type) == 0)
			sum += (double)hs_int(ev, key) / 1000.0;
	}
	return sum;
}

/* How many lock_released events held for at most `le` seconds. */
static double holds_within(const json_t *events, double le)
{
	size_t i;
	json_t *ev;
	double n = 0;
	json_array_foreach(events, i, ev)
	{
		if (strcmp(hs_str(ev, "type"), "lock_released") == 0 &&
		    (double)hs_int(ev, "hold_ms") / 1000.0 <= le)
			n++;
	}
	return n;
}

static bool past(void *arg)
{
	return hs_now_ms() > *(const int64_t *)arg;
}

/*
 * GET /metrics is text/plain; version=0.0.4 and parses strictly, with a HELP and the
 * right TYPE for every documented family; its values follow the work: a held resource
 * and a queued step show as running/pending workflows, held = 1 and queue depth 1;
 * after three workflows (5 steps) the counters, gauges and histograms say exactly so:
 * steps completed, workflows completed, POST 201 requests, lock hold and wait
 * histograms per resource (counts, sums equal to the events' hold_ms/waited_ms, each
 * hold in the bucket its event says), commits with their checkpoints per commit; no
 * counter goes down. The held resource is a call that the test resource holds until the
 * test has looked and at least 1.3 s have passed (calls_submit_gated), so no check
 * depends on how fast the machine is.
 */
static void test_metrics_exposition_and_values(void **state)
{
	calls_ctx *c = *state;
	hs_server *s = c->s;
	json_t *m0 = prom_scrape(s);
	json_t *fams = json_object_get(m0, "families");
	for (size_t i = 0; i < sizeof FAMILIES / sizeof FAMILIES[0]; i++) {
		json_t *f = json_object_get(fams, FAMILIES[i][0]);
		if (!f || strcmp(hs_str(f, "type"), FAMILIES[i][1]) != 0 ||
		    !json_is_true(json_object_get(f, "help")))
			fail_msg("/metrics lacks family %s of type %s with HELP", FAMILIES[i][0],
				 FAMILIES[i][1]);
	}
	prom_assert_metric(m0, "baton_steps_completed_total", "", 0);
	prom_assert_metric(m0, "baton_event_streams", "", 0);
	double commits0 = prom_metric_of(m0, "baton_commits_total", "");

	static const int quick[] = {50}, three[] = {30, 30, 30};
	calls_submit_gated(c, "m-hold", "meter", 1);
	json_t *holding = hs_wait_step(s, "m-hold", 0, "running", WAIT_MS);
	int64_t hold_until = hs_time(hs_step_at(holding, 0), "started_at") + 1300;
	json_decref(holding);
	submit(s, "m-queued", "meter", quick, 1);
	json_decref(hs_wait_step(s, "m-queued", 0, "waiting", WAIT_MS));
	prom_wait_metric(s, "baton_resource_queue_depth", "resource=meter", 1, WAIT_MS);
	json_t *m1 = prom_scrape(s);
	prom_assert_metric(m1, "baton_resource_held", "resource=meter", 1);
	prom_assert_metric(m1, "baton_workflows", "status=running", 1);
	prom_assert_metric(m1, "baton_workflows", "status=pending", 1);
	prom_assert_metric(m1, "baton_http_requests_total",
			   "route=/workflows,method=POST,status=201", 2);
	assert_true(prom_metric_of(m1, "baton_http_requests_total",
				   "route=/metrics,method=GET,status=200") >= 1);

	assert_true(hs_wait_until(past, &hold_until, WAIT_MS));
	fragile_open_gate(c->res);
	submit(s, "m-three", "meter-2", three, 3);
	json_decref(hs_wait_workflow(s, "m-hold", "completed", WAIT_MS));
	json_decref(hs_wait_workflow(s, "m-queued", "completed", WAIT_MS));
	json_decref(hs_wait_workflow(s, "m-three", "completed", WAIT_MS));
	prom_wait_metric(s, "baton_steps_completed_total", "", 5, WAIT_MS);
	json_t *m2 = prom_scrape(s);
	prom_assert_metric(m2, "baton_workflows", "status=completed", 3);
	prom_assert_metric(m2, "baton_workflows", "status=running", 0);
	prom_assert_metric(m2, "baton_workflows", "status=pending", 0);
	prom_assert_metric(m2, "baton_steps_failed_total", "", 0);
	prom_assert_metric(m2, "baton_steps_retried_total", "", 0);
	prom_assert_metric(m2, "baton_checkpoints_total", "", 5);
	prom_assert_metric(m2, "baton_http_requests_total",
			   "route=/workflows,method=POST,status=201", 3);
	prom_assert_metric(m2, "baton_resource_held", "resource=meter", 0);
	prom_assert_metric(m2, "baton_resource_queue_depth", "resource=meter", 0);
	prom_assert_metric(m2, "baton_lock_hold_seconds_count", "resource=meter", 2);
	prom_assert_metric(m2, "baton_lock_hold_seconds_count", "resource=meter-2", 3);
	prom_assert_metric(m2, "baton_lock_wait_seconds_count", "resource=meter", 2);
	prom_assert_metric(m2, "baton_lock_wait_seconds_count", "resource=meter-2", 3);

	json_t *doc = hs_get_json(s, "/resources/meter/events", 200);
	json_t *evs = json_object_get(doc, "events");
	/* Each hold in the buckets its event's hold_ms says (the held one is over 1.3 s). */
	static const char *const les[] = {"1", "2.5", "10"};
	for (size_t i = 0; i < 3; i++) {
		char labels[64];
		snprintf(labels, sizeof labels, "resource=meter,le=%s", les[i]);
		prom_assert_metric(m2, "baton_lock_hold_seconds_bucket", labels,
				   holds_within(evs, atof(les[i])));
	}
	double hold_sum = prom_metric_of(m2, "baton_lock_hold_seconds_sum", "resource=meter");
	double wait_sum = prom_metric_of(m2, "baton_lock_wait_seconds_sum", "resource=meter");
	double hold_ev = events_seconds(evs, "lock_released", "hold_ms");
	double wait_ev = events_seconds(evs, "lock_acquired", "waited_ms");
	if (fabs(hold_sum - hold_ev) > 0.002 || hold_sum < 1.3)
		fail_msg("hold sum %g s, events say %g s (>= 1.3 s)", hold_sum, hold_ev);
	if (fabs(wait_sum - wait_ev) > 0.002 || wait_sum < 0.3)
		fail_msg("wait sum %g s, events say %g s (m-queued waited for m-hold)", wait_sum,
			 wait_ev);
	json_decref(doc);

	/* Group commit: every commit is observed once, every checkpoint once. */
	double commits = prom_metric_of(m2, "baton_commits_total", "");
	if (commits <= commits0)
		fail_msg("baton_commits_total stayed %g after 5 steps", commits);
	prom_assert_metric(m2, "baton_checkpoints_per_commit_count", "", commits);
	prom_assert_metric(m2, "baton_commit_duration_seconds_count", "", commits);
	prom_assert_metric(m2, "baton_checkpoints_per_commit_sum", "", 5);
	assert_true(prom_metric_of(m2, "baton_http_request_duration_seconds_count", "") >
		    prom_metric_of(m0, "baton_http_request_duration_seconds_count", ""));
	assert_true(prom_metric_of(m2, "baton_http_requests_total",
				   "route=/metrics,method=GET,status=200") >= 2);
	prom_assert_monotonic(m0, m2);
	prom_assert_monotonic(m1, m2);
	json_decref(m0);
	json_decref(m1);
	json_decref(m2);
}

/* A health endpoint answers 200 application/json {"status": want}. */
static void assert_health(const hs_server *s, const char *path, const char *want)
{
	json_t *body = hs_get_json(s, path, 200);
	assert_string_equal(hs_str(body, "status"), want);
	json_decref(body);
}

/* /healthz and /readyz answer 200 JSON, also after a restart on the same database. */
static void test_health_endpoints(void **state)
{
	hs_server *s = *state;
	assert_health(s, "/healthz", "ok");
	assert_health(s, "/readyz", "ready");
	static const int work[] = {0};
	submit(s, "h", "bell", work, 1);
	json_decref(hs_wait_workflow(s, "h", "completed", WAIT_MS));
	assert_int_equal(hs_stop(s), 0);
	assert_int_equal(hs_start(s), 0);
	assert_health(s, "/healthz", "ok");
	assert_health(s, "/readyz", "ready");
}

static bool is_ready(void *arg)
{
	hs_response r;
	hs_get(arg, "/readyz", &r);
	bool ok = r.status == 200;
	hs_response_fini(&r);
	return ok;
}

/*
 * /readyz tells whether the database takes writes: while every write fails, a POST is
 * refused with 503 and /readyz answers a 503 problem, though /healthz (the process is
 * up) stays 200; once writes work again /readyz is 200 again and a POST is stored.
 */
static void test_readyz_follows_storage(void **state)
{
	if (hs_store_is_pg())
		skip(); /* the write faults come from SQLite's VFS (faulty.h) */
	hs_faulty *f = *state;
	hs_server *s = f->s;
	assert_health(s, "/readyz", "ready");
	FILE *fp = fopen(f->file, "w");
	assert_non_null(fp);
	fclose(fp);
	sse_reply x;
	sse_call(s, "POST", "/workflows", NULL,
		 "{\"id\":\"lost\",\"resource\":\"disk\",\"workers\":[\"a\"]}", &x);
	hs_assert_problem(&x.r, 503, "unavailable", "POST /workflows while writes fail");
	sse_reply_fini(&x);
	sse_call(s, "GET", "/readyz", NULL, NULL, &x);
	hs_assert_problem(&x.r, 503, "unavailable", "GET /readyz while writes fail");
	sse_reply_fini(&x);
	assert_health(s, "/healthz", "ok");

	unlink(f->file);
	if (!hs_wait_until(is_ready, s, WAIT_MS))
		fail_msg("/readyz did not answer 200 after the storage recovered");
	static const int work[] = {0};
	submit(s, "kept", "disk", work, 1);
	json_decref(hs_wait_workflow(s, "kept", "completed", WAIT_MS));
	json_decref(hs_get_json(s, "/workflows/lost", 404));
}

/* ---- SIGTERM ------------------------------------------------------------------------ */

typedef struct stopper {
	hs_server *s;
	int status;
	int64_t wall; /* when hs_stop returned */
} stopper;

static void *stop_main(void *arg)
{
	stopper *t = arg;
	/* hs_stop's deadline is for a prompt exit; this one drains an 8 s step first */
	t->status = hs_signal(t->s, SIGTERM) ? -1 : hs_wait_exit(t->s, 8000 + WAIT_MS);
	t->wall = hs_now_ms();
	return NULL;
}

/* GET /healthz until no answer comes (the listener closed); that time, or -1. */
static int64_t wait_refused(const hs_server *s, int timeout_ms)
{
	int64_t deadline = hs_mono_ms() + timeout_ms;
	while (hs_mono_ms() < deadline) {
		hs_response r;
		hs_get(s, "/healthz", &r);
		long status = r.status;
		hs_response_fini(&r);
		if (status == 0)
			return hs_now_ms();
		struct timespec ts = {0, HS_POLL_MS * 1000000L};
		nanosleep(&ts, NULL);
	}
	return -1;
}

static bool shutting_down(void *arg)
{
	return log_has(arg, "shutting down");
}

/*
 * SIGTERM while step 1 of 3 (8 s, far longer than the listener takes to close, even
 * under valgrind) runs: the listener closes while the step goes on, the step finishes and is
 * checkpointed, step 2 does not start, batond logs "stopped" and exits 0. After a restart the
 * workflow completes with one attempt per step: nothing finished ran again, nothing was
 * interrupted.
 */
static void test_sigterm_lets_running_step_finish(void **state)
{
	hs_server *s = *state;
	static const int work[] = {100, 8000, 100};
	submit(s, "drain", "kiln", work, 3);
	json_decref(hs_wait_step(s, "drain", 1, "running", WAIT_MS));

	stopper t = {.s = s};
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, stop_main, &t), 0);
	/* No assertion may fail while the thread uses s: record, join, then check. */
	bool logged = hs_wait_until(shutting_down, s, WAIT_MS);
	int64_t refused_at = logged ? wait_refused(s, WAIT_MS) : -1;
	pthread_join(th, NULL);
	assert_true(logged);
	assert_int_equal(t.status, 0);
	if (refused_at < 0)
		fail_msg("batond kept answering after SIGTERM");
	assert_logged(s, "stopped", true);
	assert_logged(s, "steps still running", false);
	/* What it waited for, and until when; then that it stopped, last. */
	assert_logged(s, "SIGTERM: shutting down: waiting for 1 running step, up to 30 s (until ",
		      true);
	assert_logged(s, "send SIGTERM or SIGINT again to stop at once", true);
	assert_log_ends_with(s, "INFO  stopped");

	int64_t restarted = hs_now_ms();
	assert_int_equal(hs_start(s), 0);
	json_t *wf = hs_wait_workflow(s, "drain", "completed", WAIT_MS);
	for (size_t i = 0; i < 3; i++) {
		json_t *st = hs_step_at(wf, i);
		assert_string_equal(hs_str(st, "status"), "completed");
		if (hs_int(st, "attempts") != 1)
			fail_msg("step %zu has %lld attempts after SIGTERM and restart, expected 1",
				 i, (long long)hs_int(st, "attempts"));
	}
	int64_t step1_done = hs_time(hs_step_at(wf, 1), "finished_at");
	if (step1_done > t.wall)
		fail_msg("step 1 finished at %lld, after batond exited at %lld",
			 (long long)step1_done, (long long)t.wall);
	if (refused_at >= step1_done)
		fail_msg("the listener closed at %lld, not before step 1 finished (%lld)",
			 (long long)refused_at, (long long)step1_done);
	if (hs_time(hs_step_at(wf, 2), "started_at") < restarted)
		fail_msg("step 2 started during the shutdown");
	json_t *events = hs_get_events(s, "drain");
	assert_int_equal(hs_event_count(events, "step_interrupted", -1, -1), 0);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(hs_event_count(events, "lock_acquired", i, -1), 1);
		assert_int_equal(hs_event_count(events, "step_completed", i, -1), 1);
	}
	json_decref(events);
	json_decref(wf);
}

/*
 * SIGTERM in a stream of short steps, ten times over: each time batond exits 0 once the
 * step it was running (if any) is checkpointed, and no step starts during the shutdown.
 * Started again each time, it completes the workflow with every step attempted once and
 * the resource called once per step. (A round that was granting the next step when the
 * signal came could send it after the shutdown had found no step running; that call was
 * cut off, and made again after the restart.)
 */
static void test_sigterm_starts_no_step(void **state)
{
	calls_ctx *c = *state;
	hs_server *s = c->s;
	enum { STEPS = 1000, STOPS = 10 };
	json_t *workers = json_array();
	for (int i = 0; i < STEPS; i++) {
		char name[32];
		snprintf(name, sizeof name, "w%d", i);
		json_array_append_new(workers, json_pack("{s:s}", "name", name));
	}
	calls_create(s, json_pack("{s:s, s:s, s:o, s:{s:s}}", "id", "stream", "resource", "tap",
				  "workers", workers, "call", "url", c->url));
	for (int k = 1; k <= STOPS; k++) {
		assert_true(fragile_wait_applied(c->res, (size_t)k * STEPS / (STOPS + 1), WAIT_MS));
		assert_int_equal(hs_stop(s), 0);
		assert_logged(s, "steps still running", false);
		assert_int_equal(hs_start(s), 0);
	}
	json_t *wf = hs_wait_workflow(s, "stream", "completed", 4 * WAIT_MS);
	for (size_t i = 0; i < STEPS; i++)
		if (hs_int(hs_step_at(wf, i), "attempts") != 1)
			fail_msg("step %zu: %lld attempts, expected 1", i,
				 (long long)hs_int(hs_step_at(wf, i), "attempts"));
	json_decref(wf);
	fragile_stats st;
	fragile_get_stats(c->res, &st);
	assert_int_equal(st.requests, STEPS);
	calls_assert_sound(c->res);
}

/*
 * With --shutdown-timeout 0, SIGTERM cuts off the running step 1 (a call the resource
 * holds until the test opens its gate, so it is surely running): batond warns,
 * logs "stopped" and exits 0 without waiting for the step (no step_completed for its
 * attempt 1: how fast it exits is not the test's business); after a restart step 1 has
 * a step_interrupted event for attempt 1, runs again as attempt 2, and the workflow
 * completes with steps 0 and 2 run once.
 */
static void test_sigterm_timeout_cuts_running_step(void **state)
{
	calls_ctx *c = *state;
	hs_server *s = c->s;
	fragile_push(c->res, (fragile_action){.status = 200, .gated = true}); /* attempt 1 */
	json_t *workers =
	    json_pack("[{s:s, s:i}, {s:s, s:{s:s}}, {s:s, s:i}]", "name", "w0", "work_ms", 50,
		      "name", "w1", "call", "url", c->url, "name", "w2", "work_ms", 50);
	calls_create(
	    s, json_pack("{s:s, s:s, s:o}", "id", "cut", "resource", "saw", "workers", workers));
	json_t *before = hs_wait_step(s, "cut", 1, "running", WAIT_MS);
	assert_true(fragile_wait_held(c->res, 1, WAIT_MS));
	assert_int_equal(hs_stop(s), 0);
	assert_logged(s, "stopped", true);
	assert_logged(s, "steps still running", true);
	assert_logged(s,
		      "SIGTERM: shutting down without waiting (--shutdown-timeout 0): 1 running"
		      " step will run again after a restart",
		      true);
	assert_log_ends_with(s, "INFO  stopped");

	assert_int_equal(hs_start(s), 0);
	json_t *wf = hs_wait_workflow(s, "cut", "completed", WAIT_MS);
	static const json_int_t attempts[] = {1, 2, 1};
	for (size_t i = 0; i < 3; i++)
		if (hs_int(hs_step_at(wf, i), "attempts") != attempts[i])
			fail_msg("step %zu: %lld attempts, expected %lld", i,
				 (long long)hs_int(hs_step_at(wf, i), "attempts"),
				 (long long)attempts[i]);
	assert_string_equal(hs_str(hs_step_at(wf, 0), "finished_at"),
			    hs_str(hs_step_at(before, 0), "finished_at"));
	json_t *events = hs_get_events(s, "cut");
	json_t *intr = hs_event_find(events, "step_interrupted", 1, 1);
	if (!intr)
		fail_msg("no step_interrupted event for step 1 attempt 1");
	assert_string_equal(hs_str(intr, "worker"), "w1");
	assert_int_equal(hs_event_count(events, "step_interrupted", -1, -1), 1);
	assert_null(hs_event_find(events, "step_completed", 1, 1));
	assert_non_null(hs_event_find(events, "step_completed", 1, 2));
	assert_int_equal(hs_event_count(events, "lock_acquired", 0, -1), 1);
	assert_int_equal(hs_event_count(events, "lock_acquired", 2, -1), 1);
	json_decref(events);
	json_decref(wf);
	json_decref(before);
}

/*
 * A second SIGTERM during the drain exits at once (status 1) instead of waiting for the
 * running step (8 s) to end, which would exit 0: the status tells which happened,
 * however long the exit takes. The log says so: "stopping now", then "stopped (exit 1)"
 * last. After a restart the step cut off runs again as attempt 2, with a
 * step_interrupted event for attempt 1.
 */
static void test_second_signal_exits_at_once(void **state)
{
	hs_server *s = *state;
	static const int work[] = {8000};
	submit(s, "twice", "anvil", work, 1);
	json_decref(hs_wait_step(s, "twice", 0, "running", WAIT_MS));
	assert_int_equal(hs_signal(s, SIGTERM), 0);
	assert_true(hs_wait_until(shutting_down, s, WAIT_MS));
	assert_int_equal(hs_signal(s, SIGTERM), 0);
	int status = hs_wait_exit(s, WAIT_MS);
	if (status != 1)
		fail_msg("a second SIGTERM: exit status %d, expected 1 (0: it drained)", status);
	assert_logged(s, "SIGTERM again: stopping now, without waiting for running steps", true);
	assert_log_ends_with(s, "WARN  stopped (exit 1)");

	assert_int_equal(hs_start(s), 0);
	json_t *wf = hs_wait_workflow(s, "twice", "completed", WAIT_MS);
	assert_int_equal(hs_int(hs_step_at(wf, 0), "attempts"), 2);
	json_t *events = hs_get_events(s, "twice");
	assert_non_null(hs_event_find(events, "step_interrupted", 0, 1));
	assert_int_equal(hs_event_count(events, "step_completed", 0, -1), 1);
	json_decref(events);
	json_decref(wf);
}

/* ---- the pid file ----------------------------------------------------------------- */

/* A directory of the test's own for the pid file (made by setup, removed by teardown). */
static char pid_dir[256];

static void pid_path(char *out, size_t n)
{
	snprintf(out, n, "%s/run/batond.pid", pid_dir);
}

static int remove_pid_dir(void)
{
	char cmd[400];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", pid_dir);
	return system(cmd);
}

static int setup_pid_file(void **state)
{
	const char *tmp = getenv("TMPDIR");
	char path[300];
	snprintf(pid_dir, sizeof pid_dir, "%s/baton-pid-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(pid_dir))
		return -1;
	pid_path(path, sizeof path);
	const char *const args[] = {"--pid-file", path, NULL};
	mode_t old = umask(022); /* the usual one: the file must be 0600 all the same */
	int rc = open_with(state, args);
	umask(old);
	if (rc) /* cmocka runs no teardown after a failed setup */
		remove_pid_dir();
	return rc;
}

static int teardown_pid_file(void **state)
{
	int rc = hs_teardown(state);
	return remove_pid_dir() == 0 ? rc : -1;
}

/* Fails unless the pid file holds the running server's pid and is 0600 in a 0700 dir. */
static void assert_pid_file(const hs_server *s)
{
	char path[300], want[32], got[32] = "";
	struct stat st;
	pid_path(path, sizeof path);
	FILE *f = fopen(path, "r");
	if (!f)
		fail_msg("no pid file %s while batond runs", path);
	size_t n = fread(got, 1, sizeof got - 1, f);
	fclose(f);
	got[n] = 0;
	snprintf(want, sizeof want, "%d\n", hs_pid(s));
	assert_string_equal(got, want);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);
	assert_int_equal(stat(dirname(path), &st), 0);
	assert_int_equal(st.st_mode & 07777, 0700);
}

/* The second start's shutdown began: the log (of every start) says so twice. */
static bool shutting_down_again(void *arg)
{
	char *log = hs_log_text(arg);
	const char *p = log ? strstr(log, "shutting down") : NULL;
	bool twice = p && strstr(p + 1, "shutting down");
	free(log);
	return twice;
}

static bool pid_file_gone(void)
{
	char path[300];
	pid_path(path, sizeof path);
	return access(path, F_OK) != 0;
}

/*
 * --pid-file PATH (what `make run` uses): written at start, 0600 under umask 022, in a
 * directory batond makes 0700; gone once batond has stopped, after a clean SIGTERM and
 * after a second SIGTERM that exits at once; a stale one (a SIGKILLed batond's, 0644) is
 * replaced at the next start.
 */
static void test_pid_file_written_and_removed(void **state)
{
	hs_server *s = *state;
	char path[300];
	pid_path(path, sizeof path);
	assert_pid_file(s);
	assert_int_equal(hs_stop(s), 0);
	assert_true(pid_file_gone());

	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs("999999\n", f);
	fclose(f);
	assert_int_equal(chmod(path, 0644), 0);
	mode_t old = umask(022);
	int rc = hs_start(s);
	umask(old);
	assert_int_equal(rc, 0);
	assert_pid_file(s);

	static const int work[] = {3000};
	submit(s, "pid", "anvil", work, 1);
	json_decref(hs_wait_step(s, "pid", 0, "running", WAIT_MS));
	assert_int_equal(hs_signal(s, SIGTERM), 0);
	assert_true(hs_wait_until(shutting_down_again, s, WAIT_MS));
	assert_int_equal(hs_signal(s, SIGTERM), 0);
	assert_int_equal(hs_wait_exit(s, WAIT_MS), 1);
	assert_true(pid_file_gone());
	assert_int_equal(hs_start(s), 0); /* the step runs again; teardown stops after it */
	json_decref(hs_wait_workflow(s, "pid", "completed", WAIT_MS));
}

/* A pid file batond cannot write (its path is a directory): it says so and exits 1. */
static void test_pid_file_unwritable_refused(void **state)
{
	(void)state;
	char dir[300], out[4096];
	const char *tmp = getenv("TMPDIR");
	snprintf(dir, sizeof dir, "%s/baton-pid-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	assert_non_null(mkdtemp(dir));
	char db[340];
	snprintf(db, sizeof db, "%s/baton.db", dir);
	const char *args[] = {"--listen", "127.0.0.1:0", "--db", db, "--pid-file", dir, NULL};
	int st = hs_run_batond(args, NULL, NULL, WAIT_MS, out, sizeof out);
	char cmd[400];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 1 || !strstr(out, "pid file"))
		fail_msg("--pid-file DIR: status %d, output: %s", st, out);
	const char *empty[] = {"--pid-file", "", NULL};
	st = hs_run_batond(empty, NULL, NULL, WAIT_MS, out, sizeof out);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 2 || !strstr(out, "--pid-file"))
		fail_msg("--pid-file \"\": status %d, output: %s", st, out);
}

/* ---- logs ------------------------------------------------------------------------- */

/*
 * The start-up line says whether retention is on, and for how long: off by default,
 * the duration given (in its largest whole unit) with --retention.
 */
static void test_startup_log_says_retention(void **state)
{
	hs_server *s = *state;
	assert_logged(s, "4 step threads, retention off (finished workflows are kept)", true);
	static const char *const cases[][2] = {
	    {"90m", "retention 90m"}, {"48h", "retention 2d"}, {"45", "retention 45s"}};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		const char *const args[] = {"--retention", cases[i][0], NULL};
		assert_int_equal(hs_stop(s), 0);
		assert_int_equal(hs_set_args(s, args), 0);
		assert_int_equal(hs_start(s), 0);
		char want[80];
		snprintf(want, sizeof want, "4 step threads, %s\n", cases[i][1]);
		assert_logged(s, want, true);
	}
}

/*
 * --log-format json: every line batond writes, from start to "stopped", is one JSON
 * object with ts (RFC 3339 UTC with ms), level (debug/info/warn/error) and a non-empty
 * msg; a workflow's lines carry its workflow_id.
 */
static void test_log_format_json(void **state)
{
	hs_server *s = *state;
	static const int work[] = {10, 10};
	submit(s, "logged", "quill", work, 2);
	json_decref(hs_wait_workflow(s, "logged", "completed", WAIT_MS));
	assert_int_equal(hs_stop(s), 0);
	char *log = hs_log_text(s);
	size_t len = strlen(log);
	assert_true(len > 0 && log[len - 1] == '\n');
	static const char *const levels[] = {"debug", "info", "warn", "error"};
	size_t lines = 0, of_workflow = 0;
	bool listening = false, stopped = false;
	for (char *line = log, *eol; *line; line = eol + 1) {
		eol = strchr(line, '\n'); /* there is one: the text ends with a newline */
		*eol = 0;
		lines++;
		json_error_t jerr;
		json_t *o = json_loads(line, 0, &jerr);
		if (!json_is_object(o))
			fail_msg("log line %zu is not a JSON object: %.300s", lines, line);
		int64_t ms;
		const char *ts = json_string_value(json_object_get(o, "ts"));
		const char *level = json_string_value(json_object_get(o, "level"));
		const char *msg = json_string_value(json_object_get(o, "msg"));
		if (!ts || rfc3339_parse_ms(ts, &ms) != 0 || !level || !msg || !*msg)
			fail_msg("log line %zu lacks ts, level or msg: %.300s", lines, line);
		bool known = false;
		for (size_t i = 0; i < 4; i++)
			known |= strcmp(level, levels[i]) == 0;
		if (!known)
			fail_msg("log line %zu: level %s", lines, level);
		json_t *wf = json_object_get(o, "workflow_id");
		if (wf && !json_is_string(wf))
			fail_msg("log line %zu: workflow_id is not a string", lines);
		of_workflow += wf && strcmp(json_string_value(wf), "logged") == 0;
		listening |= strstr(msg, "listening on http://127.0.0.1:") != NULL;
		stopped |= strcmp(msg, "stopped") == 0;
		json_decref(o);
	}
	free(log);
	assert_true(listening);
	assert_true(stopped);
	if (of_workflow < 2)
		fail_msg("only %zu log lines carry workflow_id \"logged\"", of_workflow);
}

/*
 * batond holds its database exclusively: a second batond on the same file exits at once
 * (status 1) and says why, another process cannot read the file either, and the first
 * batond goes on serving as before.
 */
static void test_second_batond_on_the_same_database_exits(void **state)
{
	if (hs_store_is_pg())
		skip(); /* the exclusive lock is SQLite's on its file (lib/vfs.c) */
	hs_server *s = *state;
	hs_response r;
	hs_post(s, "/workflows", "{\"id\":\"first\",\"resource\":\"r\",\"workers\":[\"a\"]}", &r);
	assert_int_equal(r.status, 201);
	hs_response_fini(&r);
	json_decref(hs_wait_workflow(s, "first", "completed", WAIT_MS));

	const char *const args[] = {"--listen", "127.0.0.1:0", "--db", hs_db_path(s), NULL};
	char text[8192];
	int status = hs_run_batond(args, NULL, NULL, WAIT_MS, text, sizeof text);
	if (status == -1)
		fail_msg("a second batond on the same database did not exit");
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 1);
	if (!strstr(text, "in use by another process"))
		fail_msg("the second batond did not say why it stopped: %s", text);

	sqlite3 *db = NULL;
	assert_int_equal(sqlite3_open_v2(hs_db_path(s), &db, SQLITE_OPEN_READONLY, NULL),
			 SQLITE_OK);
	int rc = sqlite3_exec(db, "SELECT count(*) FROM workflows", NULL, NULL, NULL);
	sqlite3_close(db);
	assert_int_equal(rc & 0xff, SQLITE_BUSY);

	json_t *wf = hs_get_workflow(s, "first");
	assert_string_equal(hs_str(wf, "status"), "completed");
	json_decref(wf);
	hs_post(s, "/workflows", "{\"id\":\"after\",\"resource\":\"r\",\"workers\":[\"a\"]}", &r);
	assert_int_equal(r.status, 201);
	hs_response_fini(&r);
	json_decref(hs_wait_workflow(s, "after", "completed", WAIT_MS));
}

/* ---- listening and HEAD ------------------------------------------------------------ */

static int setup_any_interface(void **state)
{
	/* The later --listen wins over the harness's 127.0.0.1:0. */
	static const char *const args[] = {"--listen", ":0", NULL};
	return open_with(state, args);
}

/*
 * --listen :PORT listens on every interface: the log says so (the IPv6 wildcard, which
 * takes IPv4 too, or 0.0.0.0 on a machine without IPv6), warns that there is no token,
 * and the server answers on 127.0.0.1 (and on ::1 when it bound IPv6).
 */
static void test_listen_colon_port_is_every_interface(void **state)
{
	hs_server *s = *state;
	char want6[96], want4[96];
	snprintf(want6, sizeof want6, "listening on http://[::]:%d (every interface)", hs_port(s));
	snprintf(want4, sizeof want4, "listening on http://0.0.0.0:%d (every interface)",
		 hs_port(s));
	bool v6 = log_has(s, want6);
	if (!v6 && !log_has(s, want4)) {
		hs_dump_log(s, 4000);
		fail_msg("the log says neither \"%s\" nor \"%s\"", want6, want4);
	}
	assert_logged(s, "listening on every interface without --token", true);
	json_decref(hs_get_json(s, "/healthz", 200)); /* through 127.0.0.1 */
	if (v6) {
		int fd = socket(AF_INET6, SOCK_STREAM, 0);
		struct sockaddr_in6 a = {.sin6_family = AF_INET6,
					 .sin6_port = htons(hs_port(s)),
					 .sin6_addr = IN6ADDR_LOOPBACK_INIT};
		assert_true(fd >= 0);
		assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
		close(fd);
	}
	/* :PORT with no port, or no colon at all, is refused with a message. */
	char text[4096];
	const char *const bad[] = {"--listen", "8080", "--db", hs_db_path(s), NULL};
	int status = hs_run_batond(bad, NULL, NULL, WAIT_MS, text, sizeof text);
	assert_true(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 2);
	assert_non_null(strstr(text, "--listen wants HOST:PORT or :PORT"));
}

/* Sends raw request text to the server and returns all it answers until it closes the
 * connection (a static buffer). */
static const char *raw_exchange(const hs_server *s, const char *request)
{
	static char buf[65536];
	struct sockaddr_in a = {.sin_family = AF_INET,
				.sin_port = htons(hs_port(s)),
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	struct timeval tv = {WAIT_MS / 1000, 0};
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(fd >= 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
	assert_int_equal(write(fd, request, strlen(request)), (ssize_t)strlen(request));
	size_t n = 0;
	ssize_t got;
	while (n + 1 < sizeof buf && (got = read(fd, buf + n, sizeof buf - 1 - n)) > 0)
		n += (size_t)got;
	buf[n] = 0;
	close(fd);
	return buf;
}

/* The value of header `name` in a raw answer (a static copy; "" when absent). */
static const char *raw_header(const char *answer, const char *name)
{
	static char value[256];
	char key[64];
	snprintf(key, sizeof key, "\r\n%s: ", name);
	const char *p = strstr(answer, key);
	value[0] = 0;
	if (p)
		sscanf(p + strlen(key), "%255[^\r]", value);
	return value;
}

/*
 * HEAD is served wherever GET is: the same status line and Content-Type as GET, the
 * Content-Length of GET's body, and no body at all; HEAD of a stream is its head, without
 * the stream. A 405 lists HEAD beside GET in Allow.
 */
static void test_head_wherever_get(void **state)
{
	hs_server *s = *state;
	static const int work[] = {10};
	submit(s, "h1", "helm", work, 1);
	json_decref(hs_wait_workflow(s, "h1", "completed", WAIT_MS));
	static const char *const paths[] = {
	    "/workflows", "/workflows/h1",   "/workflows/h1/events",   "/workflows/nope",
	    "/resources", "/resources/helm", "/resources/helm/events", "/healthz",
	    "/readyz",	  "/metrics",	     "/no/such/path",
	};
	for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
		char req[512], get_status[64], head_status[64], get_type[256];
		snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
			 paths[i]);
		const char *get = raw_exchange(s, req);
		sscanf(get, "%63[^\r]", get_status);
		snprintf(get_type, sizeof get_type, "%s", raw_header(get, "Content-Type"));
		const char *body = strstr(get, "\r\n\r\n");
		assert_non_null(body);
		snprintf(req, sizeof req,
			 "HEAD %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", paths[i]);
		const char *head = raw_exchange(s, req);
		sscanf(head, "%63[^\r]", head_status);
		if (strcmp(get_status, head_status) != 0)
			fail_msg("HEAD %s: \"%s\", GET: \"%s\"", paths[i], head_status, get_status);
		assert_string_equal(raw_header(head, "Content-Type"), get_type);
		const char *end = strstr(head, "\r\n\r\n");
		assert_non_null(end);
		if (end[4] != 0)
			fail_msg("HEAD %s sent a body: %s", paths[i], end + 4);
	}
	/* The stream's head, without the stream (which would not end: nothing follows). */
	const char *head =
	    raw_exchange(s, "HEAD /resources/helm/events HTTP/1.1\r\nHost: t\r\n"
			    "Accept: text/event-stream\r\nConnection: close\r\n\r\n");
	assert_non_null(strstr(head, "HTTP/1.1 200 "));
	assert_string_equal(raw_header(head, "Content-Type"), "text/event-stream");
	assert_string_equal(strstr(head, "\r\n\r\n"), "\r\n\r\n");

	hs_request req = {.method = "PUT", .path = "/workflows/h1"};
	hs_response r;
	hs_send(s, &req, &r);
	hs_assert_problem(&r, 405, "method-not-allowed", "PUT /workflows/h1");
	hs_assert_allow(&r, "GET, HEAD, DELETE");
	hs_response_fini(&r);
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_metrics_parser_is_strict),
	    cmocka_unit_test_setup_teardown(test_metrics_exposition_and_values, calls_setup,
					    calls_teardown),
	    cmocka_unit_test_setup_teardown(test_health_endpoints, setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_readyz_follows_storage, hs_faulty_setup,
					    hs_faulty_teardown),
	    cmocka_unit_test_setup_teardown(test_sigterm_lets_running_step_finish, setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_sigterm_timeout_cuts_running_step,
					    calls_setup_timeout0, calls_teardown),
	    cmocka_unit_test_setup_teardown(test_sigterm_starts_no_step, calls_setup,
					    calls_teardown),
	    cmocka_unit_test_setup_teardown(test_second_signal_exits_at_once, setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_second_batond_on_the_same_database_exits, setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_pid_file_written_and_removed, setup_pid_file,
					    teardown_pid_file),
	    cmocka_unit_test(test_pid_file_unwritable_refused),
	    cmocka_unit_test_setup_teardown(test_startup_log_says_retention, setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_log_format_json, setup_json_log, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_listen_colon_port_is_every_interface,
					    setup_any_interface, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_head_wherever_get, setup, hs_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
