/*
 * pg_store.c - baton's PostgreSQL store, the writer's half (pg_read.c is the readers'),
 * behind pg_store_ops (store.h).
 *
 * Design. One connection belongs to the engine thread, the only writer. A batch is one
 * transaction sent in libpq's pipeline mode: the ownership check and every row go out
 * together, followed by a sync, and their results are read back in order. What comes
 * before a sync is one implicit transaction, committed when the server reaches the sync,
 * so no BEGIN and COMMIT are needed: a round costs about one round trip and one WAL flush
 * (synchronous_commit is set on for baton's sessions, whatever the server's default). Every write
 * is an upsert or an insert that ignores a row already there, so writing a batch again after a
 * COMMIT whose outcome was lost changes nothing.
 *
 * Ownership. At open batond takes a session advisory lock (a second batond on the same
 * database is refused, as a second one on a SQLite file is) and increments the epoch in
 * baton_meta. The writer's session holds the lock for as long as it lives, so whatever
 * it commits, the owner commits; a new session (after the old one broke) takes the lock
 * again and checks that the epoch is still its own before it writes anything, so a
 * batond that lost the database while it was cut off, and was replaced, never commits
 * again. A trigger refuses any update that would move a resource's fencing token
 * backwards, whoever sends it.
 *
 * The database may go away. A failed batch or id request drops the connection; the next
 * one reconnects (the engine retries with backoff), takes the advisory lock again and
 * checks the epoch. One log line says the connection was lost and one that it is back.
 *
 * Errors by SQLSTATE class: 08 (connection), 53 (insufficient resources: disk full, out
 * of memory, too many connections), 57 (operator intervention: shutdown, cancel,
 * timeouts), 58 (system and I/O errors) and 25 (an idle transaction ended by the server)
 * are BATON_EIO; 40 (serialization failure, deadlock) and 55 (lock not available) are
 * BATON_EBUSY: a retry may clear all of those. 22 (data exception: a value the database
 * refuses) is BATON_EINVAL, 23 (integrity constraint) and BT (baton's own: ownership
 * lost, a token going backwards) BATON_ECONFLICT, XX (internal, corruption)
 * BATON_ECORRUPT, anything else BATON_EINTERNAL: a retry cannot help those.
 *
 * Schema (baton_meta 'schema' = 7; a database of an older schema is migrated when opened,
 * one version at a time, under a lock): the same tables and columns as the SQLite
 * store's, so that operators can read either with the same SQL, with boolean columns
 * where SQLite has integers, and counters for ids in baton_meta.
 */
#include "pg.h"

#include <poll.h>
#include <stdlib.h>
#include <string.h>

#define PG_SCHEMA_VERSION 7
/* Advisory lock key of the schema migration (per transaction). */
#define LOCK_MIGRATE "7303122311001"

static const char schema_sql[] =
    "CREATE TABLE baton_meta (key text PRIMARY KEY, value bigint NOT NULL);"
    "INSERT INTO baton_meta VALUES ('schema', 2), ('epoch', 0), ('workflow_seq', 0),"
    " ('event_seq', 0);"
    "CREATE TABLE workflows ("
    "  seq bigint PRIMARY KEY, id text COLLATE \"C\" NOT NULL UNIQUE,"
    "  resource text COLLATE \"C\" NOT NULL, on_failure text NOT NULL, status text NOT NULL,"
    "  cancel_requested boolean NOT NULL DEFAULT false, created_at bigint NOT NULL,"
    "  started_at bigint, finished_at bigint, steps_total integer NOT NULL,"
    "  steps_completed integer NOT NULL DEFAULT 0, result text, error text,"
    "  retry text NOT NULL);"
    "CREATE TABLE definitions (workflow_seq bigint PRIMARY KEY, definition text NOT NULL);"
    "CREATE INDEX workflows_status ON workflows(status, seq);"
    "CREATE INDEX workflows_resource ON workflows(resource, seq);"
    "CREATE TABLE steps ("
    "  workflow_seq bigint NOT NULL, idx integer NOT NULL, worker text NOT NULL,"
    "  resource text COLLATE \"C\" NOT NULL, params text NOT NULL, status text NOT NULL,"
    "  attempts integer NOT NULL DEFAULT 0, lock_seq bigint, requested_at bigint,"
    "  fencing_token bigint, started_at bigint, finished_at bigint, duration_ms bigint,"
    "  next_attempt_at bigint, error text, result text,"
    "  PRIMARY KEY (workflow_seq, idx));"
    "CREATE INDEX steps_waiting ON steps(resource, lock_seq) WHERE status = 'waiting';"
    "CREATE TABLE events ("
    "  seq bigint PRIMARY KEY, last_seq bigint NOT NULL, workflow_seq bigint NOT NULL,"
    "  resource text COLLATE \"C\" NOT NULL, lock boolean NOT NULL, data text NOT NULL);"
    "CREATE INDEX events_workflow ON events(workflow_seq, seq);"
    "CREATE INDEX events_resource ON events(resource, seq) WHERE lock;"
    "CREATE TABLE resources ("
    "  name text COLLATE \"C\" PRIMARY KEY, last_token bigint NOT NULL, grants bigint NOT NULL,"
    "  total_hold_ms bigint NOT NULL, max_hold_ms bigint NOT NULL,"
    "  total_wait_ms bigint NOT NULL, max_wait_ms bigint NOT NULL,"
    "  holder_seq bigint, holder_idx integer);"
    "CREATE FUNCTION baton_token_backwards() RETURNS trigger LANGUAGE plpgsql AS $$"
    " BEGIN RAISE EXCEPTION 'resource %: fencing token % would go back to %', OLD.name,"
    "  OLD.last_token, NEW.last_token USING ERRCODE = 'BT002'; END $$;"
    "CREATE TRIGGER resources_token_forward BEFORE UPDATE ON resources FOR EACH ROW"
    " WHEN (NEW.last_token < OLD.last_token) EXECUTE FUNCTION baton_token_backwards();";

/*
 * Schema 2 to 3: a cluster of nodes on one database (pg_cluster.c). nodes: each live
 * node and when its lease ends (the database's clock); partitions: who owns each of the
 * PARTS partitions, under which epoch (raised by every claim). A workflow records its
 * partition and whether its owner has adopted it (one submitted on another node waits
 * until then); a step, the node that drove its latest attempt. baton_fence() is the first
 * statement of every batch: it locks the batch's partition rows against a claim until the
 * batch commits, and refuses it (BT003) unless this node still owns every one of them
 * under the epoch it holds. The parts of existing rows are set by migrate() (part_of()).
 */
static const char migrate_v2_sql[] =
    "CREATE TABLE nodes (id text COLLATE \"C\" PRIMARY KEY, expires timestamptz NOT NULL,"
    "  joined timestamptz NOT NULL DEFAULT clock_timestamp(),"
    "  incarnation text NOT NULL DEFAULT '');"
    "CREATE TABLE partitions (id integer PRIMARY KEY, owner text COLLATE \"C\","
    "  epoch bigint NOT NULL DEFAULT 0);"
    "INSERT INTO partitions (id) SELECT generate_series(0, 63);"
    "ALTER TABLE workflows ADD COLUMN part integer NOT NULL DEFAULT 0,"
    "  ADD COLUMN adopted boolean NOT NULL DEFAULT true;"
    "ALTER TABLE steps ADD COLUMN node text;"
    "CREATE INDEX workflows_open ON workflows(part) WHERE status IN ('pending', 'running');"
    "CREATE INDEX workflows_inbox ON workflows(part) WHERE NOT adopted"
    "  OR (cancel_requested AND status IN ('pending', 'running'));"
    "CREATE INDEX steps_running ON steps(node) WHERE status = 'running';"
    "CREATE FUNCTION baton_fence(me text, parts integer[], epochs bigint[]) RETURNS void"
    " LANGUAGE plpgsql AS $$ BEGIN"
    " PERFORM 1 FROM partitions WHERE id = ANY(parts) ORDER BY id FOR SHARE;"
    " IF (SELECT count(*) FROM partitions p JOIN unnest(parts, epochs) AS x(id, epoch)"
    "  ON p.id = x.id WHERE p.owner = me AND p.epoch = x.epoch) <> cardinality(parts) THEN"
    "  RAISE EXCEPTION 'node % no longer owns every partition it writes', me"
    "  USING ERRCODE = 'BT003'; END IF; END $$;"
    "UPDATE baton_meta SET value = 3 WHERE key = 'schema'";

/* Schema 3 to 4: the ownership check is one statement (W_FENCE), which calls
 * baton_refuse() only to refuse a batch. baton_fence() stays for nodes of schema 3 that
 * still run during an upgrade. */
static const char migrate_v3_sql[] =
    "CREATE FUNCTION baton_refuse(me text) RETURNS void LANGUAGE plpgsql AS $$ BEGIN"
    " RAISE EXCEPTION 'node % no longer owns every partition it writes', me"
    " USING ERRCODE = 'BT003'; END $$;"
    "UPDATE baton_meta SET value = 4 WHERE key = 'schema'";

/* Schema 4 to 5: each node's URL (--advertise-url), which the other nodes pass the
 * requests on to that only it can answer (a lease or task of a partition it owns), and
 * the order of GET /workflows in a cluster. */
static const char migrate_v4_sql[] =
    "ALTER TABLE nodes ADD COLUMN url text NOT NULL DEFAULT '';"
    /* GET /workflows, newest first across the nodes' seq blocks (pg_read.c) */
    "CREATE INDEX workflows_created ON workflows(created_at DESC, seq DESC);"
    "UPDATE baton_meta SET value = 5 WHERE key = 'schema'";

/* Schema 5 to 6: a resource's limit (permits, 1: a mutex) and, when more than one holds it,
 * every holder as [[workflow_seq, idx], ...] (holder_seq names the first). A node of
 * schema 5 still running during an upgrade leaves both as they are. */
static const char migrate_v5_sql[] =
    "ALTER TABLE resources ADD COLUMN permits integer NOT NULL DEFAULT 1,"
    "  ADD COLUMN holders text;"
    "UPDATE baton_meta SET value = 6 WHERE key = 'schema'";

/*
 * Schema 6 to 7: the database's generation (baton_generation()), the floor of every
 * partition epoch and fencing token granted under it: generation_base plus the timeline ID
 * of the live primary, less one, times 2^40. PostgreSQL raises the timeline ID at every
 * promotion of a standby, and the current WAL file's name carries it (pg_walfile_name
 * errors on a standby, which takes no writes anyway). So on a database that never failed
 * over, the floor is 0 and tokens keep their values; after a promotion, everything granted
 * is above everything granted before it, also the grants the promoted standby never
 * received. generation_base is raised only when an operator accepts a database of another
 * system identifier (--accept-system-identifier), above every stored token and epoch.
 */
static const char migrate_v6_sql[] =
    "INSERT INTO baton_meta VALUES ('generation_base', 0) ON CONFLICT (key) DO NOTHING;"
    "CREATE FUNCTION baton_timeline() RETURNS bigint LANGUAGE sql VOLATILE AS $$"
    " SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint"
    " $$;"
    "CREATE FUNCTION baton_generation() RETURNS bigint LANGUAGE sql VOLATILE AS $$"
    " SELECT (SELECT value FROM baton_meta WHERE key = 'generation_base')"
    " + ((baton_timeline() - 1) << 40) $$;"
    "UPDATE baton_meta SET value = 7 WHERE key = 'schema'";

/* Deletes the finished workflows that d picks, with everything that names them, in one
 * statement; the ids deleted come back. Event seqs and workflow seqs come from
 * baton_meta's counters, which deletes do not touch. */
#define DELETE_PICKED                                                                              \
	" s AS (DELETE FROM steps WHERE workflow_seq IN (SELECT seq FROM d)),"                     \
	" f AS (DELETE FROM definitions WHERE workflow_seq IN (SELECT seq FROM d)),"               \
	" e AS (DELETE FROM events WHERE workflow_seq IN (SELECT seq FROM d))"                     \
	" DELETE FROM workflows WHERE seq IN (SELECT seq FROM d) RETURNING id"
#define FINAL_STATUS "status IN ('completed', 'failed', 'cancelled')"

/* A step row and a resource row written again replace what changes (W_ROWS, W_STEP,
 * W_RESOURCE). */
#define STEP_UPSERT                                                                                \
	" ON CONFLICT (workflow_seq, idx) DO UPDATE SET status=excluded.status,"                   \
	" attempts=excluded.attempts, lock_seq=excluded.lock_seq,"                                 \
	" requested_at=excluded.requested_at, fencing_token=excluded.fencing_token,"               \
	" started_at=excluded.started_at, finished_at=excluded.finished_at,"                       \
	" duration_ms=excluded.duration_ms, next_attempt_at=excluded.next_attempt_at,"             \
	" error=excluded.error, result=excluded.result, params=excluded.params,"                   \
	" node=coalesce(excluded.node, steps.node)"
#define RESOURCE_COLS                                                                              \
	"name, last_token, grants, total_hold_ms, max_hold_ms, total_wait_ms, max_wait_ms,"        \
	" holder_seq, holder_idx, permits, holders"
#define RESOURCE_UPSERT                                                                            \
	" ON CONFLICT (name) DO UPDATE SET last_token=excluded.last_token,"                        \
	" grants=excluded.grants, total_hold_ms=excluded.total_hold_ms,"                           \
	" max_hold_ms=excluded.max_hold_ms, total_wait_ms=excluded.total_wait_ms,"                 \
	" max_wait_ms=excluded.max_wait_ms, holder_seq=excluded.holder_seq,"                       \
	" holder_idx=excluded.holder_idx, permits=excluded.permits, holders=excluded.holders"

/* A cancel requested on another node (request_cancel) is kept whatever the owner writes. */
static const char *const writer_sql[W_NSTMT] = {
    [W_INS_WF] = "INSERT INTO workflows (" PG_WF_COLS ", part, adopted) VALUES"
		 " ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16)"
		 " ON CONFLICT (seq) DO UPDATE SET status=$5,"
		 " cancel_requested=workflows.cancel_requested OR $6,"
		 " started_at=$8, finished_at=$9, steps_completed=$11, result=$12, error=$13",
    [W_INS_DEF] = "INSERT INTO definitions (workflow_seq, definition) VALUES ($1,$2)"
		  " ON CONFLICT (workflow_seq) DO NOTHING",
    [W_UPD_WF] = "UPDATE workflows SET status=$2, cancel_requested=cancel_requested OR $3,"
		 " started_at=$4, finished_at=$5, steps_completed=$6, result=$7, error=$8,"
		 " adopted=true WHERE seq=$1",
    [W_FIND] = "SELECT d.definition, w.status FROM workflows w"
	       " JOIN definitions d ON d.workflow_seq = w.seq WHERE w.id=$1",
    [W_NEXT_ID] = "UPDATE baton_meta SET value = value + $2 WHERE key = $1 RETURNING value",
    [W_DELETE_ONE] = "WITH d AS (SELECT seq FROM workflows WHERE id=$1 AND " FINAL_STATUS
		     " FOR UPDATE)," DELETE_PICKED,
    [W_DELETE_OLD] = "WITH d AS (SELECT seq FROM workflows WHERE " FINAL_STATUS
		     " AND finished_at < $1 ORDER BY seq LIMIT $2 FOR UPDATE)," DELETE_PICKED,
    /* A batch's steps, resources and events at once: one array per column (send_rows);
     * an empty array inserts nothing. One statement, so the database's cost per
     * statement is paid once per round, however many rows it writes. */
    [W_ROWS] =
	"WITH s AS (INSERT INTO steps (workflow_seq, resource, " PG_STEP_COLS ")"
	" SELECT * FROM unnest($1::bigint[], $2::text[], $3::int[], $4::text[],"
	" $5::text[], $6::text[], $7::int[], $8::bigint[], $9::bigint[], $10::bigint[],"
	" $11::bigint[], $12::bigint[], $13::bigint[], $14::bigint[], $15::text[],"
	" $16::text[], $17::text[])" STEP_UPSERT " RETURNING 1),"
	" r AS (INSERT INTO resources (" RESOURCE_COLS ")"
	" SELECT * FROM unnest($18::text[], $19::bigint[], $20::bigint[], $21::bigint[],"
	" $22::bigint[], $23::bigint[], $24::bigint[], $25::bigint[], $26::int[], $27::int[],"
	" $28::text[])" RESOURCE_UPSERT " RETURNING 1),"
	" e AS (INSERT INTO events (seq, last_seq, workflow_seq, resource, lock, data)"
	" SELECT * FROM unnest($29::bigint[], $30::bigint[], $31::bigint[], $32::text[],"
	" $33::boolean[], $34::text[]) ON CONFLICT (seq) DO NOTHING RETURNING 1)"
	" SELECT (SELECT count(*) FROM s), (SELECT count(*) FROM r),"
	" (SELECT count(*) FROM e)",
    /* The same rows one per statement, for small batches: W_ROWS's plan (three
     * data-modifying CTEs over unnest) costs the database about 0.1 ms to start, more than
     * a lone workflow's four single-row statements together (bench/README.md). */
    [W_STEP] = "INSERT INTO steps (workflow_seq, resource, " PG_STEP_COLS ") VALUES"
	       " ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17)" STEP_UPSERT,
    /* Two step rows (a lone workflow's round: the step finished and the one granted). */
    [W_STEP2] =
	"INSERT INTO steps (workflow_seq, resource, " PG_STEP_COLS ") VALUES"
	" ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17),"
	" ($18,$19,$20,$21,$22,$23,$24,$25,$26,$27,$28,$29,$30,$31,$32,$33,$34)" STEP_UPSERT,
    [W_RESOURCE] = "INSERT INTO resources (" RESOURCE_COLS
		   ") VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11)" RESOURCE_UPSERT,
    [W_EVENT] = "INSERT INTO events (seq, last_seq, workflow_seq, resource, lock, data)"
		" VALUES ($1,$2,$3,$4,$5,$6) ON CONFLICT (seq) DO NOTHING",
    /* Ownership in one statement (schema 4): the batch's partition rows are locked FOR
     * SHARE, which waits for a claim in flight and then reads the row as that claim left
     * it, and the batch is refused (BT003) if any of them names another owner or epoch
     * ($2 and $3 are aligned). MATERIALIZED keeps the check above the lock: pushed below
     * it, only the rows that fail it would be locked. baton_refuse runs only to refuse,
     * so a batch pays for no PL/pgSQL call. An epoch below the database's generation
     * (schema 7) was claimed before a promotion: the batch is refused, and the node claims
     * its partitions again under the new generation (pg_cluster.c), so that no grant
     * commits with a token of an earlier generation. */
    [W_FENCE] = "WITH p AS MATERIALIZED (SELECT id, owner, epoch FROM partitions"
		" WHERE id = ANY($2::integer[]) ORDER BY id FOR SHARE),"
		" g AS MATERIALIZED (SELECT baton_generation() AS floor)"
		" SELECT baton_refuse($1) FROM p, g WHERE p.owner IS DISTINCT FROM $1"
		" OR p.epoch <> ($3::bigint[])[array_position($2::integer[], p.id)]"
		" OR p.epoch < g.floor",
    /* --require-sync-replication: the first statement of every batch fails unless the
     * session's synchronous_standby_names is set. A gating condition without a table is
     * evaluated before the target list, so the unknown setting is read (and fails the
     * transaction, 42704) only then; pg_batch.c recognizes that statement's failure. */
    [W_SYNC] = "SELECT current_setting('baton.synchronous_replication_is_off')"
	       " WHERE current_setting('synchronous_standby_names') = ''",
    /* A hint to the owner of a partition that it has work (a submission from here). */
    [W_NOTIFY] = "SELECT pg_notify('baton', $1)",
};

/* ---- parameters ---- */

void pg_int(pg_params *p, int64_t x)
{
	snprintf(p->num[p->n], sizeof p->num[p->n], "%lld", (long long)x);
	p->v[p->n] = p->num[p->n];
	p->len[p->n] = 0;
	p->fmt[p->n++] = 0;
}

void pg_time(pg_params *p, int64_t x)
{
	if (x) {
		pg_int(p, x);
		return;
	}
	p->v[p->n] = NULL;
	p->len[p->n] = 0;
	p->fmt[p->n++] = 0;
}

/* Strings go in binary format, which for text is its bytes: no terminator needed. */
void pg_bytes(pg_params *p, const char *s, size_t n)
{
	p->v[p->n] = s;
	p->len[p->n] = (int)n;
	p->fmt[p->n++] = 1;
}

void pg_text(pg_params *p, const char *s)
{
	if (s)
		pg_bytes(p, s, strlen(s));
	else
		pg_time(p, 0);
}

void pg_bool(pg_params *p, int b)
{
	pg_bytes(p, b ? "t" : "f", 1);
	p->fmt[p->n - 1] = 0; /* boolean's text form; "t" is NUL-terminated */
}

/* A JSON value as compact text in the writer's buffer `slot`, valid until the slot is
 * used again (libpq copies parameters when the statement is sent). */
void pg_json(pg_store *s, pg_params *p, const json_t *v, int slot)
{
	if (!v) {
		pg_time(p, 0);
		return;
	}
	textbuf *b = &s->json[slot];
	b->len = 0;
	codec_text(b, v);
	pg_bytes(p, b->v, b->len);
}

/* ---- errors and rows ---- */

int pg_transient(int code)
{
	return code == BATON_EIO || code == BATON_EBUSY;
}

static int code_of(const char *state)
{
	if (!state || strlen(state) < 2)
		return BATON_EIO;
	static const struct {
		const char *cls;
		int code;
	} classes[] = {
	    {"08", BATON_EIO},	     {"53", BATON_EIO},	     {"57", BATON_EIO},
	    {"58", BATON_EIO},	     {"25", BATON_EIO},	     {"40", BATON_EBUSY},
	    {"55", BATON_EBUSY},     {"22", BATON_EINVAL},   {"23", BATON_ECONFLICT},
	    {"BT", BATON_ECONFLICT}, {"XX", BATON_ECORRUPT},
	};
	for (size_t i = 0; i < sizeof classes / sizeof *classes; i++)
		if (strncmp(state, classes[i].cls, 2) == 0)
			return classes[i].code;
	return BATON_EINTERNAL;
}

/* The first line of libpq's message (it may end in newlines and carry hints). */
static void first_line(const char *m, char *out, size_t n)
{
	snprintf(out, n, "%s", m && *m ? m : "no answer from the database");
	out[strcspn(out, "\n")] = 0;
}

int pg_fail(PGconn *c, const PGresult *r, baton_error *err, const char *what)
{
	char line[400];
	int broken = !c || PQstatus(c) != CONNECTION_OK;
	const char *state = r && !broken ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
	first_line(r && PQresultErrorMessage(r)[0] ? PQresultErrorMessage(r)
						   : (c ? PQerrorMessage(c) : NULL),
		   line, sizeof line);
	return err_set(err, broken ? BATON_EIO : code_of(state), "%s: %s", what, line);
}

char *pg_col_str(const PGresult *r, int row, int col)
{
	return PQgetisnull(r, row, col) ? NULL : xstrdup(PQgetvalue(r, row, col));
}

int64_t pg_col_int(const PGresult *r, int row, int col)
{
	return PQgetisnull(r, row, col) ? 0 : strtoll(PQgetvalue(r, row, col), NULL, 10);
}

static json_t *pg_json_col(const PGresult *r, int row, int col)
{
	if (PQgetisnull(r, row, col))
		return NULL;
	return json_loadb(PQgetvalue(r, row, col), (size_t)PQgetlength(r, row, col),
			  JSON_DECODE_ANY, NULL);
}

wf_row *pg_read_wf(const PGresult *r, int row)
{
	wf_row *wf = xcalloc(1, sizeof *wf);
	wf->seq = pg_col_int(r, row, 0);
	wf->id = pg_col_str(r, row, 1);
	wf->resource = pg_col_str(r, row, 2);
	wf->on_failure =
	    strcmp(PQgetvalue(r, row, 3), "continue") == 0 ? ON_FAILURE_CONTINUE : ON_FAILURE_FAIL;
	wf->status = wf_status_parse(PQgetvalue(r, row, 4));
	wf->stored_status = wf->status;
	wf->cancel_requested = PQgetvalue(r, row, 5)[0] == 't';
	wf->created_at = pg_col_int(r, row, 6);
	wf->started_at = pg_col_int(r, row, 7);
	wf->finished_at = pg_col_int(r, row, 8);
	wf->steps_total = (int)pg_col_int(r, row, 9);
	wf->steps_completed = (int)pg_col_int(r, row, 10);
	wf->result = pg_json_col(r, row, 11);
	wf->error = pg_col_str(r, row, 12);
	codec_parse_retry(PQgetvalue(r, row, 13), &wf->retry);
	wf->steps = xcalloc(wf->steps_total > 0 ? (size_t)wf->steps_total : 1, sizeof *wf->steps);
	return wf;
}

int pg_read_steps(const PGresult *r, const char *definition, wf_row *wf)
{
	int rows = PQntuples(r);
	for (int i = 0; i < rows; i++) {
		int idx = (int)pg_col_int(r, i, 0);
		if (idx < 0 || idx >= wf->steps_total || wf->steps[idx].worker ||
		    PQgetisnull(r, i, 1))
			return BATON_ECORRUPT;
		step_row *st = &wf->steps[idx];
		st->index = idx;
		st->worker = pg_col_str(r, i, 1);
		st->params = pg_json_col(r, i, 2);
		st->status = step_status_parse(PQgetvalue(r, i, 3));
		st->attempts = (int)pg_col_int(r, i, 4);
		st->lock_seq = pg_col_int(r, i, 5);
		st->requested_at = pg_col_int(r, i, 6);
		st->token = pg_col_int(r, i, 7);
		st->started_at = pg_col_int(r, i, 8);
		st->finished_at = pg_col_int(r, i, 9);
		st->duration_ms = PQgetisnull(r, i, 10) ? -1 : pg_col_int(r, i, 10);
		st->next_attempt_at = pg_col_int(r, i, 11);
		st->error = pg_col_str(r, i, 12);
		st->result = pg_json_col(r, i, 13);
		st->node = pg_col_str(r, i, 14);
		st->stored = 1;
	}
	if (rows == wf->steps_total)
		return BATON_OK;
	return definition && codec_pending_steps(wf, definition) == 0 ? BATON_OK : BATON_ECORRUPT;
}

/* ---- connections ---- */

int pg_exec_ok(PGconn *c, const char *sql, baton_error *err, const char *what)
{
	PGresult *r = PQexec(c, sql);
	ExecStatusType st = PQresultStatus(r);
	int rc =
	    st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK ? BATON_OK : pg_fail(c, r, err, what);
	PQclear(r);
	return rc;
}

pg_wait pg_wait_start(const pg_store *s)
{
	int64_t bound = s->commit_timeout_ms;
	return (pg_wait){.deadline = bound > 0 ? mono_ms() + bound : 0, .bound = bound};
}

/* Asks the server to cancel what c's session runs (a commit waiting for a synchronous
 * standby: it then commits on the primary only, and warns, writer_notice). */
static void cancel(PGconn *c)
{
	char why[256];
	PGcancel *k = PQgetCancel(c);
	if (k)
		PQcancel(k, why, sizeof why);
	PQfreeCancel(k);
}

PGresult *pg_result_by(PGconn *c, pg_wait *w)
{
	while (w->deadline && !w->abandoned && PQisBusy(c)) {
		int64_t left = w->deadline - mono_ms();
		if (left <= 0) {
			if (w->cancelled) {
				w->abandoned = 1;
				return NULL;
			}
			cancel(c);
			w->cancelled = 1;
			w->deadline = mono_ms() + w->bound;
			continue;
		}
		struct pollfd fd = {.fd = PQsocket(c), .events = POLLIN};
		if (fd.fd < 0 || poll(&fd, 1, left > 1000 ? 1000 : (int)left) < 0 ||
		    !PQconsumeInput(c))
			break; /* broken: PQgetResult says so */
	}
	return w->abandoned ? NULL : PQgetResult(c);
}

PGresult *pg_exec_by(pg_store *s, PGconn **c, const char *sql, const char *prepared,
		     const pg_params *p, baton_error *err, const char *what)
{
	int sent = prepared ? PQsendQueryPrepared(*c, prepared, p ? p->n : 0, p ? p->v : NULL,
						  p ? p->len : NULL, p ? p->fmt : NULL, 0)
		   : p	    ? PQsendQueryParams(*c, sql, p->n, NULL, p->v, p->len, p->fmt, 0)
			    : PQsendQuery(*c, sql);
	if (!sent) {
		pg_fail(*c, NULL, err, what);
		return NULL;
	}
	pg_wait w = pg_wait_start(s);
	PGresult *keep = NULL, *r;
	while ((r = pg_result_by(*c, &w)) != NULL) {
		if (keep && PQresultStatus(keep) == PGRES_FATAL_ERROR) {
			PQclear(r);
			continue;
		}
		PQclear(keep);
		keep = r;
	}
	/* On the writer's session, a wait cancelled by someone else (writer_notice) too. */
	if (w.cancelled || (c == &s->w && s->sync_cancelled)) {
		PQclear(keep);
		if (w.cancelled)
			err_set(err, BATON_EIO,
				"%s: the database did not confirm it within %lld ms (a synchronous"
				" standby down?); cancelled, its outcome unknown",
				what, (long long)w.bound);
		else
			err_set(err, BATON_EIO,
				"%s: its wait for the synchronous standby was cancelled; it may be"
				" on the primary only, its outcome unknown",
				what);
		PQfinish(*c);
		*c = NULL;
		return NULL;
	}
	if (!keep)
		pg_fail(*c, NULL, err, what);
	return keep;
}

int pg_exec_by_ok(pg_store *s, PGconn **c, const char *sql, const pg_params *p, baton_error *err,
		  const char *what)
{
	PGresult *r = pg_exec_by(s, c, sql, NULL, p, err, what);
	if (!r)
		return err ? err->code : BATON_EIO;
	ExecStatusType st = PQresultStatus(r);
	int rc =
	    st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK ? BATON_OK : pg_fail(*c, r, err, what);
	PQclear(r);
	return rc;
}

PGconn *pg_connect(pg_store *s, baton_error *err)
{
	/* Later keywords win: the URL's own settings override these defaults. A database
	 * that stops answering (a cut network sends no reset) is given up on by TCP within
	 * about 30 s instead of blocking the engine for the kernel's retransmission time. */
	const char *const keys[] = {
	    "connect_timeout",	"application_name", "keepalives_idle", "keepalives_interval",
	    "keepalives_count", "tcp_user_timeout", "dbname",	       NULL};
	const char *const vals[] = {"5", "batond", "10", "5", "3", "30000", s->url, NULL};
	PGconn *c = PQconnectdbParams(keys, vals, 1);
	if (!c || PQstatus(c) != CONNECTION_OK) {
		char line[400];
		first_line(c ? PQerrorMessage(c) : "out of memory", line, sizeof line);
		err_set(err, BATON_EIO, "cannot connect to %s: %s", s->shown, line);
		PQfinish(c);
		return NULL;
	}
	/* Durable at every commit whatever the server's default; a session the database
	 * sees idle inside a transaction (a batond paused mid-write, which holds its
	 * partitions' rows) is ended by it: after 60 s, or in a cluster after one lease, so
	 * that the other nodes can take over on time. */
	char setup[256];
	snprintf(setup, sizeof setup,
		 "SET synchronous_commit = on; SET idle_in_transaction_session_timeout = %lld;"
		 " SET plan_cache_mode = force_generic_plan; SET client_min_messages = warning",
		 (long long)(s->idle_tx_ms > 0 ? s->idle_tx_ms : 60000));
	if (pg_exec_ok(c, setup, err, "setting up the session")) {
		PQfinish(c);
		return NULL;
	}
	return c;
}

/* Creates or checks the schema, once, under a lock that a second batond waits for. */
/* Schema 1 to 2: ownership is checked per writer session, no longer in every batch, so
 * the function that checked it goes. Rows are unchanged. */
static const char migrate_v1_sql[] = "DROP FUNCTION IF EXISTS baton_check_epoch(bigint);"
				     "UPDATE baton_meta SET value = 2 WHERE key = 'schema'";

/* Sets the partition of every stored workflow (schema 2 to 3): part_of() is baton's, so the
 * rows are read here and written back one resource at a time. */
static int migrate_parts(PGconn *c, baton_error *err)
{
	PGresult *r = PQexec(c, "SELECT DISTINCT resource FROM workflows");
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		int rc = pg_fail(c, r, err, "reading resources");
		PQclear(r);
		return rc;
	}
	int rc = BATON_OK;
	for (int i = 0; rc == BATON_OK && i < PQntuples(r); i++) {
		pg_params prm = {0};
		pg_text(&prm, PQgetvalue(r, i, 0));
		pg_int(&prm, part_of(PQgetvalue(r, i, 0)));
		PGresult *u = PQexecParams(c, "UPDATE workflows SET part = $2 WHERE resource = $1",
					   prm.n, NULL, prm.v, prm.len, prm.fmt, 0);
		if (PQresultStatus(u) != PGRES_COMMAND_OK)
			rc = pg_fail(c, u, err, "setting partitions");
		PQclear(u);
	}
	PQclear(r);
	return rc;
}

/* Creates or migrates the schema, once, under a lock that a second batond waits for:
 * an empty database gets schema 2 and is migrated like an old one. */
static int migrate(pg_store *s, PGconn **cp, baton_error *err)
{
	PGconn *c = *cp;
	int rc = pg_exec_ok(c, "BEGIN; SELECT pg_advisory_xact_lock(" LOCK_MIGRATE ")", err,
			    "locking the schema");
	if (rc)
		return rc;
	int64_t version = 0;
	PGresult *r = PQexec(c, "SELECT to_regclass('baton_meta') IS NULL");
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		rc = pg_fail(c, r, err, "reading the schema");
	} else if (PQgetvalue(r, 0, 0)[0] == 't') {
		rc = pg_exec_ok(c, schema_sql, err, "creating the schema");
		version = 2;
	} else {
		PQclear(r);
		r = PQexec(c, "SELECT value FROM baton_meta WHERE key = 'schema'");
		if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
			rc = PQresultStatus(r) != PGRES_TUPLES_OK
				 ? pg_fail(c, r, err, "reading the schema version")
				 : err_set(err, BATON_ECORRUPT,
					   "%s: baton_meta has no schema version", s->shown);
		else
			version = pg_col_int(r, 0, 0);
	}
	PQclear(r);
	if (rc == BATON_OK && version == 1) {
		rc = pg_exec_ok(c, migrate_v1_sql, err, "migrating schema 1 to 2");
		version = 2;
	}
	if (rc == BATON_OK && version == 2) {
		rc = pg_exec_ok(c, migrate_v2_sql, err, "migrating schema 2 to 3");
		if (rc == BATON_OK)
			rc = migrate_parts(c, err);
		version = 3;
	}
	if (rc == BATON_OK && version == 3) {
		rc = pg_exec_ok(c, migrate_v3_sql, err, "migrating schema 3 to 4");
		version = 4;
	}
	if (rc == BATON_OK && version == 4) {
		rc = pg_exec_ok(c, migrate_v4_sql, err, "migrating schema 4 to 5");
		version = 5;
	}
	if (rc == BATON_OK && version == 5) {
		rc = pg_exec_ok(c, migrate_v5_sql, err, "migrating schema 5 to 6");
		version = 6;
	}
	if (rc == BATON_OK && version == 6) {
		rc = pg_exec_ok(c, migrate_v6_sql, err, "migrating schema 6 to 7");
		version = 7;
	}
	if (rc == BATON_OK && version != PG_SCHEMA_VERSION)
		rc = err_set(err, BATON_ECORRUPT,
			     "%s: schema version %lld is not one this batond knows (%d)", s->shown,
			     (long long)version, PG_SCHEMA_VERSION);
	if (rc) {
		pg_exec_ok(c, "ROLLBACK", NULL, "rollback");
		return rc;
	}
	return pg_exec_by_ok(s, cp, "COMMIT", NULL, err, "committing the schema");
}

/*
 * The database's identity. baton_meta records the system_identifier of the PostgreSQL
 * cluster baton first ran on. A promotion keeps it (a standby is a copy of its primary);
 * a database restored from a logical dump, or moved by pg_upgrade, is in another cluster,
 * whose timeline may have started again at 1, so the generation (migrate_v6_sql) could fall
 * and tokens granted before could be granted again. Such a database is refused, unless
 * the operator accepts its identifier (accept): then generation_base rises so that the
 * generation's floor is above every token and epoch stored.
 */
static int check_identity(pg_store *s, PGconn **cp, const char *accept, baton_error *err)
{
	PGconn *c = *cp;
	/* Under the schema's lock: two batonds starting at once on a new database would both
	 * find no identifier and both record it. */
	int rc = pg_exec_ok(c, "BEGIN; SELECT pg_advisory_xact_lock(" LOCK_MIGRATE ")", err,
			    "locking the system identifier");
	PGresult *r =
	    rc ? NULL
	       : PQexec(c, "SELECT (SELECT system_identifier FROM pg_control_system()),"
			   " (SELECT value FROM baton_meta WHERE key = 'system_identifier'"
			   " FOR UPDATE)");
	if (!rc && (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1))
		rc = pg_fail(c, r, err, "reading the system identifier");
	char now[24] = "", was[24] = "";
	if (!rc) {
		snprintf(now, sizeof now, "%s", PQgetvalue(r, 0, 0));
		snprintf(was, sizeof was, "%s", PQgetvalue(r, 0, 1));
	}
	PQclear(r);
	pg_params p = {0};
	pg_text(&p, now);
	p.fmt[0] = 0;
	if (!rc && !was[0]) {
		r = PQexecParams(c, "INSERT INTO baton_meta VALUES ('system_identifier', $1)", p.n,
				 NULL, p.v, p.len, p.fmt, 0);
		rc = PQresultStatus(r) == PGRES_COMMAND_OK ? BATON_OK
							   : pg_fail(c, r, err, "recording it");
		PQclear(r);
	} else if (!rc && strcmp(was, now) != 0 && !(accept && strcmp(accept, now) == 0)) {
		rc =
		    err_set(err, BATON_ECONFLICT,
			    "%s has system_identifier %s, but baton recorded %s there: this is "
			    "another PostgreSQL cluster (a restore from a dump, pg_upgrade), where "
			    "fencing tokens granted before could be granted again. If it is the "
			    "right database, start batond with --accept-system-identifier %s: "
			    "tokens then continue above every one stored",
			    s->shown, now, was, now);
	} else if (!rc && strcmp(was, now) != 0) {
		r = PQexecParams(
		    c,
		    "WITH t AS (SELECT greatest((SELECT max(last_token) FROM resources),"
		    " (SELECT max(epoch) FROM partitions), (SELECT max(fencing_token) FROM steps),"
		    " baton_generation()) AS top),"
		    " b AS (UPDATE baton_meta SET value = greatest(value, ((((SELECT top FROM t)"
		    " >> 40) + 1) << 40) - ((baton_timeline() - 1) << 40))"
		    " WHERE key = 'generation_base')"
		    " UPDATE baton_meta SET value = $1 WHERE key = 'system_identifier'"
		    " RETURNING (SELECT (((top >> 40) + 1) << 40) FROM t)",
		    p.n, NULL, p.v, p.len, p.fmt, 0);
		if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
			rc = pg_fail(c, r, err, "starting a new generation");
		else
			log_at(s->log, BATON_LOG_WARN, NULL,
			       "accepted %s with system_identifier %s (baton recorded %s): fencing "
			       "tokens continue from %s",
			       s->shown, now, was, PQgetvalue(r, 0, 0));
		PQclear(r);
	}
	if (rc) {
		pg_exec_ok(c, "ROLLBACK", NULL, "rollback");
		return rc;
	}
	/* It commits even when nothing changed: the row lock (FOR UPDATE) has an xid. */
	return pg_exec_by_ok(s, cp, "COMMIT", NULL, err, "committing the system identifier");
}

static int prepare_writer(PGconn *c, baton_error *err)
{
	for (int i = 0; i < W_NSTMT; i++) {
		char name[8];
		snprintf(name, sizeof name, "w%d", i);
		PGresult *r = PQprepare(c, name, writer_sql[i], 0, NULL);
		int rc = PQresultStatus(r) == PGRES_COMMAND_OK
			     ? BATON_OK
			     : pg_fail(c, r, err, "preparing statements");
		PQclear(r);
		if (rc)
			return rc;
	}
	return BATON_OK;
}

/*
 * PostgreSQL commits a transaction whose wait for a synchronous standby was cancelled (a
 * statement timeout, pg_cancel_backend, a fast shutdown) and only warns: "canceling wait
 * for synchronous replication ... already committed locally, but might not have been
 * replicated to the standby". That is no success: a promotion may lose it. The warning is
 * recognized by the function that raises it, whatever language the server speaks.
 */
static void writer_notice(void *arg, const PGresult *r)
{
	pg_store *s = arg;
	const char *fn = PQresultErrorField(r, PG_DIAG_SOURCE_FUNCTION);
	if (fn && strcmp(fn, "SyncRepWaitForLSN") == 0)
		s->sync_cancelled = 1;
}

void pg_watch_writer(pg_store *s, PGconn *c)
{
	PQsetNoticeReceiver(c, writer_notice, s);
}

/* The writer's connection, reconnected when it broke. Whatever the server said while the
 * connection was idle is read first: a server that shut down has closed it, and it is
 * better to learn that before a batch is sent (its outcome would be unknown) than after. */
int pg_writer(pg_store *s, baton_error *err)
{
	if (s->w && PQconsumeInput(s->w) && PQstatus(s->w) == CONNECTION_OK)
		return BATON_OK;
	if (s->w && !s->w_lost) {
		log_at(s->log, BATON_LOG_ERROR, NULL,
		       "lost the database connection (%s); reconnecting", s->shown);
		s->w_lost = 1;
	}
	PQfinish(s->w);
	s->w = NULL;
	PGconn *c = pg_connect(s, err);
	int rc = c ? BATON_OK : err->code;
	if (rc == BATON_OK)
		rc = prepare_writer(c, err);
	if (rc) {
		PQfinish(c);
		return rc;
	}
	s->w = c;
	s->sync_cancelled = 0;
	pg_watch_writer(s, c);
	if (s->w_lost) {
		log_at(s->log, BATON_LOG_WARN, NULL, "database connection is back (%s)", s->shown);
		s->w_lost = 0;
	}
	return BATON_OK;
}

/* After a failure: a broken connection is dropped and said once. A connection on which
 * a commit's wait for the synchronous standby was cancelled counts as broken: what it
 * committed is on this server only, and a new session learns the real outcome. */
void pg_writer_failed(pg_store *s)
{
	if (s->w && PQstatus(s->w) == CONNECTION_OK && !s->sync_cancelled)
		return;
	s->sync_cancelled = 0;
	PQfinish(s->w);
	s->w = NULL;
	if (!s->w_lost)
		log_at(s->log, BATON_LOG_ERROR, NULL,
		       "lost the database connection (%s); reconnecting", s->shown);
	s->w_lost = 1;
}

/* ---- open and close ---- */

/* The URL with its password (user:PASSWORD@ or password=...) shown as ***. */
static char *hide_password(const char *url)
{
	char out[1024];
	baton_db_redact(url, out, sizeof out);
	return xstrdup(out);
}

static void pg_close(store *base)
{
	pg_store *s = (pg_store *)base;
	if (!s)
		return;
	pg_leave(&s->base);
	pg_readers_close(s);
	PQfinish(s->w);
	for (size_t i = 0; i < sizeof s->json / sizeof s->json[0]; i++)
		free(s->json[i].v);
	for (int t = 0; t < 3; t++)
		for (int i = 0; i < PG_MAX_COLS; i++)
			free(s->rows[t].col[i].v);
	free(s->url);
	free(s->shown);
	pthread_cond_destroy(&s->pool_cv);
	pthread_mutex_destroy(&s->pool_mu);
	store_base_fini(&s->base);
	free(s);
}

static int pg_open(const store_config *cfg, store **out, baton_error *err)
{
	char why[256];
	if (pg_load_libpq(why, sizeof why))
		return err_set(err, BATON_EINTERNAL, "%s", why);
	pg_store *s = xcalloc(1, sizeof *s);
	store_base_init(&s->base, &pg_store_ops);
	pthread_mutex_init(&s->pool_mu, NULL);
	pthread_cond_init(&s->pool_cv, NULL);
	s->url = xstrdup(cfg->target);
	s->shown = hide_password(cfg->target);
	s->log = cfg->log;
	s->commit_timeout_ms = cfg->commit_timeout_ms;
	s->require_sync = cfg->require_sync;
	PGconn *c = pg_connect(s, err);
	int rc = c ? BATON_OK : err->code;
	if (rc == BATON_OK)
		rc = migrate(s, &c, err);
	if (rc == BATON_OK)
		rc = check_identity(s, &c, cfg->accept_sysid, err);
	if (rc == BATON_OK)
		rc = prepare_writer(c, err);
	s->w = c;
	if (c)
		pg_watch_writer(s, c);
	if (rc == BATON_OK)
		rc = pg_readers_open(s, cfg->readers);
	if (rc) {
		if (rc == BATON_OK)
			rc = err_set(err, BATON_EIO, "cannot open connections to %s", s->shown);
		pg_close(&s->base);
		return rc;
	}
	*out = &s->base;
	return BATON_OK;
}

/*
 * Runs one writer statement on its own (not in a batch), once more on a new connection
 * when the old one turns out to have broken while it was idle (a restarted server): it
 * reads or takes ids, so running it twice is harmless. It is bounded as a batch's commit is
 * (pg_exec_by): one the database did not confirm in time fails, its outcome unknown, and is
 * not run again. NULL with err set on failure.
 */
static PGresult *writer_run(pg_store *s, int stmt, const pg_params *p, ExecStatusType want,
			    const char *what, baton_error *err)
{
	for (int attempt = 0; attempt < 2; attempt++) {
		int rc = pg_writer(s, err);
		if (rc)
			return NULL;
		char name[8];
		snprintf(name, sizeof name, "w%d", stmt);
		PGresult *r = pg_exec_by(s, &s->w, NULL, name, p, err, what);
		if (!s->w) { /* not confirmed in time: given up */
			pg_writer_failed(s);
			return NULL;
		}
		if (r && PQresultStatus(r) == want)
			return r;
		if (r)
			pg_fail(s->w, r, err, what);
		PQclear(r);
		int broken = PQstatus(s->w) != CONNECTION_OK;
		pg_writer_failed(s);
		if (!broken)
			return NULL;
	}
	return NULL;
}

static int pg_next_ids(store *base, int kind, int64_t n, int64_t *first, baton_error *err)
{
	pg_store *s = (pg_store *)base;
	pg_params prm = {0};
	pg_text(&prm, kind == STORE_ID_WORKFLOW ? "workflow_seq" : "event_seq");
	pg_int(&prm, n);
	PGresult *r = writer_run(s, W_NEXT_ID, &prm, PGRES_TUPLES_OK, "taking ids", err);
	if (!r)
		return err->code;
	int rc = PQntuples(r) == 1 ? BATON_OK
				   : err_set(err, BATON_ECORRUPT, "baton_meta has no counter");
	if (rc == BATON_OK)
		*first = pg_col_int(r, 0, 0) - n + 1;
	PQclear(r);
	return rc;
}

static int pg_find_workflow(store *base, const char *id, char **def, int *status, baton_error *err)
{
	pg_store *s = (pg_store *)base;
	pg_params prm = {0};
	pg_text(&prm, id);
	PGresult *r = writer_run(s, W_FIND, &prm, PGRES_TUPLES_OK, "looking up a workflow", err);
	if (!r)
		return err->code;
	int rc = BATON_OK;
	if (PQntuples(r) == 0) {
		rc = BATON_ENOTFOUND;
	} else {
		*def = xstrdup(PQgetvalue(r, 0, 0));
		*status = wf_status_parse(PQgetvalue(r, 0, 1));
	}
	PQclear(r);
	return rc;
}

void pg_parts_text(uint64_t parts, char *out, size_t n)
{
	size_t len = (size_t)snprintf(out, n, "{");
	for (int p = 0; p < PARTS && len < n; p++)
		if (parts >> p & 1)
			len += (size_t)snprintf(out + len, n - len, "%s%d", len > 1 ? "," : "", p);
	if (len < n)
		snprintf(out + len, n - len, "}");
}

int pg_load_where(pg_store *s, const char *where, uint64_t parts, void (*fn)(void *ctx, wf_row *wf),
		  void *ctx, baton_error *err)
{
	char sql[1024], arr[PARTS * 3 + 3];
	snprintf(sql, sizeof sql,
		 "SELECT " PG_WF_READ_COLS ", (SELECT definition FROM definitions d"
		 " WHERE d.workflow_seq = workflows.seq), adopted FROM workflows WHERE %s"
		 " ORDER BY seq",
		 where);
	pg_parts_text(parts, arr, sizeof arr);
	pg_params prm = {0};
	pg_text(&prm, arr);
	prm.fmt[0] = 0;
	PGresult *q = PQexecParams(s->w, sql, prm.n, NULL, prm.v, prm.len, prm.fmt, 0);
	if (PQresultStatus(q) != PGRES_TUPLES_OK) {
		int rc = pg_fail(s->w, q, err, "loading workflows");
		PQclear(q);
		return rc;
	}
	int rc = BATON_OK;
	for (int i = 0; rc == BATON_OK && i < PQntuples(q); i++) {
		wf_row *wf = pg_read_wf(q, i);
		wf->definition = PQgetisnull(q, i, 14) ? xstrdup("") : pg_col_str(q, i, 14);
		/* Submitted on another node: its first write here adopts it. */
		wf->dirty = PQgetvalue(q, i, 15)[0] != 't';
		prm.n = 0;
		pg_int(&prm, wf->seq);
		PGresult *st =
		    PQexecParams(s->w,
				 "SELECT " PG_STEP_COLS " FROM steps WHERE workflow_seq=$1"
				 " ORDER BY idx",
				 prm.n, NULL, prm.v, prm.len, prm.fmt, 0);
		if (PQresultStatus(st) != PGRES_TUPLES_OK)
			rc = pg_fail(s->w, st, err, "loading steps");
		else if (pg_read_steps(st, wf->definition, wf))
			rc = err_set(err, BATON_ECORRUPT, "workflow %s: its steps do not match",
				     wf->id);
		PQclear(st);
		if (rc)
			wf_row_free(wf);
		else
			fn(ctx, wf);
	}
	PQclear(q);
	return rc;
}

static int pg_load(store *base, uint64_t parts, void (*wf_fn)(void *ctx, wf_row *wf), void *ctx,
		   int64_t *lock_seq, baton_error *err)
{
	pg_store *s = (pg_store *)base;
	int rc = pg_writer(s, err);
	if (rc)
		return rc;
	rc = pg_exec_ok(s->w, "BEGIN ISOLATION LEVEL REPEATABLE READ", err, "begin");
	if (rc)
		return rc;
	PGresult *r = PQexec(s->w, "SELECT coalesce(max(lock_seq), 0) FROM steps"
				   " WHERE status = 'waiting'");
	if (PQresultStatus(r) == PGRES_TUPLES_OK)
		*lock_seq = pg_col_int(r, 0, 0);
	else
		rc = pg_fail(s->w, r, err, "reading the lock queue");
	PQclear(r);
	if (rc == BATON_OK)
		rc = pg_load_where(s, "status IN ('pending', 'running') AND part = ANY($1)", parts,
				   wf_fn, ctx, err);
	pg_exec_ok(s->w, "COMMIT", NULL, "commit");
	if (rc)
		pg_writer_failed(s);
	return rc;
}

static int pg_delete_workflows(store *base, const char *id, int64_t before, int max,
			       store_deleted_fn fn, void *ctx, int *n, baton_error *err)
{
	pg_store *s = (pg_store *)base;
	pg_params prm = {0};
	if (id) {
		pg_text(&prm, id);
	} else {
		pg_int(&prm, before);
		pg_int(&prm, max);
	}
	PGresult *r = writer_run(s, id ? W_DELETE_ONE : W_DELETE_OLD, &prm, PGRES_TUPLES_OK,
				 "deleting workflows", err);
	if (!r)
		return err->code;
	*n = PQntuples(r);
	for (int i = 0; i < *n; i++)
		fn(ctx, PQgetvalue(r, i, 0));
	PQclear(r);
	if (!id || *n)
		return BATON_OK;
	char *def = NULL;
	int status, rc = pg_find_workflow(base, id, &def, &status, err);
	free(def);
	if (rc == BATON_ENOTFOUND)
		return err_set(err, BATON_ENOTFOUND, "no workflow with id \"%s\"", id);
	return rc ? rc
		  : err_set(err, BATON_ECONFLICT,
			    "workflow \"%s\" has not finished; cancel it first", id);
}

/* A copy of a PostgreSQL database is made by PostgreSQL's own tools. */
static int pg_backup(store *base, const char *path, baton_error *err)
{
	(void)base;
	(void)path;
	return err_set(err, BATON_ECONFLICT,
		       "the PostgreSQL store is backed up with PostgreSQL's own tools (pg_dump, or "
		       "pg_basebackup with WAL archiving), not through batond");
}

const store_ops pg_store_ops = {
    .name = "postgresql",
    .open = pg_open,
    .close = pg_close,
    .write = pg_write,
    .next_ids = pg_next_ids,
    .find_workflow = pg_find_workflow,
    .load = pg_load,
    .read_workflow = pg_read_workflow,
    .list_workflows = pg_list_workflows,
    .read_events = pg_read_events,
    .read_resource = pg_read_resource,
    .list_resources = pg_list_resources,
    .count_workflows = pg_count_workflows,
    .ping = pg_ping,
    .delete_workflows = pg_delete_workflows,
    .backup = pg_backup,
    .join = pg_join,
    .advertise = pg_advertise,
    .leave = pg_leave,
    .owned = pg_owned,
    .release = pg_release,
    .load_inbox = pg_load_inbox,
    .request_cancel = pg_request_cancel,
    .list_nodes = pg_list_nodes,
    .cluster_stats = pg_cluster_stats,
};
