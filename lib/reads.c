/*
 * reads.c - the engine's read API: every answer comes from the store (store.c shapes it),
 * on the calling thread, never through the engine thread; ids and names are checked
 * first, so that one that can never exist answers "not found" without a query. The
 * metrics add the engine's own counters, read under metrics_mu.
 */
#include "engine.h"

int baton_engine_get(baton_engine *e, const char *id, json_t **out, baton_error *err)
{
	if (!valid_name(id))
		return err_set(err, BATON_ENOTFOUND, "no workflow with id \"%.128s\"", id);
	return store_get_workflow(e->st, id, out, err);
}

int baton_engine_get_text(baton_engine *e, const char *id, char **text, size_t *len,
			  baton_error *err)
{
	if (!valid_name(id))
		return err_set(err, BATON_ENOTFOUND, "no workflow with id \"%.128s\"", id);
	return store_get_workflow_text(e->st, id, text, len, err);
}

int baton_engine_list(baton_engine *e, const baton_list_query *q, json_t **out, baton_error *err)
{
	return store_list_workflows(e->st, q, out, err);
}

int baton_engine_events(baton_engine *e, const char *id, int64_t after, int limit, json_t **out,
			baton_error *err)
{
	if (!valid_name(id))
		return err_set(err, BATON_ENOTFOUND, "no workflow with id \"%.128s\"", id);
	return store_list_events(e->st, id, after, limit, out, err);
}

int baton_engine_steps(baton_engine *e, const char *id, int after, int limit, json_t **out,
		       baton_error *err)
{
	if (!valid_name(id))
		return err_set(err, BATON_ENOTFOUND, "no workflow with id \"%.128s\"", id);
	return store_list_steps(e->st, id, after, limit, out, err);
}

int baton_engine_resources(baton_engine *e, const char *cursor, int limit, int order, json_t **out,
			   baton_error *err)
{
	return store_list_resources(e->st, cursor, limit, order, out, err);
}

int baton_engine_resource(baton_engine *e, const char *name, json_t **out, baton_error *err)
{
	if (!valid_name(name))
		return err_set(err, BATON_ENOTFOUND, "no resource named \"%.128s\"", name);
	return store_get_resource(e->st, name, out, err);
}

static void add_res_metrics(void *ctx, void *value)
{
	const res_metrics *r = value;
	json_object_set_new(ctx, r->name,
			    json_pack("{s:I, s:I, s:I, s:I, s:o, s:o}", "queue_depth",
				      (json_int_t)r->queue_depth, "holders", (json_int_t)r->holders,
				      "permits_in_use", (json_int_t)r->permits_in_use, "limit",
				      (json_int_t)(r->limit ? r->limit : 1), "wait_seconds",
				      hist_json(&r->wait, hist_seconds), "hold_seconds",
				      hist_json(&r->hold, hist_seconds)));
}

int baton_engine_resource_events(baton_engine *e, const char *name, int64_t after, int limit,
				 json_t **out, baton_error *err)
{
	if (!valid_name(name))
		return err_set(err, BATON_ENOTFOUND, "no resource named \"%.128s\"", name);
	return store_resource_events(e->st, name, after, limit, out, err);
}

int baton_engine_ready(baton_engine *e)
{
	pthread_mutex_lock(&e->mu);
	int ready = !e->faulty && !e->draining;
	pthread_mutex_unlock(&e->mu);
	if (!members_ready(e))
		return 0;
	baton_error err;
	return ready && store_ping(e->st, &err) == BATON_OK;
}

int baton_engine_metrics(baton_engine *e, json_t **out, baton_error *err)
{
	json_t *counts;
	int rc = store_workflow_counts(e->st, &counts, err);
	if (rc)
		return rc;
	json_t *resources = json_object();
	pthread_mutex_lock(&e->metrics_mu);
	json_t *m = json_pack(
	    "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:o}", "steps_completed",
	    (json_int_t)e->steps_completed, "steps_failed", (json_int_t)e->steps_failed,
	    "steps_retried", (json_int_t)e->steps_retried, "commits", (json_int_t)e->commits,
	    "checkpoints", (json_int_t)e->checkpoints, "workflows_deleted",
	    (json_int_t)e->workflows_deleted, "deletes", (json_int_t)e->deletes, "commit_seconds",
	    hist_json(&e->commit_seconds, hist_seconds), "checkpoints_per_commit",
	    hist_json(&e->checkpoints_per_commit, hist_counts));
	strmap_each(e->res_metrics, add_res_metrics, resources);
	json_object_set_new(
	    m, "leases",
	    json_pack("{s:I, s:I, s:I, s:I}", "granted", (json_int_t)e->leases_granted, "released",
		      (json_int_t)e->leases_released, "expired", (json_int_t)e->leases_expired,
		      "refused", (json_int_t)e->leases_refused));
	pthread_mutex_unlock(&e->metrics_mu);
	json_object_set_new(m, "workflows", counts);
	json_object_set_new(m, "resources", resources);
	pthread_mutex_lock(&e->metrics_mu);
	json_object_set_new(m, "timers", json_integer((json_int_t)e->timers_pending));
	pthread_mutex_unlock(&e->metrics_mu);
	json_object_set_new(m, "finished_cache_bytes",
			    json_integer((json_int_t)store_cache_bytes(e->st)));
	*out = m;
	return BATON_OK;
}
