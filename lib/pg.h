/*
 * pg.h - what the two halves of baton's PostgreSQL store share: pg_store.c (the writer:
 * connection, schema and migrations, batches in one pipelined transaction, ids, start-up
 * loads) and pg_read.c (a pool of connections behind every read). These two files are
 * the only ones that include libpq-fe.h.
 */
#ifndef BATON_PG_H
#define BATON_PG_H

#include "store.h"

#include <libpq-fe.h>

/*
 * libpq is loaded when a PostgreSQL store is opened (pg_load_libpq), as libcurl is for HTTP
 * steps: a batond on SQLite maps neither, and needs neither installed. Every PQ*
 * function these files call goes through this table; the names stay libpq's.
 */
#define PG_FUNCS(X)                                                                                \
	X(PQcancel)                                                                                \
	X(PQclear)                                                                                 \
	X(PQconnectdbParams)                                                                       \
	X(PQconsumeInput)                                                                          \
	X(PQenterPipelineMode)                                                                     \
	X(PQerrorMessage)                                                                          \
	X(PQexec)                                                                                  \
	X(PQexecParams)                                                                            \
	X(PQexecPrepared)                                                                          \
	X(PQexitPipelineMode)                                                                      \
	X(PQfinish)                                                                                \
	X(PQflush)                                                                                 \
	X(PQfreeCancel)                                                                            \
	X(PQfreemem)                                                                               \
	X(PQgetCancel)                                                                             \
	X(PQgetResult)                                                                             \
	X(PQgetisnull)                                                                             \
	X(PQgetlength)                                                                             \
	X(PQgetvalue)                                                                              \
	X(PQisBusy)                                                                                \
	X(PQnotifies)                                                                              \
	X(PQntuples)                                                                               \
	X(PQpipelineSync)                                                                          \
	X(PQprepare)                                                                               \
	X(PQresultErrorField)                                                                      \
	X(PQresultErrorMessage)                                                                    \
	X(PQresultStatus)                                                                          \
	X(PQsendFlushRequest)                                                                      \
	X(PQsendQuery)                                                                             \
	X(PQsendQueryParams)                                                                       \
	X(PQsetNoticeReceiver)                                                                     \
	X(PQsendQueryPrepared)                                                                     \
	X(PQsocket)                                                                                \
	X(PQstatus)                                                                                \
	X(PQtransactionStatus)
#define PG_FUNC_FIELD(name) __typeof__(name) *name##_;
extern struct pg_api {
	PG_FUNCS(PG_FUNC_FIELD)
} pg_api;
/* 0 when libpq is loaded (at once once it was), else -1 with the reason in why. */
int pg_load_libpq(char *why, size_t n);

#define PQcancel	     (pg_api.PQcancel_)
#define PQclear		     (pg_api.PQclear_)
#define PQconnectdbParams    (pg_api.PQconnectdbParams_)
#define PQconsumeInput	     (pg_api.PQconsumeInput_)
#define PQenterPipelineMode  (pg_api.PQenterPipelineMode_)
#define PQerrorMessage	     (pg_api.PQerrorMessage_)
#define PQexec		     (pg_api.PQexec_)
#define PQexecParams	     (pg_api.PQexecParams_)
#define PQexecPrepared	     (pg_api.PQexecPrepared_)
#define PQexitPipelineMode   (pg_api.PQexitPipelineMode_)
#define PQfinish	     (pg_api.PQfinish_)
#define PQflush		     (pg_api.PQflush_)
#define PQfreeCancel	     (pg_api.PQfreeCancel_)
#define PQfreemem	     (pg_api.PQfreemem_)
#define PQgetCancel	     (pg_api.PQgetCancel_)
#define PQgetResult	     (pg_api.PQgetResult_)
#define PQgetisnull	     (pg_api.PQgetisnull_)
#define PQgetlength	     (pg_api.PQgetlength_)
#define PQgetvalue	     (pg_api.PQgetvalue_)
#define PQisBusy	     (pg_api.PQisBusy_)
#define PQnotifies	     (pg_api.PQnotifies_)
#define PQntuples	     (pg_api.PQntuples_)
#define PQpipelineSync	     (pg_api.PQpipelineSync_)
#define PQprepare	     (pg_api.PQprepare_)
#define PQresultErrorField   (pg_api.PQresultErrorField_)
#define PQresultErrorMessage (pg_api.PQresultErrorMessage_)
#define PQresultStatus	     (pg_api.PQresultStatus_)
#define PQsendFlushRequest   (pg_api.PQsendFlushRequest_)
#define PQsendQuery	     (pg_api.PQsendQuery_)
#define PQsendQueryParams    (pg_api.PQsendQueryParams_)
#define PQsetNoticeReceiver  (pg_api.PQsetNoticeReceiver_)
#define PQsendQueryPrepared  (pg_api.PQsendQueryPrepared_)
#define PQsocket	     (pg_api.PQsocket_)
#define PQstatus	     (pg_api.PQstatus_)
#define PQtransactionStatus  (pg_api.PQtransactionStatus_)

#define PG_WF_COLS                                                                                 \
	"seq, id, resource, on_failure, status, cancel_requested, created_at, started_at,"         \
	" finished_at, steps_total, steps_completed, result, error, retry"
/* As read: a workflow that has not ended counts its completed steps from their rows. */
#define PG_WF_READ_COLS                                                                            \
	"seq, id, resource, on_failure, status, cancel_requested, created_at, started_at,"         \
	" finished_at, steps_total, CASE WHEN status IN ('pending', 'running') THEN"               \
	" (SELECT count(*) FROM steps s WHERE s.workflow_seq = workflows.seq"                      \
	" AND s.status = 'completed') ELSE steps_completed END, result, error, retry"
#define PG_STEP_COLS                                                                               \
	"idx, worker, params, status, attempts, lock_seq, requested_at, fencing_token,"            \
	" started_at, finished_at, duration_ms, next_attempt_at, error, result, node"

/* Parameters of one statement: ints as decimal text, strings as bytes with a length. */
#define PG_MAX_PARAMS 34
typedef struct pg_params {
	const char *v[PG_MAX_PARAMS];
	int len[PG_MAX_PARAMS];
	int fmt[PG_MAX_PARAMS];
	char num[PG_MAX_PARAMS][24];
	int n;
} pg_params;
void pg_int(pg_params *p, int64_t x);
void pg_time(pg_params *p, int64_t x);	   /* 0 is NULL */
void pg_text(pg_params *p, const char *s); /* NULL is NULL */
void pg_bytes(pg_params *p, const char *s, size_t n);

/* Rows for one unnest() statement: an array literal per column (pg_store.c). */
#define PG_MAX_COLS 18
typedef struct pg_rows {
	textbuf col[PG_MAX_COLS];
	int ncols, nrows;
} pg_rows;

/* Reader statements, prepared on first use on each pooled connection. */
enum {
	PR_WF_BY_ID,
	PR_STEPS,
	PR_DEF,
	PR_QUEUE_POS,
	PR_WF_SEQ,
	PR_EVENTS,
	PR_RESOURCE,
	PR_RES_EVENTS,
	PR_HOLDERS,
	PR_WAITERS,
	PR_QUEUE_LEN,
	PR_RESOURCES,
	PR_RESOURCES_BUSY,
	PR_WF_COUNTS,
	PR_LIST,
	PR_OWNER,
	PR_NODES,
	PR_NSTMT
};

typedef struct pg_reader {
	PGconn *conn;
	unsigned prepared; /* bit i: statement i is prepared on conn */
	int ran;	   /* statements run since the reader was taken */
	struct pg_store *store;
	struct pg_reader *next_free;
} pg_reader;

typedef struct pg_store {
	store base;
	char *url;   /* as given: may hold a password, never shown */
	char *shown; /* the same with the password hidden, for messages */
	const logger *log;
	PGconn *w;  /* the writer's connection (engine thread) */
	int w_lost; /* the writer's connection broke and is not back yet (logged once) */
	/* The server warned that it cancelled a commit's wait for the synchronous standby: the
	 * commit is local only (writer_notice). Set by libpq's calls on the writer's thread. */
	int sync_cancelled;
	/* How long a batch waits for its results before its commit is cancelled (0: for ever):
	 * a synchronous standby that does not answer would hold the engine, and every caller,
	 * for as long as it is down. */
	int64_t commit_timeout_ms;
	int require_sync; /* --require-sync-replication: each batch checks it first (W_SYNC) */
	char node_id[MAX_NAME + 1]; /* this node in the cluster, once joined */
	int64_t idle_tx_ms;	    /* idle_in_transaction_session_timeout of new sessions */
	struct pg_cluster *cluster; /* the membership thread and what it read (pg_cluster.c) */
	int64_t lock_seq;	    /* the highest stored, at open */
	textbuf json[4];	    /* the writer's JSON values being sent (two step rows') */
	pg_rows rows[3];	    /* the batch's steps, resources and events being built */
	pg_reader *readers;
	int nreaders;
	pthread_mutex_t pool_mu;
	pthread_cond_t pool_cv;
	pg_reader *free_readers;
} pg_store;

/* Writer statements (pg_store.c), prepared on each new writer connection as "w<n>". */
enum {
	W_INS_WF,
	W_INS_DEF,
	W_UPD_WF,
	W_FIND,
	W_NEXT_ID,
	W_ROWS,
	W_STEP,
	W_STEP2,
	W_RESOURCE,
	W_EVENT,
	W_FENCE,
	W_SYNC,
	W_NOTIFY,
	W_DELETE_ONE,
	W_DELETE_OLD,
	W_NSTMT
};

/* pg_store.c */
/* A new connection with baton's session settings, or NULL with err set. */
PGconn *pg_connect(pg_store *s, baton_error *err);
/* Watches the writer's connection c for the warning of a cancelled synchronous commit. */
void pg_watch_writer(pg_store *s, PGconn *c);
/* The writer's connection, reconnected (lock taken, epoch checked) when it broke. */
int pg_writer(pg_store *s, baton_error *err);
/* After a failure: a broken writer connection is dropped, and said once. */
void pg_writer_failed(pg_store *s);
/* Runs sql on c; BATON_OK when it succeeded, else the failure in err (may be NULL). */
int pg_exec_ok(PGconn *c, const char *sql, baton_error *err, const char *what);

/*
 * The bound on a commit, for every statement that commits on PostgreSQL: a commit waits for
 * the synchronous standby, for ever when it is down. Results not come by the deadline are
 * cancelled (the server then commits on the primary only, which is no success), and a
 * connection that does not answer the cancel within the bound again is given up.
 */
typedef struct pg_wait {
	int64_t deadline; /* mono_ms: results not come by then are cancelled (0: none) */
	int64_t bound;	  /* the store's commit_timeout_ms: the cancel's own deadline */
	int cancelled;	  /* the cancel went out */
	int abandoned;	  /* no result came even after it: the connection is given up */
} pg_wait;
/* The wait for what is sent now, under s's commit_timeout_ms. */
pg_wait pg_wait_start(const pg_store *s);
/* PQgetResult on c, waiting until w's deadline at most (then w->cancelled); NULL, and
 * w->abandoned, when even the cancel was not answered in time. */
PGresult *pg_result_by(PGconn *c, pg_wait *w);
/*
 * Runs sql on *c (with parameters p, one statement; or without, several) under the commit
 * bound: the result as PQexec gives it (the first failure, else the last result), or NULL
 * with err set. A statement that had to be cancelled (or, on the writer's session, whose
 * wait for the standby someone else cancelled) has an unknown outcome whatever came back (a
 * commit cancelled while it waited for the standby is on the primary only): NULL,
 * err saying it was not confirmed, and *c closed and set to NULL, so that what follows runs
 * on a new session. prepared: the name of a statement prepared on *c to run instead of sql.
 */
PGresult *pg_exec_by(pg_store *s, PGconn **c, const char *sql, const char *prepared,
		     const pg_params *p, baton_error *err, const char *what);
/* pg_exec_by expecting rows or success: BATON_OK, or the failure in err (may be NULL). */
int pg_exec_by_ok(pg_store *s, PGconn **c, const char *sql, const pg_params *p, baton_error *err,
		  const char *what);
void pg_bool(pg_params *p, int b);
/* A JSON value's compact text in the writer's buffer `slot`, valid until the slot is used
 * again (libpq copies parameters when the statement is sent). */
void pg_json(pg_store *s, pg_params *p, const json_t *v, int slot);
/* Maps a failed result (or a broken connection) to baton's code, copying the message. */
int pg_fail(PGconn *c, const PGresult *r, baton_error *err, const char *what);
/* 1 for the codes a retry may clear: the connection, the database's resources, a lock. */
int pg_transient(int code);
wf_row *pg_read_wf(const PGresult *r, int row); /* a row of PG_WF_READ_COLS, steps allocated */
/* Reads the step rows of wf (PG_STEP_COLS, rows of r) and fills the steps with no row
 * from the definition; BATON_OK or BATON_ECORRUPT. */
int pg_read_steps(const PGresult *r, const char *definition, wf_row *wf);
char *pg_col_str(const PGresult *r, int row, int col);	 /* NULL for SQL NULL */
int64_t pg_col_int(const PGresult *r, int row, int col); /* 0 for SQL NULL */

/* A set of partitions as an array literal for a parameter ("{1,5,9}"). */
void pg_parts_text(uint64_t parts, char *out, size_t n);
/* Reads the workflows that `where` selects (a condition on workflows, part = ANY($1)
 * among it), their steps and definitions, one snapshot; fn owns each. */
int pg_load_where(pg_store *s, const char *where, uint64_t parts, void (*fn)(void *ctx, wf_row *wf),
		  void *ctx, baton_error *err);

/* pg_cluster.c: the cluster operations of pg_store_ops */
int pg_join(store *s, const char *node_id, const char *url, int64_t lease_ms,
	    const store_cluster_hooks *h, int64_t epochs[PARTS], baton_error *err);
void pg_leave(store *s);
void pg_advertise(store *s, const char *url);
int pg_owned(store *s, int64_t epochs[PARTS], baton_error *err);
int pg_release(store *s, int part, int64_t epoch, baton_error *err);
int pg_load_inbox(store *s, uint64_t parts, void (*wf_fn)(void *ctx, wf_row *wf), void *ctx,
		  baton_error *err);
int pg_request_cancel(store *s, const char *id, baton_error *err);
int pg_list_nodes(store *s, store_node **out, int *n, baton_error *err);
void pg_cluster_stats(store *s, store_cluster_stats *out);

/* pg_batch.c: the write operation of pg_store_ops */
int pg_write(store *s, const store_batch *b, store_write_failure *why, baton_error *err);

/* pg_read.c: the read operations of pg_store_ops, and the pool */
int pg_readers_open(pg_store *s, int n);
void pg_readers_close(pg_store *s);
int pg_read_workflow(store *s, const char *id, wf_row **out, baton_error *err);
int pg_list_workflows(store *s, const store_list *q, wf_row ***out, int *n, baton_error *err);
int pg_read_events(store *s, const char *id, const char *resource, int64_t after, char status[16],
		   store_event_fn fn, void *ctx, baton_error *err);
int pg_read_resource(store *s, const char *name, int with_waiters, store_resource *out,
		     baton_error *err);
int pg_list_resources(store *s, const store_resource_page *page,
		      void (*fn)(void *ctx, const store_resource *r), void *ctx, baton_error *err);
int pg_count_workflows(store *s, int64_t counts[WF_NSTATUS], baton_error *err);
int pg_ping(store *s, baton_error *err);

#endif
