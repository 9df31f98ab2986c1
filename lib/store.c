/*
 * store.c - baton's SQLite store: the only file that includes sqlite3.h.
 *
 * Design. One read-write connection belongs to the engine thread, which is the only
 * writer: it wraps each group commit in BEGIN IMMEDIATE ... COMMIT, so the checkpoints
 * of every workflow that moved since the last commit share one transaction and one
 * fsync. Queries from other threads use a small pool of read-only connections; in WAL
 * mode they never block the writer and always see the last committed state.
 * Durability: WAL with synchronous=FULL (NORMAL may lose the last commits on power
 * loss). Every statement is prepared once per connection and finalized on close.
 * A PostgreSQL store would implement the same functions (internal.h) and nothing else.
 *
 * Schema (user_version 2): workflows, steps (one row per worker), events (append-only
 * history, global sequence), resources (fencing-token high-water mark, holder and
 * totals). A database of version 1 is migrated when opened.
 *
 * Events. One row holds a run of consecutive events of one workflow (a step's end, its
 * release, the next request and grant: four events, one row), as a JSON array; their
 * seqs are consecutive, from the row's seq to its last_seq, so rows never interleave.
 * A history read starts at the row that holds `after` and expands the rows it reads.
 *
 * Cost. A durable step is one commit, and what a commit costs grows with the pages it
 * writes: a step of a lone workflow writes about six (its workflow row, its step rows,
 * its event row and its two index entries, its resource row). Hence what the schema
 * does not have: no index on running steps (the resource row names its holder), and no
 * UPDATE of an indexed column that did not change. Events stay in a rowid table in seq
 * order: appending there costs one page, where a table clustered by workflow split its
 * pages (tried: 2.8 pages per commit for the events alone).
 */
#include "internal.h"

#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

#define SCHEMA_VERSION 2

/* lock: 1 when one of the row's events is in a resource's history (see LOCK_TYPES). */
#define EVENTS_SQL                                                                                 \
	"CREATE TABLE events ("                                                                    \
	"  seq INTEGER PRIMARY KEY, last_seq INTEGER NOT NULL, workflow_seq INTEGER NOT NULL,"     \
	"  resource TEXT NOT NULL, lock INTEGER NOT NULL, data TEXT NOT NULL);"                    \
	"CREATE INDEX events_workflow ON events(workflow_seq, seq);"                               \
	"CREATE INDEX events_resource ON events(resource, seq) WHERE lock;"

/* The event types of a resource's history (as machine_resource_event says). */
#define LOCK_TYPES "'lock_requested', 'lock_acquired', 'lock_released', 'workflow_cancelled'"

static const char schema_sql[] =
    "CREATE TABLE workflows ("
    "  seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, resource TEXT NOT NULL,"
    "  on_failure TEXT NOT NULL, status TEXT NOT NULL,"
    "  cancel_requested INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL,"
    "  started_at INTEGER, finished_at INTEGER, steps_total INTEGER NOT NULL,"
    "  steps_completed INTEGER NOT NULL DEFAULT 0, result TEXT, error TEXT,"
    "  retry TEXT NOT NULL);"
    /* Written once: a workflow's row is rewritten at every step, its definition never. */
    "CREATE TABLE definitions ("
    "  workflow_seq INTEGER PRIMARY KEY, definition TEXT NOT NULL);"
    "CREATE INDEX workflows_status ON workflows(status, seq);"
    "CREATE INDEX workflows_resource ON workflows(resource, seq);"
    "CREATE TABLE steps ("
    "  workflow_seq INTEGER NOT NULL, idx INTEGER NOT NULL, worker TEXT NOT NULL,"
    "  resource TEXT NOT NULL, params TEXT NOT NULL, status TEXT NOT NULL,"
    "  attempts INTEGER NOT NULL DEFAULT 0, lock_seq INTEGER, requested_at INTEGER,"
    "  fencing_token INTEGER, started_at INTEGER, finished_at INTEGER, duration_ms INTEGER,"
    "  next_attempt_at INTEGER, error TEXT, result TEXT,"
    "  PRIMARY KEY (workflow_seq, idx)) WITHOUT ROWID;"
    /* Partial: only the few waiting and running steps are indexed, and only their
     * transitions touch the index. */
    "CREATE INDEX steps_waiting ON steps(resource, lock_seq) WHERE status = 'waiting';" EVENTS_SQL
    "CREATE TABLE resources ("
    "  name TEXT PRIMARY KEY, last_token INTEGER NOT NULL, grants INTEGER NOT NULL,"
    "  total_hold_ms INTEGER NOT NULL, max_hold_ms INTEGER NOT NULL,"
    "  total_wait_ms INTEGER NOT NULL, max_wait_ms INTEGER NOT NULL,"
    "  holder_seq INTEGER, holder_idx INTEGER) WITHOUT ROWID;"
    "PRAGMA user_version = 2;";

/* Version 1 to 2: an event row per event becomes a row of one event; the running-steps
 * index is replaced by the holder in the resource row. */
static const char migrate_v1_sql[] =
    "ALTER TABLE events RENAME TO events_v1;"
    "DROP INDEX events_workflow;"
    "DROP INDEX events_resource;" EVENTS_SQL
    "INSERT INTO events (seq, last_seq, workflow_seq, resource, lock, data)"
    "  SELECT seq, seq, workflow_seq, resource, type IN (" LOCK_TYPES "),"
    "  json_array(json_patch(json_object('seq', seq, 'ts', ts, 'type', type), data))"
    "  FROM events_v1;"
    "DROP TABLE events_v1;"
    "ALTER TABLE resources ADD COLUMN holder_seq INTEGER;"
    "ALTER TABLE resources ADD COLUMN holder_idx INTEGER;"
    "UPDATE resources SET (holder_seq, holder_idx) = (SELECT workflow_seq, idx FROM steps"
    "  WHERE steps.resource = resources.name AND status = 'running');"
    "DROP INDEX steps_running;"
    "PRAGMA user_version = 2;";

#define WF_COLS                                                                                    \
	"seq, id, resource, on_failure, status, cancel_requested, created_at, started_at,"         \
	" finished_at, steps_total, steps_completed, result, error, retry"
#define STEP_COLS                                                                                  \
	"idx, worker, params, status, attempts, lock_seq, requested_at, fencing_token,"            \
	" started_at, finished_at, duration_ms, next_attempt_at, error, result"

/* Writer statements, prepared once on the engine's connection. */
enum {
	W_BEGIN,
	W_COMMIT,
	W_ROLLBACK,
	W_INS_WF,
	W_INS_DEF,
	W_GET_DEF,
	W_UPD_WF,
	W_UPD_WF_PROGRESS,
	W_INS_STEP,
	W_UPD_STEP,
	W_INS_EVENT,
	W_PUT_RES,
	W_FIND_DEF,
	W_NSTMT
};
static const char *const writer_sql[W_NSTMT] = {
    [W_BEGIN] = "BEGIN IMMEDIATE",
    [W_COMMIT] = "COMMIT",
    [W_ROLLBACK] = "ROLLBACK",
    [W_INS_WF] = "INSERT INTO workflows (" WF_COLS ") VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
    [W_INS_DEF] = "INSERT INTO definitions (workflow_seq, definition) VALUES (?,?)",
    [W_GET_DEF] = "SELECT definition FROM definitions WHERE workflow_seq=?",
    [W_UPD_WF] = "UPDATE workflows SET status=?2, cancel_requested=?3, started_at=?4,"
		 " finished_at=?5, steps_completed=?6, result=?7, error=?8 WHERE seq=?1",
    /* The same without status: an UPDATE that sets an indexed column rewrites its index
     * entry even when the value stays, and most steps do not change the status. */
    [W_UPD_WF_PROGRESS] = "UPDATE workflows SET cancel_requested=?3, started_at=?4,"
			  " finished_at=?5, steps_completed=?6, result=?7, error=?8"
			  " WHERE seq=?1",
    [W_INS_STEP] = "INSERT INTO steps (workflow_seq, resource, " STEP_COLS
		   ") VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
    [W_UPD_STEP] = "UPDATE steps SET status=?4, attempts=?5, lock_seq=?6, requested_at=?7,"
		   " fencing_token=?8, started_at=?9, finished_at=?10, duration_ms=?11,"
		   " next_attempt_at=?12, error=?13, result=?14"
		   " WHERE workflow_seq=?1 AND idx=?2",
    [W_INS_EVENT] = "INSERT INTO events (seq, last_seq, workflow_seq, resource, lock, data)"
		    " VALUES (?,?,?,?,?,?)",
    [W_PUT_RES] = "INSERT INTO resources (name, last_token, grants, total_hold_ms,"
		  " max_hold_ms, total_wait_ms, max_wait_ms, holder_seq, holder_idx)"
		  " VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9)"
		  " ON CONFLICT (name) DO UPDATE SET last_token=?2, grants=?3,"
		  " total_hold_ms=?4, max_hold_ms=?5, total_wait_ms=?6, max_wait_ms=?7,"
		  " holder_seq=?8, holder_idx=?9",

    [W_FIND_DEF] = "SELECT d.definition, w.status FROM workflows w"
		   " JOIN definitions d ON d.workflow_seq = w.seq WHERE w.id=?",
};

/* Reader statements, prepared on first use on each pooled connection. */
enum {
	R_WF_BY_ID,
	R_STEPS,
	R_QUEUE_POS,
	R_EVENTS,
	R_RESOURCES,
	R_RESOURCE,
	R_HOLDER,
	R_WAITERS,
	R_QUEUE_LEN,
	R_RES_EVENTS,
	R_WF_COUNTS,
	R_BEGIN,
	R_COMMIT,
	R_NSTMT
};
static const char *const reader_sql[R_NSTMT] = {
    [R_WF_BY_ID] = "SELECT " WF_COLS " FROM workflows WHERE id=?",
    [R_STEPS] = "SELECT " STEP_COLS " FROM steps WHERE workflow_seq=? ORDER BY idx",
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

typedef struct reader {
	sqlite3 *db;
	sqlite3_stmt *stmt[R_NSTMT];
	struct reader *next_free;
} reader;

/* WAL pages after which the checkpointer copies the WAL back into the database. */
#define CHECKPOINT_FRAMES 1000
/* The writer finishes a checkpoint itself when at most this many pages are left... */
#define FINISH_FRAMES 256
/* ...or, whatever is left, once the WAL holds this many (the checkpointer fell behind). */
#define FORCE_FRAMES (8 * CHECKPOINT_FRAMES)

/*
 * Checkpoints run on their own thread and connection (PASSIVE: they never block the
 * writer), woken by the writer's WAL hook, so that the engine thread never pays for
 * copying most of the WAL into the database file.
 *
 * But SQLite starts the WAL over from its beginning only when a write transaction
 * begins with every frame copied back, and under steady load the writer appends between
 * any two passes of the checkpointer, which therefore never catches up: the WAL would
 * grow without end, and each commit would extend the file, so that its fsync also has
 * to write the file's size and new block map (an extra disk write per commit). So once
 * the checkpointer has copied all but the last few pages, the writer copies those
 * itself, right after a commit; its next transaction then reuses the WAL from the
 * start, overwriting blocks that already exist.
 */
typedef struct checkpointer {
	sqlite3 *db;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int pending, stop, started;
	int backfilled; /* pages of the WAL the last pass had copied (under mu) */
	int frames;	/* pages in the WAL after the writer's last commit (writer only) */
} checkpointer;

#define FINISHED_SLOTS 1024
typedef struct finished_slot {
	char id[MAX_NAME + 1];
	char *text; /* compact JSON and a newline */
	size_t len;
} finished_slot;

struct store {
	sqlite3 *db;
	checkpointer ckpt;
	pthread_mutex_t finished_mu;
	finished_slot finished[FINISHED_SLOTS];
	sqlite3_stmt *stmt[W_NSTMT];
	reader *readers;
	int nreaders;
	pthread_mutex_t pool_mu;
	pthread_cond_t pool_cv;
	reader *free_readers;
};

/* Maps a SQLite result code to baton's and copies the connection's message at once. */
static int fail(sqlite3 *db, int rc, baton_error *err, const char *what)
{
	int code;
	switch (rc & 0xff) {
	case SQLITE_BUSY:
	case SQLITE_LOCKED:
		code = BATON_EBUSY;
		break;
	case SQLITE_IOERR:
	case SQLITE_FULL:
	case SQLITE_CANTOPEN:
	case SQLITE_READONLY:
	case SQLITE_PERM:
		code = BATON_EIO;
		break;
	case SQLITE_CORRUPT:
	case SQLITE_NOTADB:
	case SQLITE_SCHEMA:
		code = BATON_ECORRUPT;
		break;
	default:
		code = BATON_EINTERNAL;
	}
	return err_set(err, code, "%s: %s", what, db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
}

static void bind_text(sqlite3_stmt *st, int i, const char *s)
{
	if (s)
		sqlite3_bind_text(st, i, s, -1, SQLITE_TRANSIENT);
	else
		sqlite3_bind_null(st, i);
}

static void bind_time(sqlite3_stmt *st, int i, int64_t v)
{
	if (v)
		sqlite3_bind_int64(st, i, v);
	else
		sqlite3_bind_null(st, i);
}

/* Binds a JSON value as compact text; NULL binds SQL NULL. */
static void bind_json(sqlite3_stmt *st, int i, const json_t *v)
{
	char *s = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
	if (s)
		sqlite3_bind_text(st, i, s, -1, free);
	else
		sqlite3_bind_null(st, i);
}

/* Runs a prepared statement that returns no row, and resets it. */
static int exec_stmt(sqlite3 *db, sqlite3_stmt *st, baton_error *err, const char *what)
{
	int rc = sqlite3_step(st);
	sqlite3_reset(st);
	sqlite3_clear_bindings(st);
	if (rc != SQLITE_DONE)
		return fail(db, rc, err, what);
	return BATON_OK;
}

static int exec_sql(sqlite3 *db, const char *sql, baton_error *err)
{
	int rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
	return rc == SQLITE_OK ? BATON_OK : fail(db, rc, err, sql);
}

static int open_conn(const char *path, const char *vfs, int flags, sqlite3 **out, baton_error *err)
{
	sqlite3 *db = NULL;
	int rc = sqlite3_open_v2(path, &db, flags | SQLITE_OPEN_NOMUTEX, vfs);
	if (rc != SQLITE_OK) {
		rc = fail(db, rc, err, path);
		sqlite3_close(db);
		return rc;
	}
	sqlite3_busy_timeout(db, 5000);
	sqlite3_extended_result_codes(db, 1);
	*out = db;
	return BATON_OK;
}

static int user_version(sqlite3 *db, int *v, baton_error *err)
{
	sqlite3_stmt *st;
	int rc = sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL);
	if (rc != SQLITE_OK)
		return fail(db, rc, err, "reading the schema version");
	rc = sqlite3_step(st);
	*v = sqlite3_column_int(st, 0);
	sqlite3_finalize(st);
	return rc == SQLITE_ROW ? BATON_OK : fail(db, rc, err, "reading the schema version");
}

/* WAL, synchronous=FULL, and the schema (created or checked in one transaction). */
static int setup_writer(store *s, const char *path, baton_error *err)
{
	int rc, v = 0;
	/* FULL: durable at every commit, and vfs.c's gathering of WAL writes relies on it. */
	if ((rc = exec_sql(s->db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;", err)) ||
	    (rc = exec_sql(s->db, "BEGIN IMMEDIATE", err)))
		return rc;
	if ((rc = user_version(s->db, &v, err)) == BATON_OK) {
		if (v == 0)
			rc = exec_sql(s->db, schema_sql, err);
		else if (v == 1)
			rc = exec_sql(s->db, migrate_v1_sql, err);
		else if (v != SCHEMA_VERSION)
			rc = err_set(err, BATON_ECORRUPT,
				     "%s: schema version %d is not one this batond knows (%d)",
				     path, v, SCHEMA_VERSION);
	}
	if (rc) {
		exec_sql(s->db, "ROLLBACK", NULL);
		return rc;
	}
	if ((rc = exec_sql(s->db, "COMMIT", err)))
		return rc;
	for (int i = 0; i < W_NSTMT; i++) {
		int r = sqlite3_prepare_v3(s->db, writer_sql[i], -1, SQLITE_PREPARE_PERSISTENT,
					   &s->stmt[i], NULL);
		if (r != SQLITE_OK)
			return fail(s->db, r, err, "preparing statements");
	}
	return BATON_OK;
}

static void *checkpoint_main(void *arg)
{
	checkpointer *c = arg;
	pthread_setname_np(pthread_self(), "baton-ckpt");
	pthread_mutex_lock(&c->mu);
	for (;;) {
		while (!c->pending && !c->stop)
			pthread_cond_wait(&c->cv, &c->mu);
		if (c->stop)
			break;
		c->pending = 0;
		pthread_mutex_unlock(&c->mu);
		int copied = 0;
		sqlite3_wal_checkpoint_v2(c->db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, &copied);
		pthread_mutex_lock(&c->mu);
		c->backfilled = copied;
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

static int on_wal_commit(void *ud, sqlite3 *db, const char *name, int frames)
{
	checkpointer *c = ud;
	(void)db;
	(void)name;
	c->frames = frames;
	if (frames >= CHECKPOINT_FRAMES) {
		pthread_mutex_lock(&c->mu);
		c->pending = 1;
		pthread_cond_signal(&c->cv);
		pthread_mutex_unlock(&c->mu);
	}
	return SQLITE_OK;
}

static int start_checkpointer(store *s, const char *path, const char *vfs, baton_error *err)
{
	checkpointer *c = &s->ckpt;
	int rc = open_conn(path, vfs, SQLITE_OPEN_READWRITE, &c->db, err);
	if (rc)
		return rc;
	exec_sql(c->db, "PRAGMA cache_size=-64", NULL);
	if (pthread_create(&c->thread, NULL, checkpoint_main, c) != 0)
		return err_set(err, BATON_EINTERNAL, "cannot start the checkpoint thread");
	c->started = 1;
	sqlite3_wal_hook(s->db, on_wal_commit, c); /* replaces the automatic checkpoints */
	return BATON_OK;
}

static void stop_checkpointer(checkpointer *c)
{
	if (c->started) {
		pthread_mutex_lock(&c->mu);
		c->stop = 1;
		pthread_cond_signal(&c->cv);
		pthread_mutex_unlock(&c->mu);
		pthread_join(c->thread, NULL);
	}
	sqlite3_close(c->db);
}

int store_open(const char *path, const char *vfs, int readers, store **out, baton_error *err)
{
	store *s = xcalloc(1, sizeof *s);
	pthread_mutex_init(&s->pool_mu, NULL);
	pthread_cond_init(&s->pool_cv, NULL);
	pthread_mutex_init(&s->ckpt.mu, NULL);
	pthread_cond_init(&s->ckpt.cv, NULL);
	pthread_mutex_init(&s->finished_mu, NULL);
	int rc = open_conn(path, vfs, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, &s->db, err);
	if (rc == BATON_OK)
		rc = setup_writer(s, path, err);
	if (rc == BATON_OK)
		rc = start_checkpointer(s, path, vfs, err);
	s->readers = xcalloc((size_t)readers, sizeof *s->readers);
	for (int i = 0; rc == BATON_OK && i < readers; i++) {
		rc = open_conn(path, vfs, SQLITE_OPEN_READONLY, &s->readers[i].db, err);
		/* Bounded memory: 512 KiB of page cache per reader (the writer keeps 2 MiB). */
		if (rc == BATON_OK)
			exec_sql(s->readers[i].db, "PRAGMA cache_size=-512", NULL);
		if (rc == BATON_OK) {
			s->nreaders++;
			s->readers[i].next_free = s->free_readers;
			s->free_readers = &s->readers[i];
		}
	}
	if (rc) {
		store_close(s);
		return rc;
	}
	*out = s;
	return BATON_OK;
}

void store_close(store *s)
{
	if (!s)
		return;
	stop_checkpointer(&s->ckpt);
	for (int i = 0; i < s->nreaders; i++) {
		for (int j = 0; j < R_NSTMT; j++)
			sqlite3_finalize(s->readers[i].stmt[j]);
		sqlite3_close(s->readers[i].db);
	}
	free(s->readers);
	for (int i = 0; i < W_NSTMT; i++)
		sqlite3_finalize(s->stmt[i]);
	sqlite3_close(s->db);
	pthread_cond_destroy(&s->pool_cv);
	pthread_mutex_destroy(&s->pool_mu);
	pthread_cond_destroy(&s->ckpt.cv);
	pthread_mutex_destroy(&s->ckpt.mu);
	for (int i = 0; i < FINISHED_SLOTS; i++)
		free(s->finished[i].text);
	pthread_mutex_destroy(&s->finished_mu);
	free(s);
}

/* ---- writer side: the engine thread only ---- */

int store_begin(store *s, baton_error *err)
{
	return exec_stmt(s->db, s->stmt[W_BEGIN], err, "begin");
}

/* After a commit: copies the WAL's last pages back when that lets the WAL start over. */
static void finish_checkpoint(store *s)
{
	checkpointer *c = &s->ckpt;
	if (!c->started || c->frames < CHECKPOINT_FRAMES)
		return;
	pthread_mutex_lock(&c->mu);
	int left = c->frames - c->backfilled;
	pthread_mutex_unlock(&c->mu);
	if (left > FINISH_FRAMES && c->frames < FORCE_FRAMES)
		return;
	/* PASSIVE: returns at once if the checkpointer holds the checkpoint lock. A failure
	 * costs nothing but the WAL's length: the next commit tries again. */
	if (sqlite3_wal_checkpoint_v2(s->db, NULL, SQLITE_CHECKPOINT_PASSIVE, NULL, NULL) ==
	    SQLITE_OK) {
		pthread_mutex_lock(&c->mu);
		c->backfilled = 0;
		pthread_mutex_unlock(&c->mu);
		c->frames = 0;
	}
}

int store_commit(store *s, baton_error *err)
{
	int rc = exec_stmt(s->db, s->stmt[W_COMMIT], err, "commit");
	if (rc == BATON_OK)
		finish_checkpoint(s);
	return rc;
}

void store_rollback(store *s)
{
	if (!sqlite3_get_autocommit(s->db))
		exec_stmt(s->db, s->stmt[W_ROLLBACK], NULL, "rollback");
}

/* A step's changing columns, in STEP_COLS order from status on, at parameters first.. */
static void bind_step_state(sqlite3_stmt *st, int first, const step_row *r)
{
	bind_text(st, first, step_status_name(r->status));
	sqlite3_bind_int(st, first + 1, r->attempts);
	bind_time(st, first + 2, r->lock_seq);
	bind_time(st, first + 3, r->requested_at);
	bind_time(st, first + 4, r->token);
	bind_time(st, first + 5, r->started_at);
	bind_time(st, first + 6, r->finished_at);
	if (r->duration_ms >= 0)
		sqlite3_bind_int64(st, first + 7, r->duration_ms);
	bind_time(st, first + 8, r->next_attempt_at);
	bind_text(st, first + 9, r->error);
	bind_json(st, first + 10, r->result);
}

int store_insert_workflow(store *s, const wf_row *wf, baton_error *err)
{
	sqlite3_stmt *st = s->stmt[W_INS_WF];
	sqlite3_bind_int64(st, 1, wf->seq);
	bind_text(st, 2, wf->id);
	bind_text(st, 3, wf->resource);
	bind_text(st, 4, wf->on_failure == ON_FAILURE_CONTINUE ? "continue" : "fail");
	bind_text(st, 5, wf_status_name(wf->status));
	sqlite3_bind_int(st, 6, wf->cancel_requested);
	sqlite3_bind_int64(st, 7, wf->created_at);
	bind_time(st, 8, wf->started_at);
	bind_time(st, 9, wf->finished_at);
	sqlite3_bind_int(st, 10, wf->steps_total);
	sqlite3_bind_int(st, 11, wf->steps_completed);
	bind_json(st, 12, wf->result);
	bind_text(st, 13, wf->error);
	char *retry = codec_retry_text(&wf->retry);
	sqlite3_bind_text(st, 14, retry, -1, free);
	int rc = exec_stmt(s->db, st, err, "inserting a workflow");
	if (rc == BATON_OK) {
		st = s->stmt[W_INS_DEF];
		sqlite3_bind_int64(st, 1, wf->seq);
		bind_text(st, 2, wf->definition);
		rc = exec_stmt(s->db, st, err, "inserting a definition");
	}
	st = s->stmt[W_INS_STEP];
	for (int i = 0; rc == BATON_OK && i < wf->steps_total; i++) {
		const step_row *r = &wf->steps[i];
		sqlite3_bind_int64(st, 1, wf->seq);
		bind_text(st, 2, wf->resource);
		sqlite3_bind_int(st, 3, r->index);
		bind_text(st, 4, r->worker);
		bind_json(st, 5, r->params);
		bind_step_state(st, 6, r);
		rc = exec_stmt(s->db, st, err, "inserting a step");
	}
	return rc;
}

int store_update_workflow(store *s, const wf_row *wf, baton_error *err)
{
	int same = wf->status == wf->stored_status;
	sqlite3_stmt *st = s->stmt[same ? W_UPD_WF_PROGRESS : W_UPD_WF];
	sqlite3_bind_int64(st, 1, wf->seq);
	if (!same)
		bind_text(st, 2, wf_status_name(wf->status));
	sqlite3_bind_int(st, 3, wf->cancel_requested);
	bind_time(st, 4, wf->started_at);
	bind_time(st, 5, wf->finished_at);
	sqlite3_bind_int(st, 6, wf->steps_completed);
	bind_json(st, 7, wf->result);
	bind_text(st, 8, wf->error);
	return exec_stmt(s->db, st, err, "updating a workflow");
}

int store_update_step(store *s, const wf_row *wf, const step_row *r, baton_error *err)
{
	sqlite3_stmt *st = s->stmt[W_UPD_STEP];
	sqlite3_bind_int64(st, 1, wf->seq);
	sqlite3_bind_int(st, 2, r->index);
	bind_step_state(st, 4, r);
	return exec_stmt(s->db, st, err, "updating a step");
}

int store_insert_events(store *s, int64_t seq, int64_t last_seq, const wf_row *wf, int lock,
			const char *json, size_t len, baton_error *err)
{
	sqlite3_stmt *st = s->stmt[W_INS_EVENT];
	sqlite3_bind_int64(st, 1, seq);
	sqlite3_bind_int64(st, 2, last_seq);
	sqlite3_bind_int64(st, 3, wf->seq);
	bind_text(st, 4, wf->resource);
	sqlite3_bind_int(st, 5, lock);
	sqlite3_bind_text(st, 6, json, (int)len, SQLITE_STATIC);
	return exec_stmt(s->db, st, err, "inserting events");
}

int store_put_resource(store *s, const resource_row *r, baton_error *err)
{
	sqlite3_stmt *st = s->stmt[W_PUT_RES];
	bind_text(st, 1, r->name);
	sqlite3_bind_int64(st, 2, r->last_token);
	sqlite3_bind_int64(st, 3, r->grants);
	sqlite3_bind_int64(st, 4, r->total_hold_ms);
	sqlite3_bind_int64(st, 5, r->max_hold_ms);
	sqlite3_bind_int64(st, 6, r->total_wait_ms);
	sqlite3_bind_int64(st, 7, r->max_wait_ms);
	if (r->holder_seq) {
		sqlite3_bind_int64(st, 8, r->holder_seq);
		sqlite3_bind_int(st, 9, r->holder_idx);
	}
	return exec_stmt(s->db, st, err, "updating a resource");
}

int store_find_workflow(store *s, const char *id, char **def, int *status, baton_error *err)
{
	sqlite3_stmt *st = s->stmt[W_FIND_DEF];
	bind_text(st, 1, id);
	int rc = sqlite3_step(st);
	int out = BATON_OK;
	if (rc == SQLITE_ROW) {
		*def = xstrdup((const char *)sqlite3_column_text(st, 0));
		*status = wf_status_parse((const char *)sqlite3_column_text(st, 1));
	} else if (rc == SQLITE_DONE)
		out = BATON_ENOTFOUND;
	else
		out = fail(s->db, rc, err, "looking up a workflow");
	sqlite3_reset(st);
	sqlite3_clear_bindings(st);
	return out;
}

static int64_t query_int(sqlite3 *db, const char *sql)
{
	sqlite3_stmt *st;
	int64_t v = 0;
	if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK &&
	    sqlite3_step(st) == SQLITE_ROW)
		v = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	return v;
}

int store_counters_load(store *s, store_counters *c, baton_error *err)
{
	c->wf_seq = query_int(s->db, "SELECT coalesce(max(seq), 0) FROM workflows");
	c->event_seq = query_int(s->db, "SELECT last_seq FROM events ORDER BY seq DESC LIMIT 1");
	c->lock_seq = query_int(s->db, "SELECT coalesce(max(lock_seq), 0) FROM steps");
	return BATON_OK;
}

static char *column_strdup(sqlite3_stmt *st, int i)
{
	const unsigned char *t = sqlite3_column_text(st, i);
	return t ? xstrdup((const char *)t) : NULL;
}

static json_t *column_json(sqlite3_stmt *st, int i)
{
	const unsigned char *t = sqlite3_column_text(st, i);
	return t ? json_loads((const char *)t, JSON_DECODE_ANY, NULL) : NULL;
}

/* Fills a workflow row from a row of WF_COLS. */
static wf_row *read_wf(sqlite3_stmt *st)
{
	wf_row *wf = xcalloc(1, sizeof *wf);
	wf->seq = sqlite3_column_int64(st, 0);
	wf->id = column_strdup(st, 1);
	wf->resource = column_strdup(st, 2);
	wf->on_failure = strcmp((const char *)sqlite3_column_text(st, 3), "continue") == 0
			     ? ON_FAILURE_CONTINUE
			     : ON_FAILURE_FAIL;
	wf->status = wf_status_parse((const char *)sqlite3_column_text(st, 4));
	wf->stored_status = wf->status;
	wf->cancel_requested = sqlite3_column_int(st, 5);
	wf->created_at = sqlite3_column_int64(st, 6);
	wf->started_at = sqlite3_column_int64(st, 7);
	wf->finished_at = sqlite3_column_int64(st, 8);
	wf->steps_total = 0; /* counts the step rows read */
	wf->steps_completed = sqlite3_column_int(st, 10);
	wf->result = column_json(st, 11);
	wf->error = column_strdup(st, 12);
	codec_parse_retry((const char *)sqlite3_column_text(st, 13), &wf->retry);
	return wf;
}

/* Reads the steps of wf (STEP_COLS, ordered by idx); returns a SQLite code. */
static int read_steps(sqlite3_stmt *st, wf_row *wf, int capacity)
{
	sqlite3_bind_int64(st, 1, wf->seq);
	int rc;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW && wf->steps_total < capacity) {
		step_row *r = &wf->steps[wf->steps_total++];
		r->index = sqlite3_column_int(st, 0);
		r->worker = column_strdup(st, 1);
		r->params = column_json(st, 2);
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
		r->error = column_strdup(st, 12);
		r->result = column_json(st, 13);
	}
	sqlite3_reset(st);
	return rc == SQLITE_ROW ? SQLITE_DONE : rc;
}

/* The stored definition of a workflow (malloc'd), for the engine's re-POST checks. */
static char *load_definition(store *s, int64_t seq)
{
	sqlite3_stmt *st = s->stmt[W_GET_DEF];
	sqlite3_bind_int64(st, 1, seq);
	char *def = sqlite3_step(st) == SQLITE_ROW ? column_strdup(st, 0) : NULL;
	sqlite3_reset(st);
	return def ? def : xstrdup("");
}

int store_load_resources(store *s, void (*fn)(void *ctx, resource_row *r), void *ctx,
			 baton_error *err)
{
	sqlite3_stmt *st;
	int rc = sqlite3_prepare_v2(s->db,
				    "SELECT name, last_token, grants, total_hold_ms, max_hold_ms,"
				    " total_wait_ms, max_wait_ms FROM resources",
				    -1, &st, NULL);
	if (rc != SQLITE_OK)
		return fail(s->db, rc, err, "loading resources");
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		resource_row r = {
		    .name = column_strdup(st, 0),
		    .last_token = sqlite3_column_int64(st, 1),
		    .grants = sqlite3_column_int64(st, 2),
		    .total_hold_ms = sqlite3_column_int64(st, 3),
		    .max_hold_ms = sqlite3_column_int64(st, 4),
		    .total_wait_ms = sqlite3_column_int64(st, 5),
		    .max_wait_ms = sqlite3_column_int64(st, 6),
		};
		fn(ctx, &r);
	}
	sqlite3_finalize(st);
	return rc == SQLITE_DONE ? BATON_OK : fail(s->db, rc, err, "loading resources");
}

int store_load_unfinished(store *s, void (*fn)(void *ctx, wf_row *wf), void *ctx, baton_error *err)
{
	sqlite3_stmt *q, *steps;
	int rc = sqlite3_prepare_v2(s->db,
				    "SELECT " WF_COLS " FROM workflows"
				    " WHERE status IN ('pending', 'running') ORDER BY seq",
				    -1, &q, NULL);
	if (rc != SQLITE_OK)
		return fail(s->db, rc, err, "loading workflows");
	rc = sqlite3_prepare_v2(s->db, reader_sql[R_STEPS], -1, &steps, NULL);
	if (rc != SQLITE_OK) {
		sqlite3_finalize(q);
		return fail(s->db, rc, err, "loading steps");
	}
	while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
		int total = sqlite3_column_int(q, 9);
		wf_row *wf = read_wf(q);
		wf->steps = xcalloc((size_t)total, sizeof *wf->steps);
		wf->definition = load_definition(s, wf->seq);
		if ((rc = read_steps(steps, wf, total)) != SQLITE_DONE ||
		    wf->steps_total != total) {
			wf_row_free(wf);
			rc = rc == SQLITE_DONE ? SQLITE_CORRUPT : rc;
			break;
		}
		fn(ctx, wf);
	}
	sqlite3_finalize(q);
	sqlite3_finalize(steps);
	return rc == SQLITE_DONE ? BATON_OK : fail(s->db, rc, err, "loading workflows");
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
	sqlite3_stmt *q = rstmt(r, R_WF_BY_ID), *steps = rstmt(r, R_STEPS);
	if (!q || !steps)
		return fail(r->db, sqlite3_errcode(r->db), err, "preparing a query");
	bind_text(q, 1, id);
	int rc = sqlite3_step(q);
	if (rc != SQLITE_ROW) {
		rdone(q);
		if (rc == SQLITE_DONE)
			return err_set(err, BATON_ENOTFOUND, "no workflow with id \"%s\"", id);
		return fail(r->db, rc, err, "reading a workflow");
	}
	int total = sqlite3_column_int(q, 9);
	wf_row *wf = read_wf(q);
	wf->steps = xcalloc((size_t)total, sizeof *wf->steps);
	rdone(q);
	rc = read_steps(steps, wf, total);
	rdone(steps);
	if (rc != SQLITE_DONE) {
		wf_row_free(wf);
		return fail(r->db, rc, err, "reading steps");
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
		bind_text(q, 1, wf->resource);
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
		return fail(r->db, sqlite3_errcode(r->db), err, "begin");
	int rc = sqlite3_step(st);
	sqlite3_reset(st);
	return rc == SQLITE_DONE ? BATON_OK : fail(r->db, rc, err, "begin");
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
		char *t = json_dumps(json, JSON_COMPACT);
		size_t n = t ? strlen(t) : 0;
		char *nl = t ? realloc(t, n + 2) : NULL;
		if (!nl) {
			free(t);
			rc = err_set(err, BATON_EINTERNAL, "out of memory rendering a workflow");
		} else {
			nl[n] = '\n';
			nl[n + 1] = 0;
			*text = nl;
			*len = n + 1;
			cache_put(s, wf, nl, n + 1);
		}
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
			       "SELECT " WF_COLS " FROM workflows WHERE seq < ?1"
			       " AND (?2 IS NULL OR status = ?2) AND (?3 IS NULL OR resource = ?3)"
			       " ORDER BY seq DESC LIMIT ?4",
			       -1, &st, NULL);
	if (rc != SQLITE_OK) {
		rc = fail(r->db, rc, err, "listing workflows");
		reader_put(s, r);
		return rc;
	}
	sqlite3_bind_int64(st, 1, before);
	bind_text(st, 2, q->status);
	bind_text(st, 3, q->resource);
	sqlite3_bind_int(st, 4, limit + 1);
	json_t *list = json_array();
	int64_t last = 0;
	int n = 0;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW && n < limit) {
		wf_row *wf = read_wf(st);
		wf->steps_total = sqlite3_column_int(st, 9);
		json_array_append_new(list, codec_workflow_summary(wf));
		last = wf->seq;
		wf_row_free(wf);
		n++;
	}
	int more = rc == SQLITE_ROW;
	if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
		rc = fail(r->db, rc, err, "listing workflows");
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
		json_t *row = column_json(q, 1), *ev;
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
	return rc == SQLITE_DONE ? BATON_OK : fail(r->db, rc, err, "reading events");
}

int store_list_events(store *s, const char *id, int64_t after, int limit, json_t **out,
		      baton_error *err)
{
	reader *r = reader_get(s);
	sqlite3_stmt *q = rstmt(r, R_WF_BY_ID), *ev = rstmt(r, R_EVENTS);
	int rc =
	    (!q || !ev) ? fail(r->db, sqlite3_errcode(r->db), err, "preparing a query") : BATON_OK;
	int64_t seq = 0;
	char status[16] = "";
	if (rc == BATON_OK) {
		bind_text(q, 1, id);
		int s1 = sqlite3_step(q);
		if (s1 == SQLITE_ROW) {
			seq = sqlite3_column_int64(q, 0);
			snprintf(status, sizeof status, "%s",
				 (const char *)sqlite3_column_text(q, 4));
		} else if (s1 == SQLITE_DONE)
			rc = err_set(err, BATON_ENOTFOUND, "no workflow with id \"%s\"", id);
		else
			rc = fail(r->db, s1, err, "reading a workflow");
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
	bind_text(q, 1, name);
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
	bind_text(q, 1, name);
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
	bind_text(q, 1, name);
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
	bind_text(q, 1, name);
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
		bind_text(q, 1, name);
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
			rc = fail(r->db, s1, err, "reading a resource");
		}
		rdone(q);
	} else if (rc == BATON_OK) {
		rc = fail(r->db, sqlite3_errcode(r->db), err, "preparing a query");
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
	int rc = q ? BATON_OK : fail(r->db, sqlite3_errcode(r->db), err, "preparing a query");
	json_t *list = json_array();
	if (rc == BATON_OK && count_query_exists(r, name) == 0)
		rc = err_set(err, BATON_ENOTFOUND, "no resource named \"%s\"", name);
	if (rc == BATON_OK) {
		bind_text(q, 1, name);
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
	int rc = q ? BATON_OK : fail(r->db, sqlite3_errcode(r->db), err, "preparing a query");
	json_t *counts = json_object();
	for (int i = 0; i < WF_NSTATUS; i++)
		json_object_set_new(counts, wf_status_name(i), json_integer(0));
	if (rc == BATON_OK) {
		int s1;
		while ((s1 = sqlite3_step(q)) == SQLITE_ROW)
			json_object_set_new(counts, (const char *)sqlite3_column_text(q, 0),
					    json_integer(sqlite3_column_int64(q, 1)));
		if (s1 != SQLITE_DONE)
			rc = fail(r->db, s1, err, "counting workflows");
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
