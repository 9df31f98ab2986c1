/*
 * test_engine.c - the engine and its SQLite store through the public API, each test on
 * its own temporary database: submission is durable and idempotent, steps run in order
 * and never overlap, a closed-while-running step resumes as a new attempt after reopen,
 * fencing tokens keep growing across reopen, retry waits are persisted, a claim's stale
 * give-back never names a later claim.
 */
#include "unit.h"

#include <pthread.h>
#include <sqlite3.h>
#include <time.h>
#include <unistd.h>

typedef struct fixture {
	char dir[64];
	char db[128];
	baton_engine *e;
} fixture;

static void quiet(void *ud, int level, const char *wf, const char *msg)
{
	(void)ud;
	(void)level;
	(void)wf;
	(void)msg;
}

static baton_engine *open_engine(fixture *f)
{
	baton_engine_config cfg = {.db_path = f->db, .threads = 4, .readers = 2, .log = quiet};
	baton_error err = {0};
	baton_engine *e = NULL;
	if (baton_engine_open(&cfg, &e, &err))
		fail_msg("open: %s", err.msg);
	return e;
}

static int setup(void **state)
{
	fixture *f = calloc(1, sizeof *f);
	snprintf(f->dir, sizeof f->dir, "/tmp/baton-unit-XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	snprintf(f->db, sizeof f->db, "%s/baton.db", f->dir);
	f->e = open_engine(f);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	fixture *f = *state;
	baton_engine_close(f->e, 0);
	char path[160];
	const char *suffix[] = {"", "-wal", "-shm"};
	for (int i = 0; i < 3; i++) {
		snprintf(path, sizeof path, "%s%s", f->db, suffix[i]);
		unlink(path);
	}
	rmdir(f->dir);
	free(f);
	return 0;
}

static json_t *submit(baton_engine *e, const char *text, int *created, int want_rc)
{
	json_t *req = js(text), *wf = NULL;
	baton_error err = {0};
	int rc = baton_engine_submit(e, req, &wf, created, &err);
	json_decref(req);
	if (rc != want_rc)
		fail_msg("submit: rc %d (%s), wanted %d", rc, err.msg, want_rc);
	return wf;
}

static const char *status_of(json_t *wf)
{
	return json_string_value(json_object_get(wf, "status"));
}

/* Polls until the workflow has the status, within a generous deadline. */
static json_t *wait_status(baton_engine *e, const char *id, const char *status)
{
	for (int i = 0; i < 3000; i++) {
		json_t *wf = NULL;
		baton_error err = {0};
		if (baton_engine_get(e, id, &wf, &err))
			fail_msg("get %s: %s", id, err.msg);
		if (strcmp(status_of(wf), status) == 0)
			return wf;
		json_decref(wf);
		usleep(10000);
	}
	fail_msg("workflow %s never became %s", id, status);
	return NULL;
}

static json_t *step(json_t *wf, int i)
{
	return json_array_get(json_object_get(wf, "steps"), (size_t)i);
}

static json_int_t step_int(json_t *wf, int i, const char *key)
{
	return json_integer_value(json_object_get(step(wf, i), key));
}

/* Polls until step i of the workflow has the status, within a generous deadline. */
static json_t *wait_step_status(baton_engine *e, const char *id, int i, const char *status)
{
	for (int n = 0; n < 3000; n++) {
		json_t *wf = NULL;
		baton_error err = {0};
		if (baton_engine_get(e, id, &wf, &err))
			fail_msg("get %s: %s", id, err.msg);
		if (strcmp(json_string_value(json_object_get(step(wf, i), "status")), status) == 0)
			return wf;
		json_decref(wf);
		usleep(5000);
	}
	fail_msg("step %d of %s never became %s", i, id, status);
	return NULL;
}

static void test_steps_complete_in_order_without_overlap(void **state)
{
	fixture *f = *state;
	int created = 0;
	json_t *wf = submit(f->e,
			    "{\"id\":\"w1\",\"resource\":\"gw\",\"workers\":["
			    "{\"name\":\"a\",\"work_ms\":20},{\"name\":\"b\",\"work_ms\":20},"
			    "{\"name\":\"c\",\"work_ms\":20}]}",
			    &created, BATON_OK);
	assert_int_equal(created, 1);
	json_decref(wf);
	wf = wait_status(f->e, "w1", "completed");
	const char *prev_end = "";
	for (int i = 0; i < 3; i++) {
		const char *start = json_string_value(json_object_get(step(wf, i), "started_at"));
		const char *end = json_string_value(json_object_get(step(wf, i), "finished_at"));
		assert_true(strcmp(start, prev_end) >= 0); /* RFC 3339 UTC sorts as text */
		assert_true(strcmp(end, start) >= 0);
		assert_int_equal(step_int(wf, i, "attempts"), 1);
		assert_int_equal(step_int(wf, i, "fencing_token"), i + 1);
		prev_end = end;
	}
	json_t *result = json_object_get(wf, "result");
	assert_int_equal(json_integer_value(json_object_get(result, "workersProcessed")), 3);
	json_decref(wf);
}

static void test_resubmit_is_idempotent_and_conflicts_are_refused(void **state)
{
	fixture *f = *state;
	const char *def = "{\"id\":\"same\",\"resource\":\"gw\",\"workers\":[\"a\"]}";
	int created = -1;
	json_decref(submit(f->e, def, &created, BATON_OK));
	assert_int_equal(created, 1);
	json_decref(submit(f->e, def, &created, BATON_OK));
	assert_int_equal(created, 0);
	json_decref(submit(f->e, "{\"id\":\"same\",\"resource\":\"gw\",\"workers\":[\"b\"]}",
			   &created, BATON_ECONFLICT));
	json_decref(wait_status(f->e, "same", "completed"));
	json_decref(submit(f->e, def, &created, BATON_OK));
	assert_int_equal(created, 0);
}

static void test_generated_ids_are_128_bit_hex(void **state)
{
	fixture *f = *state;
	int created;
	json_t *wf = submit(f->e, "{\"resource\":\"gw\",\"workers\":[\"a\"]}", &created, BATON_OK);
	const char *id = json_string_value(json_object_get(wf, "id"));
	assert_int_equal(strlen(id), 32);
	assert_int_equal(strspn(id, "0123456789abcdef"), 32);
	json_decref(wf);
}

static void test_close_mid_step_resumes_as_new_attempt(void **state)
{
	fixture *f = *state;
	int created;
	json_decref(submit(f->e,
			   "{\"id\":\"long\",\"resource\":\"gw\",\"workers\":["
			   "{\"name\":\"a\",\"work_ms\":10},{\"name\":\"b\",\"work_ms\":60000},"
			   "{\"name\":\"c\",\"work_ms\":10}]}",
			   &created, BATON_OK));
	/* Wait until b holds the resource, then stop without waiting for it. */
	for (int i = 0;; i++) {
		json_t *wf;
		baton_error err;
		assert_int_equal(baton_engine_get(f->e, "long", &wf, &err), BATON_OK);
		int running = strcmp(json_string_value(json_object_get(step(wf, 1), "status")),
				     "running") == 0;
		json_decref(wf);
		if (running)
			break;
		assert_true(i < 3000);
		usleep(10000);
	}
	baton_engine_close(f->e, 0);
	/* Make b short so that the resumed attempt finishes: rewrite its params directly. */
	sqlite3 *db;
	assert_int_equal(sqlite3_open(f->db, &db), SQLITE_OK);
	assert_int_equal(sqlite3_exec(db,
				      "UPDATE steps SET params = json_set(params, '$.work_ms', 10)"
				      " WHERE idx = 1",
				      NULL, NULL, NULL),
			 SQLITE_OK);
	sqlite3_close(db);
	f->e = open_engine(f);
	json_t *wf = wait_status(f->e, "long", "completed");
	assert_int_equal(step_int(wf, 0, "attempts"), 1); /* never re-run */
	assert_int_equal(step_int(wf, 1, "attempts"), 2);
	assert_int_equal(step_int(wf, 2, "attempts"), 1);
	assert_true(step_int(wf, 1, "fencing_token") > 2); /* a new token after restart */
	json_decref(wf);
	json_t *events;
	baton_error err;
	assert_int_equal(baton_engine_events(f->e, "long", 0, 0, &events, &err), BATON_OK);
	int interrupted = 0;
	json_int_t last = 0;
	size_t i;
	json_t *ev;
	json_array_foreach(json_object_get(events, "events"), i, ev)
	{
		interrupted +=
		    strcmp(json_string_value(json_object_get(ev, "type")), "step_interrupted") == 0;
		assert_true(json_integer_value(json_object_get(ev, "seq")) > last);
		last = json_integer_value(json_object_get(ev, "seq"));
	}
	assert_int_equal(interrupted, 1);
	json_decref(events);
}

static void test_retry_wait_survives_reopen(void **state)
{
	fixture *f = *state;
	int created;
	json_decref(submit(f->e,
			   "{\"id\":\"r\",\"resource\":\"gw\",\"workers\":["
			   "{\"name\":\"a\",\"work_ms\":0,\"fail_attempts\":1}],"
			   "\"retry\":{\"first_retry_ms\":300,\"backoff\":1.0}}",
			   &created, BATON_OK));
	json_t *wf = wait_step_status(f->e, "r", 0, "retrying");
	char next[40];
	snprintf(next, sizeof next, "%s",
		 json_string_value(json_object_get(step(wf, 0), "next_attempt_at")));
	json_decref(wf);
	baton_engine_close(f->e, 0);
	f->e = open_engine(f);
	wf = wait_status(f->e, "r", "completed");
	const char *second = json_string_value(json_object_get(step(wf, 0), "started_at"));
	assert_true(strcmp(second, next) >= 0); /* not earlier than the persisted time */
	assert_int_equal(step_int(wf, 0, "attempts"), 2);
	json_decref(wf);
}

/* Reads a whole file (malloc'd, NUL-terminated). */
static char *slurp(const char *path)
{
	FILE *fp = fopen(path, "rb");
	if (!fp)
		fail_msg("cannot open %s", path);
	fseek(fp, 0, SEEK_END);
	long n = ftell(fp);
	fseek(fp, 0, SEEK_SET);
	char *text = calloc(1, (size_t)n + 1);
	assert_int_equal(fread(text, 1, (size_t)n, fp), (size_t)n);
	fclose(fp);
	return text;
}

static json_t *events_of(baton_engine *e, const char *id)
{
	json_t *out;
	baton_error err;
	if (baton_engine_events(e, id, 0, 0, &out, &err))
		fail_msg("events of %s: %s", id, err.msg);
	return out;
}

/*
 * Replaces the fixture's database by a dump of an older schema and opens the engine on
 * it. The ten-minute step of worker `slow` becomes short first, so that its resumed
 * attempt finishes.
 */
static void load_fixture(fixture *f, const char *dump_path, const char *slow)
{
	baton_engine_close(f->e, 0);
	f->e = NULL;
	unlink(f->db);
	char *dump = slurp(dump_path);
	sqlite3 *db;
	char sql[160];
	snprintf(sql, sizeof sql,
		 "UPDATE steps SET params = json_set(params, '$.work_ms', 10) WHERE worker = '%s'",
		 slow);
	assert_int_equal(sqlite3_open(f->db, &db), SQLITE_OK);
	assert_int_equal(sqlite3_exec(db, dump, NULL, NULL, NULL), SQLITE_OK);
	assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
	sqlite3_close(db);
	free(dump);
	f->e = open_engine(f);
}

/*
 * A database written by the first version of the store (schema 1: tests/unit/fixtures/
 * store-v1.sql is the dump of one, made by that batond and killed with SIGKILL: "old-done"
 * completed, "old-running" holding "ledger" in a ten-minute step, "old-waiting" queued)
 * opens under schema 2: the history is kept, the holder is known, and the interrupted
 * step resumes as its second attempt with a higher token, then the waiter runs.
 */
static void test_schema_1_database_is_migrated(void **state)
{
	fixture *f = *state;
	load_fixture(f, "tests/unit/fixtures/store-v1.sql", "c");
	json_t *old = events_of(f->e, "old-done");
	json_t *list = json_object_get(old, "events");
	assert_int_equal(json_array_size(list), 11); /* as stored by schema 1 */
	assert_string_equal(json_string_value(json_object_get(json_array_get(list, 0), "type")),
			    "workflow_submitted");
	json_int_t last_old = 0;
	size_t i;
	json_t *ev;
	json_array_foreach(list, i, ev)
	{
		assert_true(json_integer_value(json_object_get(ev, "seq")) > last_old);
		last_old = json_integer_value(json_object_get(ev, "seq"));
	}
	json_decref(old);

	json_t *wf = wait_status(f->e, "old-waiting", "completed");
	json_decref(wf);
	wf = wait_status(f->e, "old-running", "completed");
	assert_int_equal(step_int(wf, 0, "attempts"), 2);
	assert_true(step_int(wf, 0, "fencing_token") > 3); /* above every token of schema 1 */
	json_decref(wf);
	/* New events number on from the old ones. */
	json_t *now = events_of(f->e, "old-waiting");
	list = json_object_get(now, "events");
	json_t *last = json_array_get(list, json_array_size(list) - 1);
	assert_string_equal(json_string_value(json_object_get(last, "type")), "workflow_completed");
	assert_true(json_integer_value(json_object_get(last, "seq")) > last_old);
	json_decref(now);

	json_t *res;
	baton_error err;
	assert_int_equal(baton_engine_resource(f->e, "ledger", &res, &err), BATON_OK);
	assert_true(json_is_null(json_object_get(res, "holder")));
	assert_int_equal(json_integer_value(json_object_get(res, "last_fencing_token")), 6);
	json_decref(res);
}

static void test_cancel_and_unknown_ids(void **state)
{
	fixture *f = *state;
	int created;
	json_t *out = NULL;
	baton_error err = {0};
	json_decref(submit(f->e,
			   "{\"id\":\"hold\",\"resource\":\"gw\",\"workers\":["
			   "{\"name\":\"a\",\"work_ms\":300}]}",
			   &created, BATON_OK));
	json_decref(submit(f->e, "{\"id\":\"queued\",\"resource\":\"gw\",\"workers\":[\"a\"]}",
			   &created, BATON_OK));
	assert_int_equal(baton_engine_cancel(f->e, "queued", &out, &err), BATON_OK);
	assert_string_equal(status_of(out), "cancelled");
	json_decref(out);
	assert_int_equal(baton_engine_cancel(f->e, "queued", &out, &err), BATON_OK);
	json_decref(out);
	json_decref(wait_status(f->e, "hold", "completed"));
	assert_int_equal(baton_engine_cancel(f->e, "hold", &out, &err), BATON_ECONFLICT);
	assert_int_equal(baton_engine_cancel(f->e, "nope", &out, &err), BATON_ENOTFOUND);
	assert_int_equal(baton_engine_get(f->e, "nope", &out, &err), BATON_ENOTFOUND);
	assert_int_equal(baton_engine_resource(f->e, "never", &out, &err), BATON_ENOTFOUND);
}

static int64_t count_rows(fixture *f, const char *sql)
{
	sqlite3 *db;
	sqlite3_stmt *st;
	int64_t n = -1;
	assert_int_equal(sqlite3_open_v2(f->db, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
	assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
	if (sqlite3_step(st) == SQLITE_ROW)
		n = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	sqlite3_close(db);
	return n;
}

/*
 * A database of schema 2 (tests/unit/fixtures/store-v2.sql, made by that batond and
 * killed with SIGKILL: "v2-done" completed; "v2-running" with step c completed, d holding
 * "ledger" in a ten-minute step and e pending; "v2-waiting" queued) opens under schema 4
 * (schema 3 changed no row; 4 adds the resources' limits, 1 each). Schema 2 stored a row for every
 * step at submission, pending ones too: those rows are updated in place when their steps are
 * reached, the interrupted step resumes as its second attempt with a higher token, and every step
 * counts once.
 */
static void test_schema_2_database_opens_as_it_is(void **state)
{
	fixture *f = *state;
	load_fixture(f, "tests/unit/fixtures/store-v2.sql", "d");
	json_t *wf = wait_status(f->e, "v2-running", "completed");
	assert_int_equal(json_integer_value(json_object_get(wf, "steps_completed")), 3);
	assert_int_equal(step_int(wf, 0, "attempts"), 1);
	assert_int_equal(step_int(wf, 0, "fencing_token"), 3);
	assert_int_equal(step_int(wf, 1, "attempts"), 2);
	assert_true(step_int(wf, 1, "fencing_token") > 4); /* above every token of schema 2 */
	assert_int_equal(step_int(wf, 2, "attempts"), 1);
	json_decref(wf);
	wf = wait_status(f->e, "v2-waiting", "completed");
	assert_int_equal(json_integer_value(json_object_get(wf, "steps_completed")), 2);
	assert_int_equal(step_int(wf, 1, "attempts"), 1);
	json_decref(wf);
	baton_error err;
	assert_int_equal(baton_engine_get(f->e, "v2-done", &wf, &err), BATON_OK);
	assert_string_equal(status_of(wf), "completed");
	assert_int_equal(json_integer_value(json_object_get(wf, "steps_completed")), 2);
	json_decref(wf);
	json_t *res;
	assert_int_equal(baton_engine_resource(f->e, "ledger", &res, &err), BATON_OK);
	assert_true(json_is_null(json_object_get(res, "holder")));
	/* d again, then e, f and g: four grants after the four of schema 2 */
	assert_int_equal(json_integer_value(json_object_get(res, "last_fencing_token")), 8);
	/* schema 4: a resource stored before limits is a mutex */
	assert_int_equal(json_integer_value(json_object_get(res, "limit")), 1);
	json_decref(res);
	assert_int_equal(count_rows(f, "SELECT count(*) FROM resources WHERE permits = 1"),
			 count_rows(f, "SELECT count(*) FROM resources"));
	assert_int_equal(count_rows(f, "PRAGMA user_version"), 4);
	assert_int_equal(count_rows(f, "SELECT count(*) FROM steps"), 7);
	assert_int_equal(count_rows(f, "SELECT count(*) FROM steps WHERE status != 'completed'"),
			 0);
}

/*
 * A step's row is written when the step is first reached, and a running workflow's row
 * is not rewritten at every step; what the API says is the same: pending steps with
 * their parameters (from the stored definition, also after a restart), and completed
 * steps counted from their rows.
 */
static void test_pending_steps_have_no_row_until_reached(void **state)
{
	fixture *f = *state;
	int created;
	json_decref(submit(f->e,
			   "{\"id\":\"lazy\",\"resource\":\"gw\",\"workers\":["
			   "{\"name\":\"a\",\"work_ms\":0},{\"name\":\"b\",\"work_ms\":600000},"
			   "{\"name\":\"c\",\"work_ms\":7,\"fail_attempts\":1},\"d\"]}",
			   &created, BATON_OK));
	json_t *wf = wait_step_status(f->e, "lazy", 1, "running");
	baton_error err = {0};
	assert_int_equal(json_integer_value(json_object_get(wf, "steps_completed")), 1);
	json_decref(wf);
	assert_int_equal(count_rows(f, "SELECT count(*) FROM steps"), 2);
	assert_int_equal(count_rows(f, "SELECT steps_completed FROM workflows"), 0);

	/* Queued behind it: one row (the waiting step); cancelled: a row for every step. */
	json_decref(
	    submit(f->e, "{\"id\":\"queued\",\"resource\":\"gw\",\"workers\":[\"x\",\"y\",\"z\"]}",
		   &created, BATON_OK));
	assert_int_equal(count_rows(f, "SELECT count(*) FROM steps"), 3);
	assert_int_equal(baton_engine_cancel(f->e, "queued", &wf, &err), BATON_OK);
	assert_string_equal(json_string_value(json_object_get(step(wf, 2), "status")), "cancelled");
	json_decref(wf);
	assert_int_equal(count_rows(f, "SELECT count(*) FROM steps"), 5);

	baton_engine_close(f->e, 0); /* "b" is cut off: it runs again after the reopen */
	f->e = open_engine(f);
	assert_int_equal(baton_engine_get(f->e, "lazy", &wf, &err), BATON_OK);
	assert_int_equal(json_integer_value(json_object_get(wf, "steps_completed")), 1);
	json_t *c = step(wf, 2), *d = step(wf, 3);
	assert_string_equal(json_string_value(json_object_get(c, "status")), "pending");
	assert_string_equal(json_string_value(json_object_get(c, "worker")), "c");
	assert_int_equal(json_integer_value(json_object_get(c, "work_ms")), 7);
	assert_int_equal(json_integer_value(json_object_get(c, "fail_attempts")), 1);
	assert_string_equal(json_string_value(json_object_get(d, "worker")), "d");
	assert_int_equal(json_integer_value(json_object_get(d, "attempts")), 0);
	assert_true(json_is_null(json_object_get(d, "started_at")));
	json_decref(wf);
}

/* ---- the inbox's cap ---- */

/* Holds the engine in its commit callback while `closed`, as a slow commit would. */
typedef struct gate {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int closed, held, answered, granted, commits;
	char id[48];
} gate;

static void on_commit_gate(void *ud, const baton_change *changes, size_t n)
{
	gate *g = ud;
	(void)changes, (void)n;
	pthread_mutex_lock(&g->mu);
	g->held = g->closed;
	pthread_cond_broadcast(&g->cv);
	while (g->closed)
		pthread_cond_wait(&g->cv, &g->mu);
	g->commits++;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

static void on_answer(void *ud, int rc, int created, json_t *lease, const char *why)
{
	gate *g = ud;
	(void)rc, (void)why;
	json_decref(lease);
	pthread_mutex_lock(&g->mu);
	g->answered++;
	g->granted += created;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

static void on_submitted(void *ud, int rc, const char *id, int created, const char *msg)
{
	(void)ud, (void)rc, (void)id, (void)created, (void)msg; /* only when not refused */
}

/* Waits until pred-like field *v reaches want, within 60 s; whether it did. */
static int gate_wait(gate *g, const int *v, int want)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	t.tv_sec += 60;
	pthread_mutex_lock(&g->mu);
	int rc = 0;
	while (*v < want && rc == 0)
		rc = pthread_cond_timedwait(&g->cv, &g->mu, &t);
	int ok = *v >= want;
	pthread_mutex_unlock(&g->mu);
	return ok;
}

/* Every call a client makes waits for the engine under one cap (4,096): with the engine
 * held in a slow commit, lease renewals fill it, and then a renewal, an acquire, a claim
 * and a submission are all refused BATON_EBUSY at once; once the commit ends, every call
 * that was taken is answered. Before, only submissions counted: lease and task calls
 * queued without bound behind a stalled engine. */
static gate the_gate; /* outlives a failed test: the engine may still answer into it */

static void test_calls_share_the_inbox_cap(void **state)
{
	fixture *f = *state;
	baton_engine_close(f->e, 0);
	gate *g = &the_gate;
	memset(g, 0, sizeof *g);
	pthread_mutex_init(&g->mu, NULL);
	pthread_cond_init(&g->cv, NULL);
	baton_engine_config cfg = {.db_path = f->db,
				   .threads = 2,
				   .readers = 1,
				   .log = quiet,
				   .on_commit = on_commit_gate,
				   .on_commit_ud = g};
	baton_error err = {0};
	assert_int_equal(baton_engine_open(&cfg, &f->e, &err), BATON_OK);
	baton_lease_request held = {.resource = "held", .holder = "h", .ttl_ms = 600000};
	assert_int_equal(baton_lease_acquire(f->e, &held, on_answer, g, g->id, &err), BATON_OK);
	assert_true(gate_wait(g, &g->granted, 1));
	/* the grant is answered before its commit's callback runs: that callback returns
	 * first, so that the gate closes on the next commit, the slow acquire's */
	assert_true(gate_wait(g, &g->commits, 1));

	pthread_mutex_lock(&g->mu);
	g->closed = 1;
	pthread_mutex_unlock(&g->mu);
	char other[48];
	baton_lease_request slow = {.resource = "slow", .holder = "s", .ttl_ms = 600000};
	assert_int_equal(baton_lease_acquire(f->e, &slow, on_answer, g, other, &err), BATON_OK);
	int held_in_commit = gate_wait(g, &g->held, 1); /* the engine waits in its commit */

	int taken = 0, rc[6];
	while (taken < 5000 && baton_lease_renew(f->e, g->id, 0, on_answer, g, &err) == BATON_OK)
		taken++;
	rc[0] = err.code;
	rc[1] = baton_lease_renew(f->e, g->id, 0, on_answer, g, &err);
	baton_lease_request more = {.resource = "more", .holder = "m", .ttl_ms = 60000};
	rc[2] = baton_lease_acquire(f->e, &more, on_answer, g, other, &err);
	rc[3] = baton_task_claim(f->e, NULL, NULL, NULL, 0, 60000, on_answer, g, &err);
	rc[4] = baton_task_report(f->e, "w.0.1", BATON_TASK_HEARTBEAT, NULL, NULL, 0, on_answer, g,
				  &err);
	json_t *req = js("{\"resource\": \"r\", \"workers\": [\"a\"]}");
	rc[5] = baton_engine_submit_async(f->e, req, on_submitted, NULL, &err);
	json_decref(req);
	pthread_mutex_lock(&g->mu); /* the commit ends, whatever was found */
	g->closed = 0;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);

	assert_true(held_in_commit);
	assert_int_equal(taken, 4096);
	for (int i = 0; i < 6; i++)
		assert_int_equal(rc[i], BATON_EBUSY);
	assert_true(gate_wait(g, &g->answered, 2 + 4096)); /* both grants, every renewal */
	baton_engine_close(f->e, 0);
	f->e = open_engine(f);
}

/* One claim's answer, waited for. */
typedef struct claim_answer {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done, rc;
	json_t *task;
} claim_answer;

static void on_claim(void *ud, int rc, int created, json_t *task, const char *why)
{
	claim_answer *a = ud;
	(void)created, (void)why;
	pthread_mutex_lock(&a->mu);
	a->rc = rc;
	a->task = task;
	a->done = 1;
	pthread_cond_broadcast(&a->cv);
	pthread_mutex_unlock(&a->mu);
}

/* Claims (request_id rid, or none) and waits for the answer: the task, or NULL for none. */
static json_t *claim_now(baton_engine *e, const char *rid, int64_t wait_ms)
{
	claim_answer a = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
	baton_error err = {0};
	assert_int_equal(baton_task_claim(e, "ext", NULL, rid, wait_ms, 60000, on_claim, &a, &err),
			 BATON_OK);
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	t.tv_sec += 60;
	pthread_mutex_lock(&a.mu);
	while (!a.done && pthread_cond_timedwait(&a.cv, &a.mu, &t) == 0)
		;
	pthread_mutex_unlock(&a.mu);
	assert_true(a.done);
	assert_int_equal(a.rc, BATON_OK);
	return a.task;
}

/* Give-backs name the claim attempt they undo, and the count runs on over the claims of a
 * step: a claim retried with its request_id (claim attempt 2) is given back, another worker
 * claims the step, and the give-back of the first answer (claim attempt 1), applied last,
 * changes nothing. Before, that worker's claim was numbered 1 again, and the old give-back
 * offered the step to a third claim while that worker held it. */
static void test_a_stale_give_back_never_names_a_later_claim(void **state)
{
	fixture *f = *state;
	json_decref(submit(f->e,
			   "{\"id\": \"job\", \"resource\": \"r\", \"workers\": "
			   "[{\"name\": \"ext\", \"external\": true}]}",
			   NULL, BATON_OK));
	json_t *first = claim_now(f->e, "w-1", 30000);
	assert_non_null(first);
	assert_int_equal(json_integer_value(json_object_get(first, "claim_attempt")), 1);
	json_t *again = claim_now(f->e, "w-1", 30000); /* its answer was lost: the same claim */
	assert_string_equal(json_string_value(json_object_get(again, "id")), "job.0.1");
	assert_int_equal(json_integer_value(json_object_get(again, "claim_attempt")), 2);
	baton_error err;
	baton_task_give_back(f->e, "job.0.1", 2, NULL, NULL, &err); /* the retry's failed too */
	json_t *other = claim_now(f->e, NULL, 30000); /* another worker gets the step */
	assert_non_null(other);
	assert_string_equal(json_string_value(json_object_get(other, "id")), "job.0.1");
	baton_task_give_back(f->e, "job.0.1", 1, NULL, NULL, &err); /* the first answer's */
	json_t *third = claim_now(f->e, NULL, 0);
	if (third)
		fail_msg("task %s (claim attempt %lld) given to a third claim while claimed",
			 json_string_value(json_object_get(third, "id")),
			 (long long)json_integer_value(json_object_get(third, "claim_attempt")));
	assert_int_equal(json_integer_value(json_object_get(other, "claim_attempt")), 3);
	json_decref(first);
	json_decref(again);
	json_decref(other);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_steps_complete_in_order_without_overlap, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_resubmit_is_idempotent_and_conflicts_are_refused,
					    setup, teardown),
	    cmocka_unit_test_setup_teardown(test_generated_ids_are_128_bit_hex, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_close_mid_step_resumes_as_new_attempt, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_retry_wait_survives_reopen, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_cancel_and_unknown_ids, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_schema_1_database_is_migrated, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_schema_2_database_opens_as_it_is, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_pending_steps_have_no_row_until_reached, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_calls_share_the_inbox_cap, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_a_stale_give_back_never_names_a_later_claim, setup,
					    teardown),
	};
	return cmocka_run_group_tests_name("engine", tests, NULL, NULL);
}
