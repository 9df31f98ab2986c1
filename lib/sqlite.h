/*
 * sqlite.h - what the two halves of baton's SQLite store share: sqlite_store.c (the
 * writer: schema and migrations, batches, start-up loads, checkpoints) and sqlite_read.c
 * (the pool of read connections and every query behind the API). These two files and
 * vfs.c are the only ones that include sqlite3.h; the rest of lib/ sees store.h.
 */
#ifndef BATON_SQLITE_H
#define BATON_SQLITE_H

#include "store.h"

#include <sqlite3.h>

#define WF_COLS                                                                                    \
	"seq, id, resource, on_failure, status, cancel_requested, created_at, started_at,"         \
	" finished_at, steps_total, steps_completed, result, error, retry"
/* WF_COLS as read: a workflow that has not ended counts its completed steps from their
 * rows, since its own row is not rewritten at every step (commit.c). */
#define WF_READ_COLS                                                                               \
	"seq, id, resource, on_failure, status, cancel_requested, created_at, started_at,"         \
	" finished_at, steps_total, CASE WHEN status IN ('pending', 'running') THEN"               \
	" (SELECT count(*) FROM steps s WHERE s.workflow_seq = workflows.seq"                      \
	" AND s.status = 'completed') ELSE steps_completed END, result, error, retry"
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
/* Reader statements, prepared on first use on each pooled connection. */
enum {
	R_WF_BY_ID,
	R_STEPS,
	R_DEF,
	R_QUEUE_POS,
	R_EVENTS,
	R_WF_SEQ,
	R_RESOURCES,
	R_RESOURCES_BUSY,
	R_RESOURCE,
	R_HOLDERS,
	R_WAITERS,
	R_QUEUE_LEN,
	R_RES_EVENTS,
	R_WF_COUNTS,
	R_BEGIN,
	R_COMMIT,
	R_NSTMT
};
extern const char *const reader_sql[R_NSTMT]; /* sqlite_read.c */

typedef struct reader {
	sqlite3 *db;
	sqlite3_stmt *stmt[R_NSTMT];
	struct reader *next_free;
} reader;

/* The checkpoint thread (sqlite_store.c says why it exists and how it and the writer
 * share). */
typedef struct checkpointer {
	sqlite3 *db;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int pending, stop, started;
	int backfilled; /* pages of the WAL the last pass had copied (under mu) */
	int frames;	/* pages in the WAL after the writer's last commit (writer only) */
} checkpointer;

typedef struct sqlite_store {
	store base;
	char *path;	 /* the database file, as opened */
	const char *vfs; /* baton's VFS (vfs.c) */
	sqlite3 *db;
	checkpointer ckpt;
	sqlite3_stmt *stmt[W_NSTMT];
	int64_t next_id[STORE_NIDS]; /* the next id of each kind (one process holds the file) */
	int64_t lock_seq;	     /* the highest stored, at open */
	textbuf json_text[2];	     /* the writer's JSON values being bound (bind_json) */
	reader *readers;
	int nreaders;
	pthread_mutex_t pool_mu;
	pthread_cond_t pool_cv;
	reader *free_readers;
} sqlite_store;

/* vfs.c: registers baton's SQLite VFS and returns its name: with faults while control_path
 * exists, or without faults when control_path is NULL. */
const char *baton_vfs(const char *control_path);

/* sqlite_store.c */
int sql_fail(sqlite3 *db, int rc, baton_error *err, const char *what); /* returns baton's code */
void sql_bind_text(sqlite3_stmt *st, int i, const char *s);	       /* NULL binds NULL */
int sql_exec(sqlite3 *db, const char *sql, baton_error *err);

/* sqlite_read.c: decoding rows */
char *sql_column_strdup(sqlite3_stmt *st, int i);
json_t *sql_column_json(sqlite3_stmt *st, int i);
wf_row *sql_read_wf(sqlite3_stmt *st); /* a row of WF_READ_COLS, with room for its steps */
/*
 * Reads the step rows of wf (STEP_COLS) into their places and fills the steps that have
 * no row yet (pending ones) from the workflow's definition, which *def_text holds or
 * def_stmt (bound to the workflow's seq here) reads; returns a SQLite code.
 */
int sql_read_steps(sqlite3_stmt *st, sqlite3_stmt *def_stmt, const char *def_text, wf_row *wf);

/* sqlite_read.c: the read operations of sqlite_store_ops */
int sqlite_read_workflow(store *s, const char *id, wf_row **out, baton_error *err);
int sqlite_list_workflows(store *s, const store_list *q, wf_row ***out, int *n, baton_error *err);
int sqlite_read_events(store *s, const char *id, const char *resource, int64_t after,
		       char status[16], store_event_fn fn, void *ctx, baton_error *err);
int sqlite_read_resource(store *s, const char *name, int with_waiters, store_resource *out,
			 baton_error *err);
int sqlite_list_resources(store *s, const store_resource_page *page,
			  void (*fn)(void *ctx, const store_resource *r), void *ctx,
			  baton_error *err);
int sqlite_count_workflows(store *s, int64_t counts[WF_NSTATUS], baton_error *err);

/* sqlite_admin.c: deletes and the backup of sqlite_store_ops */
int sqlite_delete_workflows(store *s, const char *id, int64_t before, int max, store_deleted_fn fn,
			    void *ctx, int *n, baton_error *err);
int sqlite_backup(store *s, const char *path, baton_error *err);

#endif
