/*
 * lock.c - one resource's lock: the current holder and a FIFO queue of waiting steps.
 *
 * Waiters are workflows whose current step asked for the resource; they are granted
 * strictly in the order they were queued, which is the order of their durable request
 * sequence (recovery re-queues them sorted by it). A waiting step holds no thread: it is
 * only a link in this list. Every grant takes the next fencing token of the resource;
 * the engine commits the new token with the grant, before the step can run.
 * Pure data structure: the engine thread is its only user.
 */
#include "internal.h"

#include <stdlib.h>

res_lock *lock_new(const char *name)
{
	res_lock *l = xcalloc(1, sizeof *l);
	l->row.name = xstrdup(name);
	l->loaded = 1;
	return l;
}

void lock_free(res_lock *l)
{
	if (!l)
		return;
	while (lock_pop(l))
		;
	resource_row_fini(&l->row);
	free(l);
}

void lock_enqueue(res_lock *l, wf_row *wf)
{
	lock_waiter *w = xcalloc(1, sizeof *w);
	w->wf = wf;
	if (l->tail)
		l->tail->next = w;
	else
		l->head = w;
	l->tail = w;
	l->queue_len++;
}

int lock_remove(res_lock *l, const wf_row *wf)
{
	lock_waiter **pp = &l->head, *prev = NULL;
	for (; *pp; prev = *pp, pp = &(*pp)->next) {
		lock_waiter *w = *pp;
		if (w->wf != wf)
			continue;
		*pp = w->next;
		if (l->tail == w)
			l->tail = prev;
		l->queue_len--;
		free(w);
		return 1;
	}
	return 0;
}

wf_row *lock_pop(res_lock *l)
{
	lock_waiter *w = l->head;
	if (!w)
		return NULL;
	l->head = w->next;
	if (!l->head)
		l->tail = NULL;
	l->queue_len--;
	wf_row *wf = w->wf;
	free(w);
	return wf;
}

wf_row *lock_grant_next(res_lock *l, int64_t now, int64_t *waited_ms)
{
	if (l->holder || !l->head || !l->loaded)
		return NULL;
	wf_row *wf = lock_pop(l);
	int64_t waited = now - wf->steps[wf->cur].requested_at;
	if (waited < 0)
		waited = 0;
	l->holder = wf;
	l->held_since = now;
	l->row.last_token++;
	l->row.grants++;
	l->row.total_wait_ms += waited;
	if (waited > l->row.max_wait_ms)
		l->row.max_wait_ms = waited;
	l->dirty = 1;
	*waited_ms = waited;
	return wf;
}

void lock_release(res_lock *l, int64_t now)
{
	int64_t held = now - l->held_since;
	if (held < 0)
		held = 0;
	l->row.total_hold_ms += held;
	if (held > l->row.max_hold_ms)
		l->row.max_hold_ms = held;
	l->holder = NULL;
	l->dirty = 1;
}

void lock_ungrant(res_lock *l)
{
	l->holder = NULL;
	l->row.last_token--;
	l->row.grants--;
	l->dirty = 1;
}

void lock_restore(res_lock *l, wf_row *wf, int64_t since)
{
	l->holder = wf;
	l->held_since = since;
}

int lock_idle(const res_lock *l)
{
	return !l->holder && !l->head && !l->dirty && !l->in_batch && l->loaded;
}
