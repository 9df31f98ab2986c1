/*
 * test_tasks.c - external workers over HTTP against the real batond: a step of a worker
 * {"external": true} holds its resource until a process claims it (POST /tasks/claim),
 * gets the workflow's results so far, and completes or fails it; 204 when no task comes;
 * filters; one step to one claimer; a claim not heartbeaten expires as a failed attempt
 * and is retried with a new token, while the stale attempt's heartbeat and completion
 * answer 410; failures retryable or not; kill -9 while a task is claimed; the cancel of a
 * workflow whose external step nobody claimed; bad input; a node that cannot read the task's
 * workflow answers 503, not 404.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../harness/cluster.h"
#include "../harness/harness.h"

#define WAIT_MS 60000

static json_t *claim(const hs_server *s, const char *body, long *status)
{
	hs_response r;
	if (hs_post(s, "/tasks/claim", body, &r) != 0)
		fail_msg("POST /tasks/claim: %s", r.error);
	*status = r.status;
	json_t *j = json_incref(r.json);
	hs_response_fini(&r);
	return j;
}

static json_t *claim_ok(const hs_server *s, const char *body)
{
	long status;
	json_t *t = claim(s, body, &status);
	if (status != 200)
		fail_msg("claim answered %ld", status);
	return t;
}

static long task_call(const hs_server *s, const char *id, const char *what, const char *body)
{
	char path[300];
	snprintf(path, sizeof path, "/tasks/%s/%s", id, what);
	hs_response r;
	if (hs_post(s, path, body, &r) != 0)
		fail_msg("POST %s: %s", path, r.error);
	long status = r.status;
	if (status >= 400)
		assert_string_equal(r.content_type, "application/problem+json");
	hs_response_fini(&r);
	return status;
}

static json_t *submit(const hs_server *s, const char *id, const char *resource, const char *worker,
		      int max_attempts)
{
	return hs_create_workflow(s, json_pack("{s:s, s:s, s:[s, {s:s, s:b}], s:{s:i, s:i}}", "id",
					       id, "resource", resource, "workers", "prep", "name",
					       worker, "external", 1, "retry", "max_attempts",
					       max_attempts, "first_retry_ms", 200));
}

static void test_claim_and_complete(void **state)
{
	hs_server *s = *state;
	json_decref(submit(s, "w1", "db", "reindex", 1));
	json_t *t = claim_ok(s, "{\"worker\": \"reindex\", \"wait_ms\": 60000}");
	assert_string_equal(hs_str(t, "id"), "w1.1.1");
	assert_string_equal(hs_str(t, "workflow_id"), "w1");
	assert_int_equal(hs_int(t, "step"), 1);
	assert_string_equal(hs_str(t, "worker"), "reindex");
	assert_string_equal(hs_str(t, "resource"), "db");
	assert_int_equal(hs_int(t, "attempt"), 1);
	hs_time(t, "expires_at");
	assert_non_null(json_object_get(json_object_get(t, "input"), "prep"));
	/* the token is the grant's: the step holds the resource */
	json_t *wf = hs_get_workflow(s, "w1");
	assert_int_equal(hs_int(t, "fencing_token"), hs_int(hs_step_at(wf, 1), "fencing_token"));
	assert_string_equal(hs_str(hs_step_at(wf, 1), "status"), "running");
	json_decref(wf);
	json_t *res = hs_get_json(s, "/resources/db", 200);
	assert_string_equal(hs_str(json_object_get(res, "holder"), "worker"), "reindex");
	json_decref(res);
	assert_int_equal(task_call(s, "w1.1.1", "heartbeat", NULL), 200);
	assert_int_equal(task_call(s, "w1.1.1", "complete", "{\"result\": {\"rows\": 42}}"), 200);
	wf = hs_wait_workflow(s, "w1", "completed", WAIT_MS);
	assert_int_equal(hs_int(json_object_get(hs_step_at(wf, 1), "result"), "rows"), 42);
	json_decref(wf);
	assert_int_equal(task_call(s, "w1.1.1", "complete", "{\"result\": 1}"), 410);
	json_decref(t);
}

static void test_no_task_is_204(void **state)
{
	hs_server *s = *state;
	long status;
	json_decref(claim(s, "{\"wait_ms\": 0}", &status));
	assert_int_equal(status, 204);
	json_decref(claim(s, "{\"wait_ms\": 300}", &status));
	assert_int_equal(status, 204);
}

static void test_filters(void **state)
{
	hs_server *s = *state;
	json_decref(submit(s, "wa", "r1", "alpha", 1));
	json_decref(submit(s, "wb", "r2", "beta", 1));
	json_t *b = claim_ok(s, "{\"worker\": \"beta\", \"wait_ms\": 60000}");
	assert_string_equal(hs_str(b, "workflow_id"), "wb");
	json_t *a = claim_ok(s, "{\"resource\": \"r1\", \"wait_ms\": 60000}");
	assert_string_equal(hs_str(a, "workflow_id"), "wa");
	long status;
	json_decref(claim(s, "{\"wait_ms\": 0}", &status));
	assert_int_equal(status, 204); /* both are claimed */
	json_decref(a);
	json_decref(b);
}

typedef struct claim_job {
	const hs_server *s;
	long status;
	pthread_t t;
} claim_job;

static void *claim_thread(void *arg)
{
	claim_job *j = arg;
	json_decref(claim(j->s, "{\"wait_ms\": 3000}", &j->status));
	return NULL;
}

static void test_one_step_one_claimer(void **state)
{
	hs_server *s = *state;
	claim_job jobs[4];
	for (int i = 0; i < 4; i++) {
		jobs[i] = (claim_job){.s = s};
		assert_int_equal(pthread_create(&jobs[i].t, NULL, claim_thread, &jobs[i]), 0);
	}
	json_decref(submit(s, "w1", "db", "reindex", 1));
	int got = 0;
	for (int i = 0; i < 4; i++) {
		pthread_join(jobs[i].t, NULL);
		assert_true(jobs[i].status == 200 || jobs[i].status == 204);
		got += jobs[i].status == 200;
	}
	assert_int_equal(got, 1);
}

static void test_expired_claim_is_retried_with_new_token(void **state)
{
	hs_server *s = *state;
	json_decref(submit(s, "w1", "db", "reindex", 3));
	json_t *t1 = claim_ok(s, "{\"ttl_ms\": 1000, \"wait_ms\": 60000}");
	/* no heartbeat: the claim expires, the attempt fails and is offered again */
	json_t *t2 = claim_ok(s, "{\"wait_ms\": 60000}");
	assert_string_equal(hs_str(t2, "id"), "w1.1.2");
	assert_true(hs_int(t2, "fencing_token") > hs_int(t1, "fencing_token"));
	assert_int_equal(task_call(s, "w1.1.1", "heartbeat", NULL), 410);
	assert_int_equal(task_call(s, "w1.1.1", "complete", "{\"result\": \"late\"}"), 410);
	assert_int_equal(task_call(s, "w1.1.2", "complete", "{\"result\": \"ok\"}"), 200);
	json_t *wf = hs_wait_workflow(s, "w1", "completed", WAIT_MS);
	assert_string_equal(json_string_value(json_object_get(hs_step_at(wf, 1), "result")), "ok");
	json_decref(wf);
	json_t *ev = hs_get_events(s, "w1");
	json_t *failed = hs_event_find(ev, "step_failed", 1, 1);
	assert_non_null(failed);
	assert_non_null(strstr(hs_str(failed, "error"), "claim expired"));
	json_decref(ev);
	json_decref(t1);
	json_decref(t2);
}

static void test_fail_retryable_or_not(void **state)
{
	hs_server *s = *state;
	json_decref(submit(s, "w1", "db", "reindex", 3));
	json_t *t = claim_ok(s, "{\"wait_ms\": 60000}");
	assert_int_equal(task_call(s, hs_str(t, "id"), "fail", "{\"error\": \"disk busy\"}"), 200);
	json_decref(t);
	t = claim_ok(s, "{\"wait_ms\": 60000}");
	assert_int_equal(hs_int(t, "attempt"), 2);
	assert_int_equal(task_call(s, hs_str(t, "id"), "fail",
				   "{\"error\": \"bad schema\", \"retryable\": false}"),
			 200);
	json_t *wf = hs_wait_workflow(s, "w1", "failed", WAIT_MS);
	assert_non_null(strstr(hs_str(wf, "error"), "bad schema"));
	json_decref(wf);
	json_decref(t);
}

/* A claim survives kill -9 as a lease does: its worker may still be at work, so nobody else
 * is given the step while the claim lives (its ttl counted again from the restart), and the
 * worker heartbeats and completes it under the same id. */
static void test_kill9_keeps_a_claim(void **state)
{
	hs_server *s = *state;
	json_decref(submit(s, "w1", "db", "reindex", 3));
	json_t *t1 = claim_ok(s, "{\"wait_ms\": 60000, \"ttl_ms\": 30000}");
	hs_kill(s);
	assert_int_equal(hs_start(s), 0);
	long status;
	json_decref(claim(s, "{\"wait_ms\": 3000}", &status));
	assert_int_equal(status, 204);
	assert_int_equal(task_call(s, hs_str(t1, "id"), "heartbeat", NULL), 200);
	assert_int_equal(task_call(s, hs_str(t1, "id"), "complete", "{\"result\": 1}"), 200);
	json_t *wf = hs_wait_workflow(s, "w1", "completed", WAIT_MS);
	assert_int_equal(hs_int(hs_step_at(wf, 1), "attempts"), 1);
	json_decref(wf);
	json_decref(t1);
}

/* A claim whose worker died with batond ends after its ttl, counted from the restart; the
 * step is then claimed again as a new attempt with a higher token, and the old id is gone. */
static void test_kill9_claim_expires_after_restart(void **state)
{
	hs_server *s = *state;
	json_decref(submit(s, "w1", "db", "reindex", 3));
	json_t *t1 = claim_ok(s, "{\"wait_ms\": 60000, \"ttl_ms\": 2000}");
	hs_kill(s);
	assert_int_equal(hs_start(s), 0);
	json_t *t2 = claim_ok(s, "{\"wait_ms\": 60000}");
	assert_int_equal(hs_int(t2, "attempt"), 2);
	assert_true(hs_int(t2, "fencing_token") > hs_int(t1, "fencing_token"));
	assert_int_equal(task_call(s, hs_str(t1, "id"), "complete", "{\"result\": 1}"), 410);
	assert_int_equal(task_call(s, hs_str(t2, "id"), "complete", "{\"result\": 2}"), 200);
	json_decref(hs_wait_workflow(s, "w1", "completed", WAIT_MS));
	json_decref(t1);
	json_decref(t2);
}

/* A worker that half-closes its socket after its claim is never told it holds a task it
 * does not hold: either 200 and the step is claimed (its heartbeat works), or no task. */
static void test_half_closed_claim_is_told_the_truth(void **state)
{
	hs_server *s = *state;
	json_decref(submit(s, "w1", "db", "reindex", 3));
	json_decref(hs_wait_step(s, "w1", 1, "running", WAIT_MS));
	json_t *t;
	long st = hs_post_half_closed(s, "/tasks/claim", "{\"wait_ms\": 0}", &t);
	assert_true(st == 200 || st == 409 || st == 204);
	if (st == 200) {
		assert_int_equal(task_call(s, hs_str(t, "id"), "heartbeat", NULL), 200);
	} else { /* the step is offered again: the next claim gets it */
		json_t *t2 = claim_ok(s, "{\"wait_ms\": 10000}");
		json_decref(t2);
	}
	json_decref(t);
}

static void test_unclaimed_step_holds_the_resource(void **state)
{
	hs_server *s = *state;
	json_decref(submit(s, "w1", "db", "reindex", 1));
	json_decref(hs_wait_step(s, "w1", 1, "running", WAIT_MS));
	hs_response r;
	assert_int_equal(hs_post(s, "/resources/db/leases", "{\"holder\": \"x\"}", &r), 0);
	assert_int_equal(r.status, 409);
	assert_string_equal(hs_str(r.json, "holder"), "reindex");
	hs_response_fini(&r);
}

static void test_cancel_of_an_unclaimed_step(void **state)
{
	hs_server *s = *state;
	json_decref(submit(s, "w1", "db", "reindex", 3));
	json_decref(hs_wait_step(s, "w1", 1, "running", WAIT_MS));
	hs_response r;
	assert_int_equal(hs_post(s, "/workflows/w1/cancel", NULL, &r), 0);
	assert_int_equal(r.status, 200);
	hs_response_fini(&r);
	json_decref(hs_wait_workflow(s, "w1", "cancelled", WAIT_MS));
	json_t *res = hs_get_json(s, "/resources/db", 200);
	assert_true(json_is_null(json_object_get(res, "holder"))); /* released */
	json_decref(res);
	long status;
	json_decref(claim(s, "{\"wait_ms\": 0}", &status));
	assert_int_equal(status, 204); /* nothing left to claim */
}

static int cluster_setup(void **state)
{
	*state = calloc(1, sizeof(cluster));
	return *state ? 0 : -1;
}

static int cluster_teardown(void **state)
{
	cluster *c = *state;
	int rc = cl_close(c);
	free(c);
	return rc;
}

struct report {
	hs_server *s;
	const char *id, *what;
	long want;
};

static bool report_answers(void *arg)
{
	struct report *r = arg;
	return task_call(r->s, r->id, r->what, NULL) == r->want;
}

/* A report on a task whose workflow has left the node's memory (it ended) is looked up in
 * the database. A node that cannot read it (cut off PostgreSQL) answers 503, try again: not
 * 404 "no such task", which tells a worker that baton never issued the id, and which baton
 * worker takes for the attempt's end. Once the node reads again it answers 410. PostgreSQL
 * only: a SQLite read does not fail this way. */
static void test_unreadable_task_is_503_not_404(void **state)
{
	if (!hs_store_is_pg())
		skip();
	cluster *c = *state;
	assert_int_equal(cl_open_proxied(c, 1, 2000, NULL), 0);
	hs_server *s = c->node[0];
	json_decref(submit(s, "cut1", "db", "reindex", 1));
	json_decref(claim_ok(s, "{\"worker\": \"reindex\", \"wait_ms\": 60000}"));
	assert_int_equal(task_call(s, "cut1.1.1", "complete", "{\"result\": 1}"), 200);
	json_decref(hs_wait_workflow(s, "cut1", "completed", WAIT_MS));
	cl_cut(c, 0);
	long complete = task_call(s, "cut1.1.1", "complete", "{\"result\": 1}");
	long heartbeat = task_call(s, "cut1.1.1", "heartbeat", NULL);
	cl_heal(c, 0);
	assert_int_equal(complete, 503);
	assert_int_equal(heartbeat, 503);
	struct report r = {s, "cut1.1.1", "heartbeat", 410};
	assert_true(hs_wait_until(report_answers, &r, WAIT_MS));
}

static void test_bad_input(void **state)
{
	hs_server *s = *state;
	static const char *const bad_claims[] = {"{\"ttl_ms\": 10}", "{\"wait_ms\": 300001}",
						 "{\"color\": 1}", "{\"worker\": 5}", "[]"};
	for (size_t i = 0; i < sizeof bad_claims / sizeof *bad_claims; i++) {
		hs_response r;
		assert_int_equal(hs_post(s, "/tasks/claim", bad_claims[i], &r), 0);
		hs_assert_problem(&r, 400, "invalid-request", bad_claims[i]);
		hs_response_fini(&r);
	}
	static const char *const bad_wfs[] = {
	    "{\"resource\": \"db\", \"workers\": [{\"name\": \"a\", \"external\": \"yes\"}]}",
	    "{\"resource\": \"db\", \"workers\": [{\"name\": \"a\", \"external\": true, "
	    "\"work_ms\": 5}]}"};
	for (size_t i = 0; i < 2; i++) {
		hs_response r;
		assert_int_equal(hs_post(s, "/workflows", bad_wfs[i], &r), 0);
		hs_assert_problem(&r, 400, "invalid-request", bad_wfs[i]);
		hs_response_fini(&r);
	}
	assert_int_equal(task_call(s, "nope.0.1", "complete", "{}"), 404);
	assert_int_equal(task_call(s, "nope", "heartbeat", NULL), 404);
	assert_int_equal(task_call(s, "x.0.1", "fail", "{\"retryable\": 3}"), 400);
	json_t *list = hs_get_json(s, "/workflows", 200);
	assert_int_equal(json_array_size(json_object_get(list, "workflows")), 0);
	json_decref(list);
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_claim_and_complete, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_no_task_is_204, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_filters, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_one_step_one_claimer, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_expired_claim_is_retried_with_new_token, hs_setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_fail_retryable_or_not, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_kill9_keeps_a_claim, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_kill9_claim_expires_after_restart, hs_setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_half_closed_claim_is_told_the_truth, hs_setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_unclaimed_step_holds_the_resource, hs_setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_cancel_of_an_unclaimed_step, hs_setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_bad_input, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_unreadable_task_is_503_not_404, cluster_setup,
					    cluster_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
