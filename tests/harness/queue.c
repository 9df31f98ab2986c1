/*
 * queue.c - what the resource suites (test_resources.c, test_cancel.c) share: workflows
 * submitted onto a resource, waiting for its queue to reach a length, the events of many
 * workflows merged in seq order, and the check that a resource has one holder at a time.
 */
#include "queue.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WAIT_MS 60000

/*
 * A workflow body: `resource`, `steps` workers named "<tag>-<i>" of `work_ms` each.
 * The caller frees the result.
 */
char *queue_body(const char *id, const char *resource, int steps, int work_ms)
{
	json_t *workers = json_array();
	for (int i = 0; i < steps; i++) {
		char name[64];
		snprintf(name, sizeof name, "%s-%d", id, i);
		json_array_append_new(workers,
				      json_pack("{s:s, s:i}", "name", name, "work_ms", work_ms));
	}
	json_t *body =
	    json_pack("{s:s, s:s, s:o}", "id", id, "resource", resource, "workers", workers);
	char *text = json_dumps(body, JSON_COMPACT);
	json_decref(body);
	return text;
}

void queue_free_all(json_t **wfs, size_t n)
{
	for (size_t i = 0; wfs && i < n; i++)
		json_decref(wfs[i]);
	free(wfs);
}

static int by_seq(const void *a, const void *b)
{
	json_int_t x = json_integer_value(json_object_get(*(json_t *const *)a, "seq"));
	json_int_t y = json_integer_value(json_object_get(*(json_t *const *)b, "seq"));
	return (x > y) - (x < y);
}

/* All events of the workflows `ids`, in seq order (seq is global). New reference. */
json_t *queue_merged_events(const hs_server *s, char **ids, size_t n)
{
	json_t *lists = json_array();
	size_t total = 0;
	for (size_t i = 0; i < n; i++) {
		json_t *evs = hs_get_events(s, ids[i]);
		total += json_array_size(evs);
		json_array_append_new(lists, evs);
	}
	json_t **all = calloc(total ? total : 1, sizeof *all);
	size_t k = 0, i, j;
	json_t *evs;
	for (i = 0; i < json_array_size(lists); i++) {
		evs = json_array_get(lists, i);
		for (j = 0; j < json_array_size(evs); j++)
			all[k++] = json_array_get(evs, j);
	}
	qsort(all, total, sizeof *all, by_seq);
	json_t *out = json_array();
	for (k = 0; k < total; k++) {
		if (k > 0 && hs_int(all[k], "seq") == hs_int(all[k - 1], "seq"))
			fail_msg("two events share seq %lld", (long long)hs_int(all[k], "seq"));
		json_array_append(out, all[k]);
	}
	free(all);
	json_decref(lists);
	return out;
}

bool queue_is_type(const json_t *ev, const char *type)
{
	return strcmp(hs_str(ev, "type"), type) == 0;
}

/* "wf#step#attempt": the identity of one attempt of one step. */
void queue_attempt_key(const json_t *ev, char *buf, size_t size)
{
	snprintf(buf, size, "%s#%lld#%lld", hs_str(ev, "workflow_id"),
		 (long long)hs_int(ev, "step"), (long long)hs_int(ev, "attempt"));
}

bool queue_has_event(const json_t *events, const char *type, const char *key)
{
	size_t i;
	json_t *ev;
	json_array_foreach(events, i, ev)
	{
		char k[256];
		if (!queue_is_type(ev, type))
			continue;
		queue_attempt_key(ev, k, sizeof k);
		if (strcmp(k, key) == 0)
			return true;
	}
	return false;
}

/*
 * Walks the merged `events` by seq and asserts one holder per resource: a lock_acquired
 * only when nobody holds it, a lock_released only by its holder. When `kill_ms` is not
 * HS_NO_TIME, the first event after it starts the restarted process's life: whoever held
 * a resource when it was killed must have a step_interrupted event (or have ended that
 * attempt before the kill). Returns how many grants it saw.
 */
size_t queue_assert_one_holder(const json_t *events, int64_t kill_ms)
{
	json_t *holders = json_object(); /* resource -> attempt key */
	bool restarted = kill_ms == HS_NO_TIME;
	size_t grants = 0, i;
	json_t *ev;
	json_array_foreach(events, i, ev)
	{
		if (!restarted && hs_time(ev, "ts") > kill_ms) {
			restarted = true;
			const char *res;
			json_t *holder;
			json_object_foreach(holders, res, holder)
			{
				/* Its attempt either ended before the kill (the release was not
				 * recorded) or was interrupted and must say so. */
				const char *key = json_string_value(holder);
				if (!queue_has_event(events, "step_interrupted", key) &&
				    !queue_has_event(events, "step_completed", key) &&
				    !queue_has_event(events, "step_failed", key))
					fail_msg("%s held %s when batond was killed but has no "
						 "step_interrupted event",
						 key, res);
			}
			json_object_clear(holders);
		}
		bool acq = queue_is_type(ev, "lock_acquired"),
		     rel = queue_is_type(ev, "lock_released");
		if (!acq && !rel)
			continue;
		const char *res = hs_str(ev, "resource");
		char key[256];
		queue_attempt_key(ev, key, sizeof key);
		const char *holder = json_string_value(json_object_get(holders, res));
		if (acq) {
			grants++;
			if (holder)
				fail_msg("%s acquired %s (seq %lld) while %s held it", key, res,
					 (long long)hs_int(ev, "seq"), holder);
			json_object_set_new(holders, res, json_string(key));
		} else {
			if (!holder || strcmp(holder, key) != 0)
				fail_msg("%s released %s (seq %lld), held by %s", key, res,
					 (long long)hs_int(ev, "seq"), holder ? holder : "nobody");
			json_object_del(holders, res);
		}
	}
	if (json_object_size(holders) != 0)
		fail_msg("a resource is still held after every workflow completed");
	json_decref(holders);
	return grants;
}

typedef struct res_wait {
	const hs_server *s;
	const char *path;
	size_t waiters;
} res_wait;

/* True when GET res_wait.path shows a holder and exactly `waiters` waiters. */
static bool resource_queue_is(void *arg)
{
	res_wait *w = arg;
	hs_response r;
	bool ok = hs_get(w->s, w->path, &r) == 0 && r.status == 200 &&
		  json_is_object(json_object_get(r.json, "holder")) &&
		  json_array_size(json_object_get(r.json, "waiters")) == w->waiters;
	hs_response_fini(&r);
	return ok;
}

void queue_wait(const hs_server *s, const char *resource, size_t waiters)
{
	char path[256];
	snprintf(path, sizeof path, "/resources/%s", resource);
	res_wait w = {s, path, waiters};
	if (!hs_wait_until(resource_queue_is, &w, WAIT_MS))
		fail_msg("%s never showed a holder and %zu waiters", resource, waiters);
}

/* POSTs a workflow of single steps `work_ms` long each; the caller frees nothing. */
void queue_submit(const hs_server *s, const char *id, const char *resource, int steps, int work_ms)
{
	char *text = queue_body(id, resource, steps, work_ms);
	hs_response r;
	hs_post(s, "/workflows", text, &r);
	if (r.status != 201)
		fail_msg("POST %s: %ld %s", text, r.status, r.body ? r.body : "");
	hs_response_fini(&r);
	free(text);
}

/* Waits until every workflow of `ids` is completed; returns their states (free with
 * queue_free_all). */
json_t **queue_wait_completed(const hs_server *s, char **ids, size_t n)
{
	json_t **wfs = calloc(n, sizeof *wfs);
	for (size_t i = 0; i < n; i++)
		wfs[i] = hs_wait_workflow(s, ids[i], "completed", WAIT_MS);
	return wfs;
}
