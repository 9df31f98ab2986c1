/*
 * pg_read.c - the readers' half of baton's PostgreSQL store: a pool of connections,
 * each with its statements prepared on first use, behind every read of pg_store_ops
 * (rows; store.c shapes them). A read of several statements runs in one REPEATABLE READ
 * transaction, so it sees one commit. A connection that broke is dropped and the next
 * read that takes it connects again; meanwhile reads answer BATON_EIO (503).
 */
#include "pg.h"

#include <stdlib.h>
#include <string.h>

/* What a page of GET /resources shows of each row. */
#define PG_RES_LIST_COLS                                                                           \
	"name, permits, last_token, grants, total_hold_ms, max_hold_ms, total_wait_ms, "           \
	"max_wait_ms"

static const char *const reader_sql[PR_NSTMT] = {
    [PR_WF_BY_ID] = "SELECT " PG_WF_READ_COLS " FROM workflows WHERE id=$1",
    [PR_STEPS] = "SELECT " PG_STEP_COLS " FROM steps WHERE workflow_seq=$1 ORDER BY idx",
    [PR_DEF] = "SELECT definition FROM definitions WHERE workflow_seq=$1",
    [PR_QUEUE_POS] = "SELECT count(*) FROM steps WHERE resource=$1 AND status='waiting'"
		     " AND lock_seq<=$2",
    [PR_WF_SEQ] = "SELECT seq, status FROM workflows WHERE id=$1",
    /* From the row holding `after` (or the last before it) on; store.c expands. */
    [PR_EVENTS] = "SELECT seq, data FROM events WHERE workflow_seq=$1 AND seq >= coalesce("
		  "(SELECT max(seq) FROM events WHERE workflow_seq=$1 AND seq<=$2), 0)"
		  " ORDER BY seq",
    /* Last: the end of the newest row of the resource's history (0 when it has none). */
    [PR_RESOURCE] =
	"SELECT last_token, grants, total_hold_ms, max_hold_ms, total_wait_ms,"
	" max_wait_ms, coalesce((SELECT last_seq FROM events WHERE resource=$1"
	" AND lock ORDER BY seq DESC LIMIT 1), 0), permits FROM resources WHERE name=$1",
    [PR_RES_EVENTS] = "SELECT e.seq, e.data, w.id FROM events e"
		      " JOIN workflows w ON w.seq=e.workflow_seq WHERE e.resource=$1 AND e.lock"
		      " AND e.seq >= coalesce((SELECT max(seq) FROM events"
		      " WHERE resource=$1 AND lock AND seq<=$2), 0) ORDER BY e.seq",
    /* Every holder: those the row lists when more than one holds it, else the first. An
     * exclusive holder's slot is -1; a plain one's is kept in its params, 0 as no key. */
    [PR_HOLDERS] = "SELECT w.id, s.idx, s.worker, s.fencing_token, s.started_at,"
		   " CASE WHEN (s.params::jsonb->>'exclusive')::boolean THEN -1"
		   " ELSE coalesce((s.params::jsonb->>'slot')::int, 0) END"
		   " FROM resources r CROSS JOIN LATERAL jsonb_array_elements(coalesce("
		   "r.holders::jsonb, jsonb_build_array(jsonb_build_array(r.holder_seq,"
		   " r.holder_idx)))) j(v) JOIN steps s ON s.workflow_seq=(j.v->>0)::bigint"
		   " AND s.idx=(j.v->>1)::int JOIN workflows w ON w.seq=s.workflow_seq"
		   " WHERE r.name=$1 ORDER BY s.fencing_token",
    [PR_WAITERS] = "SELECT w.id, s.idx, s.worker, s.requested_at,"
		   " coalesce((s.params::jsonb->>'exclusive')::boolean, false) FROM steps s"
		   " JOIN workflows w ON w.seq=s.workflow_seq"
		   " WHERE s.resource=$1 AND s.status='waiting' ORDER BY s.lock_seq",
    [PR_QUEUE_LEN] = "SELECT count(*), coalesce(min(requested_at), 0) FROM steps"
		     " WHERE resource=$1 AND status='waiting'",
    [PR_RESOURCES] = "SELECT " PG_RES_LIST_COLS " FROM resources WHERE name COLLATE \"C\" > $1"
		     " ORDER BY name COLLATE \"C\" LIMIT $2",
    /* The longest queues first, then by name, after the page's last (queue, name). */
    [PR_RESOURCES_BUSY] =
	"SELECT " PG_RES_LIST_COLS " FROM (SELECT r.*, (SELECT count(*)"
	" FROM steps s WHERE s.resource=r.name AND s.status='waiting') AS q"
	" FROM resources r) x WHERE q < $3 OR (q = $3 AND name COLLATE \"C\" > $1)"
	" ORDER BY q DESC, name COLLATE \"C\" LIMIT $2",
    [PR_WF_COUNTS] = "SELECT status, count(*) FROM workflows GROUP BY status",
    /* Newest first by the time the accepting node took it (the seqs of a cluster come from
     * each node's blocks), then by seq; a page starts below the last one's pair. */
    [PR_LIST] = "SELECT " PG_WF_READ_COLS " FROM workflows WHERE (created_at, seq) < ($5, $1)"
		" AND ($2::text IS NULL OR status = $2) AND ($3::text IS NULL OR resource = $3)"
		" ORDER BY created_at DESC, seq DESC LIMIT $4",
    [PR_OWNER] = "SELECT owner FROM partitions WHERE id=$1",
    /* The live nodes (the database's clock judges), with what each drives. */
    [PR_NODES] = "SELECT n.id, n.url, (extract(epoch FROM n.expires) * 1000)::bigint,"
		 " (SELECT count(*) FROM partitions p WHERE p.owner = n.id),"
		 " (SELECT count(DISTINCT w.resource) FROM workflows w"
		 " WHERE w.status IN ('pending', 'running') AND w.part IN"
		 " (SELECT p.id FROM partitions p WHERE p.owner = n.id)),"
		 " (SELECT count(*) FROM steps s WHERE s.status = 'running' AND s.node = n.id)"
		 " FROM nodes n WHERE n.expires > now() ORDER BY n.id",
};

int pg_readers_open(pg_store *s, int n)
{
	s->readers = xcalloc((size_t)n, sizeof *s->readers);
	s->nreaders = n;
	for (int i = 0; i < n; i++) {
		s->readers[i].store = s;
		s->readers[i].next_free = s->free_readers;
		s->free_readers = &s->readers[i];
	}
	return BATON_OK;
}

void pg_readers_close(pg_store *s)
{
	for (int i = 0; i < s->nreaders; i++)
		PQfinish(s->readers[i].conn);
	free(s->readers);
}

/* A reader with a live connection (made now when it had none), or NULL with err set. */
static pg_reader *reader_get(pg_store *s, baton_error *err)
{
	pthread_mutex_lock(&s->pool_mu);
	while (!s->free_readers)
		pthread_cond_wait(&s->pool_cv, &s->pool_mu);
	pg_reader *r = s->free_readers;
	s->free_readers = r->next_free;
	pthread_mutex_unlock(&s->pool_mu);
	r->ran = 0;
	if (r->conn && PQstatus(r->conn) == CONNECTION_OK)
		return r;
	PQfinish(r->conn);
	r->prepared = 0;
	if ((r->conn = pg_connect(s, err)))
		return r;
	pthread_mutex_lock(&s->pool_mu);
	r->next_free = s->free_readers;
	s->free_readers = r;
	pthread_cond_signal(&s->pool_cv);
	pthread_mutex_unlock(&s->pool_mu);
	return NULL;
}

static void reader_put(pg_store *s, pg_reader *r)
{
	/* A connection left inside a transaction (a read that failed half-way) or broken
	 * is not handed on: the next user connects afresh. */
	if (r->conn &&
	    (PQstatus(r->conn) != CONNECTION_OK || PQtransactionStatus(r->conn) != PQTRANS_IDLE)) {
		PQfinish(r->conn);
		r->conn = NULL;
	}
	pthread_mutex_lock(&s->pool_mu);
	r->next_free = s->free_readers;
	s->free_readers = r;
	pthread_cond_signal(&s->pool_cv);
	pthread_mutex_unlock(&s->pool_mu);
}

/*
 * After the first statement of a read failed on a connection that broke while it was
 * idle (a restarted server): a new connection, so that the read is tried once more
 * instead of answering 503. 1 when the statement should run again.
 */
static int revive(pg_reader *r)
{
	if (r->ran || PQstatus(r->conn) == CONNECTION_OK)
		return 0;
	r->ran = 1; /* once */
	baton_error ignored;
	PGconn *c = pg_connect(r->store, &ignored);
	if (!c)
		return 0;
	PQfinish(r->conn);
	r->conn = c;
	r->prepared = 0;
	return 1;
}

/* Runs reader statement i; a result that is not rows becomes a baton code in err. */
static PGresult *query(pg_reader *r, int i, const pg_params *p, int *rc, baton_error *err,
		       const char *what)
{
	char name[8];
	snprintf(name, sizeof name, "r%d", i);
again:
	if (!(r->prepared & (1u << i))) {
		PGresult *pr = PQprepare(r->conn, name, reader_sql[i], 0, NULL);
		if (PQresultStatus(pr) != PGRES_COMMAND_OK) {
			*rc = pg_fail(r->conn, pr, err, "preparing a query");
			PQclear(pr);
			if (revive(r))
				goto again;
			return NULL;
		}
		PQclear(pr);
		r->prepared |= 1u << i;
	}
	PGresult *res = PQexecPrepared(r->conn, name, p ? p->n : 0, p ? p->v : NULL,
				       p ? p->len : NULL, p ? p->fmt : NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		*rc = pg_fail(r->conn, res, err, what);
		PQclear(res);
		if (revive(r))
			goto again;
		return NULL;
	}
	r->ran++;
	*rc = BATON_OK;
	return res;
}

/* Runs sql, once more on a new connection when the first statement found it broken. */
static int exec_simple(pg_reader *r, const char *sql, ExecStatusType want, baton_error *err)
{
	for (;;) {
		PGresult *res = PQexec(r->conn, sql);
		int rc = PQresultStatus(res) == want ? BATON_OK : pg_fail(r->conn, res, err, sql);
		PQclear(res);
		if (rc == BATON_OK)
			r->ran++;
		if (rc == BATON_OK || !revive(r))
			return rc;
	}
}

static int begin_read(pg_reader *r, baton_error *err)
{
	return exec_simple(r, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", PGRES_COMMAND_OK,
			   err);
}

static void end_read(pg_reader *r)
{
	if (PQstatus(r->conn) == CONNECTION_OK && PQtransactionStatus(r->conn) != PQTRANS_IDLE)
		exec_simple(r, "COMMIT", PGRES_COMMAND_OK, NULL);
}

static int load_workflow(pg_reader *r, const char *id, wf_row **out, baton_error *err)
{
	pg_params p = {0};
	pg_text(&p, id);
	int rc;
	PGresult *q = query(r, PR_WF_BY_ID, &p, &rc, err, "reading a workflow");
	if (!q)
		return rc;
	if (PQntuples(q) == 0) {
		PQclear(q);
		return err_set(err, BATON_ENOTFOUND, "no workflow with id \"%s\"", id);
	}
	wf_row *wf = pg_read_wf(q, 0);
	PQclear(q);
	p.n = 0;
	pg_int(&p, wf->seq);
	PGresult *steps = query(r, PR_STEPS, &p, &rc, err, "reading steps");
	char *def = NULL;
	if (steps && PQntuples(steps) < wf->steps_total) {
		PGresult *d = query(r, PR_DEF, &p, &rc, err, "reading a definition");
		if (d && PQntuples(d) == 1)
			def = pg_col_str(d, 0, 0);
		PQclear(d);
	}
	if (steps && rc == BATON_OK && pg_read_steps(steps, def, wf))
		rc = err_set(err, BATON_ECORRUPT, "workflow %s: its steps do not match", id);
	PQclear(steps);
	free(def);
	if (rc) {
		wf_row_free(wf);
		return rc;
	}
	*out = wf;
	return BATON_OK;
}

static int fill_queue_positions(pg_reader *r, wf_row *wf, baton_error *err)
{
	for (int i = 0; i < wf->steps_total; i++) {
		step_row *st = &wf->steps[i];
		if (st->status != ST_WAITING)
			continue;
		pg_params p = {0};
		pg_text(&p, wf->resource);
		pg_int(&p, st->lock_seq);
		int rc;
		PGresult *q = query(r, PR_QUEUE_POS, &p, &rc, err, "reading a queue position");
		if (!q)
			return rc;
		st->queue_position = (int)pg_col_int(q, 0, 0);
		PQclear(q);
	}
	return BATON_OK;
}

int pg_read_workflow(store *base, const char *id, wf_row **out, baton_error *err)
{
	pg_store *s = (pg_store *)base;
	pg_reader *r = reader_get(s, err);
	if (!r)
		return err->code;
	wf_row *wf = NULL;
	int rc = begin_read(r, err);
	if (rc == BATON_OK)
		rc = load_workflow(r, id, &wf, err);
	if (rc == BATON_OK)
		rc = fill_queue_positions(r, wf, err);
	end_read(r);
	reader_put(s, r);
	if (rc) {
		wf_row_free(wf);
		return rc;
	}
	*out = wf;
	return BATON_OK;
}

int pg_list_workflows(store *base, const store_list *q, wf_row ***out, int *n, baton_error *err)
{
	pg_store *s = (pg_store *)base;
	pg_reader *r = reader_get(s, err);
	if (!r)
		return err->code;
	pg_params p = {0};
	pg_int(&p, q->before);
	pg_text(&p, q->status);
	pg_text(&p, q->resource);
	pg_int(&p, q->limit);
	pg_int(&p, q->before_at);
	int rc;
	PGresult *res = query(r, PR_LIST, &p, &rc, err, "listing workflows");
	reader_put(s, r);
	if (!res)
		return rc;
	int k = PQntuples(res);
	wf_row **rows = xcalloc((size_t)k + 1, sizeof *rows);
	for (int i = 0; i < k; i++)
		rows[i] = pg_read_wf(res, i);
	PQclear(res);
	*out = rows;
	*n = k;
	return BATON_OK;
}

int pg_read_events(store *base, const char *id, const char *resource, int64_t after,
		   char status[16], store_event_fn fn, void *ctx, baton_error *err)
{
	pg_store *s = (pg_store *)base;
	pg_reader *r = reader_get(s, err);
	if (!r)
		return err->code;
	int rc = begin_read(r, err);
	pg_params p = {0};
	pg_text(&p, id ? id : resource);
	PGresult *q = rc ? NULL
			 : query(r, id ? PR_WF_SEQ : PR_RESOURCE, &p, &rc, err,
				 id ? "reading a workflow" : "reading a resource");
	if (q && PQntuples(q) == 0)
		rc = id ? err_set(err, BATON_ENOTFOUND, "no workflow with id \"%s\"", id)
			: err_set(err, BATON_ENOTFOUND, "no resource named \"%s\"", resource);
	PGresult *ev = NULL;
	if (q && rc == BATON_OK) {
		p.n = 0;
		if (id) {
			pg_int(&p, pg_col_int(q, 0, 0));
			snprintf(status, 16, "%s", PQgetvalue(q, 0, 1));
		} else {
			pg_text(&p, resource);
		}
		pg_int(&p, after);
		ev = query(r, id ? PR_EVENTS : PR_RES_EVENTS, &p, &rc, err, "reading events");
	}
	PQclear(q);
	end_read(r);
	reader_put(s, r);
	for (int i = 0; ev && i < PQntuples(ev); i++) {
		int stop = fn(ctx, PQgetvalue(ev, i, 1), (size_t)PQgetlength(ev, i, 1),
			      id ? id : PQgetvalue(ev, i, 2));
		if (stop < 0)
			rc = err_set(err, BATON_EINTERNAL, "out of memory reading events");
		if (stop)
			break;
	}
	PQclear(ev);
	return rc;
}

static int read_holders(pg_reader *r, store_resource *out, baton_error *err)
{
	pg_params p = {0};
	pg_text(&p, out->row.name);
	int rc;
	PGresult *q = query(r, PR_HOLDERS, &p, &rc, err, "reading the holders");
	if (!q)
		return rc;
	int n = PQntuples(q);
	out->holders = xcalloc((size_t)n + 1, sizeof *out->holders);
	for (int i = 0; i < n; i++)
		out->holders[i] = (store_holder){
		    .wf_id = pg_col_str(q, i, 0),
		    .step = (int)pg_col_int(q, i, 1),
		    .worker = pg_col_str(q, i, 2),
		    .token = pg_col_int(q, i, 3),
		    .since = pg_col_int(q, i, 4),
		    .slot = (int)pg_col_int(q, i, 5),
		};
	out->nholders = (size_t)n;
	PQclear(q);
	return BATON_OK;
}

static int read_waiters(pg_reader *r, const char *name, store_resource *out, baton_error *err)
{
	pg_params p = {0};
	pg_text(&p, name);
	int rc;
	PGresult *q = query(r, PR_WAITERS, &p, &rc, err, "reading waiters");
	if (!q)
		return rc;
	int n = PQntuples(q);
	out->waiters = xcalloc((size_t)n + 1, sizeof *out->waiters);
	for (int i = 0; i < n; i++)
		out->waiters[i] = (store_waiter){
		    .wf_id = pg_col_str(q, i, 0),
		    .step = (int)pg_col_int(q, i, 1),
		    .worker = pg_col_str(q, i, 2),
		    .since = pg_col_int(q, i, 3),
		    .exclusive = PQgetvalue(q, i, 4)[0] == 't',
		};
	out->nwaiters = (size_t)n;
	out->queue_length = n;
	PQclear(q);
	return BATON_OK;
}

/* The queue's length; *oldest (when not NULL) gets its oldest request's time (0: none). */
static int queue_length(pg_reader *r, const char *name, int64_t *n, int64_t *oldest,
			baton_error *err)
{
	pg_params p = {0};
	pg_text(&p, name);
	int rc;
	PGresult *q = query(r, PR_QUEUE_LEN, &p, &rc, err, "reading a queue length");
	if (!q)
		return rc;
	*n = pg_col_int(q, 0, 0);
	if (oldest)
		*oldest = pg_col_int(q, 0, 1);
	PQclear(q);
	return BATON_OK;
}

int pg_read_resource(store *base, const char *name, int with_waiters, store_resource *out,
		     baton_error *err)
{
	pg_store *s = (pg_store *)base;
	memset(out, 0, sizeof *out);
	pg_reader *r = reader_get(s, err);
	if (!r)
		return err->code;
	int rc = begin_read(r, err);
	pg_params p = {0};
	pg_text(&p, name);
	PGresult *q = rc ? NULL : query(r, PR_RESOURCE, &p, &rc, err, "reading a resource");
	if (q && PQntuples(q) == 0)
		rc = err_set(err, BATON_ENOTFOUND, "no resource named \"%s\"", name);
	else if (q)
		out->row = (resource_row){
		    .name = xstrdup(name),
		    .last_token = pg_col_int(q, 0, 0),
		    .grants = pg_col_int(q, 0, 1),
		    .total_hold_ms = pg_col_int(q, 0, 2),
		    .max_hold_ms = pg_col_int(q, 0, 3),
		    .total_wait_ms = pg_col_int(q, 0, 4),
		    .max_wait_ms = pg_col_int(q, 0, 5),
		    .permits = (int)pg_col_int(q, 0, 7),
		};
	if (q && rc == BATON_OK)
		out->last_event_seq = pg_col_int(q, 0, 6);
	PQclear(q);
	if (rc == BATON_OK) {
		p.n = 0;
		pg_int(&p, part_of(name));
		q = query(r, PR_OWNER, &p, &rc, err, "reading the resource's node");
		if (q && PQntuples(q) == 1)
			out->node = pg_col_str(q, 0, 0);
		PQclear(q);
	}
	if (rc == BATON_OK)
		rc = read_holders(r, out, err);
	if (rc == BATON_OK)
		rc = with_waiters ? read_waiters(r, name, out, err)
				  : queue_length(r, name, &out->queue_length, NULL, err);
	end_read(r);
	reader_put(s, r);
	if (rc)
		store_resource_fini(out);
	return rc;
}

int pg_list_resources(store *base, const store_resource_page *page,
		      void (*fn)(void *ctx, const store_resource *r), void *ctx, baton_error *err)
{
	pg_store *s = (pg_store *)base;
	pg_reader *r = reader_get(s, err);
	if (!r)
		return err->code;
	int rc = begin_read(r, err);
	pg_params p = {0};
	pg_text(&p, page->after);
	pg_int(&p, page->limit);
	if (page->by_contention)
		pg_int(&p, page->after_queue);
	PGresult *q = rc ? NULL
			 : query(r, page->by_contention ? PR_RESOURCES_BUSY : PR_RESOURCES, &p, &rc,
				 err, "listing resources");
	for (int i = 0; q && rc == BATON_OK && i < PQntuples(q); i++) {
		store_resource res = {0};
		res.row = (resource_row){
		    .name = pg_col_str(q, i, 0),
		    .permits = (int)pg_col_int(q, i, 1),
		    .last_token = pg_col_int(q, i, 2),
		    .grants = pg_col_int(q, i, 3),
		    .total_hold_ms = pg_col_int(q, i, 4),
		    .max_hold_ms = pg_col_int(q, i, 5),
		    .total_wait_ms = pg_col_int(q, i, 6),
		    .max_wait_ms = pg_col_int(q, i, 7),
		};
		rc = read_holders(r, &res, err);
		if (rc == BATON_OK)
			rc =
			    queue_length(r, res.row.name, &res.queue_length, &res.oldest_wait, err);
		if (rc == BATON_OK)
			fn(ctx, &res);
		store_resource_fini(&res);
	}
	PQclear(q);
	end_read(r);
	reader_put(s, r);
	return rc;
}

int pg_count_workflows(store *base, int64_t counts[WF_NSTATUS], baton_error *err)
{
	pg_store *s = (pg_store *)base;
	pg_reader *r = reader_get(s, err);
	if (!r)
		return err->code;
	int rc;
	PGresult *q = query(r, PR_WF_COUNTS, NULL, &rc, err, "counting workflows");
	reader_put(s, r);
	for (int i = 0; q && i < PQntuples(q); i++) {
		int st = wf_status_parse(PQgetvalue(q, i, 0));
		if (st >= 0)
			counts[st] = pg_col_int(q, i, 1);
	}
	PQclear(q);
	return rc;
}

int pg_ping(store *base, baton_error *err)
{
	pg_store *s = (pg_store *)base;
	pg_reader *r = reader_get(s, err);
	if (!r)
		return err->code;
	int rc = exec_simple(r, "SELECT 1", PGRES_TUPLES_OK, err);
	reader_put(s, r);
	return rc;
}

int pg_list_nodes(store *base, store_node **out, int *n, baton_error *err)
{
	pg_store *s = (pg_store *)base;
	pg_reader *r = reader_get(s, err);
	if (!r)
		return err->code;
	int rc;
	PGresult *q = query(r, PR_NODES, NULL, &rc, err, "listing nodes");
	reader_put(s, r);
	if (!q)
		return rc;
	*n = PQntuples(q);
	*out = xcalloc((size_t)*n + 1, sizeof **out);
	for (int i = 0; i < *n; i++)
		(*out)[i] = (store_node){
		    .id = pg_col_str(q, i, 0),
		    .url = pg_col_str(q, i, 1),
		    .lease_expires_at = pg_col_int(q, i, 2),
		    .partitions = (int)pg_col_int(q, i, 3),
		    .resources = pg_col_int(q, i, 4),
		    .running_steps = pg_col_int(q, i, 5),
		};
	PQclear(q);
	return BATON_OK;
}
