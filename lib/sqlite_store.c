/*
 * sqlite_store.c - baton's SQLite store, the writer's half (sqlite_read.c is the
 * readers'), behind sqlite_store_ops (store.h).
 *
 * Design. One read-write connection belongs to the engine thread, which is the only
 * writer: it wraps each group commit in BEGIN IMMEDIATE ... COMMIT, so the checkpoints
 * of every workflow that moved since the last commit share one transaction and one
 * fsync. Queries from other threads use a small pool of read-only connections; in WAL
 * mode they never block the writer and always see the last committed state.
 * Durability: WAL with synchronous=FULL (NORMAL may lose the last commits on power
 * loss). Every statement is prepared once per connection and finalized on close.
 * One process holds the file (vfs.c), so ids are handed out from counters in memory,
 * loaded from the database at open.
 *
 * Schema (user_version 4): workflows, steps (a row per worker, written when the step is
 * first reached: until then the definition describes it), events (append-only history,
 * global sequence), resources (fencing-token high-water mark, limit, holders and totals).
 * Databases of versions 1 to 3 are migrated when opened.
 *
 * Events. One row holds a run of consecutive events of one workflow (a step's end, its
 * release, the next request and grant: four events, one row), as a JSON array; their
 * seqs are consecutive, from the row's seq to its last_seq, so rows never interleave.
 * A history read starts at the row that holds `after` and expands the rows it reads.
 *
 * Cost. A durable step is one commit, and what a commit costs grows with the pages it
 * writes: a step of a lone workflow writes about five (its step rows, its event row and
 * its two index entries, its resource row). Hence what the schema does not have: no
 * index on running steps (the resource row names its holder), no UPDATE of an indexed
 * column that did not change, no rewrite of a running workflow's row at each step (its
 * count of completed steps is read from the step rows), and no rows for steps not yet
 * reached (written all at once at submission, they filled their pages, which then split
 * as each step's row grew with its result). Events stay in a rowid table in seq order:
 * appending there costs one page, where a table clustered by workflow split its pages
 * (tried: 2.8 pages per commit for the events alone).
 */
#include "sqlite.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SCHEMA_VERSION 4

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
    "  holder_seq INTEGER, holder_idx INTEGER, permits INTEGER NOT NULL DEFAULT 1,"
    "  holders TEXT) WITHOUT ROWID;"
    "PRAGMA user_version = 4;";

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

/* Version 2 to 3: a step's row is written when the step is first reached, so pending
 * steps may have none (readers take them from the definition). Rows of schema 2 stay
 * valid as they are; only the version changes, so that an older batond refuses the file. */
static const char migrate_v2_sql[] = "PRAGMA user_version = 3;";

/* Version 3 to 4: a resource's limit (permits, 1: a mutex) and, when more than one holds
 * it, every holder as [[workflow_seq, idx], ...] (holder_seq names the first). */
static const char migrate_v3_sql[] =
    "ALTER TABLE resources ADD COLUMN permits INTEGER NOT NULL DEFAULT 1;"
    "ALTER TABLE resources ADD COLUMN holders TEXT;"
    "PRAGMA user_version = 4;";

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
		   " next_attempt_at=?12, error=?13, result=?14, params=coalesce(?15, params)"
		   " WHERE workflow_seq=?1 AND idx=?2",
    [W_INS_EVENT] = "INSERT INTO events (seq, last_seq, workflow_seq, resource, lock, data)"
		    " VALUES (?,?,?,?,?,?)",
    [W_PUT_RES] = "INSERT INTO resources (name, last_token, grants, total_hold_ms,"
		  " max_hold_ms, total_wait_ms, max_wait_ms, holder_seq, holder_idx, permits,"
		  " holders) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11)"
		  " ON CONFLICT (name) DO UPDATE SET last_token=?2, grants=?3,"
		  " total_hold_ms=?4, max_hold_ms=?5, total_wait_ms=?6, max_wait_ms=?7,"
		  " holder_seq=?8, holder_idx=?9, permits=?10, holders=?11 WHERE last_token <= ?2",

    [W_FIND_DEF] = "SELECT d.definition, w.status FROM workflows w"
		   " JOIN definitions d ON d.workflow_seq = w.seq WHERE w.id=?",
};

/* Maps a SQLite result code to baton's and copies the connection's message at once. */
int sql_fail(sqlite3 *db, int rc, baton_error *err, const char *what)
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

void sql_bind_text(sqlite3_stmt *st, int i, const char *s)
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

/*
 * Binds a JSON value as compact text (codec_text: jansson's text, without its
 * allocations); NULL binds SQL NULL. The text stays in the writer's buffer `slot` until
 * that slot is bound again, after the statement has run: one slot per value of a statement.
 */
static void bind_json(sqlite_store *s, sqlite3_stmt *st, int i, const json_t *v, int slot)
{
	if (!v) {
		sqlite3_bind_null(st, i);
		return;
	}
	textbuf *b = &s->json_text[slot];
	b->len = 0;
	codec_text(b, v);
	sqlite3_bind_text(st, i, b->v, (int)b->len, SQLITE_STATIC);
}

/* Runs a prepared statement that returns no row, and resets it. */
static int exec_stmt(sqlite3 *db, sqlite3_stmt *st, baton_error *err, const char *what)
{
	int rc = sqlite3_step(st);
	sqlite3_reset(st);
	sqlite3_clear_bindings(st);
	if (rc != SQLITE_DONE)
		return sql_fail(db, rc, err, what);
	return BATON_OK;
}

int sql_exec(sqlite3 *db, const char *sql, baton_error *err)
{
	int rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
	return rc == SQLITE_OK ? BATON_OK : sql_fail(db, rc, err, sql);
}

/*
 * Creates the database file, when there is none, readable and writable by its owner only
 * (0600, whatever the umask): calls' headers, Authorization among them, are stored in it.
 * SQLite gives its -wal and -shm files the mode of the database file, so they follow.
 * SQLite itself would create it 0644 under the usual umask. An error is left to
 * sqlite3_open_v2 to report.
 */
static void create_private(const char *path)
{
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd >= 0)
		close(fd);
}

static int open_conn(const char *path, const char *vfs, int flags, sqlite3 **out, baton_error *err)
{
	sqlite3 *db = NULL;
	int rc = sqlite3_open_v2(path, &db, flags | SQLITE_OPEN_NOMUTEX, vfs);
	if (rc != SQLITE_OK) {
		rc = sql_fail(db, rc, err, path);
		sqlite3_close(db);
		return rc;
	}
	sqlite3_busy_timeout(db, 5000);
	sqlite3_extended_result_codes(db, 1);
	*out = db;
	return BATON_OK;
}

/* Brings a database of version v (1 to 3) up to SCHEMA_VERSION, one version at a time. */
static int migrate(sqlite3 *db, int v, baton_error *err)
{
	static const char *const steps[] = {NULL, migrate_v1_sql, migrate_v2_sql, migrate_v3_sql};
	int rc = BATON_OK;
	for (; v < SCHEMA_VERSION && rc == BATON_OK; v++)
		rc = sql_exec(db, steps[v], err);
	return rc;
}

static int user_version(sqlite3 *db, int *v, baton_error *err)
{
	sqlite3_stmt *st;
	int rc = sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL);
	if (rc != SQLITE_OK)
		return sql_fail(db, rc, err, "reading the schema version");
	rc = sqlite3_step(st);
	*v = sqlite3_column_int(st, 0);
	sqlite3_finalize(st);
	return rc == SQLITE_ROW ? BATON_OK : sql_fail(db, rc, err, "reading the schema version");
}

/* WAL, synchronous=FULL, and the schema (created or checked in one transaction). */
static int setup_writer(sqlite_store *s, const char *path, baton_error *err)
{
	int rc, v = 0;
	/* The first statement takes the process's exclusive lock (vfs.c): if another process
	 * holds the file, say so at once instead of waiting for it. */
	sqlite3_busy_timeout(s->db, 0);
	rc = sqlite3_exec(s->db, "PRAGMA user_version", NULL, NULL, NULL);
	sqlite3_busy_timeout(s->db, 5000);
	if ((rc & 0xff) == SQLITE_BUSY)
		return err_set(err, BATON_EBUSY,
			       "%s is in use by another process (is another batond running on it?)",
			       path);
	/* FULL: durable at every commit, and vfs.c's gathering of WAL writes relies on it. */
	if ((rc = sql_exec(s->db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;", err)) ||
	    (rc = sql_exec(s->db, "BEGIN IMMEDIATE", err)))
		return rc;
	if ((rc = user_version(s->db, &v, err)) == BATON_OK) {
		if (v == 0)
			rc = sql_exec(s->db, schema_sql, err);
		else if (v >= 1 && v < SCHEMA_VERSION)
			rc = migrate(s->db, v, err);
		else if (v != SCHEMA_VERSION)
			rc = err_set(err, BATON_ECORRUPT,
				     "%s: schema version %d is not one this batond knows (%d)",
				     path, v, SCHEMA_VERSION);
	}
	if (rc) {
		sql_exec(s->db, "ROLLBACK", NULL);
		return rc;
	}
	if ((rc = sql_exec(s->db, "COMMIT", err)))
		return rc;
	for (int i = 0; i < W_NSTMT; i++) {
		int r = sqlite3_prepare_v3(s->db, writer_sql[i], -1, SQLITE_PREPARE_PERSISTENT,
					   &s->stmt[i], NULL);
		if (r != SQLITE_OK)
			return sql_fail(s->db, r, err, "preparing statements");
	}
	return BATON_OK;
}

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

static int start_checkpointer(sqlite_store *s, const char *path, const char *vfs, baton_error *err)
{
	checkpointer *c = &s->ckpt;
	int rc = open_conn(path, vfs, SQLITE_OPEN_READWRITE, &c->db, err);
	if (rc)
		return rc;
	sql_exec(c->db, "PRAGMA cache_size=-64", NULL);
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

static int sqlite_load_counters(sqlite_store *s);
static void sqlite_close(store *base);

static int sqlite_open(const store_config *cfg, store **out, baton_error *err)
{
	sqlite_store *s = xcalloc(1, sizeof *s);
	store_base_init(&s->base, &sqlite_store_ops);
	pthread_mutex_init(&s->pool_mu, NULL);
	pthread_cond_init(&s->pool_cv, NULL);
	pthread_mutex_init(&s->ckpt.mu, NULL);
	pthread_cond_init(&s->ckpt.cv, NULL);
	const char *path = cfg->target, *vfs = baton_vfs(cfg->fault_file);
	s->path = xstrdup(path);
	s->vfs = vfs;
	create_private(path);
	int rc = open_conn(path, vfs, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, &s->db, err);
	if (rc == BATON_OK)
		rc = setup_writer(s, path, err);
	if (rc == BATON_OK)
		rc = start_checkpointer(s, path, vfs, err);
	if (rc == BATON_OK)
		rc = sqlite_load_counters(s);
	s->readers = xcalloc((size_t)cfg->readers, sizeof *s->readers);
	for (int i = 0; rc == BATON_OK && i < cfg->readers; i++) {
		rc = open_conn(path, vfs, SQLITE_OPEN_READONLY, &s->readers[i].db, err);
		/* Bounded memory: 512 KiB of page cache per reader (the writer keeps 2 MiB). */
		if (rc == BATON_OK)
			sql_exec(s->readers[i].db, "PRAGMA cache_size=-512", NULL);
		if (rc == BATON_OK) {
			s->nreaders++;
			s->readers[i].next_free = s->free_readers;
			s->free_readers = &s->readers[i];
		}
	}
	if (rc) {
		sqlite_close(&s->base);
		return rc;
	}
	*out = &s->base;
	return BATON_OK;
}

static void sqlite_close(store *base)
{
	sqlite_store *s = (sqlite_store *)base;
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
	free(s->json_text[0].v);
	free(s->json_text[1].v);
	free(s->path);
	store_base_fini(&s->base);
	free(s);
}

/* ---- writer side: the engine thread only ---- */

/* After a commit: copies the WAL's last pages back when that lets the WAL start over. */
static void finish_checkpoint(sqlite_store *s)
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

/* A step's changing columns, in STEP_COLS order from status on, at parameters first.. */
static void bind_step_state(sqlite_store *s, sqlite3_stmt *st, int first, const step_row *r)
{
	sql_bind_text(st, first, step_status_name(r->status));
	sqlite3_bind_int(st, first + 1, r->attempts);
	bind_time(st, first + 2, r->lock_seq);
	bind_time(st, first + 3, r->requested_at);
	bind_time(st, first + 4, r->token);
	bind_time(st, first + 5, r->started_at);
	bind_time(st, first + 6, r->finished_at);
	if (r->duration_ms >= 0)
		sqlite3_bind_int64(st, first + 7, r->duration_ms);
	bind_time(st, first + 8, r->next_attempt_at);
	sql_bind_text(st, first + 9, r->error);
	bind_json(s, st, first + 10, r->result, 1);
}

static int insert_workflow(sqlite_store *s, const wf_row *wf, baton_error *err)
{
	sqlite3_stmt *st = s->stmt[W_INS_WF];
	sqlite3_bind_int64(st, 1, wf->seq);
	sql_bind_text(st, 2, wf->id);
	sql_bind_text(st, 3, wf->resource);
	sql_bind_text(st, 4, wf->on_failure == ON_FAILURE_CONTINUE ? "continue" : "fail");
	sql_bind_text(st, 5, wf_status_name(wf->status));
	sqlite3_bind_int(st, 6, wf->cancel_requested);
	sqlite3_bind_int64(st, 7, wf->created_at);
	bind_time(st, 8, wf->started_at);
	bind_time(st, 9, wf->finished_at);
	sqlite3_bind_int(st, 10, wf->steps_total);
	sqlite3_bind_int(st, 11, wf->steps_completed);
	bind_json(s, st, 12, wf->result, 1);
	sql_bind_text(st, 13, wf->error);
	char *retry = codec_retry_text(&wf->retry);
	sqlite3_bind_text(st, 14, retry, -1, free);
	int rc = exec_stmt(s->db, st, err, "inserting a workflow");
	if (rc == BATON_OK) {
		st = s->stmt[W_INS_DEF];
		sqlite3_bind_int64(st, 1, wf->seq);
		sql_bind_text(st, 2, wf->definition);
		rc = exec_stmt(s->db, st, err, "inserting a definition");
	}
	return rc;
}

static int update_workflow(sqlite_store *s, const wf_row *wf, baton_error *err)
{
	int same = wf->status == wf->stored_status;
	sqlite3_stmt *st = s->stmt[same ? W_UPD_WF_PROGRESS : W_UPD_WF];
	sqlite3_bind_int64(st, 1, wf->seq);
	if (!same)
		sql_bind_text(st, 2, wf_status_name(wf->status));
	sqlite3_bind_int(st, 3, wf->cancel_requested);
	bind_time(st, 4, wf->started_at);
	bind_time(st, 5, wf->finished_at);
	sqlite3_bind_int(st, 6, wf->steps_completed);
	bind_json(s, st, 7, wf->result, 1);
	sql_bind_text(st, 8, wf->error);
	return exec_stmt(s->db, st, err, "updating a workflow");
}

static int put_step(sqlite_store *s, const wf_row *wf, const step_row *r, baton_error *err)
{
	sqlite3_stmt *st;
	if (r->stored) {
		st = s->stmt[W_UPD_STEP];
		sqlite3_bind_int64(st, 1, wf->seq);
		sqlite3_bind_int(st, 2, r->index);
		bind_step_state(s, st, 4, r);
		if (r->params_dirty) /* else NULL: the stored params stay */
			bind_json(s, st, 15, r->params, 0);
		return exec_stmt(s->db, st, err, "updating a step");
	}
	st = s->stmt[W_INS_STEP];
	sqlite3_bind_int64(st, 1, wf->seq);
	sql_bind_text(st, 2, wf->resource);
	sqlite3_bind_int(st, 3, r->index);
	sql_bind_text(st, 4, r->worker);
	bind_json(s, st, 5, r->params, 0);
	bind_step_state(s, st, 6, r);
	return exec_stmt(s->db, st, err, "inserting a step");
}

static int insert_events(sqlite_store *s, const store_event_row *e, baton_error *err)
{
	sqlite3_stmt *st = s->stmt[W_INS_EVENT];
	sqlite3_bind_int64(st, 1, e->seq);
	sqlite3_bind_int64(st, 2, e->last_seq);
	sqlite3_bind_int64(st, 3, e->wf->seq);
	sql_bind_text(st, 4, e->wf->resource);
	sqlite3_bind_int(st, 5, e->lock);
	sqlite3_bind_text(st, 6, e->text, (int)e->len, SQLITE_STATIC);
	return exec_stmt(s->db, st, err, "inserting events");
}

/* Writes a resource's row unless the stored token is higher (then nothing changes). */
static int put_resource(sqlite_store *s, const resource_row *r, baton_error *err)
{
	sqlite3_stmt *st = s->stmt[W_PUT_RES];
	sql_bind_text(st, 1, r->name);
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
	sqlite3_bind_int(st, 10, r->permits > 0 ? r->permits : 1);
	sql_bind_text(st, 11, r->holders);
	int rc = exec_stmt(s->db, st, err, "updating a resource");
	if (rc == BATON_OK && sqlite3_changes(s->db) != 1)
		rc = err_set(err, BATON_ECONFLICT,
			     "resource \"%s\": the stored fencing token is higher than %lld",
			     r->name, (long long)r->last_token);
	return rc;
}

static int write_rows(sqlite_store *s, const store_batch *b, const wf_row **culprit,
		      baton_error *err)
{
	int rc = BATON_OK;
	for (size_t i = 0; rc == BATON_OK && i < b->nwfs; i++) {
		const wf_row *wf = b->wfs[i];
		*culprit = wf;
		/* A step of a running workflow changes only step rows: the workflow's row is
		 * written when it is new, when it starts or ends, and on a cancel. */
		if (wf->is_new)
			rc = insert_workflow(s, wf, err);
		else if (wf->dirty)
			rc = update_workflow(s, wf, err);
		for (int k = wf->dirty_lo; rc == BATON_OK && k < wf->dirty_hi; k++)
			if (wf->steps[k].dirty)
				rc = put_step(s, wf, &wf->steps[k], err);
	}
	*culprit = NULL;
	for (size_t i = 0; rc == BATON_OK && i < b->nresources; i++)
		rc = put_resource(s, b->resources[i], err);
	for (size_t i = 0; rc == BATON_OK && i < b->nevents; i++)
		rc = insert_events(s, &b->events[i], err);
	return rc;
}

/* One transaction; SQLite never leaves its outcome unknown to the caller. */
static int sqlite_write(store *base, const store_batch *b, store_write_failure *why,
			baton_error *err)
{
	sqlite_store *s = (sqlite_store *)base;
	const wf_row *culprit = NULL;
	int rc = exec_stmt(s->db, s->stmt[W_BEGIN], err, "begin");
	if (rc == BATON_OK)
		rc = write_rows(s, b, &culprit, err);
	if (rc == BATON_OK)
		rc = exec_stmt(s->db, s->stmt[W_COMMIT], err, "commit");
	if (rc == BATON_OK) {
		finish_checkpoint(s);
		return BATON_OK;
	}
	if (!sqlite3_get_autocommit(s->db))
		exec_stmt(s->db, s->stmt[W_ROLLBACK], NULL, "rollback");
	/* Busy, I/O and a full disk may clear; a refused value or constraint will not. */
	*why = (store_write_failure){0};
	if (rc == BATON_EINTERNAL || rc == BATON_ECONFLICT || rc == BATON_EINVAL) {
		why->permanent = 1;
		why->culprit = culprit;
	}
	return rc;
}

static int sqlite_next_ids(store *base, int kind, int64_t n, int64_t *first, baton_error *err)
{
	sqlite_store *s = (sqlite_store *)base;
	(void)err;
	*first = s->next_id[kind];
	s->next_id[kind] += n;
	return BATON_OK;
}

static int sqlite_find_workflow(store *base, const char *id, char **def, int *status,
				baton_error *err)
{
	sqlite_store *s = (sqlite_store *)base;
	sqlite3_stmt *st = s->stmt[W_FIND_DEF];
	sql_bind_text(st, 1, id);
	int rc = sqlite3_step(st);
	int out = BATON_OK;
	if (rc == SQLITE_ROW) {
		*def = xstrdup((const char *)sqlite3_column_text(st, 0));
		*status = wf_status_parse((const char *)sqlite3_column_text(st, 1));
	} else if (rc == SQLITE_DONE)
		out = BATON_ENOTFOUND;
	else
		out = sql_fail(s->db, rc, err, "looking up a workflow");
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

static int sqlite_load_counters(sqlite_store *s)
{
	s->next_id[STORE_ID_WORKFLOW] =
	    query_int(s->db, "SELECT coalesce(max(seq), 0) FROM workflows") + 1;
	s->next_id[STORE_ID_EVENT] =
	    query_int(s->db, "SELECT last_seq FROM events ORDER BY seq DESC LIMIT 1") + 1;
	s->lock_seq = query_int(s->db, "SELECT coalesce(max(lock_seq), 0) FROM steps");
	return BATON_OK;
}

/* The stored definition of a workflow (malloc'd), for the engine's re-POST checks. */
static char *load_definition(sqlite_store *s, int64_t seq)
{
	sqlite3_stmt *st = s->stmt[W_GET_DEF];
	sqlite3_bind_int64(st, 1, seq);
	char *def = sqlite3_step(st) == SQLITE_ROW ? sql_column_strdup(st, 0) : NULL;
	sqlite3_reset(st);
	return def ? def : xstrdup("");
}

static int load_unfinished(sqlite_store *s, void (*fn)(void *ctx, wf_row *wf), void *ctx,
			   baton_error *err)
{
	sqlite3_stmt *q, *steps;
	int rc = sqlite3_prepare_v2(s->db,
				    "SELECT " WF_READ_COLS " FROM workflows"
				    " WHERE status IN ('pending', 'running') ORDER BY seq",
				    -1, &q, NULL);
	if (rc != SQLITE_OK)
		return sql_fail(s->db, rc, err, "loading workflows");
	rc = sqlite3_prepare_v2(s->db, reader_sql[R_STEPS], -1, &steps, NULL);
	if (rc != SQLITE_OK) {
		sqlite3_finalize(q);
		return sql_fail(s->db, rc, err, "loading steps");
	}
	while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
		wf_row *wf = sql_read_wf(q);
		wf->definition = load_definition(s, wf->seq);
		if ((rc = sql_read_steps(steps, NULL, wf->definition, wf)) != SQLITE_DONE) {
			wf_row_free(wf);
			break;
		}
		fn(ctx, wf);
	}
	sqlite3_finalize(q);
	sqlite3_finalize(steps);
	return rc == SQLITE_DONE ? BATON_OK : sql_fail(s->db, rc, err, "loading workflows");
}

static int sqlite_load(store *base, uint64_t parts, void (*wf_fn)(void *ctx, wf_row *wf), void *ctx,
		       int64_t *lock_seq, baton_error *err)
{
	sqlite_store *s = (sqlite_store *)base;
	(void)parts; /* a SQLite store has one node: every partition is its */
	*lock_seq = s->lock_seq;
	return load_unfinished(s, wf_fn, ctx, err);
}

static int sqlite_ping(store *s, baton_error *err)
{
	(void)s;
	(void)err;
	return BATON_OK; /* a file that is open answers; a failing disk shows in commits */
}

const store_ops sqlite_store_ops = {
    .name = "sqlite",
    .local = 1,
    .open = sqlite_open,
    .close = sqlite_close,
    .write = sqlite_write,
    .next_ids = sqlite_next_ids,
    .find_workflow = sqlite_find_workflow,
    .load = sqlite_load,
    .read_workflow = sqlite_read_workflow,
    .list_workflows = sqlite_list_workflows,
    .read_events = sqlite_read_events,
    .read_resource = sqlite_read_resource,
    .list_resources = sqlite_list_resources,
    .count_workflows = sqlite_count_workflows,
    .ping = sqlite_ping,
    .delete_workflows = sqlite_delete_workflows,
    .backup = sqlite_backup,
};
