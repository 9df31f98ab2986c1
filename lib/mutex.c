/*
 * mutex.c - the distributed-mutex workflow: baton's reason to exist, defined on top of
 * the general engine in a few lines.
 *
 *     exclusive_resource_access(resource, workers):
 *         for each worker, in order:
 *             result = run(access_resource, resource, worker)   # one checkpointed step
 *         return { resource, processed: results, workersProcessed, totalMs }
 *
 * The loop and the checkpoints are the engine's (one step per worker, each holding the
 * workflow's resource); this file says what one step does and what the result is.
 */
#include "internal.h"

#include <stdio.h>

/* One step: the worker's HTTP call when it has one (call.c); otherwise simulated work
 * as in the origin, work_ms of holding the resource, failing with "resource timeout"
 * on the first fail_attempts attempts. */
static void access_resource(const step_input *in, step_output *out)
{
	if (json_object_get(in->params, "call")) {
		call_run(in, out); /* real work: an HTTP request to the resource */
		return;
	}
	json_int_t work = json_integer_value(json_object_get(in->params, "work_ms"));
	json_int_t fail = json_integer_value(json_object_get(in->params, "fail_attempts"));
	int64_t t0 = mono_ms();
	if (in->sleep_ms(in->sleep_ctx, work)) {
		out->aborted = 1;
		return;
	}
	out->duration_ms = mono_ms() - t0;
	if (in->attempt <= fail) {
		snprintf(out->error, sizeof out->error, "resource timeout");
		out->retryable = 1;
		return;
	}
	char action[MAX_NAME + 16];
	snprintf(action, sizeof action, "updated-%s", in->resource);
	out->result = json_pack("{s:s, s:s, s:I}", "workerId", in->worker, "action", action,
				"duration", (json_int_t)out->duration_ms);
}

static json_t *exclusive_resource_access_result(const wf_row *wf)
{
	json_t *processed = json_array(), *failed = json_array();
	for (int i = 0; i < wf->steps_total; i++) {
		const step_row *st = &wf->steps[i];
		if (st->status == ST_COMPLETED)
			json_array_append(processed, st->result);
		else if (st->status == ST_FAILED)
			json_array_append_new(failed, json_pack("{s:s, s:s?}", "workerId",
								st->worker, "error", st->error));
	}
	json_t *r = json_pack("{s:s, s:o, s:I, s:I}", "resource", wf->resource, "processed",
			      processed, "workersProcessed", (json_int_t)json_array_size(processed),
			      "totalMs", (json_int_t)(wf->finished_at - wf->started_at));
	if (json_array_size(failed))
		json_object_set_new(r, "failed", failed);
	else
		json_decref(failed);
	return r;
}

const workflow_def mutex_workflow = {
    .kind = "exclusive_resource_access",
    .run_step = access_resource,
    .result = exclusive_resource_access_result,
};
