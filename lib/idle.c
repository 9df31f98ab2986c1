/*
 * idle.c - which resources stay in memory.
 *
 * A resource that somebody holds or waits for lives in e->locks. Once it is free, with
 * an empty queue and everything about it committed, it is idle: its token and totals are
 * in its stored row, and nothing in memory knows more. The most recently used idle
 * resources stay (up to e->idle_max, least recently used first in e->idle_head), so that
 * a resource used again soon costs no read; the others leave memory with their
 * per-resource metrics. A resource that is not in memory is read back from the store
 * when a step asks for it: its stored token is the high-water mark, so the next grant
 * takes the token after it, as if it had never left.
 *
 * A read that fails (the store unreachable) leaves the resource in memory unloaded: it
 * queues requests but grants nothing until a read succeeds, tried again every second
 * (eng_load_pending). A grant without the stored token could repeat a token.
 *
 * Engine thread only, except the metrics removal, which takes metrics_mu.
 */
#include "engine.h"

#include <stdlib.h>

#define LOAD_RETRY_MS 1000

static void unpark(baton_engine *e, res_lock *l)
{
	if (!l->parked)
		return;
	if (l->idle_prev)
		l->idle_prev->idle_next = l->idle_next;
	else
		e->idle_head = l->idle_next;
	if (l->idle_next)
		l->idle_next->idle_prev = l->idle_prev;
	else
		e->idle_tail = l->idle_prev;
	l->idle_prev = l->idle_next = NULL;
	l->parked = 0;
	e->idle_n--;
}

/* Removes l from memory, with its metrics. */
static void forget(baton_engine *e, res_lock *l)
{
	pthread_mutex_lock(&e->metrics_mu);
	res_metrics *m = strmap_get(e->res_metrics, l->row.name);
	if (m) {
		strmap_del(e->res_metrics, m->name);
		free(m->name);
		free(m);
	}
	pthread_mutex_unlock(&e->metrics_mu);
	strmap_del(e->locks, l->row.name);
	lock_free(l);
}

/* In a cluster, a grant takes a token above the floor of the database generation under
 * which this node holds the resource's partition (internal.h): above every token granted
 * under an earlier generation, also those that the promoted standby never received and so
 * are not in the stored row. */
static void raise_to_generation(const baton_engine *e, res_lock *l)
{
	int64_t floor = e->clustered ? generation_floor(e->epoch[part_of(l->row.name)]) : 0;
	if (l->row.last_token < floor)
		l->row.last_token = floor;
}

/* Reads l's stored row; BATON_OK when l is loaded (a resource never stored is new). */
static int load(baton_engine *e, res_lock *l)
{
	store_resource r;
	baton_error err;
	int rc = e->st->ops->read_resource(e->st, l->row.name, 0, &r, &err);
	if (rc == BATON_ENOTFOUND) {
		l->loaded = 1;
		l->dirty = 1; /* its first row is written with its first grant */
		raise_to_generation(e, l);
		return BATON_OK;
	}
	if (rc != BATON_OK) {
		if (!e->load_failing)
			log_at(&e->log, BATON_LOG_WARN, NULL,
			       "cannot read resource \"%s\" (%s); its waiters wait until it can be "
			       "read",
			       l->row.name, err.msg);
		e->load_failing = 1;
		return rc;
	}
	/* The name stays: it is the key of e->locks. */
	char *name = l->row.name;
	l->row.name = r.row.name;
	resource_row_fini(&l->row);
	l->row = r.row;
	l->row.name = name;
	r.row = (resource_row){0};
	store_resource_fini(&r);
	l->loaded = 1;
	raise_to_generation(e, l);
	return BATON_OK;
}

res_lock *eng_lock_of(baton_engine *e, const char *name)
{
	res_lock *l = strmap_get(e->locks, name);
	if (l) {
		unpark(e, l);
		return l;
	}
	l = lock_new(name);
	l->loaded = 0;
	strmap_put(e->locks, l->row.name, l);
	if (load(e, l) != BATON_OK) {
		VEC_PUSH(e->unloaded, l);
		if (!e->load_retry_at)
			e->load_retry_at = mono_ms() + LOAD_RETRY_MS;
	}
	return l;
}

void eng_load_pending(baton_engine *e)
{
	if (!e->unloaded.n || mono_ms() < e->load_retry_at)
		return;
	size_t kept = 0;
	for (size_t i = 0; i < e->unloaded.n; i++) {
		res_lock *l = e->unloaded.v[i];
		if (load(e, l) == BATON_OK)
			eng_touch_lock(e, l); /* granted in this round */
		else
			e->unloaded.v[kept++] = l;
	}
	e->unloaded.n = kept;
	if (kept) {
		e->load_retry_at = mono_ms() + LOAD_RETRY_MS;
		return;
	}
	e->load_retry_at = 0;
	if (e->load_failing)
		log_at(&e->log, BATON_LOG_INFO, NULL, "resources can be read again");
	e->load_failing = 0;
}

void eng_drop_lock(baton_engine *e, res_lock *l)
{
	unpark(e, l);
	forget(e, l);
}

void eng_park(baton_engine *e, res_lock *l)
{
	if (l->parked || !lock_idle(l))
		return;
	l->parked = 1;
	l->idle_prev = e->idle_tail;
	l->idle_next = NULL;
	if (e->idle_tail)
		e->idle_tail->idle_next = l;
	else
		e->idle_head = l;
	e->idle_tail = l;
	e->idle_n++;
	while (e->idle_n > e->idle_max) {
		res_lock *old = e->idle_head;
		unpark(e, old);
		forget(e, old);
	}
}
