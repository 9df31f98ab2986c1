/*
 * permits.c - a resource's limit: how many may hold it at once (lock.c).
 *
 * The limit is part of the resource's row, so it is written, fenced and read as the row
 * is: an engine round sets it in memory, the round's commit makes it durable (under the
 * ownership check, in a cluster), and only then is its caller answered. Raising it grants,
 * in the same round, the waiters that now fit; lowering it takes nothing from the holders,
 * and nobody is granted until they fit under it. A node that does not drive the resource
 * refuses with the node that does (eng_pass_on), and the server passes the call on to it.
 */
#include "engine.h"

#include <stdlib.h>

void permits_apply(baton_engine *e, msg *m, int64_t now)
{
	const char *name = m->resource;
	if (!eng_drives(e, name)) {
		eng_pass_on(e, m->w, name);
	} else {
		res_lock *l = eng_lock_of(e, name);
		if (!l->loaded) {
			eng_waiter_done(m->w, BATON_EBUSY, 0,
					"the resource's stored row cannot be read now; try again");
		} else {
			l->row.permits = (int)m->ttl_ms;
			l->dirty = 1;
			eng_touch_lock(e, l);
			eng_reply(e, m->w, BATON_OK, REPLY_CHANGED, name);
			if (!e->no_new_work)
				eng_grant_lock(e, l, now);
		}
	}
	free(m->resource);
	m->resource = NULL;
}

int baton_resource_limit(baton_engine *e, const char *name, int64_t limit, baton_lease_fn done,
			 void *ud, baton_error *err)
{
	if (!valid_name(name))
		return err_set(err, BATON_EINVAL,
			       "a resource's name is 1 to 128 characters [A-Za-z0-9._:-]");
	if (limit < 1 || limit > MAX_PERMITS)
		return err_set(err, BATON_EINVAL, "limit: a whole number from 1 to %d",
			       MAX_PERMITS);
	waiter *w = xcalloc(1, sizeof *w);
	w->lease_cb = done;
	w->ud = ud;
	snprintf(w->id, sizeof w->id, "%s", name);
	msg *m = xcalloc(1, sizeof *m);
	m->type = MSG_LIMIT;
	m->resource = xstrdup(name);
	m->ttl_ms = limit;
	m->w = w;
	if (eng_post_call(e, m, err)) {
		free(m->resource);
		free(m->w);
		free(m);
		return err->code;
	}
	return BATON_OK;
}
