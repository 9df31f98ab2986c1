/*
 * pg_batch.c - the PostgreSQL store's writes: a round's batch in one pipelined
 * transaction (pg_store.c's header says why), with a batch's steps, resources and events
 * as one statement of many rows.
 */
#include "pg.h"

#include <stdlib.h>
#include <string.h>

/* Statements of a batch sent before their results are read (libpq's blocking mode must
 * not fill the server's output while it still sends); -DPIPELINE_CHUNK=1 sends one
 * statement per round trip, to measure what the pipeline saves. */
#ifndef PIPELINE_CHUNK
#define PIPELINE_CHUNK 256
#endif

/* ---- writes ---- */

/* One statement of a batch, and the workflow it writes (NULL for others). */
typedef struct sent {
	const wf_row *wf;
	const char *what;
} sent;

typedef struct pipeline {
	pg_store *s;
	sent v[PIPELINE_CHUNK];
	int n;
	int failed; /* a statement failed: baton's code */
	const wf_row *culprit;
	int fenced;	 /* the ownership check refused the batch (BT003) */
	int commit_sent; /* the sync that commits the batch was sent */
	int at_commit;	 /* the failure came after every statement had succeeded */
	pg_wait wait;	 /* the results' deadline: then cancelled, then abandoned */
	baton_error *err;
} pipeline;

/* PQgetResult against the commit bound (pg_result_by). */
static PGresult *next_result(pipeline *p)
{
	return pg_result_by(p->s->w, &p->wait);
}

/* What the check of --require-sync-replication is called (W_SYNC): its failure says why. */
static const char sync_check[] = "checking synchronous replication";

/* Reads the results of what was sent; the first failure is kept. */
static void drain(pipeline *p)
{
	PGconn *c = p->s->w;
	for (int i = 0; i < p->n; i++) {
		PGresult *r = next_result(p);
		if (!r) {
			if (!p->failed && p->wait.abandoned)
				p->failed = err_set(p->err, BATON_EIO, "%s: no answer in time",
						    p->v[i].what);
			else if (!p->failed)
				p->failed = pg_fail(c, NULL, p->err, p->v[i].what);
			break;
		}
		ExecStatusType st = PQresultStatus(r);
		if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK && !p->failed &&
		    p->v[i].what == sync_check) {
			p->failed = err_set(
			    p->err, BATON_EBUSY,
			    "synchronous replication is off (synchronous_standby_names is empty),"
			    " and batond requires it (--require-sync-replication): nothing is"
			    " committed until it is on again");
		} else if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK && !p->failed) {
			const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
			p->failed = pg_fail(c, r, p->err, p->v[i].what);
			p->culprit = p->v[i].wf;
			p->fenced = state && strcmp(state, "BT003") == 0;
		}
		PQclear(r);
		/* Each statement's results end with a NULL. */
		while ((r = next_result(p)) != NULL)
			PQclear(r);
		if (PQstatus(c) != CONNECTION_OK || p->wait.abandoned)
			break;
	}
	p->n = 0;
}

static void flush(pipeline *p)
{
	if (PQsendFlushRequest(p->s->w) != 1 || PQflush(p->s->w) != 0) {
		if (!p->failed)
			p->failed = pg_fail(p->s->w, NULL, p->err, "sending a batch");
		p->n = 0;
		return;
	}
	drain(p);
}

static void send_stmt(pipeline *p, int stmt, const pg_params *prm, const wf_row *wf,
		      const char *what)
{
	if (p->failed)
		return;
	char name[8];
	snprintf(name, sizeof name, "w%d", stmt);
	if (!PQsendQueryPrepared(p->s->w, name, prm ? prm->n : 0, prm ? prm->v : NULL,
				 prm ? prm->len : NULL, prm ? prm->fmt : NULL, 0)) {
		p->failed = pg_fail(p->s->w, NULL, p->err, what);
		return;
	}
	p->v[p->n++] = (sent){wf, what};
	if (p->n == PIPELINE_CHUNK)
		flush(p);
}

static void send_workflow(pipeline *p, const wf_row *wf)
{
	pg_store *s = p->s;
	pg_params prm = {0};
	if (wf->is_new) {
		pg_int(&prm, wf->seq);
		pg_text(&prm, wf->id);
		pg_text(&prm, wf->resource);
		pg_text(&prm, wf->on_failure == ON_FAILURE_CONTINUE ? "continue" : "fail");
		pg_text(&prm, wf_status_name(wf->status));
		pg_bool(&prm, wf->cancel_requested);
		pg_int(&prm, wf->created_at);
		pg_time(&prm, wf->started_at);
		pg_time(&prm, wf->finished_at);
		pg_int(&prm, wf->steps_total);
		pg_int(&prm, wf->steps_completed);
		pg_json(s, &prm, wf->result, 1);
		pg_text(&prm, wf->error);
		char *retry = codec_retry_text(&wf->retry);
		pg_text(&prm, retry);
		pg_int(&prm, part_of(wf->resource));
		pg_bool(&prm, !wf->foreign);
		send_stmt(p, W_INS_WF, &prm, wf, "inserting a workflow");
		free(retry);
		prm.n = 0;
		pg_int(&prm, wf->seq);
		pg_text(&prm, wf->definition);
		send_stmt(p, W_INS_DEF, &prm, wf, "inserting a definition");
		if (wf->foreign) { /* its owner learns at once, not at its next poll */
			char hint[16];
			snprintf(hint, sizeof hint, "p%d", part_of(wf->resource));
			prm.n = 0;
			pg_text(&prm, hint);
			send_stmt(p, W_NOTIFY, &prm, NULL, "waking the owner");
		}
	} else if (wf->dirty) {
		pg_int(&prm, wf->seq);
		pg_text(&prm, wf_status_name(wf->status));
		pg_bool(&prm, wf->cancel_requested);
		pg_time(&prm, wf->started_at);
		pg_time(&prm, wf->finished_at);
		pg_int(&prm, wf->steps_completed);
		pg_json(s, &prm, wf->result, 1);
		pg_text(&prm, wf->error);
		send_stmt(p, W_UPD_WF, &prm, wf, "updating a workflow");
	}
}

/* ---- many rows per statement ---- */

/*
 * One array literal per column ("{1,NULL,\"text\"}"), rows added one value per column,
 * sent as text parameters of unnest(). A batch's steps, resources and events go in one
 * statement however many rows they have: the database's cost per statement, not per
 * row, is most of what a round of a lone workflow pays (bench/README.md).
 */
static void rows_start(pg_rows *r, int ncols)
{
	r->ncols = ncols;
	r->nrows = 0;
	for (int i = 0; i < ncols; i++) {
		r->col[i].len = 0;
		textbuf_put(&r->col[i], "{", 1);
	}
}

static textbuf *cell(pg_rows *r, int c)
{
	if (r->nrows > 1)
		textbuf_put(&r->col[c], ",", 1);
	return &r->col[c];
}

static void cell_int(pg_rows *r, int c, int64_t v)
{
	textbuf_int(cell(r, c), v);
}

static void cell_null(pg_rows *r, int c)
{
	textbuf_put(cell(r, c), "NULL", 4);
}

static void cell_time(pg_rows *r, int c, int64_t v)
{
	if (v)
		cell_int(r, c, v);
	else
		cell_null(r, c);
}

/* A quoted element: " and \ escaped with a backslash. */
static void cell_bytes(pg_rows *r, int c, const char *v, size_t n)
{
	textbuf *b = cell(r, c);
	textbuf_reserve(b, n + 2);
	textbuf_put(b, "\"", 1);
	for (size_t i = 0, run = 0; i <= n; i++) {
		if (i < n && v[i] != '"' && v[i] != '\\')
			continue;
		textbuf_put(b, v + run, i - run);
		if (i < n)
			textbuf_put(b, v[i] == '"' ? "\\\"" : "\\\\", 2);
		run = i + 1;
	}
	textbuf_put(b, "\"", 1);
}

static void cell_text(pg_rows *r, int c, const char *v)
{
	if (v)
		cell_bytes(r, c, v, strlen(v));
	else
		cell_null(r, c);
}

static void cell_json(pg_store *s, pg_rows *r, int c, const json_t *v)
{
	if (!v) {
		cell_null(r, c);
		return;
	}
	textbuf *b = &s->json[0];
	b->len = 0;
	codec_text(b, v);
	cell_bytes(r, c, b->v, b->len);
}

/* Rows, one array per column of each table, in one statement (W_ROWS); wf: the workflow
 * they all belong to, when they do. */
static void send_rows(pipeline *p, pg_rows rows[3], const wf_row *wf)
{
	if (!rows[0].nrows && !rows[1].nrows && !rows[2].nrows)
		return;
	pg_params prm = {0};
	for (int t = 0; t < 3; t++)
		for (int i = 0; i < rows[t].ncols; i++) {
			/* The closing brace and the terminator: text parameters. */
			textbuf_put(&rows[t].col[i], "}", 2);
			prm.v[prm.n] = rows[t].col[i].v;
			prm.fmt[prm.n++] = 0;
		}
	send_stmt(p, W_ROWS, &prm, wf, "writing steps, resources and events");
}

static void add_step(pg_store *s, pg_rows *r, const wf_row *wf, const step_row *st)
{
	r->nrows++;
	cell_int(r, 0, wf->seq);
	cell_text(r, 1, wf->resource);
	cell_int(r, 2, st->index);
	cell_text(r, 3, st->worker);
	cell_json(s, r, 4, st->params);
	cell_text(r, 5, step_status_name(st->status));
	cell_int(r, 6, st->attempts);
	cell_time(r, 7, st->lock_seq);
	cell_time(r, 8, st->requested_at);
	cell_time(r, 9, st->token);
	cell_time(r, 10, st->started_at);
	cell_time(r, 11, st->finished_at);
	if (st->duration_ms >= 0)
		cell_int(r, 12, st->duration_ms);
	else
		cell_null(r, 12);
	cell_time(r, 13, st->next_attempt_at);
	cell_text(r, 14, st->error);
	cell_json(s, r, 15, st->result);
	cell_text(r, 16, st->status == ST_RUNNING && s->node_id[0] ? s->node_id : NULL);
}

static void add_event_row(pg_rows *r, const store_event_row *e)
{
	r->nrows++;
	cell_int(r, 0, e->seq);
	cell_int(r, 1, e->last_seq);
	cell_int(r, 2, e->wf->seq);
	cell_text(r, 3, e->wf->resource);
	textbuf_put(cell(r, 4), e->lock ? "t" : "f", 1);
	cell_bytes(r, 5, e->text, e->len);
}

static void add_resource(pg_rows *r, const resource_row *res)
{
	r->nrows++;
	cell_text(r, 0, res->name);
	cell_int(r, 1, res->last_token);
	cell_int(r, 2, res->grants);
	cell_int(r, 3, res->total_hold_ms);
	cell_int(r, 4, res->max_hold_ms);
	cell_int(r, 5, res->total_wait_ms);
	cell_int(r, 6, res->max_wait_ms);
	cell_time(r, 7, res->holder_seq);
	if (res->holder_seq)
		cell_int(r, 8, res->holder_idx);
	else
		cell_null(r, 8);
	cell_int(r, 9, res->permits > 0 ? res->permits : 1);
	cell_text(r, 10, res->holders);
}

static void rows_start_all(pg_rows rows[3])
{
	rows_start(&rows[0], 17);
	rows_start(&rows[1], 11);
	rows_start(&rows[2], 6);
}

/* ---- one row per statement ---- */

/* A step row's 17 parameters; its JSON values go in the writer's slots slot and slot + 1. */
static void step_params(pg_store *s, pg_params *prm, const wf_row *wf, const step_row *st, int slot)
{
	pg_int(prm, wf->seq);
	pg_text(prm, wf->resource);
	pg_int(prm, st->index);
	pg_text(prm, st->worker);
	pg_json(s, prm, st->params, slot);
	pg_text(prm, step_status_name(st->status));
	pg_int(prm, st->attempts);
	pg_time(prm, st->lock_seq);
	pg_time(prm, st->requested_at);
	pg_time(prm, st->token);
	pg_time(prm, st->started_at);
	pg_time(prm, st->finished_at);
	if (st->duration_ms >= 0)
		pg_int(prm, st->duration_ms);
	else
		pg_time(prm, 0);
	pg_time(prm, st->next_attempt_at);
	pg_text(prm, st->error);
	pg_json(s, prm, st->result, slot + 1);
	pg_text(prm, st->status == ST_RUNNING && s->node_id[0] ? s->node_id : NULL);
}

/* The dirty steps of a batch, two rows per statement (W_STEP2), an odd one alone. A step
 * row refused names its workflow only when it is alone in its statement (one_each). */
static void send_steps(pipeline *p, const store_batch *b, int one_each)
{
	pg_params prm = {0};
	const wf_row *first = NULL;
	for (size_t i = 0; i < b->nwfs; i++) {
		const wf_row *wf = b->wfs[i];
		for (int k = wf->dirty_lo; k < wf->dirty_hi; k++) {
			if (!wf->steps[k].dirty)
				continue;
			step_params(p->s, &prm, wf, &wf->steps[k], first ? 2 : 0);
			if (!first && !one_each) {
				first = wf;
				continue;
			}
			send_stmt(p, first ? W_STEP2 : W_STEP, &prm,
				  first == wf || !first ? wf : NULL, "writing steps");
			prm.n = 0;
			first = NULL;
		}
	}
	if (first)
		send_stmt(p, W_STEP, &prm, first, "writing a step");
}

static void send_resource(pipeline *p, const resource_row *res)
{
	pg_params prm = {0};
	pg_text(&prm, res->name);
	pg_int(&prm, res->last_token);
	pg_int(&prm, res->grants);
	pg_int(&prm, res->total_hold_ms);
	pg_int(&prm, res->max_hold_ms);
	pg_int(&prm, res->total_wait_ms);
	pg_int(&prm, res->max_wait_ms);
	pg_time(&prm, res->holder_seq);
	if (res->holder_seq)
		pg_int(&prm, res->holder_idx);
	else
		pg_time(&prm, 0);
	pg_int(&prm, res->permits > 0 ? res->permits : 1);
	pg_text(&prm, res->holders);
	send_stmt(p, W_RESOURCE, &prm, NULL, "writing a resource");
}

static void send_event(pipeline *p, const store_event_row *e)
{
	pg_params prm = {0};
	pg_int(&prm, e->seq);
	pg_int(&prm, e->last_seq);
	pg_int(&prm, e->wf->seq);
	pg_text(&prm, e->wf->resource);
	pg_bool(&prm, e->lock);
	pg_bytes(&prm, e->text, e->len);
	send_stmt(p, W_EVENT, &prm, e->wf, "writing events");
}

/* Rows up to which a batch goes one row per statement: the database starts W_ROWS's plan
 * in about the time of eight single-row statements (bench/README.md). */
#define ROWS_ONE_BY_ONE 8

/*
 * The batch: each workflow's own row, then the steps, resources and events. A small batch
 * (a lone workflow's round) sends one statement per row, a larger one a statement of many
 * rows per round (W_ROWS). per_row forces the first, so that a row the database refuses
 * names its workflow (pg_write falls back to it when the statement of many rows is
 * refused for good).
 */
static void send_fence(pipeline *p, const store_batch *b)
{
	char parts[PARTS * 3 + 3], epochs[PARTS * 21 + 3];
	size_t len = (size_t)snprintf(epochs, sizeof epochs, "{");
	for (int i = 0; i < PARTS; i++)
		if (b->parts >> i & 1)
			len += (size_t)snprintf(epochs + len, sizeof epochs - len, "%s%lld",
						len > 1 ? "," : "", (long long)b->epochs[i]);
	snprintf(epochs + len, sizeof epochs - len, "}");
	pg_parts_text(b->parts, parts, sizeof parts);
	pg_params prm = {0};
	pg_text(&prm, p->s->node_id);
	pg_text(&prm, parts);
	pg_text(&prm, epochs);
	prm.fmt[1] = prm.fmt[2] = 0; /* array literals, as text (NUL-terminated) */
	send_stmt(p, W_FENCE, &prm, NULL, "checking ownership");
}

static void send_batch(pipeline *p, const store_batch *b, int per_row)
{
	pg_store *s = p->s;
	if (s->require_sync)
		send_stmt(p, W_SYNC, NULL, NULL, sync_check);
	if (b->parts)
		send_fence(p, b);
	for (size_t i = 0; i < b->nwfs; i++)
		send_workflow(p, b->wfs[i]);
	size_t nrows = b->nresources + b->nevents;
	for (size_t i = 0; i < b->nwfs && nrows <= ROWS_ONE_BY_ONE; i++)
		for (int k = b->wfs[i]->dirty_lo; k < b->wfs[i]->dirty_hi; k++)
			nrows += b->wfs[i]->steps[k].dirty != 0;
	if (per_row || nrows <= ROWS_ONE_BY_ONE) {
		send_steps(p, b, per_row);
		for (size_t i = 0; i < b->nresources; i++)
			send_resource(p, b->resources[i]);
		for (size_t i = 0; i < b->nevents; i++)
			send_event(p, &b->events[i]);
		return;
	}
	pg_rows *rows = s->rows;
	rows_start_all(rows);
	for (size_t i = 0; i < b->nwfs; i++) {
		const wf_row *wf = b->wfs[i];
		for (int k = wf->dirty_lo; k < wf->dirty_hi; k++)
			if (wf->steps[k].dirty)
				add_step(s, &rows[0], wf, &wf->steps[k]);
	}
	for (size_t i = 0; i < b->nresources; i++)
		add_resource(&rows[1], b->resources[i]);
	for (size_t i = 0; i < b->nevents; i++)
		add_event_row(&rows[2], &b->events[i]);
	send_rows(p, rows, NULL);
}

/* One attempt at the batch in one pipeline; see pg_write. */
static int write_once(pg_store *s, const store_batch *b, int per_row, store_write_failure *why,
		      baton_error *err)
{
	if (PQenterPipelineMode(s->w) != 1)
		return pg_fail(s->w, NULL, err, "entering pipeline mode");
	s->sync_cancelled = 0;
	pipeline p = {.s = s, .err = err};
	p.wait = pg_wait_start(s);
	send_batch(&p, b, per_row);
	/* The statements up to the sync are one implicit transaction, committed (or, after a
	 * failed statement, rolled back) when the server reaches the sync. A server that did
	 * not answer the statements in time gets no sync: the connection is dropped, and
	 * what was sent is rolled back. */
	int sync_sent = !p.wait.abandoned && PQpipelineSync(s->w) == 1;
	if (sync_sent)
		p.commit_sent = !p.failed;
	else if (!p.failed)
		p.failed = pg_fail(s->w, NULL, err, "sending a batch");
	if (PQstatus(s->w) == CONNECTION_OK && !p.wait.abandoned) {
		drain(&p);
		/* What follows the statements: the commit's failure if it failed, and the
		 * sync's own result. */
		PGresult *r;
		int synced = 0;
		while (!synced && (r = next_result(&p)) != NULL) {
			ExecStatusType st = PQresultStatus(r);
			synced = st == PGRES_PIPELINE_SYNC;
			if (st == PGRES_FATAL_ERROR && !p.failed) {
				p.failed = pg_fail(s->w, r, err, "commit");
				p.at_commit = 1;
			}
			PQclear(r);
		}
		if (!synced && !p.failed && p.wait.abandoned) {
			p.failed = err_set(err, BATON_EIO,
					   "commit: not confirmed within %lld ms, nor cancelled",
					   (long long)s->commit_timeout_ms);
			p.at_commit = 1;
		} else if (!synced && !p.failed) {
			p.failed = pg_fail(s->w, NULL, err, "commit");
			p.at_commit = 1;
		}
		if (!p.wait.abandoned)
			PQexitPipelineMode(s->w);
	}
	/* Committed on this server only (writer_notice): its outcome is unknown until a new
	 * session writes it again, which waits for the standby. */
	if (!p.failed && s->sync_cancelled) {
		p.failed = err_set(err, BATON_EIO,
				   "commit: its wait for the synchronous standby was cancelled; it "
				   "is committed on the primary only");
		p.at_commit = 1;
	}
	if (!p.failed)
		return BATON_OK;
	/* The commit's outcome is unknown when the connection broke after the sync went out,
	 * and when the failure came at the commit itself and a retry may clear it: a server
	 * told to shut down while the commit waited for its WAL flush commits, then says
	 * "terminating connection" instead of acknowledging. */
	if (p.wait.abandoned)
		s->sync_cancelled = 1; /* dropped as one whose commit may be local only */
	int broken = PQstatus(s->w) != CONNECTION_OK || s->sync_cancelled;
	why->unknown = p.commit_sent && (broken || (p.at_commit && pg_transient(p.failed)));
	why->permanent = !broken && !pg_transient(p.failed);
	why->culprit = why->permanent ? p.culprit : NULL;
	why->fenced = p.fenced;
	return p.failed;
}

/*
 * Ownership: a batch that writes a partition's workflows or resources starts with
 * the ownership check (W_FENCE, pg_store.c), so it commits only while this node still owns
 * them. A batch refused for good in many-row statements is tried at once one row per
 * statement, which names the workflow refused.
 */
int pg_write(store *base, const store_batch *b, store_write_failure *why, baton_error *err)
{
	pg_store *s = (pg_store *)base;
	*why = (store_write_failure){0};
	int rc = pg_writer(s, err);
	if (rc) {
		why->permanent = !pg_transient(rc);
		return rc;
	}
	rc = write_once(s, b, 0, why, err);
	if (rc && why->permanent && !why->culprit && !why->fenced) {
		*why = (store_write_failure){0};
		rc = write_once(s, b, 1, why, err);
	}
	if (rc)
		pg_writer_failed(s);
	return rc;
}
