/*
 * store.h - the store seam: one table of operations, one implementation per database.
 *
 * Design (SQLite's sqlite3_io_methods, libcurl's vtls): each backend is one pair of files
 * (sqlite_store.c and sqlite_read.c, pg_store.c and pg_read.c) that defines a const
 * store_ops and keeps its own types in its own header (sqlite.h, pg.h). Callers never ask
 * which one they hold. What both stores share lives above the table, once, in store.c:
 * choosing a backend from the --db value, shaping rows into the API's JSON, paging
 * cursors, and the cache of finished workflows.
 *
 * Writes. The engine hands the store one batch per round (everything the round changed)
 * and the store commits it in one transaction, durable before the call returns. Writing
 * a batch is idempotent: when a commit's outcome is unknown (the connection broke during
 * COMMIT), the engine writes the same batch again, with the same ids, once the database
 * answers, and a batch that had landed changes nothing the second time. Fencing tokens
 * never go backwards in the database: a resource row is written only while its stored
 * token is not higher than the batch's.
 *
 * Ids. Workflow sequence numbers and event seqs are handed out by the store (next_ids),
 * in blocks that are durable before they are used, so that no value is ever given twice,
 * across restarts and (later) across writers. Fencing tokens come from the resource's
 * row, which only ever moves forward. Lock-queue numbers order one resource's queue;
 * the engine counts on from the highest stored one.
 *
 * Reads return rows (wf_row, stored event rows, resource views): never API JSON.
 *
 * Threads. open, close, write, find_workflow, next_ids and load belong to the engine
 * thread (one writer); every read may be called from any thread at once.
 */
#ifndef BATON_STORE_H
#define BATON_STORE_H

#include "internal.h"

/* ---- what the engine writes ---- */

/* One row of events: consecutive events of one workflow, seqs seq..last_seq, as the JSON
 * array text[0..len) of {"seq", "ts", "type", ...}; lock: one of them belongs to the
 * resource's history. */
typedef struct store_event_row {
	int64_t seq, last_seq;
	const wf_row *wf;
	int lock;
	const char *text;
	size_t len;
} store_event_row;

/*
 * A round's changes. For each workflow: its row when is_new (insert) or dirty (update),
 * and its steps marked dirty in [dirty_lo, dirty_hi) (a step with `stored` clear has no
 * row yet). Resources: their rows as they are now.
 */
typedef struct store_batch {
	wf_row *const *wfs;
	size_t nwfs;
	const resource_row *const *resources;
	size_t nresources;
	const store_event_row *events;
	size_t nevents;
	/* Cluster: the partitions whose workflows and resources the batch writes (bit p), and
	 * the epoch under which this node holds each; the store commits the batch only while
	 * the database still shows this node as their owner under those epochs. 0: none
	 * (SQLite; a batch of foreign submissions only). */
	uint64_t parts;
	const int64_t *epochs;
} store_batch;

/* Why a write failed, for the engine's choice of what to do next. */
typedef struct store_write_failure {
	/* 1: the transaction may have committed (the connection broke during COMMIT): the
	 * same batch must be written again before anything is answered. */
	int unknown;
	/* 1: a retry cannot help (the database refused a value or a constraint). */
	int permanent;
	/* With permanent: the workflow whose row was refused, when the store could tell. */
	const wf_row *culprit;
	/* The database no longer shows this node as the owner of a partition of the batch
	 * (another node took it over): nothing was written. */
	int fenced;
} store_write_failure;

enum store_id_kind { STORE_ID_WORKFLOW, STORE_ID_EVENT, STORE_NIDS };

/* ---- what readers return ---- */

/* A stored event row (the JSON array text of store_event_row) and its workflow's id;
 * returns 0 to go on, 1 when it has enough, -1 when it failed (out of memory). */
typedef int (*store_event_fn)(void *ctx, const char *text, size_t len, const char *wf_id);

typedef struct store_holder {
	char *wf_id;
	int step;
	char *worker;
	int64_t token, since;
	int slot; /* -1: exclusive */
} store_holder;

typedef struct store_waiter {
	char *wf_id;
	int step;
	char *worker;
	int64_t since;
	int exclusive;
} store_waiter;

typedef struct store_resource {
	resource_row row;      /* name, limit and totals */
	store_holder *holders; /* lowest fencing token first */
	size_t nholders;
	int64_t queue_length;
	int64_t oldest_wait; /* list_resources: when its oldest waiter asked (ms); 0: none */
	char *node; /* read_resource: the cluster node that drives it (NULL: none, SQLite) */
	/* read_resource: where the resource's history ends now (the last seq of its newest
	 * event row; 0 when it has none): events after it are newer than the read. */
	int64_t last_event_seq;
	store_waiter *waiters; /* with_waiters only */
	size_t nwaiters;
} store_resource;
void store_resource_fini(store_resource *r);

/* A page of list_resources: by name after `after`, or with by_contention the longest
 * queues first, then by name, after (after_queue, after). */
typedef struct store_resource_page {
	const char *after; /* "" for the first page */
	int64_t after_queue;
	int by_contention;
	int limit;
} store_resource_page;

typedef struct store_list {
	int64_t before; /* seq, exclusive */
	/* In a cluster (PostgreSQL) seqs come from each node's blocks: the order is by
	 * created_at, then seq, and a page starts below (before_at, before). */
	int64_t before_at;
	const char *status, *resource;
	int limit;
} store_list;

/* Given the id of each workflow a delete removed, once the delete is committed. */
typedef void (*store_deleted_fn)(void *ctx, const char *id);

/* ---- a cluster of nodes on one database (PostgreSQL; members.c drives it) ---- */

/* What the database says about the partitions, as the membership thread last read it. */
typedef struct store_ownership {
	int64_t epoch[PARTS];		 /* this node's, 0 where it holds none */
	char owner[PARTS][MAX_NAME + 1]; /* every partition's owner, "" when none */
	char url[PARTS][MAX_URL + 1];	 /* and that owner's --advertise-url, "" when none */
	int want;			 /* this node's fair share of partitions */
	int64_t read_at;		 /* proof_ms when the read was sent */
} store_ownership;

/* Called on the membership thread: each time it has read the partitions (every third of
 * the lease, and when another node hints that partitions were freed), and when another
 * node hints that this node has new work (a submission or cancel it accepted). */
typedef struct store_cluster_hooks {
	void (*ownership)(void *ud, const store_ownership *o);
	void (*inbox)(void *ud);
	void *ud;
} store_cluster_hooks;

typedef struct store_node {
	char *id;
	char *url;		  /* as it advertises itself, "" when it does not */
	int64_t lease_expires_at; /* ms since the epoch, the database's clock */
	int partitions;
	int64_t resources, running_steps;
} store_node;

typedef struct store_cluster_stats {
	int joined;
	int nodes;		  /* live, as last read */
	int64_t lease_expires_at; /* this node's, as last renewed */
	int64_t lease_left_ms;	  /* what is left of it now (this node's proof_ms clock) */
	int64_t lease_ms;	  /* the lease it renews */
	/* proof_ms when the lease as it stands began: a renewal that came after the last one
	 * had run out (as members_send_by counts it) begins it anew, since another node may
	 * have claimed this node's partitions in between. */
	int64_t lease_since;
	uint64_t renew_failures;
	/* Whether the database replicates this node's commits synchronously, as last read
	 * (pg_cluster.c, with the partitions): 1, 0, or -1 not read yet; and how many
	 * standbys pg_stat_replication shows as sync or quorum. */
	int sync_replication;
	int sync_standbys;
} store_cluster_stats;

/* Where a backend comes from: the --db value and what every backend needs. */
typedef struct store_config {
	const char *target; /* file path, or the URL without its "sqlite:" prefix */
	int readers;
	const logger *log;
	const char *fault_file; /* SQLite's testing seam (vfs.c); NULL elsewhere */
	/* PostgreSQL: a system_identifier to accept in place of the one recorded (pg_store.c);
	 * NULL elsewhere */
	const char *accept_sysid;
	/* PostgreSQL: how long a write waits for the server to confirm its commit before it
	 * cancels it (its outcome then unknown); 0 for ever. Ignored on SQLite. */
	int64_t commit_timeout_ms;
	/* PostgreSQL: a write commits only while synchronous_standby_names is set (checked in
	 * its transaction); else it fails with BATON_EBUSY. Ignored on SQLite. */
	int require_sync;
} store_config;

/*
 * The operations. Every one returns BATON_OK or a baton code with detail in err.
 * The store's own header fields (struct store) are for store.c; a backend's struct
 * starts with a struct store.
 */
typedef struct store_ops {
	const char *name; /* "sqlite", "postgresql" */
	/* 1: a write waits for the local disk only, never for a network, so a request's own
	 * thread may run a round (baton_engine_help): a PostgreSQL cut off without a reset
	 * would hold that HTTP thread, and every connection it serves, up to tcp_user_timeout. */
	int local;
	int (*open)(const store_config *cfg, store **out, baton_error *err);
	void (*close)(store *s); /* accepts NULL */

	/* Engine thread. */
	int (*write)(store *s, const store_batch *b, store_write_failure *why, baton_error *err);
	/* first..first+n-1 are this caller's, for ever. */
	int (*next_ids)(store *s, int kind, int64_t n, int64_t *first, baton_error *err);
	/* A stored workflow's definition (malloc'd) and status; BATON_ENOTFOUND when none. */
	int (*find_workflow)(store *s, const char *id, char **def, int *status, baton_error *err);
	/* Every unfinished workflow of the partitions in parts (bit p) with its steps (owned
	 * by fn; resources are read when needed, with read_resource); *lock_seq: the highest
	 * lock-queue number stored (the engine counts on from it). */
	int (*load)(store *s, uint64_t parts, void (*wf_fn)(void *ctx, wf_row *wf), void *ctx,
		    int64_t *lock_seq, baton_error *err);

	/* Cluster operations: NULL where the store has no cluster (SQLite). */
	/* Joins as node_id (reached by the other nodes at url, "" if they cannot) with a lease
	 * of lease_ms: this node's epochs of the partitions it
	 * holds at once (those it held in an earlier life, taken again, and its fair share),
	 * then the membership thread renews the lease, takes a share and calls hooks. */
	int (*join)(store *s, const char *node_id, const char *url, int64_t lease_ms,
		    const store_cluster_hooks *h, int64_t epochs[PARTS], baton_error *err);
	/* The url the other nodes reach this node at, from its next lease renewal on. */
	void (*advertise)(store *s, const char *url);
	/* Stops the membership thread, gives up every partition and the node's row, and
	 * wakes the other nodes to take them. Accepts a store that never joined. */
	void (*leave)(store *s);
	/* Engine thread. The partitions the database shows this node holding, now. */
	int (*owned)(store *s, int64_t epochs[PARTS], baton_error *err);
	/* Gives partition part up (when still held under epoch) and wakes the others. */
	int (*release)(store *s, int part, int64_t epoch, baton_error *err);
	/* The workflows of the partitions in parts that wait for their owner: submitted on
	 * another node and not adopted yet, or with a cancel requested on another node. */
	int (*load_inbox)(store *s, uint64_t parts, void (*wf_fn)(void *ctx, wf_row *wf), void *ctx,
			  baton_error *err);
	/* Any thread. Records a cancel request for a workflow another node drives and wakes
	 * it; BATON_ENOTFOUND, or BATON_ECONFLICT when it has finished. */
	int (*request_cancel)(store *s, const char *id, baton_error *err);
	/* The live nodes, by id (malloc'd array, each id malloc'd). */
	int (*list_nodes)(store *s, store_node **out, int *n, baton_error *err);
	void (*cluster_stats)(store *s, store_cluster_stats *out);
	/*
	 * Deletes finished workflows with their steps, definitions and events, in one
	 * transaction: the workflow `id` when id is set (BATON_ENOTFOUND when there is none,
	 * BATON_ECONFLICT when it has not finished), else at most `max` of those that
	 * finished before `before` (ms since the epoch), the earliest submitted first (within
	 * each final status on SQLite). fn(ctx, id) for each
	 * one deleted, after the commit; *n: how many. Event seqs and workflow seqs handed
	 * out before are never handed out again, whichever rows go.
	 */
	int (*delete_workflows)(store *s, const char *id, int64_t before, int max,
				store_deleted_fn fn, void *ctx, int *n, baton_error *err);

	/* Any thread. */
	/* A workflow with its steps and the queue positions of its waiting step. */
	int (*read_workflow)(store *s, const char *id, wf_row **out, baton_error *err);
	/* Up to q->limit rows newest first, without steps; *n rows in *out (malloc'd). */
	int (*list_workflows)(store *s, const store_list *q, wf_row ***out, int *n,
			      baton_error *err);
	/* The event rows of workflow id (status: its status, 16 bytes) or of a resource's
	 * history (id NULL, resource set), from the row that holds `after` on, in order. */
	int (*read_events)(store *s, const char *id, const char *resource, int64_t after,
			   char status[16], store_event_fn fn, void *ctx, baton_error *err);
	int (*read_resource)(store *s, const char *name, int with_waiters, store_resource *out,
			     baton_error *err);
	/* Up to page->limit resources of the page's order (names compare bytewise), each with
	 * its row (limit, last token, totals), holders, queue length and oldest wait; fn
	 * owns nothing. */
	int (*list_resources)(store *s, const store_resource_page *page,
			      void (*fn)(void *ctx, const store_resource *r), void *ctx,
			      baton_error *err);
	int (*count_workflows)(store *s, int64_t counts[WF_NSTATUS], baton_error *err);
	/* BATON_OK while the database answers. */
	int (*ping)(store *s, baton_error *err);
	/* A consistent copy of the whole database, taken while the engine goes on writing,
	 * into the new file `path`; BATON_ECONFLICT when the store cannot be copied that way
	 * (PostgreSQL has its own tools). */
	int (*backup)(store *s, const char *path, baton_error *err);
} store_ops;

#define FINISHED_SLOTS 1024
/* The cache's default budget of text bytes; one workflow takes at most an eighth of it. */
#define FINISHED_DEFAULT_BYTES (64 * 1024 * 1024)
typedef struct finished_slot {
	char id[MAX_NAME + 1];
	char *text; /* compact JSON and a newline */
	size_t len;
} finished_slot;

struct store {
	const store_ops *ops;
	pthread_mutex_t finished_mu;
	uint64_t finished_gen; /* under finished_mu: deletes so far (a read from before one
				  is not cached) */
	finished_slot finished[FINISHED_SLOTS];
	size_t finished_bytes; /* under finished_mu: the texts' sizes together */
	size_t finished_max;   /* budget; 0: no cache */
	int finished_hand;     /* under finished_mu: the next slot to evict past the budget */
};

extern const store_ops sqlite_store_ops; /* sqlite_store.c */
extern const store_ops pg_store_ops;	 /* pg_store.c */

/* For backends: the header's fields, set up and torn down once. */
void store_base_init(store *s, const store_ops *ops);
void store_base_fini(store *s);

/* ---- store.c: above the table ---- */

/*
 * Opens the store that db names: "postgresql://..." or "postgres://..." (a libpq URL),
 * "sqlite:PATH", or a plain PATH (SQLite). Any other "SCHEME://" is refused.
 */
/* Opens the store that cfg->target names (a file path, sqlite:PATH or a PostgreSQL URL). */
int store_open(const store_config *cfg, store **out, baton_error *err);
void store_close(store *s);
/* The finished-workflow cache's budget in bytes (0: no cache); before any read. */
void store_set_cache_bytes(store *s, size_t max);
/* The bytes the cache holds now (for metrics). */
size_t store_cache_bytes(store *s);

static inline int store_write(store *s, const store_batch *b, store_write_failure *why,
			      baton_error *err)
{
	return s->ops->write(s, b, why, err);
}
static inline int store_next_ids(store *s, int kind, int64_t n, int64_t *first, baton_error *err)
{
	return s->ops->next_ids(s, kind, n, first, err);
}
static inline int store_find_workflow(store *s, const char *id, char **def, int *status,
				      baton_error *err)
{
	return s->ops->find_workflow(s, id, def, status, err);
}
static inline int store_load(store *s, uint64_t parts, void (*wf_fn)(void *ctx, wf_row *wf),
			     void *ctx, int64_t *lock_seq, baton_error *err)
{
	return s->ops->load(s, parts, wf_fn, ctx, lock_seq, err);
}
void store_nodes_free(store_node *v, int n);
/* ops->delete_workflows, and the deleted workflows leave the cache of finished ones. */
int store_delete_workflows(store *s, const char *id, int64_t before, int max, int *n,
			   baton_error *err);
static inline int store_backup(store *s, const char *path, baton_error *err)
{
	return s->ops->backup(s, path, err);
}
static inline int store_ping(store *s, baton_error *err)
{
	return s->ops->ping(s, err);
}

/* Reads shaped into the API's JSON (new references), any thread. */
int store_get_workflow(store *s, const char *id, json_t **out, baton_error *err);
/* The same as compact JSON text and a newline (malloc'd), cached once finished. */
int store_get_workflow_text(store *s, const char *id, char **text, size_t *len, baton_error *err);
int store_list_workflows(store *s, const baton_list_query *q, json_t **out, baton_error *err);
/* Steps of workflow id with index > after (-1: from the first), at most limit. */
int store_list_steps(store *s, const char *id, int after, int limit, json_t **out,
		     baton_error *err);
int store_list_events(store *s, const char *id, int64_t after, int limit, json_t **out,
		      baton_error *err);
int store_list_resources(store *s, const char *cursor, int limit, int order, json_t **out,
			 baton_error *err);
int store_get_resource(store *s, const char *name, json_t **out, baton_error *err);
int store_resource_events(store *s, const char *name, int64_t after, int limit, json_t **out,
			  baton_error *err);
int store_workflow_counts(store *s, json_t **out, baton_error *err);

#endif
