/*
 * test_cancel.c - cancelling workflows that wait, run or wait to retry, over HTTP against
 * the real batond: a waiting workflow is cancelled at once and leaves the queue; a
 * running one ends after its step, whose checkpoint stays; a retry wait ends at once;
 * each hands the resource to the next waiter; a repeat is harmless and a finished
 * workflow cannot be cancelled.
 *
 * Each test starts its own batond on a fresh temporary database (harness.h), allowed to
 * call a test resource (calls.h): a workflow that must hold its resource while the test
 * looks makes a call that the resource holds until the test opens its gate, so no check
 * depends on how fast the machine is.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../harness/calls.h"
#include "../harness/queue.h"

#define WAIT_MS 60000

/* POST /workflows/{id}/cancel; returns the response (the caller finishes it). */
static hs_response cancel(const hs_server *s, const char *id)
{
	char path[256];
	snprintf(path, sizeof path, "/workflows/%s/cancel", id);
	hs_request req = {.method = "POST", .path = path};
	hs_response r;
	hs_send(s, &req, &r);
	return r;
}

/* Asserts that in `events` the grant right after `prev`'s release of step `step` is `next`'s. */
static void assert_handed_to(const json_t *events, const char *prev, int step, const char *next)
{
	bool released = false;
	size_t i;
	json_t *ev;
	json_array_foreach(events, i, ev)
	{
		const char *wf = hs_str(ev, "workflow_id");
		if (queue_is_type(ev, "lock_released") && strcmp(wf, prev) == 0 &&
		    hs_int(ev, "step") == step)
			released = true;
		else if (released && queue_is_type(ev, "lock_acquired")) {
			if (strcmp(wf, next) != 0)
				fail_msg("after %s released, the resource went to %s, expected %s",
					 prev, wf, next);
			return;
		}
	}
	fail_msg("no grant after %s released step %d", prev, step);
}

/* Cancelling a waiting workflow: cancelled at once, leaves the queue, the next waiter moves up. */
static void test_cancel_waiting(void **state)
{
	calls_ctx *c = *state;
	hs_server *s = c->s;
	calls_submit_gated(c, "cw-holder", "cw", 1);
	json_decref(hs_wait_step(s, "cw-holder", 0, "running", WAIT_MS));
	queue_submit(s, "cw-1", "cw", 1, 10);
	queue_submit(s, "cw-2", "cw", 1, 10);
	queue_wait(s, "cw", 2);

	hs_response r = cancel(s, "cw-1");
	assert_int_equal(r.status, 200);
	assert_string_equal(hs_str(r.json, "id"), "cw-1");
	assert_string_equal(hs_str(r.json, "status"), "cancelled");
	hs_response_fini(&r);
	json_t *wf1 = hs_get_workflow(s, "cw-1");
	hs_assert_workflow_shape(wf1);
	assert_string_equal(hs_str(wf1, "status"), "cancelled");
	assert_string_equal(hs_str(hs_step_at(wf1, 0), "status"), "cancelled");
	hs_time(wf1, "finished_at");

	json_t *res = hs_get_json(s, "/resources/cw", 200);
	json_t *waiters = json_object_get(res, "waiters");
	assert_int_equal(json_array_size(waiters), 1);
	assert_string_equal(hs_str(json_array_get(waiters, 0), "workflow_id"), "cw-2");
	assert_int_equal(hs_int(json_array_get(waiters, 0), "position"), 1);
	json_t *wf2 = hs_get_workflow(s, "cw-2");
	assert_int_equal(hs_int(hs_step_at(wf2, 0), "queue_position"), 1);

	fragile_open_gate(c->res);
	char *ids[] = {"cw-holder", "cw-2"};
	json_t **wfs = queue_wait_completed(s, ids, 2);
	char *all_ids[] = {"cw-holder", "cw-1", "cw-2"};
	json_t *events = queue_merged_events(s, all_ids, 3);
	assert_handed_to(events, "cw-holder", 0, "cw-2");
	json_t *ev1 = hs_get_events(s, "cw-1");
	assert_int_equal(hs_event_count(ev1, "lock_acquired", -1, -1), 0);
	assert_non_null(hs_event_find(ev1, "cancel_requested", -1, -1));
	assert_string_equal(hs_str(json_array_get(ev1, json_array_size(ev1) - 1), "type"),
			    "workflow_cancelled");
	json_t *still = hs_get_workflow(s, "cw-1");
	assert_string_equal(hs_str(still, "status"), "cancelled");

	json_decref(still);
	json_decref(ev1);
	json_decref(events);
	queue_free_all(wfs, 2);
	json_decref(wf2);
	json_decref(res);
	json_decref(wf1);
}

/*
 * Cancelling a running workflow: it stays running with cancel_requested until its current
 * step finishes, keeps that step's checkpoint, starts no later step, and the resource goes
 * to the next waiter.
 */
static void test_cancel_running(void **state)
{
	calls_ctx *c = *state;
	hs_server *s = c->s;
	calls_submit_gated(c, "cr-run", "cr", 3);
	json_decref(hs_wait_step(s, "cr-run", 0, "running", WAIT_MS));
	queue_submit(s, "cr-next", "cr", 1, 10);
	queue_wait(s, "cr", 1);

	hs_response r = cancel(s, "cr-run");
	assert_int_equal(r.status, 200);
	assert_string_equal(hs_str(r.json, "status"), "running");
	assert_true(json_is_true(json_object_get(r.json, "cancel_requested")));
	hs_response_fini(&r);

	fragile_open_gate(c->res);
	json_t *wf = hs_wait_workflow(s, "cr-run", "cancelled", WAIT_MS);
	hs_assert_workflow_shape(wf);
	assert_true(json_is_true(json_object_get(wf, "cancel_requested")));
	json_t *first = hs_step_at(wf, 0);
	assert_string_equal(hs_str(first, "status"), "completed");
	assert_int_equal(hs_int(first, "attempts"), 1);
	assert_true(json_is_object(json_object_get(first, "result")));
	assert_int_equal(hs_int(wf, "steps_completed"), 1);
	for (size_t i = 1; i < 3; i++) {
		json_t *st = hs_step_at(wf, i);
		const char *status = hs_str(st, "status");
		/* A cancel marks every step it leaves unreached: none stays pending. */
		if (strcmp(status, "cancelled") != 0)
			fail_msg("step %zu of the cancelled workflow is %s", i, status);
		assert_int_equal(hs_int(st, "attempts"), 0);
		assert_true(json_is_null(json_object_get(st, "started_at")));
	}
	json_decref(hs_wait_workflow(s, "cr-next", "completed", WAIT_MS));

	char *ids[] = {"cr-run", "cr-next"};
	json_t *events = queue_merged_events(s, ids, 2);
	assert_handed_to(events, "cr-run", 0, "cr-next");
	json_t *run_events = hs_get_events(s, "cr-run");
	assert_non_null(hs_event_find(run_events, "step_completed", 0, 1));
	assert_non_null(hs_event_find(run_events, "cancel_requested", -1, -1));
	for (int i = 1; i < 3; i++) {
		assert_int_equal(hs_event_count(run_events, "lock_requested", i, -1), 0);
		assert_int_equal(hs_event_count(run_events, "lock_acquired", i, -1), 0);
	}
	assert_string_equal(
	    hs_str(json_array_get(run_events, json_array_size(run_events) - 1), "type"),
	    "workflow_cancelled");

	json_decref(run_events);
	json_decref(events);
	json_decref(wf);
}

static bool past(void *arg)
{
	return hs_now_ms() > *(const int64_t *)arg;
}

/*
 * Cancelling a workflow in its retry wait: cancelled at once; its retry never asks for
 * the resource again, which goes from holder to waiter as if it never existed. The wait
 * (10 s) is far longer than the few requests made before the cancel; the holder keeps
 * the resource until the retry's time has passed, so the retry had its chance.
 */
static void test_cancel_retrying(void **state)
{
	calls_ctx *c = *state;
	hs_server *s = c->s;
	json_t *body =
	    json_pack("{s:s, s:s, s:[{s:s, s:i, s:i}], s:{s:i, s:f}}", "id", "cx-retry", "resource",
		      "cx", "workers", "name", "flaky", "work_ms", 10, "fail_attempts", 1, "retry",
		      "first_retry_ms", 10000, "backoff", 1.0);
	json_decref(hs_create_workflow(s, body));
	json_t *retrying = hs_wait_step(s, "cx-retry", 0, "retrying", WAIT_MS);
	int64_t next_at = hs_time(hs_step_at(retrying, 0), "next_attempt_at");
	calls_submit_gated(c, "cx-hold", "cx", 1);
	json_decref(hs_wait_step(s, "cx-hold", 0, "running", WAIT_MS));

	hs_response r = cancel(s, "cx-retry");
	assert_int_equal(r.status, 200);
	assert_string_equal(hs_str(r.json, "status"), "cancelled");
	hs_response_fini(&r);
	json_t *wf = hs_get_workflow(s, "cx-retry");
	assert_string_equal(hs_str(wf, "status"), "cancelled");
	assert_string_equal(hs_str(hs_step_at(wf, 0), "status"), "cancelled");
	assert_true(json_is_null(json_object_get(hs_step_at(wf, 0), "next_attempt_at")));
	queue_submit(s, "cx-next", "cx", 1, 10);
	queue_wait(s, "cx", 1);
	assert_true(hs_wait_until(past, &next_at, WAIT_MS));
	fragile_open_gate(c->res);

	json_t *next = hs_wait_workflow(s, "cx-next", "completed", WAIT_MS);
	/* The retry was due long before cx-next finished: it had its chance to sneak in. */
	assert_true(hs_time(hs_step_at(next, 0), "finished_at") > next_at);
	char *ids[] = {"cx-retry", "cx-hold", "cx-next"};
	json_t *events = queue_merged_events(s, ids, 3);
	queue_assert_one_holder(events, HS_NO_TIME);
	assert_handed_to(events, "cx-hold", 0, "cx-next");
	json_t *ev = hs_get_events(s, "cx-retry");
	assert_int_equal(hs_event_count(ev, "lock_requested", 0, 2), 0);
	assert_int_equal(hs_event_count(ev, "lock_acquired", 0, -1), 1);
	assert_string_equal(hs_str(json_array_get(ev, json_array_size(ev) - 1), "type"),
			    "workflow_cancelled");
	json_t *still = hs_get_workflow(s, "cx-retry");
	assert_string_equal(hs_str(still, "status"), "cancelled");
	assert_int_equal(hs_int(hs_step_at(still, 0), "attempts"), 1);

	json_decref(still);
	json_decref(ev);
	json_decref(events);
	json_decref(next);
	json_decref(wf);
	json_decref(retrying);
}

/* A repeated cancel answers 200 again; a finished workflow answers 409; unknown 404. */
static void test_cancel_repeat_and_finished(void **state)
{
	calls_ctx *c = *state;
	hs_server *s = c->s;
	calls_submit_gated(c, "rp-hold", "rp", 1);
	json_decref(hs_wait_step(s, "rp-hold", 0, "running", WAIT_MS));
	queue_submit(s, "rp-wait", "rp", 1, 10);
	for (int i = 0; i < 2; i++) {
		hs_response r = cancel(s, "rp-wait");
		assert_int_equal(r.status, 200);
		assert_string_equal(hs_str(r.json, "status"), "cancelled");
		hs_response_fini(&r);
		r = cancel(s, "rp-hold");
		assert_int_equal(r.status, 200);
		assert_true(json_is_true(json_object_get(r.json, "cancel_requested")));
		hs_response_fini(&r);
	}
	fragile_open_gate(c->res);
	json_decref(hs_wait_workflow(s, "rp-hold", "cancelled", WAIT_MS));
	hs_response r = cancel(s, "rp-hold");
	assert_int_equal(r.status, 200);
	assert_string_equal(hs_str(r.json, "status"), "cancelled");
	hs_response_fini(&r);

	queue_submit(s, "rp-done", "rp", 1, 0);
	json_decref(hs_wait_workflow(s, "rp-done", "completed", WAIT_MS));
	json_t *body = json_pack("{s:s, s:s, s:[{s:s, s:i, s:i}], s:{s:i}}", "id", "rp-failed",
				 "resource", "rp", "workers", "name", "f", "work_ms", 0,
				 "fail_attempts", 1, "retry", "max_attempts", 1);
	json_decref(hs_create_workflow(s, body));
	json_decref(hs_wait_workflow(s, "rp-failed", "failed", WAIT_MS));
	static const char *const finished[] = {"rp-done", "rp-failed"};
	static const char *const final_status[] = {"completed", "failed"};
	for (size_t i = 0; i < 2; i++) {
		r = cancel(s, finished[i]);
		hs_assert_problem(&r, 409, "conflict", finished[i]);
		hs_response_fini(&r);
		json_t *wf = hs_get_workflow(s, finished[i]);
		assert_string_equal(hs_str(wf, "status"), final_status[i]);
		assert_true(json_is_false(json_object_get(wf, "cancel_requested")));
		json_decref(wf);
	}
	r = cancel(s, "rp-unknown");
	hs_assert_problem(&r, 404, "not-found", "cancel of an unknown workflow");
	hs_response_fini(&r);
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_cancel_waiting, calls_setup, calls_teardown),
	    cmocka_unit_test_setup_teardown(test_cancel_running, calls_setup, calls_teardown),
	    cmocka_unit_test_setup_teardown(test_cancel_retrying, calls_setup, calls_teardown),
	    cmocka_unit_test_setup_teardown(test_cancel_repeat_and_finished, calls_setup,
					    calls_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
