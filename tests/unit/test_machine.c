/*
 * test_machine.c - the workflow state machine's rules, without threads, locks or a
 * database: retry policy, memoized completion, retries, on_failure, cancellation.
 */
#include "unit.h"

/* Records every event the machine emits. */
typedef struct recorder {
	char types[64][32];
	json_t *data[64];
	int n;
} recorder;

static void record(void *ctx, const wf_row *wf, const char *type, json_t *data)
{
	recorder *r = ctx;
	(void)wf;
	assert_true(r->n < 64);
	snprintf(r->types[r->n], sizeof r->types[r->n], "%s", type);
	r->data[r->n++] = data;
}

static void recorder_clear(recorder *r)
{
	for (int i = 0; i < r->n; i++)
		json_decref(r->data[i]);
	r->n = 0;
}

static int count(const recorder *r, const char *type)
{
	int n = 0;
	for (int i = 0; i < r->n; i++)
		n += strcmp(r->types[i], type) == 0;
	return n;
}

static step_output ok_output(int64_t duration)
{
	step_output o = {.duration_ms = duration};
	o.result = json_pack("{s:s}", "ok", "yes");
	return o;
}

static step_output failed_output(int retryable)
{
	step_output o = {.duration_ms = 5, .retryable = retryable};
	snprintf(o.error, sizeof o.error, "resource timeout");
	return o;
}

static void test_retry_delay_policy(void **state)
{
	(void)state;
	retry_policy p = {10, 2000, 2.0, 30000};
	assert_int_equal(retry_delay_ms(&p, 1), 2000); /* the origin's first retry: 2 s */
	assert_int_equal(retry_delay_ms(&p, 2), 4000);
	assert_int_equal(retry_delay_ms(&p, 4), 16000);
	assert_int_equal(retry_delay_ms(&p, 5), 30000);	  /* capped */
	assert_int_equal(retry_delay_ms(&p, 900), 30000); /* no overflow */
	retry_policy flat = {3, 500, 1.0, 30000};
	assert_int_equal(retry_delay_ms(&flat, 7), 500);
}

/* Runs steps[cur] to an outcome: grant, then the given output. */
static transition run(wf_row *wf, step_output *o, int64_t now, const event_sink *ev)
{
	machine_grant(wf, wf->steps[wf->cur].attempts + 100, 0, 0, now, ev);
	transition t = machine_outcome(wf, o, &mutex_workflow, now + 10, ev);
	json_decref(o->result);
	return t;
}

static void test_happy_path_runs_each_step_once_in_order(void **state)
{
	(void)state;
	recorder r = {0};
	event_sink ev = {record, &r};
	wf_row *wf = wf_from("{\"resource\":\"gw\",\"workers\":[\"a\",\"b\",\"c\"]}");
	machine_request(wf, 0, 1, 1000, &ev);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(wf->cur, i);
		assert_int_equal(wf->steps[i].status, ST_WAITING);
		step_output o = ok_output(7);
		transition t = run(wf, &o, 2000 + i * 100, &ev);
		assert_true(t.release);
		assert_int_equal(wf->steps[i].status, ST_COMPLETED);
		assert_int_equal(wf->steps[i].attempts, 1);
		if (i < 2) {
			assert_int_equal(t.request, i + 1);
			assert_false(t.finished);
			machine_request(wf, t.request, 2 + i, 2050 + i * 100, &ev);
		} else {
			assert_int_equal(t.request, -1);
			assert_true(t.finished);
		}
	}
	assert_int_equal(wf->status, WF_COMPLETED);
	assert_int_equal(wf->steps_completed, 3);
	assert_int_equal(json_integer_value(json_object_get(wf->result, "workersProcessed")), 3);
	assert_int_equal(count(&r, "lock_acquired"), 3);
	assert_int_equal(count(&r, "step_completed"), 3);
	assert_int_equal(count(&r, "lock_released"), 3);
	assert_int_equal(count(&r, "workflow_completed"), 1);
	recorder_clear(&r);
	wf_row_free(wf);
}

static void test_failed_attempt_waits_with_backoff_then_retries(void **state)
{
	(void)state;
	recorder r = {0};
	event_sink ev = {record, &r};
	wf_row *wf = wf_from("{\"resource\":\"gw\",\"workers\":[\"a\"]}");
	machine_request(wf, 0, 1, 0, &ev);
	step_output o = failed_output(1);
	transition t = run(wf, &o, 1000, &ev);
	assert_true(t.release);
	assert_int_equal(wf->steps[0].status, ST_RETRYING);
	assert_int_equal(t.timer_at, 1010 + 2000);
	assert_int_equal(wf->steps[0].next_attempt_at, 3010);
	/* Too early: nothing happens. On time: the step queues again. */
	assert_int_equal(machine_timer(wf, 3009).request, -1);
	assert_int_equal(machine_timer(wf, 3010).request, 0);
	machine_request(wf, 0, 2, 3010, &ev);
	o = ok_output(3);
	t = run(wf, &o, 3020, &ev);
	assert_true(t.finished);
	assert_int_equal(wf->steps[0].attempts, 2);
	assert_null(wf->steps[0].error);
	assert_int_equal(wf->status, WF_COMPLETED);
	recorder_clear(&r);
	wf_row_free(wf);
}

static void test_retry_after_longer_than_backoff_wins(void **state)
{
	(void)state;
	wf_row *wf = wf_from("{\"resource\":\"gw\",\"workers\":[\"a\"]}");
	machine_request(wf, 0, 1, 0, NULL);
	step_output o = failed_output(1);
	o.retry_after_ms = 5000;
	transition t = run(wf, &o, 0, NULL);
	assert_int_equal(t.timer_at, 10 + 5000);
	wf_row_free(wf);
}

static void test_attempts_exhausted_fail_the_workflow(void **state)
{
	(void)state;
	recorder r = {0};
	event_sink ev = {record, &r};
	wf_row *wf = wf_from("{\"resource\":\"gw\",\"workers\":[\"a\",\"b\"],"
			     "\"retry\":{\"max_attempts\":2}}");
	machine_request(wf, 0, 1, 0, &ev);
	step_output o = failed_output(1);
	run(wf, &o, 0, &ev);
	machine_request(wf, 0, 2, 5000, &ev);
	o = failed_output(1);
	transition t = run(wf, &o, 5000, &ev);
	assert_true(t.finished);
	assert_int_equal(t.request, -1);
	assert_int_equal(wf->steps[0].status, ST_FAILED);
	assert_int_equal(wf->steps[1].status, ST_PENDING); /* later workers never run */
	assert_int_equal(wf->status, WF_FAILED);
	assert_non_null(strstr(wf->error, "resource timeout"));
	assert_int_equal(count(&r, "workflow_failed"), 1);
	recorder_clear(&r);
	wf_row_free(wf);
}

static void test_non_retryable_failure_with_continue_runs_next_worker(void **state)
{
	(void)state;
	wf_row *wf = wf_from("{\"resource\":\"gw\",\"workers\":[\"a\",\"b\"],"
			     "\"on_failure\":\"continue\"}");
	machine_request(wf, 0, 1, 0, NULL);
	step_output o = failed_output(0);
	transition t = run(wf, &o, 0, NULL);
	assert_int_equal(wf->steps[0].status, ST_FAILED);
	assert_int_equal(wf->steps[0].attempts, 1);
	assert_int_equal(t.request, 1);
	machine_request(wf, 1, 2, 20, NULL);
	o = ok_output(1);
	t = run(wf, &o, 30, NULL);
	assert_true(t.finished);
	assert_int_equal(wf->status, WF_COMPLETED);
	assert_int_equal(json_integer_value(json_object_get(wf->result, "workersProcessed")), 1);
	assert_int_equal(json_array_size(json_object_get(wf->result, "failed")), 1);
	wf_row_free(wf);
}

static void test_cancel_while_running_waits_for_the_step(void **state)
{
	(void)state;
	wf_row *wf = wf_from("{\"resource\":\"gw\",\"workers\":[\"a\",\"b\"]}");
	machine_request(wf, 0, 1, 0, NULL);
	machine_grant(wf, 1, 0, 0, 0, NULL);
	transition t = machine_cancel(wf, &mutex_workflow, 5, NULL);
	assert_false(t.finished);
	assert_int_equal(wf->status, WF_RUNNING);
	assert_true(wf->cancel_requested);
	step_output o = ok_output(1);
	t = machine_outcome(wf, &o, &mutex_workflow, 10, NULL);
	json_decref(o.result);
	assert_true(t.release);
	assert_true(t.finished);
	assert_int_equal(t.request, -1);		     /* no later step starts */
	assert_int_equal(wf->steps[0].status, ST_COMPLETED); /* its checkpoint is kept */
	assert_int_equal(wf->steps[1].status, ST_CANCELLED);
	assert_int_equal(wf->status, WF_CANCELLED);
	wf_row_free(wf);
}

static void test_cancel_while_waiting_or_retrying_is_immediate(void **state)
{
	(void)state;
	wf_row *wf = wf_from("{\"resource\":\"gw\",\"workers\":[\"a\"]}");
	machine_request(wf, 0, 1, 0, NULL);
	transition t = machine_cancel(wf, &mutex_workflow, 5, NULL);
	assert_true(t.finished);
	assert_int_equal(wf->status, WF_CANCELLED);
	assert_int_equal(wf->steps[0].status, ST_CANCELLED);
	/* A second cancel changes nothing. */
	t = machine_cancel(wf, &mutex_workflow, 6, NULL);
	assert_false(t.finished);
	wf_row_free(wf);

	wf = wf_from("{\"resource\":\"gw\",\"workers\":[\"a\"]}");
	machine_request(wf, 0, 1, 0, NULL);
	step_output o = failed_output(1);
	run(wf, &o, 0, NULL);
	assert_int_equal(wf->steps[0].status, ST_RETRYING);
	t = machine_cancel(wf, &mutex_workflow, 5, NULL);
	assert_true(t.finished);
	assert_int_equal(machine_timer(wf, 1000000).request, -1); /* the timer is void */
	wf_row_free(wf);
}

static void test_interrupted_step_queues_again_as_new_attempt(void **state)
{
	(void)state;
	recorder r = {0};
	event_sink ev = {record, &r};
	wf_row *wf = wf_from("{\"resource\":\"gw\",\"workers\":[\"a\"]}");
	machine_request(wf, 0, 1, 0, &ev);
	machine_grant(wf, 1, 0, 0, 0, &ev);
	machine_interrupted(wf, &ev);
	assert_int_equal(wf->steps[0].status, ST_WAITING);
	machine_grant(wf, 2, 0, 0, 10, &ev);
	assert_int_equal(wf->steps[0].attempts, 2);
	assert_int_equal(wf->steps[0].token, 2);
	assert_int_equal(count(&r, "step_interrupted"), 1);
	recorder_clear(&r);
	wf_row_free(wf);
}

/* A string result of n bytes of JSON text ("xxx...", quotes included). */
static step_output big_output(size_t n)
{
	step_output o = {.duration_ms = 1};
	char *text = malloc(n - 1);
	assert_non_null(text);
	memset(text, 'x', n - 2);
	text[n - 2] = 0;
	o.result = json_string(text);
	free(text);
	return o;
}

/*
 * A workflow's results together stay within MAX_WORKFLOW_RESULTS: a step whose result
 * would pass it fails for good (no retry, even with attempts left) with an error that
 * says why, and the workflow fails (or goes on with on_failure "continue", where a
 * smaller result still fits). Recovery counts the stored results again.
 */
static void test_results_past_the_workflow_cap_fail_the_step(void **state)
{
	(void)state;
	recorder r = {0};
	event_sink ev = {record, &r};
	wf_row *wf = wf_from("{\"resource\":\"gw\",\"workers\":[\"a\",\"b\",\"c\"],"
			     "\"on_failure\":\"continue\",\"retry\":{\"max_attempts\":5}}");
	size_t half = MAX_WORKFLOW_RESULTS / 2 + 10;
	machine_request(wf, 0, 1, 0, &ev);
	step_output o = big_output(half);
	transition t = run(wf, &o, 10, &ev);
	assert_int_equal(wf->steps[0].status, ST_COMPLETED);
	assert_int_equal(wf->results_bytes, half);
	assert_int_equal(wf_results_bytes(wf), half);
	machine_request(wf, t.request, 2, 20, &ev);
	o = big_output(half); /* the two would pass the cap */
	recorder_clear(&r);
	t = run(wf, &o, 30, &ev);
	assert_int_equal(wf->steps[1].status, ST_FAILED);
	assert_int_equal(wf->steps[1].attempts, 1); /* not retried */
	assert_non_null(strstr(wf->steps[1].error, "past 16777216 bytes"));
	assert_null(wf->steps[1].result);
	assert_int_equal(count(&r, "step_failed"), 1);
	assert_int_equal(wf->results_bytes, half);
	assert_int_equal(t.request, 2); /* on_failure continue */
	machine_request(wf, 2, 3, 40, &ev);
	o = ok_output(1);
	t = run(wf, &o, 50, &ev);
	assert_true(t.finished);
	assert_int_equal(wf->status, WF_COMPLETED);
	assert_int_equal(wf_results_bytes(wf), wf->results_bytes);
	recorder_clear(&r);
	wf_row_free(wf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_retry_delay_policy),
	    cmocka_unit_test(test_happy_path_runs_each_step_once_in_order),
	    cmocka_unit_test(test_failed_attempt_waits_with_backoff_then_retries),
	    cmocka_unit_test(test_retry_after_longer_than_backoff_wins),
	    cmocka_unit_test(test_attempts_exhausted_fail_the_workflow),
	    cmocka_unit_test(test_non_retryable_failure_with_continue_runs_next_worker),
	    cmocka_unit_test(test_cancel_while_running_waits_for_the_step),
	    cmocka_unit_test(test_cancel_while_waiting_or_retrying_is_immediate),
	    cmocka_unit_test(test_interrupted_step_queues_again_as_new_attempt),
	    cmocka_unit_test(test_results_past_the_workflow_cap_fail_the_step),
	};
	return cmocka_run_group_tests_name("machine", tests, NULL, NULL);
}
