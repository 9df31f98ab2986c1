/*
 * lock.c - one resource's lock: its holders and a FIFO queue of waiting steps.
 *
 * A resource has row.permits permits (its limit; 1, the default, makes it a mutex). A
 * plain request takes one, and with it the lowest free slot (0 to limit-1); an exclusive
 * request (lock_wants_all) takes all of them, so it is granted only when nobody holds the
 * resource and nobody is granted beside it. Waiters are granted strictly in the order they
 * were queued, which is the order of their durable request sequence (recovery re-queues
 * them sorted by it), as a weighted semaphore serves its waiters: the head is granted as
 * soon as its permits are free, and nobody behind it before it, even a request that would
 * fit, so a waiting exclusive request is never starved by plain ones. A waiting step holds
 * no thread: it is only a link in this list. Every grant takes the next fencing token of
 * the resource; the engine commits the new token with the grant, before the step can run.
 * A lower limit takes nothing from the holders: nobody is granted until they fit.
 * Pure data structure: the engine thread is its only user.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

res_lock *lock_new(const char *name)
{
	res_lock *l = xcalloc(1, sizeof *l);
	l->row.name = xstrdup(name);
	l->row.permits = 1;
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
	free(l->holds);
	free(l->slots);
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

int lock_params_slot(const json_t *params)
{
	if (json_is_true(json_object_get(params, "exclusive")))
		return -1;
	return (int)json_integer_value(json_object_get(params, "slot"));
}

int lock_granted_slot(const wf_row *wf)
{
	return lock_params_slot(wf->steps[wf->cur].params);
}

int lock_wants_all(const wf_row *wf)
{
	return lock_granted_slot(wf) < 0;
}

/* Whether a request (exclusive or not) fits beside the holders under the limit. */
static int fits(const res_lock *l, int exclusive)
{
	if (l->nholds == 0)
		return 1;
	if (exclusive || l->holds[0].slot < 0)
		return 0;
	return l->nholds < l->row.permits;
}

/* The lowest slot no holder has; one exists below the limit when a plain request fits. */
static int free_slot(const res_lock *l)
{
	int w = 0;
	while (w < l->slot_words && l->slots[w] == UINT64_MAX)
		w++;
	if (w == l->slot_words)
		return w * 64;
	int bit = 0;
	while (l->slots[w] >> bit & 1)
		bit++;
	return w * 64 + bit;
}

/* Marks slot taken (1) or free (0); an exclusive hold (-1) takes none. */
static void mark_slot(res_lock *l, int slot, int taken)
{
	if (slot < 0)
		return;
	int w = slot / 64;
	if (w >= l->slot_words) {
		if (!taken)
			return;
		int n = w + 1;
		l->slots = realloc(l->slots, (size_t)n * sizeof *l->slots);
		if (!l->slots)
			abort();
		memset(&l->slots[l->slot_words], 0, (size_t)(n - l->slot_words) * sizeof *l->slots);
		l->slot_words = n;
	}
	if (taken)
		l->slots[w] |= (uint64_t)1 << (slot % 64);
	else
		l->slots[w] &= ~((uint64_t)1 << (slot % 64));
}

static void grow_holds(res_lock *l)
{
	if (l->nholds == l->holds_cap) {
		l->holds_cap = l->holds_cap ? l->holds_cap * 2 : 2;
		l->holds = realloc(l->holds, (size_t)l->holds_cap * sizeof *l->holds);
		if (!l->holds)
			abort();
	}
}

/* Adds a hold, keeping the holds in token order. */
static void add_hold(res_lock *l, wf_row *wf, int slot, int64_t since)
{
	grow_holds(l);
	int64_t token = wf->steps[wf->cur].token;
	int at = l->nholds;
	while (at > 0 && l->holds[at - 1].wf->steps[l->holds[at - 1].wf->cur].token > token)
		at--;
	memmove(&l->holds[at + 1], &l->holds[at], (size_t)(l->nholds - at) * sizeof *l->holds);
	l->holds[at] = (lock_hold){wf, slot, since};
	l->nholds++;
	mark_slot(l, slot, 1);
}

static int hold_index(const res_lock *l, const wf_row *wf)
{
	for (int i = 0; i < l->nholds; i++)
		if (l->holds[i].wf == wf)
			return i;
	return -1;
}

static void drop_hold(res_lock *l, int i)
{
	mark_slot(l, l->holds[i].slot, 0);
	memmove(&l->holds[i], &l->holds[i + 1], (size_t)(l->nholds - i - 1) * sizeof *l->holds);
	l->nholds--;
}

int lock_fits_now(const res_lock *l, int exclusive)
{
	return !l->head && fits(l, exclusive);
}

wf_row *lock_grant_next(res_lock *l, int64_t now, int64_t *waited_ms)
{
	if (!l->head || !l->loaded)
		return NULL;
	int exclusive = lock_wants_all(l->head->wf);
	if (!fits(l, exclusive))
		return NULL;
	int slot = exclusive ? -1 : free_slot(l);
	wf_row *wf = lock_pop(l);
	int64_t waited = now - wf->steps[wf->cur].requested_at;
	if (waited < 0)
		waited = 0;
	l->row.last_token++;
	l->row.grants++;
	l->row.total_wait_ms += waited;
	if (waited > l->row.max_wait_ms)
		l->row.max_wait_ms = waited;
	/* The newest grant has the highest token: it goes last, whatever the step's token
	 * says until the engine records the new one. */
	grow_holds(l);
	l->holds[l->nholds++] = (lock_hold){wf, slot, now};
	mark_slot(l, slot, 1);
	l->dirty = 1;
	*waited_ms = waited;
	return wf;
}

const lock_hold *lock_hold_of(const res_lock *l, const wf_row *wf)
{
	int i = hold_index(l, wf);
	return i < 0 ? NULL : &l->holds[i];
}

wf_row *lock_first_holder(const res_lock *l)
{
	return l->nholds ? l->holds[0].wf : NULL;
}

int lock_permits_in_use(const res_lock *l)
{
	if (l->nholds && l->holds[0].slot < 0)
		return l->row.permits;
	return l->nholds;
}

void lock_release(res_lock *l, const wf_row *wf, int64_t now)
{
	int i = hold_index(l, wf);
	if (i < 0)
		return;
	int64_t held = now - l->holds[i].since;
	if (held < 0)
		held = 0;
	l->row.total_hold_ms += held;
	if (held > l->row.max_hold_ms)
		l->row.max_hold_ms = held;
	drop_hold(l, i);
	l->dirty = 1;
}

void lock_ungrant(res_lock *l, const wf_row *wf)
{
	int i = hold_index(l, wf);
	if (i < 0)
		return;
	if (i == l->nholds - 1 && wf->steps[wf->cur].token == l->row.last_token)
		l->row.last_token--;
	l->row.grants--;
	drop_hold(l, i);
	l->dirty = 1;
}

void lock_restore(res_lock *l, wf_row *wf, int slot, int64_t since)
{
	add_hold(l, wf, slot, since);
}

void lock_clear_holds(res_lock *l)
{
	l->nholds = 0;
	if (l->slots)
		memset(l->slots, 0, (size_t)l->slot_words * sizeof *l->slots);
}

int lock_idle(const res_lock *l)
{
	return !l->nholds && !l->head && !l->dirty && !l->in_batch && l->loaded;
}
