/*
 * test_workflows.c - the core of batond, over HTTP against the real binary:
 * a workflow's steps run in worker order, one at a time, each checkpointed; a failed
 * step waits and retries without re-running the others; a SIGKILL in the middle of a
 * step or of a retry wait loses nothing; on_failure. Submission, ids, lists, 404 and
 * 405 are test_workflow_api.c.
 *
 * Each test starts its own batond on a fresh temporary database (harness.h).
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

#include "../harness/harness.h"

#define WAIT_MS 30000
#define EM_DASH "\xe2\x80\x94"

static const char *const ABCDE[] = {"worker-A", "worker-B", "worker-C", "worker-D", "worker-E"};

/* The five origin workers; worker C may carry extra members (stolen). */
static json_t *origin_workers(json_t *worker_c)
{
	json_t *ws = json_array();
	for (size_t i = 0; i < 5; i++) {
		if (i == 2 && worker_c)
			json_array_append_new(ws, worker_c);
		else
			json_array_append_new(ws, json_string(ABCDE[i]));
	}
	return ws;
}

/*
 * Finds, from offset *pos of `log`, the first line about workflow `id` and `worker`
 * ("wf=<id> [<worker>]") that contains `needle`; moves *pos past that line start.
 */
static bool log_line(const char *log, size_t *pos, const char *id, const char *worker,
		     const char *needle)
{
	char tag[512];
	snprintf(tag, sizeof tag, "wf=%s [%s]", id, worker);
	const char *line = log + *pos;
	while (*line) {
		const char *eol = strchr(line, '\n');
		size_t len = eol ? (size_t)(eol - line) : strlen(line);
		char *copy = strndup(line, len);
		bool hit = strstr(copy, tag) && strstr(copy, needle);
		free(copy);
		if (hit) {
			*pos = (size_t)(line - log) + 1;
			return true;
		}
		if (!eol)
			break;
		line = eol + 1;
	}
	return false;
}

/* The result a completed step of `worker` on `resource` must carry. */
static void assert_step_result(const json_t *result, const char *worker, const char *resource,
			       json_int_t work_ms)
{
	char action[256];
	snprintf(action, sizeof action, "updated-%s", resource);
	assert_true(json_is_object(result));
	assert_int_equal(json_object_size(result), 3);
	assert_string_equal(hs_str(result, "workerId"), worker);
	assert_string_equal(hs_str(result, "action"), action);
	assert_true(hs_int(result, "duration") >= work_ms);
}

/* The step events (lock_*, step_*) of `events`, in order. New reference. */
static json_t *step_events(const json_t *events)
{
	json_t *out = json_array();
	size_t i;
	json_t *ev;
	json_array_foreach(events, i, ev)
	{
		const char *t = hs_str(ev, "type");
		if (strncmp(t, "lock_", 5) == 0 || strncmp(t, "step_", 5) == 0)
			json_array_append(out, ev);
	}
	return out;
}

/* Asserts that event `ev` has `type`, `step`, `worker` and `attempt`. */
static void assert_event(const json_t *ev, const char *type, int step, const char *worker,
			 int attempt)
{
	if (!ev)
		fail_msg("missing event %s for step %d", type, step);
	if (strcmp(hs_str(ev, "type"), type) != 0 || hs_int(ev, "step") != step ||
	    strcmp(hs_str(ev, "worker"), worker) != 0 || hs_int(ev, "attempt") != attempt) {
		char *dump = json_dumps(ev, JSON_COMPACT);
		fail_msg("expected %s of step %d (%s) attempt %d, got %s", type, step, worker,
			 attempt, dump);
	}
}

/*
 * Happy path: five workers run once each, in order, never overlapping; the result and
 * the event log have the documented shape and order; default work_ms, retry policy and
 * on_failure are applied; ?after= filters events; the log shows each step.
 */
static void test_happy_path(void **state)
{
	hs_server *s = *state;
	json_t *created =
	    hs_create_workflow(s, json_pack("{s:s, s:o}", "resource", "payment-gateway", "workers",
					    origin_workers(NULL)));
	hs_assert_workflow_shape(created);
	const char *status = hs_str(created, "status");
	assert_true(strcmp(status, "pending") == 0 || strcmp(status, "running") == 0);
	assert_true(json_is_false(json_object_get(created, "cancel_requested")));
	assert_int_equal(hs_int(created, "steps_total"), 5);
	char *id = strdup(hs_str(created, "id"));

	json_t *wf = hs_wait_workflow(s, id, "completed", WAIT_MS);
	hs_assert_workflow_shape(wf);
	assert_string_equal(hs_str(wf, "resource"), "payment-gateway");
	assert_string_equal(hs_str(wf, "created_at"), hs_str(created, "created_at"));
	assert_true(json_is_null(json_object_get(wf, "error")));
	assert_int_equal(hs_int(wf, "steps_completed"), 5);
	assert_string_equal(hs_str(wf, "on_failure"), "fail");
	json_t *retry = json_object_get(wf, "retry");
	assert_int_equal(hs_int(retry, "max_attempts"), 10);
	assert_int_equal(hs_int(retry, "first_retry_ms"), 2000);
	assert_null(json_object_get(retry, "initial_delay_ms"));
	assert_true(json_number_value(json_object_get(retry, "backoff")) == 2.0);
	assert_int_equal(hs_int(retry, "max_delay_ms"), 30000);
	int64_t created_at = hs_time(wf, "created_at"), started_at = hs_time(wf, "started_at");
	int64_t finished_at = hs_time(wf, "finished_at");
	assert_true(created_at <= started_at && started_at <= finished_at);

	int64_t prev_end = started_at;
	json_int_t prev_token = 0, sum_work = 0;
	for (size_t i = 0; i < 5; i++) {
		json_t *st = hs_step_at(wf, i);
		json_int_t work = hs_default_work_ms(ABCDE[i]);
		sum_work += work;
		assert_string_equal(hs_str(st, "worker"), ABCDE[i]);
		assert_int_equal(hs_int(st, "work_ms"), work);
		assert_int_equal(hs_int(st, "fail_attempts"), 0);
		assert_string_equal(hs_str(st, "status"), "completed");
		assert_int_equal(hs_int(st, "attempts"), 1);
		assert_true(json_is_null(json_object_get(st, "queue_position")));
		assert_true(json_is_null(json_object_get(st, "next_attempt_at")));
		assert_true(json_is_null(json_object_get(st, "error")));
		int64_t st_start = hs_time(st, "started_at"), st_end = hs_time(st, "finished_at");
		/* Worker order and no overlap: this step began after the previous one ended. */
		if (st_start < prev_end)
			fail_msg("step %zu started at %lld, before the previous step ended (%lld)",
				 i, (long long)st_start, (long long)prev_end);
		assert_true(st_end - st_start >= work);
		assert_true(hs_int(st, "duration_ms") >= work);
		assert_true(st_end <= finished_at);
		prev_end = st_end;
		json_int_t token = hs_int(st, "fencing_token");
		assert_true(token > prev_token);
		prev_token = token;
		assert_step_result(json_object_get(st, "result"), ABCDE[i], "payment-gateway",
				   work);
	}

	json_t *result = json_object_get(wf, "result");
	assert_string_equal(hs_str(result, "resource"), "payment-gateway");
	json_t *processed = json_object_get(result, "processed");
	assert_int_equal(json_array_size(processed), 5);
	for (size_t i = 0; i < 5; i++)
		assert_true(json_equal(json_array_get(processed, i),
				       json_object_get(hs_step_at(wf, i), "result")));
	assert_int_equal(hs_int(result, "workersProcessed"), 5);
	assert_true(hs_int(result, "totalMs") >= sum_work);
	json_t *failed = json_object_get(result, "failed");
	assert_true(!failed || (json_is_array(failed) && json_array_size(failed) == 0));

	/* Events: submitted first, completed last, per step requested/acquired/completed/released.
	 */
	json_t *events = hs_get_events(s, id);
	size_t n = json_array_size(events);
	assert_true(n >= 2 + 4 * 5);
	json_t *first = json_array_get(events, 0), *last = json_array_get(events, n - 1);
	assert_string_equal(hs_str(first, "type"), "workflow_submitted");
	assert_string_equal(hs_str(first, "resource"), "payment-gateway");
	assert_int_equal(hs_int(first, "steps_total"), 5);
	assert_string_equal(hs_str(last, "type"), "workflow_completed");
	assert_true(json_equal(json_object_get(last, "result"), result));
	assert_int_equal(hs_event_count(events, "workflow_started", -1, -1), 1);
	assert_int_equal(hs_event_count(events, "step_failed", -1, -1), 0);
	assert_int_equal(hs_event_count(events, "step_interrupted", -1, -1), 0);
	json_t *started_ev = hs_event_find(events, "workflow_started", -1, -1);
	json_t *done0 = hs_event_find(events, "step_completed", 0, 1);
	assert_non_null(done0);
	assert_true(hs_int(started_ev, "seq") < hs_int(done0, "seq"));

	json_t *sev = step_events(events);
	assert_int_equal(json_array_size(sev), 4 * 5);
	for (size_t i = 0; i < 5; i++) {
		json_t *st = hs_step_at(wf, i);
		json_int_t work = hs_int(st, "work_ms");
		json_t *req = json_array_get(sev, 4 * i), *acq = json_array_get(sev, 4 * i + 1);
		json_t *done = json_array_get(sev, 4 * i + 2),
		       *rel = json_array_get(sev, 4 * i + 3);
		assert_event(req, "lock_requested", (int)i, ABCDE[i], 1);
		assert_event(acq, "lock_acquired", (int)i, ABCDE[i], 1);
		assert_event(done, "step_completed", (int)i, ABCDE[i], 1);
		assert_event(rel, "lock_released", (int)i, ABCDE[i], 1);
		assert_string_equal(hs_str(acq, "resource"), "payment-gateway");
		assert_int_equal(hs_int(acq, "fencing_token"), hs_int(st, "fencing_token"));
		assert_true(hs_int(acq, "waited_ms") >= 0);
		assert_true(hs_int(done, "duration_ms") >= work);
		assert_true(
		    json_equal(json_object_get(done, "result"), json_object_get(st, "result")));
		assert_string_equal(hs_str(rel, "resource"), "payment-gateway");
		assert_int_equal(hs_int(rel, "fencing_token"), hs_int(st, "fencing_token"));
		assert_true(hs_int(rel, "hold_ms") >= work);
		assert_true(hs_time(acq, "ts") <= hs_time(rel, "ts"));
	}

	/* ?after=SEQ returns exactly the events after SEQ. */
	json_int_t after = hs_int(json_array_get(events, 3), "seq");
	char path[256];
	snprintf(path, sizeof path, "/workflows/%s/events?after=%lld", id, (long long)after);
	json_t *tail = hs_get_json(s, path, 200);
	json_t *tail_events = json_object_get(tail, "events");
	assert_int_equal(json_array_size(tail_events), n - 4);
	for (size_t i = 0; i < n - 4; i++)
		assert_true(
		    json_equal(json_array_get(tail_events, i), json_array_get(events, i + 4)));

	/* The log tells the story the demo tells, in order. */
	char *log = hs_log_text(s);
	size_t pos = 0;
	for (size_t i = 0; i < 5; i++) {
		if (!log_line(log, &pos, id, ABCDE[i], "Acquired lock on \"payment-gateway\""))
			fail_msg(
			    "log lacks \"wf=%s [%s] Acquired lock on \\\"payment-gateway\\\"\" "
			    "in order",
			    id, ABCDE[i]);
		if (!log_line(log, &pos, id, ABCDE[i], "Done " EM_DASH " ") ||
		    !strstr(log + pos, "ms, lock released"))
			fail_msg("log lacks \"wf=%s [%s] Done — Nms, lock released\" in order", id,
				 ABCDE[i]);
	}
	free(log);

	json_decref(tail);
	json_decref(sev);
	json_decref(events);
	json_decref(wf);
	json_decref(created);
	free(id);
}

/*
 * worker-C fails its first attempt: it is retried after the default 2 s, alone; A and B
 * are not re-run, D and E run after C's success; attempts are 1,1,2,1,1.
 */
static void test_failed_step_retries_after_wait(void **state)
{
	hs_server *s = *state;
	json_t *c = json_pack("{s:s, s:i}", "name", "worker-C", "fail_attempts", 1);
	json_t *created =
	    hs_create_workflow(s, json_pack("{s:s, s:o}", "resource", "payment-gateway", "workers",
					    origin_workers(c)));
	char *id = strdup(hs_str(created, "id"));
	json_decref(created);

	/* While C waits for its retry, it is "retrying" with a next_attempt_at. */
	json_t *waiting = hs_wait_step(s, id, 2, "retrying", WAIT_MS);
	hs_assert_workflow_shape(waiting);
	assert_string_equal(hs_str(waiting, "status"), "running");
	json_t *wc = hs_step_at(waiting, 2);
	assert_int_equal(hs_int(wc, "attempts"), 1);
	assert_true(strlen(hs_str(wc, "error")) > 0);
	int64_t next_at = hs_time(wc, "next_attempt_at");
	assert_string_equal(hs_str(hs_step_at(waiting, 0), "status"), "completed");
	assert_string_equal(hs_str(hs_step_at(waiting, 1), "status"), "completed");
	assert_string_equal(hs_str(hs_step_at(waiting, 3), "status"), "pending");
	assert_string_equal(hs_str(hs_step_at(waiting, 4), "status"), "pending");

	json_t *wf = hs_wait_workflow(s, id, "completed", WAIT_MS);
	hs_assert_workflow_shape(wf);
	static const json_int_t attempts[] = {1, 1, 2, 1, 1};
	for (size_t i = 0; i < 5; i++) {
		assert_string_equal(hs_str(hs_step_at(wf, i), "status"), "completed");
		assert_int_equal(hs_int(hs_step_at(wf, i), "attempts"), attempts[i]);
	}
	assert_int_equal(hs_int(json_object_get(wf, "result"), "workersProcessed"), 5);

	json_t *events = hs_get_events(s, id);
	for (int i = 0; i < 5; i++) {
		/* Only C acquired the lock twice: A and B were not re-run. */
		assert_int_equal(hs_event_count(events, "lock_acquired", i, -1), i == 2 ? 2 : 1);
		assert_int_equal(hs_event_count(events, "step_completed", i, -1), 1);
	}
	json_t *fail = hs_event_find(events, "step_failed", 2, 1);
	assert_non_null(fail);
	assert_string_equal(hs_str(fail, "worker"), "worker-C");
	assert_true(strlen(hs_str(fail, "error")) > 0);
	assert_int_equal(hs_int(fail, "retry_in_ms"), 2000);
	assert_int_equal(hs_time(fail, "next_attempt_at"), next_at);
	json_t *rel1 = hs_event_find(events, "lock_released", 2, 1);
	json_t *acq1 = hs_event_find(events, "lock_acquired", 2, 1);
	json_t *acq2 = hs_event_find(events, "lock_acquired", 2, 2);
	json_t *done2 = hs_event_find(events, "step_completed", 2, 2);
	json_t *acq_d = hs_event_find(events, "lock_acquired", 3, 1);
	assert_non_null(rel1);
	assert_non_null(acq2);
	assert_non_null(done2);
	assert_non_null(acq_d);
	assert_true(hs_int(fail, "seq") < hs_int(rel1, "seq"));
	assert_true(hs_int(rel1, "seq") < hs_int(acq2, "seq"));
	assert_true(hs_int(done2, "seq") < hs_int(acq_d, "seq"));
	assert_null(hs_event_find(events, "step_completed", 2, 1));

	/* The wait between the failure and the retry: 2 s, not earlier than planned (how much
	 * later depends on the machine's speed: the workflow's deadline bounds it). */
	int64_t waited = hs_time(acq2, "ts") - hs_time(fail, "ts");
	if (waited < 1900)
		fail_msg("worker-C retried %lld ms after failing, expected 2000",
			 (long long)waited);
	assert_true(hs_time(acq2, "ts") >= next_at);
	assert_true(hs_int(acq2, "fencing_token") > hs_int(acq1, "fencing_token"));
	assert_int_equal(hs_int(hs_step_at(wf, 2), "fencing_token"), hs_int(acq2, "fencing_token"));

	char *log = hs_log_text(s);
	size_t pos = 0;
	if (!log_line(log, &pos, id, "worker-C",
		      "FAILED " EM_DASH " resource timeout (lock released, retrying in 2 s"))
		fail_msg("log lacks \"[worker-C] FAILED — resource timeout (lock released, "
			 "retrying in 2 s...)\"");
	if (!log_line(log, &pos, id, "worker-C", "lock released (retry 2)"))
		fail_msg("log lacks \"[worker-C] Done — Nms, lock released (retry 2)\"");
	free(log);

	json_decref(events);
	json_decref(wf);
	json_decref(waiting);
	free(id);
}

/*
 * SIGKILL while step 3 (worker-C) runs; on restart the workflow completes, A and B keep
 * their single attempt and checkpoint, C runs again as attempt 2 after a step_interrupted
 * event, D and E run once.
 */
static void test_sigkill_mid_step_resumes(void **state)
{
	hs_server *s = *state;
	json_t *c = json_pack("{s:s, s:i}", "name", "worker-C", "work_ms", 1500);
	json_t *created =
	    hs_create_workflow(s, json_pack("{s:s, s:o}", "resource", "payment-gateway", "workers",
					    origin_workers(c)));
	char *id = strdup(hs_str(created, "id"));
	json_decref(created);

	json_t *before = hs_wait_step(s, id, 2, "running", WAIT_MS);
	hs_kill(s);
	assert_int_equal(hs_start(s), 0);

	/* What was checkpointed survived the kill as it was. */
	json_t *after = hs_get_workflow(s, id);
	for (size_t i = 0; i < 2; i++) {
		json_t *b = hs_step_at(before, i), *a = hs_step_at(after, i);
		assert_string_equal(hs_str(a, "status"), "completed");
		assert_int_equal(hs_int(a, "attempts"), 1);
		assert_true(json_equal(json_object_get(a, "result"), json_object_get(b, "result")));
		assert_string_equal(hs_str(a, "finished_at"), hs_str(b, "finished_at"));
	}

	json_t *wf = hs_wait_workflow(s, id, "completed", WAIT_MS);
	hs_assert_workflow_shape(wf);
	static const json_int_t attempts[] = {1, 1, 2, 1, 1};
	for (size_t i = 0; i < 5; i++) {
		json_t *st = hs_step_at(wf, i);
		assert_string_equal(hs_str(st, "status"), "completed");
		if (hs_int(st, "attempts") != attempts[i])
			fail_msg("step %zu (%s) has %lld attempts after the restart, expected %lld",
				 i, ABCDE[i], (long long)hs_int(st, "attempts"),
				 (long long)attempts[i]);
	}
	for (size_t i = 0; i < 2; i++) {
		assert_int_equal(hs_int(hs_step_at(wf, i), "fencing_token"),
				 hs_int(hs_step_at(before, i), "fencing_token"));
		assert_string_equal(hs_str(hs_step_at(wf, i), "started_at"),
				    hs_str(hs_step_at(before, i), "started_at"));
	}
	assert_int_equal(hs_int(json_object_get(wf, "result"), "workersProcessed"), 5);
	assert_int_equal(
	    json_array_size(json_object_get(json_object_get(wf, "result"), "processed")), 5);

	json_t *events = hs_get_events(s, id);
	json_t *intr = hs_event_find(events, "step_interrupted", 2, 1);
	if (!intr)
		fail_msg("no step_interrupted event for worker-C's attempt 1");
	assert_string_equal(hs_str(intr, "worker"), "worker-C");
	assert_int_equal(hs_event_count(events, "step_interrupted", -1, -1), 1);
	for (int i = 0; i < 5; i++) {
		assert_int_equal(hs_event_count(events, "step_completed", i, -1), 1);
		assert_int_equal(hs_event_count(events, "lock_acquired", i, -1), i == 2 ? 2 : 1);
	}
	json_t *acq1 = hs_event_find(events, "lock_acquired", 2, 1);
	json_t *acq2 = hs_event_find(events, "lock_acquired", 2, 2);
	assert_non_null(acq1);
	assert_non_null(acq2);
	assert_non_null(hs_event_find(events, "step_completed", 2, 2));
	assert_true(hs_int(intr, "seq") < hs_int(acq2, "seq"));
	assert_true(hs_int(acq2, "fencing_token") > hs_int(acq1, "fencing_token"));
	assert_string_equal(hs_str(json_array_get(events, json_array_size(events) - 1), "type"),
			    "workflow_completed");

	json_decref(events);
	json_decref(wf);
	json_decref(after);
	json_decref(before);
	free(id);
}

#define RESTART_WAIT_MS 30000 /* far longer than any restart */

/*
 * A restart (SIGKILL) during a retry wait keeps next_attempt_at as it was, and the retry
 * does not start before it. The wait (RESTART_WAIT_MS) is far longer than any restart, a
 * restart under valgrind on a loaded machine included: the test must not depend on how
 * fast batond restarts (a 3 s wait once ran out under valgrind in CI).
 */
static void test_restart_during_retry_wait_keeps_schedule(void **state)
{
	hs_server *s = *state;
	json_t *body =
	    json_pack("{s:s, s:s, s:[{s:s, s:i, s:i}, {s:s, s:i}], s:{s:i, s:f}}", "id",
		      "retry-restart", "resource", "printer", "workers", "name", "worker-A",
		      "work_ms", 10, "fail_attempts", 1, "name", "worker-B", "work_ms", 10, "retry",
		      "first_retry_ms", RESTART_WAIT_MS, "backoff", 1.0);
	json_decref(hs_create_workflow(s, body));

	json_t *before = hs_wait_step(s, "retry-restart", 0, "retrying", WAIT_MS);
	const char *planned_text = hs_str(hs_step_at(before, 0), "next_attempt_at");
	int64_t planned = hs_time(hs_step_at(before, 0), "next_attempt_at");
	json_t *events = hs_get_events(s, "retry-restart");
	json_t *fail = hs_event_find(events, "step_failed", 0, 1);
	assert_non_null(fail);
	assert_int_equal(hs_int(fail, "retry_in_ms"), RESTART_WAIT_MS);
	int64_t offset = planned - hs_time(fail, "ts");
	if (offset < RESTART_WAIT_MS - 100 || offset > RESTART_WAIT_MS + 100)
		fail_msg("next_attempt_at is %lld ms after the failure, expected %d",
			 (long long)offset, RESTART_WAIT_MS);
	json_decref(events);

	hs_kill(s);
	assert_int_equal(hs_start(s), 0);
	json_t *after = hs_get_workflow(s, "retry-restart");
	/* The restart took far less than the wait, which is still running. */
	assert_true(hs_now_ms() < planned);
	assert_string_equal(hs_str(hs_step_at(after, 0), "status"), "retrying");
	assert_string_equal(hs_str(hs_step_at(after, 0), "next_attempt_at"), planned_text);
	assert_int_equal(hs_int(hs_step_at(after, 0), "attempts"), 1);

	int until_due = (int)(planned - hs_now_ms());
	json_t *wf = hs_wait_workflow(s, "retry-restart", "completed", until_due + WAIT_MS);
	assert_int_equal(hs_int(hs_step_at(wf, 0), "attempts"), 2);
	assert_int_equal(hs_int(hs_step_at(wf, 1), "attempts"), 1);
	events = hs_get_events(s, "retry-restart");
	json_t *acq2 = hs_event_find(events, "lock_acquired", 0, 2);
	assert_non_null(acq2);
	int64_t retried = hs_time(acq2, "ts");
	if (retried < planned)
		fail_msg("the retry started at %lld, before next_attempt_at %lld",
			 (long long)retried, (long long)planned);
	assert_true(retried < planned + WAIT_MS);
	assert_int_equal(hs_event_count(events, "step_interrupted", -1, -1), 0);
	assert_int_equal(hs_event_count(events, "lock_acquired", 0, -1), 2);

	json_decref(events);
	json_decref(wf);
	json_decref(after);
	json_decref(before);
}

/* Runs the sqlite3 shell on `db` with `sql`; asserts it exited 0. */
static void sqlite3_shell(const char *db, const char *sql)
{
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		execlp("sqlite3", "sqlite3", db, sql, (char *)NULL);
		perror("sqlite3 (apt-get install sqlite3)");
		_exit(127);
	}
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/*
 * Puts the stored retry policy of the one workflow of the (stopped) server's database back
 * as the previous batond wrote it, in its definition and in its row: the default policy's
 * "first_retry_ms":2000 becomes "initial_delay_ms":1000.
 */
static void store_old_retry_field(hs_server *s)
{
#define TO_OLD "'\"first_retry_ms\":2000', '\"initial_delay_ms\":1000'"
	if (hs_store_is_pg())
		assert_int_equal(
		    hs_db_count(s, "WITH d AS (UPDATE definitions SET definition ="
				   " replace(definition, " TO_OLD ") RETURNING 1),"
				   " w AS (UPDATE workflows SET retry = replace(retry, " TO_OLD ")"
				   " RETURNING 1) SELECT count(*) FROM d, w"),
		    1);
	else
		sqlite3_shell(hs_db_path(s),
			      "UPDATE definitions SET definition = replace(definition, " TO_OLD ");"
			      " UPDATE workflows SET retry = replace(retry, " TO_OLD ");");
#undef TO_OLD
	assert_int_equal(
	    hs_db_count(s, "SELECT count(*) FROM definitions WHERE definition"
			   " LIKE '%\"retry\":{\"backoff\":2.0,\"initial_delay_ms\":1000,%'"),
	    1);
	assert_int_equal(hs_db_count(s, "SELECT count(*) FROM workflows WHERE retry"
					" LIKE '%\"initial_delay_ms\":1000,%'"),
			 1);
}

/*
 * An upgrade: a workflow stored by the previous batond, whose retry policy says
 * initial_delay_ms (here the default policy, 1000 then), is the same workflow to this one.
 * Re-posting its body answers 200, not 409, and it shows first_retry_ms 2000; a body that
 * does change the policy (first retry after 1 s) is still a conflict.
 */
static void test_upgrade_keeps_workflows_with_initial_delay_ms(void **state)
{
	hs_server *s = *state;
	static const char body[] = "{\"id\":\"upgraded\",\"resource\":\"printer\","
				   "\"workers\":[{\"name\":\"a\",\"work_ms\":0}]}";
	static const char changed[] = "{\"id\":\"upgraded\",\"resource\":\"printer\","
				      "\"workers\":[{\"name\":\"a\",\"work_ms\":0}],"
				      "\"retry\":{\"first_retry_ms\":1000}}";
	hs_response r;
	hs_post(s, "/workflows", body, &r);
	assert_int_equal(r.status, 201);
	hs_response_fini(&r);
	json_decref(hs_wait_workflow(s, "upgraded", "completed", WAIT_MS));
	assert_int_equal(hs_stop(s), 0);
	store_old_retry_field(s);
	assert_int_equal(hs_start(s), 0);

	hs_post(s, "/workflows", body, &r);
	if (r.status != 200)
		fail_msg("re-POST after the upgrade: %ld %s, expected 200", r.status,
			 r.body ? r.body : "");
	hs_response_fini(&r);
	hs_post(s, "/workflows", changed, &r);
	hs_assert_problem(&r, 409, "conflict", "a re-POST with another retry policy");
	hs_response_fini(&r);
	json_t *wf = hs_get_workflow(s, "upgraded");
	json_t *retry = json_object_get(wf, "retry");
	assert_int_equal(hs_int(retry, "first_retry_ms"), 2000);
	assert_null(json_object_get(retry, "initial_delay_ms"));
	json_decref(wf);
}

/*
 * The retry policy: wait before retry n = min(first_retry_ms * backoff^(n-1), max_delay_ms),
 * here 100 ms, then times 3 capped at 500 ms: 100, 300, 500; no retry starts before its time.
 */
static void test_retry_backoff_schedule(void **state)
{
	hs_server *s = *state;
	json_t *body = json_pack("{s:s, s:s, s:[{s:s, s:i, s:i}], s:{s:i, s:i, s:f, s:i}}", "id",
				 "backoff", "resource", "printer", "workers", "name", "flaky",
				 "work_ms", 0, "fail_attempts", 3, "retry", "max_attempts", 4,
				 "first_retry_ms", 100, "backoff", 3.0, "max_delay_ms", 500);
	json_decref(hs_create_workflow(s, body));
	json_t *wf = hs_wait_workflow(s, "backoff", "completed", WAIT_MS);
	assert_int_equal(hs_int(hs_step_at(wf, 0), "attempts"), 4);
	json_t *events = hs_get_events(s, "backoff");
	static const json_int_t waits[] = {100, 300, 500};
	for (int n = 1; n <= 3; n++) {
		json_t *fail = hs_event_find(events, "step_failed", 0, n);
		json_t *next = hs_event_find(events, "lock_acquired", 0, n + 1);
		assert_non_null(fail);
		assert_non_null(next);
		if (hs_int(fail, "retry_in_ms") != waits[n - 1])
			fail_msg("retry %d: retry_in_ms %lld, expected %lld", n,
				 (long long)hs_int(fail, "retry_in_ms"), (long long)waits[n - 1]);
		int64_t due = hs_time(fail, "next_attempt_at");
		assert_true(due - hs_time(fail, "ts") >= waits[n - 1] - 1);
		if (hs_time(next, "ts") < due)
			fail_msg("attempt %d started at %lld, before its next_attempt_at %lld",
				 n + 1, (long long)hs_time(next, "ts"), (long long)due);
	}
	assert_int_equal(hs_event_count(events, "step_failed", -1, -1), 3);
	json_decref(events);
	json_decref(wf);
}

/*
 * A retry wait is slept through: while the only thing due is a step's next attempt, 6 s
 * away, batond uses a small part of one core (an engine that timed its waits on the wrong
 * clock woke at once, again and again, and used all of it until the attempt).
 */
static void test_retry_wait_is_slept_through(void **state)
{
	hs_server *s = *state;
	json_t *body =
	    json_pack("{s:s, s:s, s:[{s:s, s:i, s:i}], s:{s:i, s:i}}", "id", "sleepy", "resource",
		      "printer", "workers", "name", "flaky", "work_ms", 0, "fail_attempts", 1,
		      "retry", "max_attempts", 2, "first_retry_ms", 6000);
	json_decref(hs_create_workflow(s, body));
	json_decref(hs_wait_step(s, "sleepy", 0, "retrying", WAIT_MS));
	int64_t cpu0 = hs_cpu_ms(s), t0 = hs_mono_ms();
	assert_true(cpu0 >= 0);
	json_decref(hs_wait_workflow(s, "sleepy", "completed", WAIT_MS));
	int64_t cpu = hs_cpu_ms(s) - cpu0, wall = hs_mono_ms() - t0;
	/* The wait, polled by this test every HS_POLL_MS, costs batond little; a spin costs
	 * about the whole wall time. */
	if (cpu * 2 > wall)
		fail_msg("batond used %lld ms of CPU in a %lld ms retry wait", (long long)cpu,
			 (long long)wall);
}

/*
 * SIGTERM while a step runs: batond shuts down cleanly (exit 0, checked by the harness
 * as well) and, started again, finishes the workflow with every step completed once.
 */
static void test_sigterm_mid_step_is_clean(void **state)
{
	hs_server *s = *state;
	json_t *body =
	    json_pack("{s:s, s:s, s:[{s:s, s:i}, {s:s, s:i}]}", "id", "term", "resource", "printer",
		      "workers", "name", "long", "work_ms", 1500, "name", "short", "work_ms", 10);
	json_decref(hs_create_workflow(s, body));
	json_decref(hs_wait_step(s, "term", 0, "running", WAIT_MS));
	assert_int_equal(hs_stop(s), 0);
	assert_int_equal(hs_start(s), 0);
	json_t *wf = hs_wait_workflow(s, "term", "completed", WAIT_MS);
	json_t *events = hs_get_events(s, "term");
	for (int i = 0; i < 2; i++) {
		assert_int_equal(hs_event_count(events, "step_completed", i, -1), 1);
		/* Run again only if it was interrupted; never completed twice. */
		assert_int_equal(hs_int(hs_step_at(wf, (size_t)i), "attempts"),
				 1 + (json_int_t)hs_event_count(events, "step_interrupted", i, -1));
	}
	json_decref(events);
	json_decref(wf);
}

/*
 * A long history: three workers failing 999 times each before succeeding make 12003
 * events; GET /workflows/{id}/events gives all of them, a page of 1000 at a time
 * (hs_get_events follows next_after), and ?after= continues from any point.
 */
static void test_long_event_history_is_complete(void **state)
{
	hs_server *s = *state;
	json_t *workers = json_array();
	static const char *const names[] = {"a", "b", "c"};
	for (size_t i = 0; i < 3; i++)
		json_array_append_new(workers, json_pack("{s:s, s:i, s:i}", "name", names[i],
							 "work_ms", 0, "fail_attempts", 999));
	json_decref(
	    hs_create_workflow(s, json_pack("{s:s, s:s, s:o, s:{s:i, s:i}}", "id", "long-history",
					    "resource", "history", "workers", workers, "retry",
					    "max_attempts", 1000, "first_retry_ms", 0)));
	json_t *wf = hs_wait_workflow(s, "long-history", "completed", 120000);
	for (size_t i = 0; i < 3; i++)
		assert_int_equal(hs_int(hs_step_at(wf, i), "attempts"), 1000);
	json_decref(wf);

	enum { EXPECTED = 3 * 1000 * 4 + 3 };
	json_t *events = hs_get_events(s, "long-history");
	size_t n = json_array_size(events);
	const char *last = hs_str(json_array_get(events, n - 1), "type");
	if (n != EXPECTED || strcmp(last, "workflow_completed") != 0)
		fail_msg("GET /workflows/long-history/events returned %zu events ending with %s, "
			 "expected all %d ending with workflow_completed",
			 n, last, EXPECTED);
	json_int_t after = hs_int(json_array_get(events, n - 101), "seq");
	char path[256];
	snprintf(path, sizeof path, "/workflows/long-history/events?after=%lld", (long long)after);
	json_t *tail = hs_get_json(s, path, 200);
	assert_int_equal(json_array_size(json_object_get(tail, "events")), 100);
	json_decref(tail);
	json_decref(events);
}

/* The three-worker workflow whose middle worker always fails; `on_failure` may be NULL. */
static json_t *failing_middle(const char *id, const char *on_failure)
{
	json_t *body = json_pack("{s:s, s:s, s:[{s:s, s:i}, {s:s, s:i, s:i}, {s:s, s:i}], "
				 "s:{s:i, s:i}}",
				 "id", id, "resource", "ledger", "workers", "name", "a", "work_ms",
				 10, "name", "b", "work_ms", 10, "fail_attempts", 5, "name", "c",
				 "work_ms", 10, "retry", "max_attempts", 2, "first_retry_ms", 0);
	if (on_failure)
		json_object_set_new(body, "on_failure", json_string(on_failure));
	return body;
}

/* Asserts b's two failed attempts: the first one retried at once, the second final. */
static void assert_failed_twice(const json_t *events)
{
	json_t *f1 = hs_event_find(events, "step_failed", 1, 1);
	json_t *f2 = hs_event_find(events, "step_failed", 1, 2);
	assert_non_null(f1);
	assert_non_null(f2);
	assert_int_equal(hs_int(f1, "retry_in_ms"), 0);
	hs_time(f1, "next_attempt_at");
	assert_true(json_is_null(json_object_get(f2, "retry_in_ms")));
	assert_true(json_is_null(json_object_get(f2, "next_attempt_at")));
	assert_true(strlen(hs_str(f2, "error")) > 0);
	assert_int_equal(hs_event_count(events, "step_failed", -1, -1), 2);
}

/* on_failure "fail" (the default): a step failing for good fails the workflow; later steps never
 * start. */
static void test_on_failure_fail_stops_workflow(void **state)
{
	hs_server *s = *state;
	json_decref(hs_create_workflow(s, failing_middle("stop-on-fail", NULL)));
	json_t *wf = hs_wait_workflow(s, "stop-on-fail", "failed", WAIT_MS);
	hs_assert_workflow_shape(wf);
	assert_string_equal(hs_str(wf, "on_failure"), "fail");
	assert_true(strlen(hs_str(wf, "error")) > 0);
	hs_time(wf, "finished_at");
	assert_int_equal(hs_int(wf, "steps_completed"), 1);
	assert_string_equal(hs_str(hs_step_at(wf, 0), "status"), "completed");
	json_t *b = hs_step_at(wf, 1), *c = hs_step_at(wf, 2);
	assert_string_equal(hs_str(b, "status"), "failed");
	assert_int_equal(hs_int(b, "attempts"), 2);
	assert_true(strlen(hs_str(b, "error")) > 0);
	assert_true(json_is_null(json_object_get(b, "result")));
	const char *c_status = hs_str(c, "status");
	if (strcmp(c_status, "skipped") != 0)
		fail_msg("the step after the failed one is %s, not skipped", c_status);
	assert_int_equal(hs_int(c, "attempts"), 0);
	assert_true(json_is_null(json_object_get(c, "started_at")));

	json_t *events = hs_get_events(s, "stop-on-fail");
	assert_failed_twice(events);
	assert_int_equal(hs_event_count(events, "lock_requested", 2, -1), 0);
	assert_int_equal(hs_event_count(events, "lock_acquired", 2, -1), 0);
	json_t *last = json_array_get(events, json_array_size(events) - 1);
	assert_string_equal(hs_str(last, "type"), "workflow_failed");
	assert_true(strlen(hs_str(last, "error")) > 0);
	assert_int_equal(hs_event_count(events, "workflow_completed", -1, -1), 0);
	json_decref(events);
	json_decref(wf);
}

/* on_failure "continue": the failed step is recorded and the next steps still run. */
static void test_on_failure_continue_runs_the_rest(void **state)
{
	hs_server *s = *state;
	json_decref(hs_create_workflow(s, failing_middle("go-on", "continue")));
	json_t *wf = hs_wait_workflow(s, "go-on", "completed", WAIT_MS);
	hs_assert_workflow_shape(wf);
	assert_string_equal(hs_str(wf, "on_failure"), "continue");
	assert_int_equal(hs_int(wf, "steps_completed"), 2);
	json_t *b = hs_step_at(wf, 1), *c = hs_step_at(wf, 2);
	assert_string_equal(hs_str(b, "status"), "failed");
	assert_int_equal(hs_int(b, "attempts"), 2);
	assert_string_equal(hs_str(c, "status"), "completed");
	assert_int_equal(hs_int(c, "attempts"), 1);

	json_t *result = json_object_get(wf, "result");
	json_t *processed = json_object_get(result, "processed");
	assert_int_equal(json_array_size(processed), 2);
	assert_true(
	    json_equal(json_array_get(processed, 0), json_object_get(hs_step_at(wf, 0), "result")));
	assert_true(json_equal(json_array_get(processed, 1), json_object_get(c, "result")));
	assert_int_equal(hs_int(result, "workersProcessed"), 2);
	json_t *failed = json_object_get(result, "failed");
	assert_int_equal(json_array_size(failed), 1);
	assert_string_equal(hs_str(json_array_get(failed, 0), "workerId"), "b");
	assert_true(strlen(hs_str(json_array_get(failed, 0), "error")) > 0);

	json_t *events = hs_get_events(s, "go-on");
	assert_failed_twice(events);
	json_t *final_fail = hs_event_find(events, "step_failed", 1, 2);
	json_t *acq_c = hs_event_find(events, "lock_acquired", 2, 1);
	assert_non_null(acq_c);
	assert_true(hs_int(final_fail, "seq") < hs_int(acq_c, "seq"));
	assert_non_null(hs_event_find(events, "workflow_completed", -1, -1));
	assert_null(hs_event_find(events, "workflow_failed", -1, -1));
	json_decref(events);
	json_decref(wf);
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_happy_path, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_failed_step_retries_after_wait, hs_setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_sigkill_mid_step_resumes, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_restart_during_retry_wait_keeps_schedule, hs_setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_upgrade_keeps_workflows_with_initial_delay_ms,
					    hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_retry_backoff_schedule, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_retry_wait_is_slept_through, hs_setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_sigterm_mid_step_is_clean, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_long_event_history_is_complete, hs_setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_on_failure_fail_stops_workflow, hs_setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_on_failure_continue_runs_the_rest, hs_setup,
					    hs_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
