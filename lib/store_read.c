/*
 * store_read.c - the readers' half of baton's SQLite store: a pool of read-only
 * connections, each with its statements prepared on first use, behind every query of
 * the API (workflows, lists, histories, resources, counts), and the cache of finished
 * workflows. In WAL mode a reader never blocks the writer and sees the last commit;
 * a read of several statements runs in one read transaction, so it sees one commit.
 */
#include "store.h"

#include <stdlib.h>
#include <string.h>

const char *const reader_sql[R_NSTMT] = {
    [R_WF_BY_ID] = "SELECT " WF_READ_COLS " FROM workflows WHERE id=?",
    [R_STEPS] = "SELECT " STEP_COLS " FROM steps WHERE workflow_seq=? ORDER BY idx",
    [R_DEF] = "SELECT definition FROM definitions WHERE workflow_seq=?",
    [R_QUEUE_POS] = "SELECT count(*) FROM steps WHERE resource=? AND status='waiting'"
		    " AND lock_seq<=?",
    /* From the row holding `after` (or the last before it) on; the caller expands. */
    [R_EVENTS] = "SELECT seq, data FROM events WHERE workflow_seq=?1 AND seq >= coalesce("
		 "(SELECT max(seq) FROM events WHERE workflow_seq=?1 AND seq<=?2), 0)"
		 " ORDER BY seq",
    [R_RESOURCES] = "SELECT name FROM resources ORDER BY name",
    [R_RESOURCE] = "SELECT last_token, grants, total_hold_ms, max_hold_ms, total_wait_ms,"
		   " max_wait_ms FROM resources WHERE name=?",
    [R_HOLDER] = "SELECT w.id, s.idx, s.worker, s.fencing_token, s.started_at"
		 " FROM resources r JOIN steps s ON s.workflow_seq=r.holder_seq"
		 " AND s.idx=r.holder_idx JOIN workflows w ON w.seq=r.holder_seq"
		 " WHERE r.name=?",
    [R_WAITERS] = "SELECT w.id, s.idx, s.worker, s.requested_at FROM steps s"
		  " JOIN workflows w ON w.seq=s.workflow_seq"
		  " WHERE s.resource=? AND s.status='waiting' ORDER BY s.lock_seq",
    [R_QUEUE_LEN] = "SELECT count(*) FROM steps WHERE resource=? AND status='waiting'",
    [R_RES_EVENTS] = "SELECT e.seq, e.data, w.id FROM events e"
		     " JOIN workflows w ON w.seq=e.workflow_seq WHERE e.resource=?1 AND e.lock"
		     " AND e.seq >= coalesce((SELECT max(seq) FROM events"
		     " WHERE resource=?1 AND lock AND seq<=?2), 0) ORDER BY e.seq",
    [R_WF_COUNTS] = "SELECT status, count(*) FROM workflows GROUP BY status",
    [R_BEGIN] = "BEGIN",
    [R_COMMIT] = "COMMIT",
};

char *sql_column_strdup(sqlite3_stmt *st, int i)
{
	const unsigned char *t = sqlite3_column_text(st, i);
	return t ? xstrdup((const char *)t) : NULL;
}

json_t *sql_column_json(sqlite3_stmt *st, int i)
{
	const unsigned char *t = sqlite3_column_text(st, i);
	return t ? json_loads((const char *)t, JSON_DECODE_ANY, NULL) : NULL;
}

/* Fills a workflow row from a row of WF_READ_COLS; its steps are allocated, not read. */
wf_row *sql_read_wf(sqlite3_stmt *st)
{
	wf_row *wf = xcalloc(1, sizeof *wf);
	wf->seq = sqlite3_column_int64(st, 0);
	wf->id = sql_column_strdup(st, 1);
	wf->resource = sql_column_strdup(st, 2);
	wf->on_failure = strcmp((const char *)sqlite3_column_text(st, 3), "continue") == 0
			     ? ON_FAILURE_CONTINUE
			     : ON_FAILURE_FAIL;
	wf->status = wf_status_parse((const char *)sqlite3_column_text(st, 4));
	wf->stored_status = wf->status;
	wf->cancel_requested = sqlite3_column_int(st, 5);
	wf->created_at = sqlite3_column_int64(st, 6);
	wf->started_at = sqlite3_column_int64(st, 7);
	wf->finished_at = sqlite3_column_int64(st, 8);
	wf->steps_total = sqlite3_column_int(st, 9);
	wf->steps_completed = sqlite3_column_int(st, 10);
	wf->result = sql_column_json(st, 11);
	wf->error = sql_column_strdup(st, 12);
	codec_parse_retry((const char *)sqlite3_column_text(st, 13), &wf->retry);
	wf->steps = xcalloc(wf->steps_total > 0 ? (size_t)wf->steps_total : 1, sizeof *wf->steps);
	return wf;
}

static int read_step_rows(sqlite3_stmt *st, wf_row *wf, int *rows)
{
	sqlite3_bind_int64(st, 1, wf->seq);
	int rc;
	*rows = 0;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		int idx = sqlite3_column_int(st, 0);
		if (idx < 0 || idx >= wf->steps_total || wf->steps[idx].worker) {
			rc = SQLITE_CORRUPT;
			break;
		}
		step_row *r = &wf->steps[idx];
		r->index = idx;
		r->worker = sql_column_strdup(st, 1);
		r->params = sql_column_json(st, 2);
		r->status = step_status_parse((const char *)sqlite3_column_text(st, 3));
		r->attempts = sqlite3_column_int(st, 4);
		r->lock_seq = sqlite3_column_int64(st, 5);
		r->requested_at = sqlite3_column_int64(st, 6);
		r->token = sqlite3_column_int64(st, 7);
		r->started_at = sqlite3_column_int64(st, 8);
		r->finished_at = sqlite3_column_int64(st, 9);
		r->duration_ms =
		    sqlite3_column_type(st, 10) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 10);
		r->next_attempt_at = sqlite3_column_int64(st, 11);
		r->error = sql_column_strdup(st, 12);
		r->result = sql_column_json(st, 13);
		r->stored = 1;
		if (!r->worker)
			rc = SQLITE_CORRUPT;
		(*rows)++;
	}
	sqlite3_reset(st);
	return rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_DONE : rc;
}

int sql_read_steps(sqlite3_stmt *st, sqlite3_stmt *def_stmt, const char *def_text, wf_row *wf)
{
	int rows, rc = read_step_rows(st, wf, &rows);
	if (rc != SQLITE_DONE || rows == wf->steps_total)
		return rc;
	if (!def_text) {
		sqlite3_bind_int64(def_stmt, 1, wf->seq);
		rc = sqlite3_step(def_stmt);
		def_text = rc == SQLITE_ROW ? (const char *)sqlite3_column_text(def_stmt, 0) : NULL;
	}
	rc = def_text && codec_pending_steps(wf, def_text) == 0 ? SQLITE_DONE : SQLITE_CORRUPT;
	if (def_stmt)
		sqlite3_reset(def_stmt);
	return rc;
}

/* ---- reader side: any thread ---- */

static reader *reader_get(store *s)
{
	pthread_mutex_lock(&s->pool_mu);
	while (!s->free_readers)
		pthread_cond_wait(&s->pool_cv, &s->pool_mu);
	reader *r = s->free_readers;
	s->free_readers = r->next_free;
	pthread_mutex_unlock(&s->pool_mu);
	return r;
}

static void reader_put(store *s, reader *r)
{
	pthread_mutex_lock(&s->pool_mu);
	r->next_free = s->free_readers;
	s->free_readers = r;
	pthread_cond_signal(&s->pool_cv);
	pthread_mutex_unlock(&s->pool_mu);
}

static sqlite3_stmt *rstmt(reader *r, int i)
{
	if (!r->stmt[i] && sqlite3_prepare_v3(r->db, reader_sql[i], -1, SQLITE_PREPARE_PERSISTENT,
					      &r->stmt[i], NULL) != SQLITE_OK)
		return NULL;
	return r->stmt[i];
}

static void rdone(sqlite3_stmt *st)
{
	sqlite3_reset(st);
	sqlite3_clear_bindings(st);
}

/* Loads one workflow by id with its steps. A read transaction keeps the rows consistent. */
static int load_workflow(reader *r, const char *id, wf_row **out, baton_error *err)
{
	sqlite3_stmt *q = rstmt(r, R_WF_BY_ID), *steps = rstmt(r, R_STEPS), *def = rstmt(r, R_DEF);
	if (!q || !steps || !def)
		return sql_fail(r->db, sqlite3_errcode(r->db), err, "preparing a query");
	sql_bind_text(q, 1, id);
	int rc = sqlite3_step(q);
	if (rc != SQLITE_ROW) {
		rdone(q);
		if (rc == SQLITE_DONE)
			return err_set(err, BATON_ENOTFOUND, "no workflow with id \"%s\"", id);
		return sql_fail(r->db, rc, err, "reading a workflow");
	}
	wf_row *wf = sql_read_wf(q);
	rdone(q);
	rc = sql_read_steps(steps, def, NULL, wf);
	rdone(steps);
	if (rc != SQLITE_DONE) {
		wf_row_free(wf);
		return sql_fail(r->db, rc, err, "reading steps");
	}
	*out = wf;
	return BATON_OK;
}

static void fill_queue_positions(reader *r, wf_row *wf)
{
	sqlite3_stmt *q = rstmt(r, R_QUEUE_POS);
	for (int i = 0; q && i < wf->steps_total; i++) {
		step_row *st = &wf->steps[i];
		if (st->status != ST_WAITING)
			continue;
		sql_bind_text(q, 1, wf->resource);
		sqlite3_bind_int64(q, 2, st->lock_seq);
		if (sqlite3_step(q) == SQLITE_ROW)
			st->queue_position = sqlite3_column_int(q, 0);
		rdone(q);
	}
}

static int begin_read(reader *r, baton_error *err)
{
	sqlite3_stmt *st = rstmt(r, R_BEGIN);
	if (!st)
		return sql_fail(r->db, sqlite3_errcode(r->db), err, "begin");
	int rc = sqlite3_step(st);
	sqlite3_reset(st);
	return rc == SQLITE_DONE ? BATON_OK : sql_fail(r->db, rc, err, "begin");
}

static void end_read(reader *r)
{
	sqlite3_stmt *st = rstmt(r, R_COMMIT);
	if (st) {
		sqlite3_step(st);
		sqlite3_reset(st);
	}
}

/*
 * Finished workflows never change again, so their rendered JSON text is kept in a small
 * direct-mapped cache (a slot per hash of the id): reads of them skip SQLite, rendering
 * and serialising. Filled by reads, not by the answers to POSTs, which are seldom read
 * again.
 */
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

static void cache_put(store *s, const wf_row *wf, const char *text, size_t len)
{
	if (wf->status != WF_COMPLETED && wf->status != WF_FAILED && wf->status != WF_CANCELLED)
		return;
	char *copy = malloc(len + 1);
	if (!copy)
		return;
	memcpy(copy, text, len + 1);
	finished_slot *slot = &s->finished[fnv1a(wf->id) % FINISHED_SLOTS];
	pthread_mutex_lock(&s->finished_mu);
	free(slot->text);
	snprintf(slot->id, sizeof slot->id, "%s", wf->id);
	slot->text = copy;
	slot->len = len;
	pthread_mutex_unlock(&s->finished_mu);
}

/* Reads and renders workflow id (a new reference); *wf_out keeps the row when asked. */
static int render_workflow(store *s, const char *id, json_t **out, wf_row **wf_out,
			   baton_error *err)
{
	reader *r = reader_get(s);
	wf_row *wf = NULL;
	int rc = begin_read(r, err);
	if (rc == BATON_OK) {
		rc = load_workflow(r, id, &wf, err);
		if (rc == BATON_OK)
			fill_queue_positions(r, wf);
		end_read(r);
	}
	reader_put(s, r);
	if (rc == BATON_OK) {
		*out = codec_workflow(wf);
		*wf_out = wf;
	}
	return rc;
}

int store_get_workflow(store *s, const char *id, json_t **out, baton_error *err)
{
	wf_row *wf = NULL;
	int rc = render_workflow(s, id, out, &wf, err);
	wf_row_free(wf);
	return rc;
}

int store_get_workflow_text(store *s, const char *id, char **text, size_t *len, baton_error *err)
{
	if ((*text = cache_get(s, id, len)))
		return BATON_OK;
	json_t *json = NULL;
	wf_row *wf = NULL;
	int rc = render_workflow(s, id, &json, &wf, err);
	if (rc == BATON_OK) {
		*text = baton_json_text(json, '\n', len);
		if (*text)
			cache_put(s, wf, *text, *len);
		else
			rc = err_set(err, BATON_EINTERNAL, "out of memory rendering a workflow");
	}
	json_decref(json);
	wf_row_free(wf);
	return rc;
}

static int parse_cursor(const char *c, int64_t *seq)
{
	char *end;
	if (!c || c[0] != 'w' || !c[1])
		return -1;
	long long v = strtoll(c + 1, &end, 36);
	if (*end || v <= 0)
		return -1;
	*seq = v;
	return 0;
}

int store_list_workflows(store *s, const baton_list_query *q, json_t **out, baton_error *err)
{
	int64_t before = INT64_MAX;
	int limit = q->limit ? q->limit : 50;
	if (limit < 1 || limit > 1000)
		return err_set(err, BATON_EINVAL, "limit: must be between 1 and 1000");
	if (q->status && wf_status_parse(q->status) < 0)
		return err_set(err, BATON_EINVAL,
			       "status: must be pending, running, completed, failed or cancelled");
	if (q->resource && !valid_name(q->resource))
		return err_set(err, BATON_EINVAL,
			       "resource: must be 1-128 characters of [A-Za-z0-9._:-]");
	if (q->cursor && parse_cursor(q->cursor, &before))
		return err_set(err, BATON_EINVAL, "cursor: not a cursor this server returned");
	reader *r = reader_get(s);
	sqlite3_stmt *st;
	int rc =
	    sqlite3_prepare_v2(r->db,
			       "SELECT " WF_READ_COLS " FROM workflows WHERE seq < ?1"
			       " AND (?2 IS NULL OR status = ?2) AND (?3 IS NULL OR resource = ?3)"
			       " ORDER BY seq DESC LIMIT ?4",
			       -1, &st, NULL);
	if (rc != SQLITE_OK) {
		rc = sql_fail(r->db, rc, err, "listing workflows");
		reader_put(s, r);
		return rc;
	}
	sqlite3_bind_int64(st, 1, before);
	sql_bind_text(st, 2, q->status);
	sql_bind_text(st, 3, q->resource);
	sqlite3_bind_int(st, 4, limit + 1);
	json_t *list = json_array();
	int64_t last = 0;
	int n = 0;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW && n < limit) {
		wf_row *wf = sql_read_wf(st);
		json_array_append_new(list, codec_workflow_summary(wf));
		last = wf->seq;
		wf_row_free(wf);
		n++;
	}
	int more = rc == SQLITE_ROW;
	if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
		rc = sql_fail(r->db, rc, err, "listing workflows");
		sqlite3_finalize(st);
		reader_put(s, r);
		json_decref(list);
		return rc;
	}
	sqlite3_finalize(st);
	reader_put(s, r);
	json_t *next = json_null();
	if (more) {
		char buf[32], tmp[32];
		int i = 0;
		for (int64_t v = last; v > 0; v /= 36)
			tmp[i++] = "0123456789abcdefghijklmnopqrstuvwxyz"[v % 36];
		buf[0] = 'w';
		for (int j = 0; j < i; j++)
			buf[1 + j] = tmp[i - 1 - j];
		buf[1 + i] = 0;
		json_decref(next);
		next = json_string(buf);
	}
	*out = json_pack("{s:o, s:o}", "workflows", list, "next_cursor", next);
	return BATON_OK;
}

/* An event as the API shows it: seq, ts, type, workflow_id, then the stored fields. */
static json_t *event_json(json_t *stored, const char *wf_id)
{
	json_t *e = json_pack("{s:O, s:o, s:O, s:s}", "seq", json_object_get(stored, "seq"), "ts",
			      time_json(json_integer_value(json_object_get(stored, "ts"))), "type",
			      json_object_get(stored, "type"), "workflow_id", wf_id);
	json_object_update_missing(e, stored);
	return e;
}

/*
 * Runs an events query whose ?1 the caller bound (?2 after) and appends to list the
 * events after `after`, at most limit (0: all); lock_only keeps a resource's history.
 * The workflow id is wf_id, or the query's third column when NULL.
 */
static int read_events(reader *r, sqlite3_stmt *q, int64_t after, int limit, int lock_only,
		       const char *wf_id, json_t *list, baton_error *err)
{
	sqlite3_bind_int64(q, 2, after);
	int rc = SQLITE_DONE;
	while ((limit <= 0 || json_array_size(list) < (size_t)limit) &&
	       (rc = sqlite3_step(q)) == SQLITE_ROW) {
		const char *id = wf_id ? wf_id : (const char *)sqlite3_column_text(q, 2);
		json_t *row = sql_column_json(q, 1), *ev;
		if (!json_is_array(row)) { /* out of memory: an answer without them would lie */
			json_decref(row);
			rc = SQLITE_NOMEM;
			break;
		}
		size_t i;
		json_array_foreach(row, i, ev)
		{
			if (limit > 0 && json_array_size(list) >= (size_t)limit)
				break;
			if (json_integer_value(json_object_get(ev, "seq")) <= after ||
			    (lock_only && !machine_resource_event(
					      json_string_value(json_object_get(ev, "type")))))
				continue;
			json_array_append_new(list, event_json(ev, id));
		}
		json_decref(row);
	}
	if (limit > 0 && json_array_size(list) >= (size_t)limit)
		rc = SQLITE_DONE;
	rdone(q);
	return rc == SQLITE_DONE ? BATON_OK : sql_fail(r->db, rc, err, "reading events");
}

int store_list_events(store *s, const char *id, int64_t after, int limit, json_t **out,
		      baton_error *err)
{
	reader *r = reader_get(s);
	sqlite3_stmt *q = rstmt(r, R_WF_BY_ID), *ev = rstmt(r, R_EVENTS);
	int rc = (!q || !ev) ? sql_fail(r->db, sqlite3_errcode(r->db), err, "preparing a query")
			     : BATON_OK;
	int64_t seq = 0;
	char status[16] = "";
	if (rc == BATON_OK) {
		sql_bind_text(q, 1, id);
		int s1 = sqlite3_step(q);
		if (s1 == SQLITE_ROW) {
			seq = sqlite3_column_int64(q, 0);
			snprintf(status, sizeof status, "%s",
				 (const char *)sqlite3_column_text(q, 4));
		} else if (s1 == SQLITE_DONE)
			rc = err_set(err, BATON_ENOTFOUND, "no workflow with id \"%s\"", id);
		else
			rc = sql_fail(r->db, s1, err, "reading a workflow");
		rdone(q);
	}
	json_t *list = json_array();
	if (rc == BATON_OK) {
		sqlite3_bind_int64(ev, 1, seq);
		rc = read_events(r, ev, after, limit, 0, id, list, err);
	}
	reader_put(s, r);
	if (rc) {
		json_decref(list);
		return rc;
	}
	/* The status is read with the events: a stream that sees a final status and no
	 * newer event knows it has everything. */
	*out = json_pack("{s:s, s:s, s:o}", "workflow_id", id, "status", status, "events", list);
	return BATON_OK;
}

/* 1 when the resource has a row, 0 when it was never used. */
static int count_query_exists(reader *r, const char *name)
{
	sqlite3_stmt *q = rstmt(r, R_RESOURCE);
	if (!q)
		return 0;
	sql_bind_text(q, 1, name);
	int found = sqlite3_step(q) == SQLITE_ROW;
	rdone(q);
	return found;
}

static json_t *holder_json(reader *r, const char *name)
{
	sqlite3_stmt *q = rstmt(r, R_HOLDER);
	json_t *h = json_null();
	if (!q)
		return h;
	sql_bind_text(q, 1, name);
	if (sqlite3_step(q) == SQLITE_ROW) {
		json_decref(h);
		h = json_pack("{s:s, s:i, s:s, s:I}", "workflow_id", sqlite3_column_text(q, 0),
			      "step", sqlite3_column_int(q, 1), "worker", sqlite3_column_text(q, 2),
			      "fencing_token", (json_int_t)sqlite3_column_int64(q, 3));
		json_object_set_new(h, "since", time_json(sqlite3_column_int64(q, 4)));
	}
	rdone(q);
	return h;
}

static int64_t count_query(reader *r, int which, const char *name)
{
	sqlite3_stmt *q = rstmt(r, which);
	int64_t n = 0;
	if (!q)
		return 0;
	sql_bind_text(q, 1, name);
	if (sqlite3_step(q) == SQLITE_ROW)
		n = sqlite3_column_int64(q, 0);
	rdone(q);
	return n;
}

int store_list_resources(store *s, json_t **out, baton_error *err)
{
	reader *r = reader_get(s);
	int rc = begin_read(r, err);
	sqlite3_stmt *q = rstmt(r, R_RESOURCES);
	json_t *list = json_array();
	if (rc == BATON_OK && q) {
		while (sqlite3_step(q) == SQLITE_ROW) {
			const char *name = (const char *)sqlite3_column_text(q, 0);
			json_array_append_new(
			    list, json_pack("{s:s, s:o, s:I}", "name", name, "holder",
					    holder_json(r, name), "queue_length",
					    (json_int_t)count_query(r, R_QUEUE_LEN, name)));
		}
		rdone(q);
	}
	if (rc == BATON_OK)
		end_read(r);
	reader_put(s, r);
	if (rc) {
		json_decref(list);
		return rc;
	}
	*out = json_pack("{s:o}", "resources", list);
	return BATON_OK;
}

static json_t *waiters_json(reader *r, const char *name)
{
	sqlite3_stmt *q = rstmt(r, R_WAITERS);
	json_t *list = json_array();
	if (!q)
		return list;
	sql_bind_text(q, 1, name);
	for (int pos = 1; sqlite3_step(q) == SQLITE_ROW; pos++) {
		json_t *w = json_pack("{s:s, s:i, s:s, s:i}", "workflow_id",
				      sqlite3_column_text(q, 0), "step", sqlite3_column_int(q, 1),
				      "worker", sqlite3_column_text(q, 2), "position", pos);
		json_object_set_new(w, "waiting_since", time_json(sqlite3_column_int64(q, 3)));
		json_array_append_new(list, w);
	}
	rdone(q);
	return list;
}

int store_get_resource(store *s, const char *name, json_t **out, baton_error *err)
{
	reader *r = reader_get(s);
	int rc = begin_read(r, err);
	sqlite3_stmt *q = rc ? NULL : rstmt(r, R_RESOURCE);
	json_t *res = NULL;
	if (q) {
		sql_bind_text(q, 1, name);
		int s1 = sqlite3_step(q);
		if (s1 == SQLITE_ROW) {
			json_t *totals =
			    json_pack("{s:I, s:I, s:I, s:I, s:I}", "grants",
				      (json_int_t)sqlite3_column_int64(q, 1), "total_hold_ms",
				      (json_int_t)sqlite3_column_int64(q, 2), "max_hold_ms",
				      (json_int_t)sqlite3_column_int64(q, 3), "total_wait_ms",
				      (json_int_t)sqlite3_column_int64(q, 4), "max_wait_ms",
				      (json_int_t)sqlite3_column_int64(q, 5));
			res = json_pack(
			    "{s:s, s:I, s:o, s:o, s:o}", "name", name, "last_fencing_token",
			    (json_int_t)sqlite3_column_int64(q, 0), "holder", holder_json(r, name),
			    "waiters", waiters_json(r, name), "totals", totals);
		} else if (s1 == SQLITE_DONE) {
			rc = err_set(err, BATON_ENOTFOUND, "no resource named \"%s\"", name);
		} else {
			rc = sql_fail(r->db, s1, err, "reading a resource");
		}
		rdone(q);
	} else if (rc == BATON_OK) {
		rc = sql_fail(r->db, sqlite3_errcode(r->db), err, "preparing a query");
	}
	end_read(r);
	reader_put(s, r);
	if (rc == BATON_OK)
		*out = res;
	return rc;
}

int store_resource_events(store *s, const char *name, int64_t after, int limit, json_t **out,
			  baton_error *err)
{
	reader *r = reader_get(s);
	sqlite3_stmt *q = rstmt(r, R_RES_EVENTS);
	int rc = q ? BATON_OK : sql_fail(r->db, sqlite3_errcode(r->db), err, "preparing a query");
	json_t *list = json_array();
	if (rc == BATON_OK && count_query_exists(r, name) == 0)
		rc = err_set(err, BATON_ENOTFOUND, "no resource named \"%s\"", name);
	if (rc == BATON_OK) {
		sql_bind_text(q, 1, name);
		rc = read_events(r, q, after, limit, 1, NULL, list, err);
	}
	reader_put(s, r);
	if (rc) {
		json_decref(list);
		return rc;
	}
	*out = json_pack("{s:s, s:o}", "resource", name, "events", list);
	return BATON_OK;
}

int store_workflow_counts(store *s, json_t **out, baton_error *err)
{
	reader *r = reader_get(s);
	sqlite3_stmt *q = rstmt(r, R_WF_COUNTS);
	int rc = q ? BATON_OK : sql_fail(r->db, sqlite3_errcode(r->db), err, "preparing a query");
	json_t *counts = json_object();
	for (int i = 0; i < WF_NSTATUS; i++)
		json_object_set_new(counts, wf_status_name(i), json_integer(0));
	if (rc == BATON_OK) {
		int s1;
		while ((s1 = sqlite3_step(q)) == SQLITE_ROW)
			json_object_set_new(counts, (const char *)sqlite3_column_text(q, 0),
					    json_integer(sqlite3_column_int64(q, 1)));
		if (s1 != SQLITE_DONE)
			rc = sql_fail(r->db, s1, err, "counting workflows");
		rdone(q);
	}
	reader_put(s, r);
	if (rc) {
		json_decref(counts);
		return rc;
	}
	*out = counts;
	return BATON_OK;
}
