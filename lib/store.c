/*
 * store.c - what both stores share, above the table of store.h: choosing a backend from
 * the --db value, shaping the rows that backends read into the API's JSON (in one place
 * for both), paging cursors, and the cache of finished workflows.
 */
#include "store.h"

#include <stdlib.h>
#include <string.h>

void store_base_init(store *s, const store_ops *ops)
{
	s->ops = ops;
	s->finished_max = FINISHED_DEFAULT_BYTES;
	pthread_mutex_init(&s->finished_mu, NULL);
}

void store_base_fini(store *s)
{
	for (int i = 0; i < FINISHED_SLOTS; i++)
		free(s->finished[i].text);
	pthread_mutex_destroy(&s->finished_mu);
}

void store_nodes_free(store_node *v, int n)
{
	for (int i = 0; i < n; i++) {
		free(v[i].id);
		free(v[i].url);
	}
	free(v);
}

void store_resource_fini(store_resource *r)
{
	resource_row_fini(&r->row);
	for (size_t i = 0; i < r->nholders; i++) {
		free(r->holders[i].wf_id);
		free(r->holders[i].worker);
	}
	free(r->holders);
	free(r->node);
	for (size_t i = 0; i < r->nwaiters; i++) {
		free(r->waiters[i].wf_id);
		free(r->waiters[i].worker);
	}
	free(r->waiters);
	memset(r, 0, sizeof *r);
}

int store_open(const store_config *in, store **out, baton_error *err)
{
	store_config cfg = *in;
	const char *db = in->target;
	const store_ops *ops = &sqlite_store_ops;
	const char *scheme_end = strstr(db, "://");
	if (strncmp(db, "postgresql://", 13) == 0 || strncmp(db, "postgres://", 11) == 0) {
		ops = &pg_store_ops;
	} else if (strncmp(db, "sqlite:", 7) == 0) {
		cfg.target = db + 7;
		if (strncmp(cfg.target, "//", 2) == 0)
			cfg.target += 2; /* sqlite:///abs/path and sqlite://rel/path */
	} else if (scheme_end) {
		return err_set(err, BATON_EINVAL,
			       "--db: \"%.*s://\" is not a store baton supports (postgresql://..., "
			       "postgres://..., sqlite:PATH or a file path)",
			       (int)(scheme_end - db > 32 ? 32 : scheme_end - db), db);
	}
	if (!*cfg.target)
		return err_set(err, BATON_EINVAL, "--db: no database file named");
	return ops->open(&cfg, out, err);
}

void store_close(store *s)
{
	if (s)
		s->ops->close(s);
}

/* ---- workflows ---- */

/*
 * Finished workflows never change again, so their rendered JSON text is kept in a small
 * direct-mapped cache (a slot per hash of the id): reads of them skip the database,
 * rendering and serialising. Filled by reads, not by the answers to POSTs, which are
 * seldom read again. Bounded by bytes as well as by slots: the texts together stay
 * within finished_max (a text larger than an eighth of it is not kept); past the budget,
 * a clock hand frees other slots until the new text fits.
 */
void store_set_cache_bytes(store *s, size_t max)
{
	pthread_mutex_lock(&s->finished_mu);
	s->finished_max = max;
	pthread_mutex_unlock(&s->finished_mu);
}

size_t store_cache_bytes(store *s)
{
	pthread_mutex_lock(&s->finished_mu);
	size_t n = s->finished_bytes;
	pthread_mutex_unlock(&s->finished_mu);
	return n;
}

static char *cache_get(store *s, const char *id, size_t *len)
{
	finished_slot *slot = &s->finished[fnv1a(id) % FINISHED_SLOTS];
	char *hit = NULL;
	pthread_mutex_lock(&s->finished_mu);
	if (slot->text && strcmp(slot->id, id) == 0 && (hit = malloc(slot->len + 1))) {
		memcpy(hit, slot->text, slot->len + 1);
		*len = slot->len;
	}
	pthread_mutex_unlock(&s->finished_mu);
	return hit;
}

static void slot_clear(store *s, finished_slot *slot)
{
	if (!slot->text)
		return;
	s->finished_bytes -= slot->len + 1;
	free(slot->text);
	slot->text = NULL;
	slot->len = 0;
}

/* gen: finished_gen when the row was read; a delete since then may have removed it. */
static void cache_put(store *s, const wf_row *wf, const char *text, size_t len, uint64_t gen)
{
	if (wf->status != WF_COMPLETED && wf->status != WF_FAILED && wf->status != WF_CANCELLED)
		return;
	pthread_mutex_lock(&s->finished_mu);
	size_t max = s->finished_max;
	pthread_mutex_unlock(&s->finished_mu);
	if (len + 1 > max / 8)
		return; /* also when there is no cache (max 0) */
	char *copy = malloc(len + 1);
	if (!copy)
		return;
	memcpy(copy, text, len + 1);
	finished_slot *slot = &s->finished[fnv1a(wf->id) % FINISHED_SLOTS];
	pthread_mutex_lock(&s->finished_mu);
	if (gen != s->finished_gen) {
		pthread_mutex_unlock(&s->finished_mu);
		free(copy);
		return;
	}
	slot_clear(s, slot);
	while (s->finished_bytes + len + 1 > s->finished_max) {
		slot_clear(s, &s->finished[s->finished_hand]);
		s->finished_hand = (s->finished_hand + 1) % FINISHED_SLOTS;
	}
	snprintf(slot->id, sizeof slot->id, "%s", wf->id);
	slot->text = copy;
	slot->len = len;
	s->finished_bytes += len + 1;
	pthread_mutex_unlock(&s->finished_mu);
}

int store_get_workflow(store *s, const char *id, json_t **out, baton_error *err)
{
	wf_row *wf = NULL;
	int rc = s->ops->read_workflow(s, id, &wf, err);
	if (rc == BATON_OK)
		*out = codec_workflow(wf);
	wf_row_free(wf);
	return rc;
}

int store_get_workflow_text(store *s, const char *id, char **text, size_t *len, baton_error *err)
{
	if ((*text = cache_get(s, id, len)))
		return BATON_OK;
	pthread_mutex_lock(&s->finished_mu);
	uint64_t gen = s->finished_gen;
	pthread_mutex_unlock(&s->finished_mu);
	wf_row *wf = NULL;
	int rc = s->ops->read_workflow(s, id, &wf, err);
	if (rc)
		return rc;
	json_t *json = codec_workflow(wf);
	*text = baton_json_text(json, '\n', len);
	if (*text)
		cache_put(s, wf, *text, *len, gen);
	else
		rc = err_set(err, BATON_EINTERNAL, "out of memory rendering a workflow");
	json_decref(json);
	wf_row_free(wf);
	return rc;
}

int store_list_steps(store *s, const char *id, int after, int limit, json_t **out, baton_error *err)
{
	wf_row *wf = NULL;
	int rc = s->ops->read_workflow(s, id, &wf, err);
	if (rc)
		return rc;
	int ended = wf->status == WF_FAILED || wf->status == WF_CANCELLED;
	json_t *steps = json_array();
	int i = after < 0 ? 0 : after + 1;
	for (; i < wf->steps_total && (int)json_array_size(steps) < limit; i++)
		json_array_append_new(steps, codec_step(&wf->steps[i], ended));
	json_t *next = i < wf->steps_total && i > 0 ? json_integer(i - 1) : json_null();
	*out = json_pack("{s:s, s:s, s:i, s:o, s:o}", "workflow_id", wf->id, "status",
			 wf_status_name(wf->status), "steps_total", wf->steps_total, "steps", steps,
			 "next_after", next);
	wf_row_free(wf);
	return BATON_OK;
}

/* A list cursor is "w" and the last seq shown, in base 36. */
/* A cursor: "w" and the last row's seq in base 36 (before schema 5), or "t", its
 * created_at, "." and its seq (both base 36). */
static int parse_cursor(const char *c, int64_t *at, int64_t *seq)
{
	char *end;
	if (!c || (c[0] != 'w' && c[0] != 't') || !c[1])
		return -1;
	long long a = INT64_MAX, v;
	const char *p = c + 1;
	if (c[0] == 't') {
		a = strtoll(p, &end, 36);
		if (*end != '.' || a <= 0)
			return -1;
		p = end + 1;
	}
	v = strtoll(p, &end, 36);
	if (*end || v <= 0)
		return -1;
	*at = a;
	*seq = v;
	return 0;
}

static void base36(char *out, int64_t v)
{
	char tmp[32];
	int i = 0;
	for (; v > 0; v /= 36)
		tmp[i++] = "0123456789abcdefghijklmnopqrstuvwxyz"[v % 36];
	for (int j = 0; j < i; j++)
		out[j] = tmp[i - 1 - j];
	out[i] = 0;
}

static json_t *cursor_json(const wf_row *last)
{
	char at[16], seq[16], buf[40];
	base36(at, last->created_at > 0 ? last->created_at : 1);
	base36(seq, last->seq);
	snprintf(buf, sizeof buf, "t%s.%s", at, seq);
	return json_string(buf);
}

int store_list_workflows(store *s, const baton_list_query *q, json_t **out, baton_error *err)
{
	store_list l = {.before = INT64_MAX,
			.before_at = INT64_MAX,
			.status = q->status,
			.resource = q->resource,
			.limit = q->limit ? q->limit : 50};
	if (l.limit < 1 || l.limit > 1000)
		return err_set(err, BATON_EINVAL, "limit: must be between 1 and 1000");
	if (q->status && wf_status_parse(q->status) < 0)
		return err_set(err, BATON_EINVAL,
			       "status: must be pending, running, completed, failed or cancelled");
	if (q->resource && !valid_name(q->resource))
		return err_set(err, BATON_EINVAL,
			       "resource: must be 1-128 characters of [A-Za-z0-9._:-]");
	if (q->cursor && parse_cursor(q->cursor, &l.before_at, &l.before))
		return err_set(err, BATON_EINVAL, "cursor: not a cursor this server returned");
	int limit = l.limit, n = 0;
	l.limit = limit + 1; /* one more tells whether there is a next page */
	wf_row **rows = NULL;
	int rc = s->ops->list_workflows(s, &l, &rows, &n, err);
	if (rc)
		return rc;
	json_t *list = json_array();
	for (int i = 0; i < n && i < limit; i++)
		json_array_append_new(list, codec_workflow_summary(rows[i]));
	json_t *next = n > limit ? cursor_json(rows[limit - 1]) : json_null();
	for (int i = 0; i < n; i++)
		wf_row_free(rows[i]);
	free(rows);
	*out = json_pack("{s:o, s:o}", "workflows", list, "next_cursor", next);
	return BATON_OK;
}

/* ---- events ---- */

typedef struct event_page {
	json_t *list;
	int64_t after;
	int limit; /* 0: all */
	int lock_only;
} event_page;

/* An event as the API shows it: seq, ts, type, workflow_id, then the stored fields. */
static json_t *event_json(json_t *stored, const char *wf_id)
{
	json_t *e = json_pack("{s:O, s:o, s:O, s:s}", "seq", json_object_get(stored, "seq"), "ts",
			      time_json(json_integer_value(json_object_get(stored, "ts"))), "type",
			      json_object_get(stored, "type"), "workflow_id", wf_id);
	json_object_update_missing(e, stored);
	return e;
}

static int page_full(const event_page *p)
{
	return p->limit > 0 && json_array_size(p->list) >= (size_t)p->limit;
}

/* Expands a stored row into the events after `after`, up to the page's limit. */
static int add_event_row(void *ctx, const char *text, size_t len, const char *wf_id)
{
	event_page *p = ctx;
	json_t *row = json_loadb(text, len, JSON_DECODE_ANY, NULL), *ev;
	if (!json_is_array(row)) { /* out of memory: an answer without them would lie */
		json_decref(row);
		return -1;
	}
	size_t i;
	json_array_foreach(row, i, ev)
	{
		if (page_full(p))
			break;
		if (json_integer_value(json_object_get(ev, "seq")) <= p->after ||
		    (p->lock_only &&
		     !machine_resource_event(json_string_value(json_object_get(ev, "type")))))
			continue;
		json_array_append_new(p->list, event_json(ev, wf_id));
	}
	json_decref(row);
	return page_full(p);
}

/* With a limit, one event more than the page tells whether there is a next page: it is
 * taken out again and the page's last seq becomes next_after (null: nothing after). */
static json_t *next_after(event_page *p, int limit)
{
	if (limit <= 0 || json_array_size(p->list) <= (size_t)limit)
		return json_null();
	json_array_remove(p->list, (size_t)limit);
	return json_copy(json_object_get(json_array_get(p->list, (size_t)limit - 1), "seq"));
}

int store_list_events(store *s, const char *id, int64_t after, int limit, json_t **out,
		      baton_error *err)
{
	event_page p = {json_array(), after, limit > 0 ? limit + 1 : 0, 0};
	char status[16] = "";
	int rc = s->ops->read_events(s, id, NULL, after, status, add_event_row, &p, err);
	if (rc) {
		json_decref(p.list);
		return rc;
	}
	/* The status is read with the events: a stream that sees a final status and no
	 * newer event knows it has everything. */
	json_t *next = next_after(&p, limit);
	*out = json_pack("{s:s, s:s, s:o, s:o}", "workflow_id", id, "status", status, "events",
			 p.list, "next_after", next);
	return BATON_OK;
}

int store_resource_events(store *s, const char *name, int64_t after, int limit, json_t **out,
			  baton_error *err)
{
	event_page p = {json_array(), after, limit > 0 ? limit + 1 : 0, 1};
	char status[16] = "";
	int rc = s->ops->read_events(s, NULL, name, after, status, add_event_row, &p, err);
	if (rc) {
		json_decref(p.list);
		return rc;
	}
	json_t *next = next_after(&p, limit);
	*out = json_pack("{s:s, s:o, s:o}", "resource", name, "events", p.list, "next_after", next);
	return BATON_OK;
}

/* A deleted workflow leaves the cache; reads that started before are not cached. */
static void cache_forget(void *ctx, const char *id)
{
	store *s = ctx;
	finished_slot *slot = &s->finished[fnv1a(id) % FINISHED_SLOTS];
	pthread_mutex_lock(&s->finished_mu);
	s->finished_gen++;
	if (slot->text && strcmp(slot->id, id) == 0)
		slot_clear(s, slot);
	pthread_mutex_unlock(&s->finished_mu);
}

int store_delete_workflows(store *s, const char *id, int64_t before, int max, int *n,
			   baton_error *err)
{
	*n = 0;
	return s->ops->delete_workflows(s, id, before, max, cache_forget, s, n, err);
}

/* ---- resources ---- */

/* A holder or waiter that is a lease (lease.c: ids "lease-...") says so. */
static void mark_kind(json_t *j, const char *wf_id)
{
	int lease = strncmp(wf_id, "lease-", 6) == 0;
	json_object_set_new(j, "kind", json_string(lease ? "lease" : "step"));
	if (lease)
		json_object_set_new(j, "lease_id", json_string(wf_id));
}

static json_t *holder_json(const store_holder *h)
{
	json_t *j =
	    json_pack("{s:s, s:i, s:s, s:I}", "workflow_id", h->wf_id, "step", h->step, "worker",
		      h->worker ? h->worker : "", "fencing_token", (json_int_t)h->token);
	json_object_set_new(j, "since", time_json(h->since));
	json_object_set_new(j, "slot", h->slot >= 0 ? json_integer(h->slot) : json_null());
	json_object_set_new(j, "exclusive", json_boolean(h->slot < 0));
	mark_kind(j, h->wf_id);
	return j;
}

/* The resource's limit (a row never written has the default, 1). */
static int limit_of(const store_resource *r)
{
	return r->row.permits > 0 ? r->row.permits : 1;
}

/* Adds the limit, the permits in use and, as before permits, "holder": the first holder
 * (lowest token), or null; with all, every holder as well ("holders"), which a page of
 * the list leaves out (a resource may have up to 10,000). */
static void put_holders(json_t *o, const store_resource *r, int all)
{
	int exclusive = r->nholders && r->holders[0].slot < 0;
	json_object_set_new(o, "limit", json_integer(limit_of(r)));
	json_object_set_new(o, "permits_in_use",
			    json_integer(exclusive ? limit_of(r) : (json_int_t)r->nholders));
	json_object_set_new(o, "holder", r->nholders ? holder_json(&r->holders[0]) : json_null());
	if (!all)
		return;
	json_t *list = json_array();
	for (size_t i = 0; i < r->nholders; i++)
		json_array_append_new(list, holder_json(&r->holders[i]));
	json_object_set_new(o, "holders", list);
}

static json_t *totals_json(const resource_row *row)
{
	return json_pack("{s:I, s:I, s:I, s:I, s:I}", "grants", (json_int_t)row->grants,
			 "total_hold_ms", (json_int_t)row->total_hold_ms, "max_hold_ms",
			 (json_int_t)row->max_hold_ms, "total_wait_ms",
			 (json_int_t)row->total_wait_ms, "max_wait_ms",
			 (json_int_t)row->max_wait_ms);
}

static void add_resource(void *ctx, const store_resource *r)
{
	json_t *o = json_pack("{s:s, s:I}", "name", r->row.name, "queue_length",
			      (json_int_t)r->queue_length);
	json_object_set_new(o, "oldest_waiting_since",
			    r->queue_length ? time_json(r->oldest_wait) : json_null());
	json_object_set_new(o, "last_fencing_token", json_integer(r->row.last_token));
	json_object_set_new(o, "totals", totals_json(&r->row));
	put_holders(o, r, 0);
	json_array_append_new(ctx, o);
}

/*
 * A cursor by name is "r" and the last name shown; by contention "c", the last queue
 * length shown, ":" and its name. Fills page from it (NULL: the first page); -1 when it
 * is none this server could have returned for that order.
 */
static int parse_resource_cursor(const char *cursor, int order, store_resource_page *page)
{
	page->after = "";
	page->after_queue = INT64_MAX;
	page->by_contention = order == BATON_RESOURCES_BY_CONTENTION;
	if (!cursor)
		return 0;
	if (!page->by_contention) {
		page->after = cursor + 1;
		return cursor[0] == 'r' && valid_name(cursor + 1) ? 0 : -1;
	}
	const char *colon = strchr(cursor, ':');
	if (cursor[0] != 'c' || !colon || colon == cursor + 1 || colon - cursor > 19 ||
	    !valid_name(colon + 1))
		return -1;
	int64_t q = 0;
	for (const char *p = cursor + 1; p < colon; p++) {
		if (*p < '0' || *p > '9')
			return -1;
		q = q * 10 + (*p - '0');
	}
	page->after_queue = q;
	page->after = colon + 1;
	return 0;
}

int store_list_resources(store *s, const char *cursor, int limit, int order, json_t **out,
			 baton_error *err)
{
	limit = limit ? limit : BATON_RESOURCE_PAGE;
	if (limit < 1 || limit > BATON_RESOURCE_PAGE_MAX)
		return err_set(err, BATON_EINVAL, "limit: must be between 1 and %d",
			       BATON_RESOURCE_PAGE_MAX);
	store_resource_page page = {.limit = limit + 1};
	if (parse_resource_cursor(cursor, order, &page))
		return err_set(err, BATON_EINVAL, "cursor: not a cursor this server returned");
	json_t *list = json_array();
	int rc = s->ops->list_resources(s, &page, add_resource, list, err);
	if (rc) {
		json_decref(list);
		return rc;
	}
	json_t *next = json_null();
	if (json_array_size(list) > (size_t)limit) {
		json_array_remove(list, (size_t)limit);
		json_t *lastr = json_array_get(list, (size_t)limit - 1);
		const char *last = json_string_value(json_object_get(lastr, "name"));
		char buf[MAX_NAME + 32];
		if (page.by_contention)
			snprintf(
			    buf, sizeof buf, "c%lld:%s",
			    (long long)json_integer_value(json_object_get(lastr, "queue_length")),
			    last ? last : "");
		else
			snprintf(buf, sizeof buf, "r%s", last ? last : "");
		json_decref(next);
		next = json_string(buf);
	}
	*out = json_pack("{s:o, s:o}", "resources", list, "next_cursor", next);
	return BATON_OK;
}

int store_get_resource(store *s, const char *name, json_t **out, baton_error *err)
{
	store_resource r;
	int rc = s->ops->read_resource(s, name, 1, &r, err);
	if (rc)
		return rc;
	json_t *waiters = json_array();
	for (size_t i = 0; i < r.nwaiters; i++) {
		const store_waiter *w = &r.waiters[i];
		json_t *j =
		    json_pack("{s:s, s:i, s:s, s:i}", "workflow_id", w->wf_id, "step", w->step,
			      "worker", w->worker ? w->worker : "", "position", (int)i + 1);
		json_object_set_new(j, "waiting_since", time_json(w->since));
		json_object_set_new(j, "exclusive", json_boolean(w->exclusive));
		json_object_set_new(j, "permits", json_integer(w->exclusive ? limit_of(&r) : 1));
		mark_kind(j, w->wf_id);
		json_array_append_new(waiters, j);
	}
	json_t *totals = totals_json(&r.row);
	*out = json_pack("{s:s, s:I, s:I, s:o, s:o}", "name", name, "last_fencing_token",
			 (json_int_t)r.row.last_token, "last_event_seq",
			 (json_int_t)r.last_event_seq, "waiters", waiters, "totals", totals);
	put_holders(*out, &r, 1);
	json_object_set_new(*out, "node", r.node ? json_string(r.node) : json_null());
	store_resource_fini(&r);
	return BATON_OK;
}

int store_workflow_counts(store *s, json_t **out, baton_error *err)
{
	int64_t counts[WF_NSTATUS] = {0};
	int rc = s->ops->count_workflows(s, counts, err);
	if (rc)
		return rc;
	json_t *j = json_object();
	for (int i = 0; i < WF_NSTATUS; i++)
		json_object_set_new(j, wf_status_name(i), json_integer(counts[i]));
	*out = j;
	return BATON_OK;
}
