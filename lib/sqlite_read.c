/*
 * sqlite_read.c - the readers' half of baton's SQLite store: a pool of read-only
 * connections, each with its statements prepared on first use, behind every read of
 * sqlite_store_ops (rows; store.c shapes them). In WAL mode a reader never blocks the
 * writer and sees the last commit; a read of several statements runs in one read
 * transaction, so it sees one commit.
 */
#include "sqlite.h"

#include <stdlib.h>
#include <string.h>

/* What a page of GET /resources shows of each row. */
#define RES_LIST_COLS                                                                              \
	"name, permits, last_token, grants, total_hold_ms, max_hold_ms, total_wait_ms, "           \
	"max_wait_ms"

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
    [R_WF_SEQ] = "SELECT seq, status FROM workflows WHERE id=?",
    [R_RESOURCES] = "SELECT " RES_LIST_COLS " FROM resources WHERE name > ?1 ORDER BY name"
		    " LIMIT ?2",
    /* The longest queues first, then by name, after the page's last (queue, name). */
    [R_RESOURCES_BUSY] = "SELECT " RES_LIST_COLS " FROM (SELECT *, (SELECT count(*) FROM steps s"
			 " WHERE s.resource=r.name AND s.status='waiting') AS q FROM resources r)"
			 " WHERE q < ?3 OR (q = ?3 AND name > ?1) ORDER BY q DESC, name LIMIT ?2",
    /* Last: the end of the newest row of the resource's history (0 when it has none). */
    [R_RESOURCE] = "SELECT last_token, grants, total_hold_ms, max_hold_ms, total_wait_ms,"
		   " max_wait_ms, coalesce((SELECT last_seq FROM events WHERE resource=?1"
		   " AND lock ORDER BY seq DESC LIMIT 1), 0), permits FROM resources WHERE name=?1",
    /* Every holder: those the row lists when more than one holds it, else the first. An
     * exclusive holder's slot is -1; a plain one's is kept in its params, 0 as no key. */
    [R_HOLDERS] = "SELECT w.id, s.idx, s.worker, s.fencing_token, s.started_at,"
		  " CASE WHEN json_extract(s.params, '$.exclusive') THEN -1"
		  " ELSE coalesce(json_extract(s.params, '$.slot'), 0) END"
		  " FROM resources r CROSS JOIN json_each(coalesce(r.holders,"
		  " json_array(json_array(r.holder_seq, r.holder_idx)))) j"
		  " CROSS JOIN steps s ON s.workflow_seq=json_extract(j.value, '$[0]')"
		  " AND s.idx=json_extract(j.value, '$[1]')"
		  " CROSS JOIN workflows w ON w.seq=s.workflow_seq"
		  " WHERE r.name=? ORDER BY s.fencing_token",
    [R_WAITERS] = "SELECT w.id, s.idx, s.worker, s.requested_at,"
		  " coalesce(json_extract(s.params, '$.exclusive'), 0) FROM steps s"
		  " JOIN workflows w ON w.seq=s.workflow_seq"
		  " WHERE s.resource=? AND s.status='waiting' ORDER BY s.lock_seq",
    [R_QUEUE_LEN] = "SELECT count(*), coalesce(min(requested_at), 0) FROM steps"
		    " WHERE resource=? AND status='waiting'",
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

static reader *reader_get(sqlite_store *s)
{
	pthread_mutex_lock(&s->pool_mu);
	while (!s->free_readers)
		pthread_cond_wait(&s->pool_cv, &s->pool_mu);
	reader *r = s->free_readers;
	s->free_readers = r->next_free;
	pthread_mutex_unlock(&s->pool_mu);
	return r;
}

static void reader_put(sqlite_store *s, reader *r)
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

static int fill_queue_positions(reader *r, wf_row *wf, baton_error *err)
{
	sqlite3_stmt *q = rstmt(r, R_QUEUE_POS);
	for (int i = 0; i < wf->steps_total; i++) {
		step_row *st = &wf->steps[i];
		if (st->status != ST_WAITING)
			continue;
		if (!q)
			return sql_fail(r->db, sqlite3_errcode(r->db), err, "preparing a query");
		sql_bind_text(q, 1, wf->resource);
		sqlite3_bind_int64(q, 2, st->lock_seq);
		int rc = sqlite3_step(q);
		if (rc == SQLITE_ROW)
			st->queue_position = sqlite3_column_int(q, 0);
		rdone(q);
		if (rc != SQLITE_ROW)
			return sql_fail(r->db, rc, err, "reading a queue position");
	}
	return BATON_OK;
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

int sqlite_read_workflow(store *base, const char *id, wf_row **out, baton_error *err)
{
	sqlite_store *s = (sqlite_store *)base;
	reader *r = reader_get(s);
	wf_row *wf = NULL;
	int rc = begin_read(r, err);
	if (rc == BATON_OK) {
		rc = load_workflow(r, id, &wf, err);
		if (rc == BATON_OK)
			rc = fill_queue_positions(r, wf, err);
		end_read(r);
	}
	reader_put(s, r);
	if (rc) {
		wf_row_free(wf);
		return rc;
	}
	*out = wf;
	return BATON_OK;
}

int sqlite_list_workflows(store *base, const store_list *q, wf_row ***out, int *n, baton_error *err)
{
	sqlite_store *s = (sqlite_store *)base;
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
	sqlite3_bind_int64(st, 1, q->before);
	sql_bind_text(st, 2, q->status);
	sql_bind_text(st, 3, q->resource);
	sqlite3_bind_int(st, 4, q->limit);
	wf_row **rows = xcalloc((size_t)q->limit + 1, sizeof *rows);
	int k = 0;
	while (k < q->limit && (rc = sqlite3_step(st)) == SQLITE_ROW)
		rows[k++] = sql_read_wf(st);
	if (k == q->limit)
		rc = SQLITE_DONE;
	sqlite3_finalize(st);
	if (rc != SQLITE_DONE) {
		rc = sql_fail(r->db, rc, err, "listing workflows");
		for (int i = 0; i < k; i++)
			wf_row_free(rows[i]);
		free(rows);
		reader_put(s, r);
		return rc;
	}
	reader_put(s, r);
	*out = rows;
	*n = k;
	return BATON_OK;
}

/* Runs an events query whose ?1 the caller bound and hands each row to fn. */
static int each_event_row(reader *r, sqlite3_stmt *q, int64_t after, const char *wf_id,
			  store_event_fn fn, void *ctx, baton_error *err)
{
	sqlite3_bind_int64(q, 2, after);
	int rc, stop = 0;
	while (!stop && (rc = sqlite3_step(q)) == SQLITE_ROW) {
		const char *id = wf_id ? wf_id : (const char *)sqlite3_column_text(q, 2);
		const char *text = (const char *)sqlite3_column_text(q, 1);
		stop = fn(ctx, text, (size_t)sqlite3_column_bytes(q, 1), id);
	}
	rdone(q);
	if (stop < 0)
		return err_set(err, BATON_EINTERNAL, "out of memory reading events");
	return stop || rc == SQLITE_DONE ? BATON_OK : sql_fail(r->db, rc, err, "reading events");
}

int sqlite_read_events(store *base, const char *id, const char *resource, int64_t after,
		       char status[16], store_event_fn fn, void *ctx, baton_error *err)
{
	sqlite_store *s = (sqlite_store *)base;
	reader *r = reader_get(s);
	int rc = begin_read(r, err);
	sqlite3_stmt *q = rstmt(r, id ? R_WF_SEQ : R_RESOURCE),
		     *ev = rstmt(r, id ? R_EVENTS : R_RES_EVENTS);
	if (rc == BATON_OK && (!q || !ev))
		rc = sql_fail(r->db, sqlite3_errcode(r->db), err, "preparing a query");
	int64_t seq = 0;
	if (rc == BATON_OK) {
		sql_bind_text(q, 1, id ? id : resource);
		int s1 = sqlite3_step(q);
		if (s1 == SQLITE_ROW && id) {
			seq = sqlite3_column_int64(q, 0);
			snprintf(status, 16, "%s", (const char *)sqlite3_column_text(q, 1));
		} else if (s1 == SQLITE_DONE)
			rc = id ? err_set(err, BATON_ENOTFOUND, "no workflow with id \"%s\"", id)
				: err_set(err, BATON_ENOTFOUND, "no resource named \"%s\"",
					  resource);
		else if (s1 != SQLITE_ROW)
			rc = sql_fail(r->db, s1, err,
				      id ? "reading a workflow" : "reading a resource");
		rdone(q);
	}
	if (rc == BATON_OK) {
		if (id)
			sqlite3_bind_int64(ev, 1, seq);
		else
			sql_bind_text(ev, 1, resource);
		rc = each_event_row(r, ev, after, id, fn, ctx, err);
	}
	end_read(r);
	reader_put(s, r);
	return rc;
}

static int read_holders(reader *r, store_resource *out, baton_error *err)
{
	sqlite3_stmt *q = rstmt(r, R_HOLDERS);
	if (!q)
		return sql_fail(r->db, sqlite3_errcode(r->db), err, "preparing a query");
	sql_bind_text(q, 1, out->row.name);
	int rc;
	size_t cap = 0;
	while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
		if (out->nholders == cap) {
			cap = cap ? cap * 2 : 4;
			out->holders = realloc(out->holders, cap * sizeof *out->holders);
			if (!out->holders)
				abort();
		}
		out->holders[out->nholders++] = (store_holder){
		    .wf_id = sql_column_strdup(q, 0),
		    .step = sqlite3_column_int(q, 1),
		    .worker = sql_column_strdup(q, 2),
		    .token = sqlite3_column_int64(q, 3),
		    .since = sqlite3_column_int64(q, 4),
		    .slot = sqlite3_column_int(q, 5),
		};
	}
	rdone(q);
	return rc == SQLITE_DONE ? BATON_OK : sql_fail(r->db, rc, err, "reading the holders");
}

static int read_waiters(reader *r, const char *name, store_resource *out, baton_error *err)
{
	sqlite3_stmt *q = rstmt(r, R_WAITERS);
	if (!q)
		return sql_fail(r->db, sqlite3_errcode(r->db), err, "preparing a query");
	sql_bind_text(q, 1, name);
	int rc;
	size_t cap = 0;
	while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
		if (out->nwaiters == cap) {
			cap = cap ? cap * 2 : 8;
			out->waiters = realloc(out->waiters, cap * sizeof *out->waiters);
			if (!out->waiters)
				abort();
		}
		out->waiters[out->nwaiters++] = (store_waiter){
		    .wf_id = sql_column_strdup(q, 0),
		    .step = sqlite3_column_int(q, 1),
		    .worker = sql_column_strdup(q, 2),
		    .since = sqlite3_column_int64(q, 3),
		    .exclusive = sqlite3_column_int(q, 4),
		};
	}
	rdone(q);
	out->queue_length = (int64_t)out->nwaiters;
	return rc == SQLITE_DONE ? BATON_OK : sql_fail(r->db, rc, err, "reading waiters");
}

/* The queue's length; *oldest (when not NULL) gets its oldest request's time (0: none). */
static int64_t queue_length(reader *r, const char *name, int64_t *oldest, int *rc)
{
	sqlite3_stmt *q = rstmt(r, R_QUEUE_LEN);
	int64_t n = 0;
	if (!q) {
		*rc = sqlite3_errcode(r->db);
		return 0;
	}
	sql_bind_text(q, 1, name);
	*rc = sqlite3_step(q);
	if (*rc == SQLITE_ROW) {
		n = sqlite3_column_int64(q, 0);
		if (oldest)
			*oldest = sqlite3_column_int64(q, 1);
		*rc = SQLITE_OK;
	}
	rdone(q);
	return n;
}

int sqlite_read_resource(store *base, const char *name, int with_waiters, store_resource *out,
			 baton_error *err)
{
	sqlite_store *s = (sqlite_store *)base;
	reader *r = reader_get(s);
	memset(out, 0, sizeof *out);
	int rc = begin_read(r, err);
	sqlite3_stmt *q = rc ? NULL : rstmt(r, R_RESOURCE);
	if (rc == BATON_OK && !q)
		rc = sql_fail(r->db, sqlite3_errcode(r->db), err, "preparing a query");
	if (rc == BATON_OK) {
		sql_bind_text(q, 1, name);
		int s1 = sqlite3_step(q);
		if (s1 == SQLITE_ROW) {
			out->row = (resource_row){
			    .name = xstrdup(name),
			    .last_token = sqlite3_column_int64(q, 0),
			    .grants = sqlite3_column_int64(q, 1),
			    .total_hold_ms = sqlite3_column_int64(q, 2),
			    .max_hold_ms = sqlite3_column_int64(q, 3),
			    .total_wait_ms = sqlite3_column_int64(q, 4),
			    .max_wait_ms = sqlite3_column_int64(q, 5),
			    .permits = sqlite3_column_int(q, 7),
			};
			out->last_event_seq = sqlite3_column_int64(q, 6);
		} else if (s1 == SQLITE_DONE) {
			rc = err_set(err, BATON_ENOTFOUND, "no resource named \"%s\"", name);
		} else {
			rc = sql_fail(r->db, s1, err, "reading a resource");
		}
		rdone(q);
	}
	if (rc == BATON_OK)
		rc = read_holders(r, out, err);
	if (rc == BATON_OK && with_waiters)
		rc = read_waiters(r, name, out, err);
	else if (rc == BATON_OK) {
		int qrc;
		out->queue_length = queue_length(r, name, NULL, &qrc);
		if (qrc != SQLITE_OK)
			rc = sql_fail(r->db, qrc, err, "reading a queue length");
	}
	end_read(r);
	reader_put(s, r);
	if (rc)
		store_resource_fini(out);
	return rc;
}

int sqlite_list_resources(store *base, const store_resource_page *page,
			  void (*fn)(void *ctx, const store_resource *r), void *ctx,
			  baton_error *err)
{
	sqlite_store *s = (sqlite_store *)base;
	reader *r = reader_get(s);
	int rc = begin_read(r, err);
	sqlite3_stmt *q =
	    rc ? NULL : rstmt(r, page->by_contention ? R_RESOURCES_BUSY : R_RESOURCES);
	if (rc == BATON_OK && !q)
		rc = sql_fail(r->db, sqlite3_errcode(r->db), err, "preparing a query");
	if (q) {
		sqlite3_bind_text(q, 1, page->after, -1, SQLITE_TRANSIENT);
		sqlite3_bind_int(q, 2, page->limit);
		if (page->by_contention)
			sqlite3_bind_int64(q, 3, page->after_queue);
	}
	int s1 = SQLITE_DONE;
	while (rc == BATON_OK && (s1 = sqlite3_step(q)) == SQLITE_ROW) {
		store_resource res = {0};
		res.row = (resource_row){
		    .name = sql_column_strdup(q, 0),
		    .permits = sqlite3_column_int(q, 1),
		    .last_token = sqlite3_column_int64(q, 2),
		    .grants = sqlite3_column_int64(q, 3),
		    .total_hold_ms = sqlite3_column_int64(q, 4),
		    .max_hold_ms = sqlite3_column_int64(q, 5),
		    .total_wait_ms = sqlite3_column_int64(q, 6),
		    .max_wait_ms = sqlite3_column_int64(q, 7),
		};
		int qrc;
		rc = read_holders(r, &res, err);
		if (rc == BATON_OK) {
			res.queue_length = queue_length(r, res.row.name, &res.oldest_wait, &qrc);
			if (qrc != SQLITE_OK)
				rc = sql_fail(r->db, qrc, err, "reading a queue length");
		}
		if (rc == BATON_OK)
			fn(ctx, &res);
		store_resource_fini(&res);
	}
	if (rc == BATON_OK && s1 != SQLITE_DONE)
		rc = sql_fail(r->db, s1, err, "listing resources");
	if (q)
		rdone(q);
	end_read(r);
	reader_put(s, r);
	return rc;
}

int sqlite_count_workflows(store *base, int64_t counts[WF_NSTATUS], baton_error *err)
{
	sqlite_store *s = (sqlite_store *)base;
	reader *r = reader_get(s);
	sqlite3_stmt *q = rstmt(r, R_WF_COUNTS);
	int rc = q ? BATON_OK : sql_fail(r->db, sqlite3_errcode(r->db), err, "preparing a query");
	if (rc == BATON_OK) {
		int s1;
		while ((s1 = sqlite3_step(q)) == SQLITE_ROW) {
			int st = wf_status_parse((const char *)sqlite3_column_text(q, 0));
			if (st >= 0)
				counts[st] = sqlite3_column_int64(q, 1);
		}
		if (s1 != SQLITE_DONE)
			rc = sql_fail(r->db, s1, err, "counting workflows");
		rdone(q);
	}
	reader_put(s, r);
	return rc;
}
