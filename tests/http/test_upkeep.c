/*
 * test_upkeep.c - keeping batond's database in shape, against the real binary on both
 * stores: DELETE /workflows/{id} (204, 404, 409 while pending or running, and what a
 * deleted workflow leaves behind: nothing, not even in the cache of finished ones),
 * retention deleting finished workflows in bounded batches while others run (event seqs
 * never handed out twice, across a restart), and GET /backup: on SQLite a copy taken
 * under load, from which a new batond resumes every unfinished workflow and re-runs
 * nothing finished; on PostgreSQL a 501 problem (and `baton backup` exits 1, writing
 * nothing).
 *
 * Each test starts its own batond on a fresh database (harness.h); the client (`baton
 * delete`, `baton backup`) runs as a child process (client.h).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sqlite3.h>

#include "../harness/client.h"
#include "../harness/harness.h"
#include "../harness/prom.h"

#define WAIT_MS 60000

static int setup_quick_stop(void **state)
{
	static const char *const args[] = {"--shutdown-timeout", "0", NULL};
	hs_server *s = hs_open(args);
	*state = s;
	return s ? 0 : -1;
}

/* The second server of the backup test, stopped here also when the test fails. */
static hs_server *restored;

static int teardown(void **state)
{
	client_free_all();
	int rc = hs_close(restored);
	restored = NULL;
	return hs_teardown(state) || rc ? -1 : 0;
}

/* Workflow `id` on `resource` of n workers of work_ms each. */
static json_t *workflow(const char *id, const char *resource, int n, int work_ms)
{
	json_t *workers = json_array();
	for (int i = 0; i < n; i++) {
		char name[16];
		snprintf(name, sizeof name, "w%d", i);
		json_array_append_new(workers,
				      json_pack("{s:s, s:i}", "name", name, "work_ms", work_ms));
	}
	return json_pack("{s:s, s:s, s:o}", "id", id, "resource", resource, "workers", workers);
}

static void submit(const hs_server *s, const char *id, const char *resource, int n, int work_ms)
{
	json_decref(hs_create_workflow(s, workflow(id, resource, n, work_ms)));
}

static long status_of(const hs_server *s, const char *method, const char *path)
{
	hs_request req = {.method = method, .path = path};
	hs_response r;
	assert_int_equal(hs_send(s, &req, &r), 0);
	long st = r.status;
	hs_response_fini(&r);
	return st;
}

static void assert_problem_at(const hs_server *s, const char *method, const char *path, long status,
			      const char *slug)
{
	hs_request req = {.method = method, .path = path};
	hs_response r;
	assert_int_equal(hs_send(s, &req, &r), 0);
	char what[256];
	snprintf(what, sizeof what, "%s %s", method, path);
	hs_assert_problem(&r, status, slug, what);
	hs_response_fini(&r);
}

static double metric(const hs_server *s, const char *name)
{
	json_t *m = prom_scrape(s);
	double v = prom_metric_of(m, name, "");
	json_decref(m);
	return v;
}

/* The highest seq of a workflow's events. */
static json_int_t last_seq(const hs_server *s, const char *id)
{
	json_t *ev = hs_get_events(s, id);
	json_int_t seq = hs_int(json_array_get(ev, json_array_size(ev) - 1), "seq");
	json_decref(ev);
	return seq;
}

/* ---- DELETE ------------------------------------------------------------------------- */

/*
 * A finished workflow, read (so that it sits in the cache of finished workflows), is
 * deleted: 204 without a body; afterwards GET, its events and a second DELETE answer 404,
 * the list and the resource's history no longer show it, and /metrics counts it. A
 * running and a pending workflow answer 409 and stay; once cancelled, they are deleted.
 * Unknown and malformed ids answer 404. The id may be submitted again. `baton delete`
 * exits 0 and says so, and 1 for an unknown id.
 */
static void test_delete(void **state)
{
	hs_server *s = *state;
	submit(s, "done", "press", 1, 0);
	json_decref(hs_wait_workflow(s, "done", "completed", WAIT_MS));
	json_decref(hs_get_workflow(s, "done"));
	json_decref(hs_get_workflow(s, "done")); /* served from the cache now */
	submit(s, "busy", "press", 1, 600000);
	json_decref(hs_wait_step(s, "busy", 0, "running", WAIT_MS));
	submit(s, "queued", "press", 1, 0);
	json_decref(hs_wait_step(s, "queued", 0, "waiting", WAIT_MS));

	assert_problem_at(s, "DELETE", "/workflows/busy", 409, "conflict");
	assert_problem_at(s, "DELETE", "/workflows/queued", 409, "conflict");
	json_t *busy = hs_get_workflow(s, "busy");
	assert_string_equal(hs_str(busy, "status"), "running");
	json_decref(busy);

	hs_request del = {.method = "DELETE", .path = "/workflows/done"};
	hs_response r;
	assert_int_equal(hs_send(s, &del, &r), 0);
	assert_int_equal(r.status, 204);
	assert_int_equal(r.body_len, 0);
	hs_response_fini(&r);
	assert_problem_at(s, "GET", "/workflows/done", 404, "not-found");
	assert_problem_at(s, "GET", "/workflows/done/events", 404, "not-found");
	assert_problem_at(s, "DELETE", "/workflows/done", 404, "not-found");
	assert_problem_at(s, "DELETE", "/workflows/never-was", 404, "not-found");
	assert_problem_at(s, "DELETE", "/workflows/bad%20id", 404, "not-found");
	json_t *list = hs_get_json(s, "/workflows", 200), *w;
	size_t i;
	json_array_foreach(json_object_get(list, "workflows"), i, w)
	    assert_string_not_equal(hs_str(w, "id"), "done");
	json_decref(list);
	json_t *hist = hs_get_json(s, "/resources/press/events", 200), *e;
	json_array_foreach(json_object_get(hist, "events"), i, e)
	    assert_string_not_equal(hs_str(e, "workflow_id"), "done");
	assert_true(json_array_size(json_object_get(hist, "events")) > 0);
	json_decref(hist);
	assert_true(metric(s, "baton_workflows_deleted_total") == 1);

	/* Cancelled, then deletable; the client says so. */
	hs_response c;
	assert_int_equal(hs_post(s, "/workflows/queued/cancel", NULL, &c), 0);
	assert_int_equal(c.status, 200);
	hs_response_fini(&c);
	json_decref(hs_wait_workflow(s, "queued", "cancelled", WAIT_MS));
	const char *const del_queued[] = {"delete", "queued", NULL};
	client_proc *p = client_expect_exit(0, client_url_of(s), del_queued);
	assert_non_null(strstr(p->o.p, "deleted queued"));
	client_free(p);
	assert_int_equal(status_of(s, "GET", "/workflows/queued"), 404);
	p = client_expect_exit(1, client_url_of(s), del_queued);
	assert_non_null(strstr(p->e.p, "404"));
	client_free(p);

	/* The id is free again. */
	submit(s, "done", "press2", 1, 0);
	json_decref(hs_wait_workflow(s, "done", "completed", WAIT_MS));
	assert_true(metric(s, "baton_workflows_deleted_total") == 2);
	assert_true(metric(s, "baton_deletes_total") == 2);
}

/* ---- retention ---------------------------------------------------------------------- */

typedef struct metric_at_least {
	const hs_server *s;
	const char *name;
	double want;
} metric_at_least;

static bool metric_reached(void *arg)
{
	metric_at_least *m = arg;
	return metric(m->s, m->name) >= m->want;
}

#define NOLD 250

static int setup_retention(void **state)
{
	static const char *const args[] = {"--retention",	 "2s", "--threads", "8",
					   "--shutdown-timeout", "0",  NULL};
	hs_server *s = hs_open(args);
	*state = s;
	return s ? 0 : -1;
}

/*
 * --retention 2s: 250 quick workflows finish and are all deleted, in at least 3
 * transactions (a batch holds at most 100), while a slow workflow submitted first runs
 * on (older than the retention, but unfinished: never deleted) and completes afterwards,
 * to be deleted in turn. The resources' histories empty with them. Then, after a restart,
 * a new workflow's events get seqs above every seq handed out before, although the
 * workflows that held the newest ones are gone.
 */
static void test_retention_batches_while_running(void **state)
{
	hs_server *s = *state;
	submit(s, "slow", "kiln", 3, 2500);
	json_decref(hs_wait_step(s, "slow", 0, "running", WAIT_MS));
	for (int i = 0; i < NOLD; i++) {
		char id[32], res[32];
		snprintf(id, sizeof id, "old-%d", i);
		snprintf(res, sizeof res, "lathe-%d", i % 8);
		submit(s, id, res, 1, 0);
	}
	json_int_t seen = last_seq(s, "slow");
	metric_at_least all = {s, "baton_workflows_deleted_total", NOLD};
	if (!hs_wait_until(metric_reached, &all, WAIT_MS))
		fail_msg("%g of %d old workflows deleted", metric(s, all.name), NOLD);
	double deletes = metric(s, "baton_deletes_total");
	if (deletes < 3)
		fail_msg("%d workflows deleted in %g transactions: batches are not bounded", NOLD,
			 deletes);
	for (int i = 0; i < NOLD; i += 25) {
		char path[64];
		snprintf(path, sizeof path, "/workflows/old-%d", i);
		assert_int_equal(status_of(s, "GET", path), 404);
	}
	json_t *h = hs_get_json(s, "/resources/lathe-0/events", 200);
	assert_int_equal(json_array_size(json_object_get(h, "events")), 0);
	json_decref(h);

	/* The slow one outlived the retention unfinished, then ends and goes too. */
	json_t *slow = hs_get_workflow(s, "slow");
	const char *st = hs_str(slow, "status");
	assert_true(strcmp(st, "running") == 0 || strcmp(st, "completed") == 0);
	json_decref(slow);
	json_decref(hs_wait_workflow(s, "slow", "completed", WAIT_MS));
	seen = last_seq(s, "slow") > seen ? last_seq(s, "slow") : seen;
	metric_at_least gone = {s, "baton_workflows_deleted_total", NOLD + 1};
	if (!hs_wait_until(metric_reached, &gone, WAIT_MS))
		fail_msg("the slow workflow was not deleted after it finished");
	assert_int_equal(status_of(s, "GET", "/workflows/slow"), 404);

	/* Nothing is left that holds the newest seq: a restart must not hand it out again. */
	assert_int_equal(hs_stop(s), 0);
	assert_int_equal(hs_start(s), 0);
	submit(s, "after", "kiln", 1, 0);
	json_decref(hs_wait_workflow(s, "after", "completed", WAIT_MS));
	json_t *ev = hs_get_events(s, "after");
	json_int_t first = hs_int(json_array_get(ev, 0), "seq");
	json_decref(ev);
	if (first <= seen)
		fail_msg("after a restart, event seq %lld was handed out again (seen up to %lld)",
			 (long long)first, (long long)seen);
}

/* ---- backup ------------------------------------------------------------------------- */

typedef struct copied {
	char id[64];
	char status[16];
	long long finished_at;
	size_t events; /* on the restored server, at its start */
} copied;

/* The workflows of the SQLite file `path`, read directly (the server is stopped). */
static size_t read_copy(const char *path, copied *out, size_t max)
{
	sqlite3 *db;
	sqlite3_stmt *q;
	assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
	assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &q, NULL), SQLITE_OK);
	assert_int_equal(sqlite3_step(q), SQLITE_ROW);
	assert_string_equal((const char *)sqlite3_column_text(q, 0), "ok");
	sqlite3_finalize(q);
	assert_int_equal(sqlite3_prepare_v2(db,
					    "SELECT id, status, coalesce(finished_at, 0)"
					    " FROM workflows ORDER BY seq",
					    -1, &q, NULL),
			 SQLITE_OK);
	size_t n = 0;
	while (n < max && sqlite3_step(q) == SQLITE_ROW) {
		snprintf(out[n].id, sizeof out[n].id, "%s", sqlite3_column_text(q, 0));
		snprintf(out[n].status, sizeof out[n].status, "%s", sqlite3_column_text(q, 1));
		out[n].finished_at = sqlite3_column_int64(q, 2);
		n++;
	}
	sqlite3_finalize(q);
	sqlite3_close(db);
	return n;
}

static bool unfinished(const copied *c)
{
	return strcmp(c->status, "pending") == 0 || strcmp(c->status, "running") == 0;
}

#define NLOAD 12

/*
 * A backup under load: 6 finished workflows, then 12 of 3 steps of 1 s on 3 resources (some
 * running, the rest queued) when `baton backup` writes the copy. The copy passes SQLite's integrity
 * check and holds unfinished workflows. A second batond started on the copy (the first one killed)
 * resumes each of them to completion, and leaves each workflow that had finished in the copy as it
 * was: same status, same finish time, no new event.
 */
static void test_backup_under_load_restores(void **state)
{
	hs_server *s = *state;
	if (hs_store_is_pg()) {
		assert_problem_at(s, "GET", "/backup", 501, "not-implemented");
		char file[64];
		snprintf(file, sizeof file, "/tmp/baton-no-backup-%d.db", (int)getpid());
		const char *const args[] = {"backup", file, NULL};
		client_proc *p = client_expect_exit(1, client_url_of(s), args);
		assert_non_null(strstr(p->e.p, "pg_dump"));
		client_free(p);
		assert_int_not_equal(access(file, F_OK), 0);
		skip();
	}
	/* The server to restore on, its own database removed. */
	static const char *const args[] = {"--shutdown-timeout", "0", NULL};
	hs_server *b = restored = hs_open(args);
	assert_non_null(b);
	assert_int_equal(hs_stop(b), 0);
	char path[4200];
	const char *suffixes[] = {"", "-wal", "-shm"};
	for (int i = 0; i < 3; i++) {
		snprintf(path, sizeof path, "%s%s", hs_db_path(b), suffixes[i]);
		unlink(path);
	}

	char id[64], res[32];
	for (int i = 0; i < 6; i++) {
		snprintf(id, sizeof id, "early-%d", i);
		submit(s, id, "anvil", 2, 0);
	}
	json_decref(hs_wait_workflow(s, "early-5", "completed", WAIT_MS));
	for (int i = 0; i < NLOAD; i++) {
		snprintf(id, sizeof id, "load-%d", i);
		snprintf(res, sizeof res, "forge-%d", i % 3);
		submit(s, id, res, 3, 1000);
	}
	json_decref(hs_wait_step(s, "load-0", 1, "running", WAIT_MS));

	const char *const backup[] = {"backup", hs_db_path(b), NULL};
	client_proc *p = client_expect_exit(0, client_url_of(s), backup);
	assert_non_null(strstr(p->o.p, "backup written to"));
	client_free(p);
	snprintf(path, sizeof path, "%s.part", hs_db_path(b));
	assert_int_not_equal(access(path, F_OK), 0);
	hs_kill(s); /* the copy is all there is now */

	copied c[64];
	size_t n = read_copy(hs_db_path(b), c, 64);
	assert_int_equal(n, 6 + NLOAD);
	size_t open_ones = 0;
	for (size_t i = 0; i < n; i++)
		open_ones += unfinished(&c[i]);
	if (open_ones == 0)
		fail_msg("the copy was taken after the load had ended: it proves nothing");

	assert_int_equal(hs_start(b), 0);
	for (size_t i = 0; i < n; i++)
		if (!unfinished(&c[i])) {
			json_t *ev = hs_get_events(b, c[i].id);
			c[i].events = json_array_size(ev);
			json_decref(ev);
		}
	for (size_t i = 0; i < n; i++) {
		json_t *wf = unfinished(&c[i]) ? hs_wait_workflow(b, c[i].id, "completed", WAIT_MS)
					       : hs_get_workflow(b, c[i].id);
		if (!unfinished(&c[i])) {
			assert_string_equal(hs_str(wf, "status"), c[i].status);
			assert_true(hs_time(wf, "finished_at") == c[i].finished_at);
			json_t *ev = hs_get_events(b, c[i].id);
			if (json_array_size(ev) != c[i].events)
				fail_msg("%s, finished in the copy, has %zu events, not %zu",
					 c[i].id, json_array_size(ev), c[i].events);
			json_decref(ev);
		} else {
			json_t *step = hs_step_at(wf, 2);
			assert_string_equal(hs_str(step, "status"), "completed");
		}
		json_decref(wf);
	}
}

/* ---- the setting -------------------------------------------------------------------- */

/*
 * --retention and BATON_RETENTION take 45s, 90m, 12h, 30d, a bare number of seconds, 0
 * or forever; anything else stops batond at start (status 2) with a message naming the
 * setting; --help shows it.
 */
static void test_retention_setting_is_checked(void **state)
{
	(void)state;
	static const char *const bad[] = {"5x", "-1s", "", "1.5h", "s", "10dd", "99999999d"};
	char text[4096];
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		const char *const args[] = {"--listen", "127.0.0.1:0", "--retention", bad[i], NULL};
		int status = hs_run_batond(args, NULL, NULL, WAIT_MS, text, sizeof text);
		if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 2 ||
		    !strstr(text, "--retention wants a duration"))
			fail_msg("--retention \"%s\": status %d, said: %s", bad[i], status, text);
	}
	const char *const none[] = {"--listen", "127.0.0.1:0", NULL};
	int status = hs_run_batond(none, "BATON_RETENTION", "soon", WAIT_MS, text, sizeof text);
	assert_true(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 2);
	assert_non_null(strstr(text, "(from BATON_RETENTION)"));
	const char *const help[] = {"--help", NULL};
	status = hs_run_batond(help, NULL, NULL, WAIT_MS, text, sizeof text);
	assert_true(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
	assert_non_null(strstr(text, "--retention DURATION"));
	assert_non_null(strstr(text, "BATON_RETENTION, default forever"));
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_retention_setting_is_checked),
	    cmocka_unit_test_setup_teardown(test_delete, setup_quick_stop, teardown),
	    cmocka_unit_test_setup_teardown(test_retention_batches_while_running, setup_retention,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_backup_under_load_restores, setup_quick_stop,
					    teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
