/*
 * baton.h - the engine of baton: durable, serialized workflows checkpointed in SQLite.
 *
 * This header is the library's whole public interface and its manual. The library
 * knows nothing of HTTP; the daemon batond (server/) and the tests drive it.
 *
 * A workflow is a resource name and an ordered list of workers. The engine runs one
 * step per worker, in order; each step holds the named resource exclusively while it
 * runs (one holder per resource across all workflows, granted in FIFO order with a
 * strictly increasing fencing token). Every state change is committed to SQLite before
 * anything that depends on it happens, so a process killed at any instant resumes from
 * its last checkpoint: finished steps never run again.
 *
 * Threads. A baton_engine owns one engine thread (the only writer of the database),
 * a pool of step threads, and a pool of read-only database connections. Every function
 * below may be called from any thread at the same time, unless it says otherwise.
 *
 * JSON. Values are jansson json_t. "New reference" means the caller owns the result and
 * must json_decref it; "borrowed" means it must not.
 */
#ifndef BATON_H
#define BATON_H

#include <jansson.h>
#include <stdint.h>

#define BATON_VERSION "0.1.0"

/* Result codes of every fallible call. Values never change meaning once published. */
enum baton_code {
	BATON_OK = 0,
	BATON_EINVAL = 1,    /* the input is invalid: the caller must change it */
	BATON_ENOTFOUND = 2, /* no such workflow or resource */
	BATON_ECONFLICT = 3, /* conflicts with the current state (id reuse, finished) */
	BATON_EBUSY = 4,     /* temporarily unable (storage failing, shutting down) */
	BATON_EIO = 5,	     /* the storage failed */
	BATON_ECORRUPT = 6,  /* the database is not a baton database or is damaged */
	BATON_EINTERNAL = 7, /* out of memory or another internal failure */
	BATON_ETOOLARGE = 8, /* the input is larger than the engine accepts */
	BATON_EGONE = 9,     /* it existed and ended: a lease that expired */
};

/* Detail of a failed call, owned by the caller (as jansson's json_error_t). */
typedef struct baton_error {
	int code;
	char msg[512];
} baton_error;

/*
 * Copies a --db value into out (size n, always terminated) with any password hidden:
 * "postgresql://user:secret@host/db?password=x" becomes
 * "postgresql://user:***@host/db?password=***". Any thread.
 */
void baton_db_redact(const char *db, char *out, size_t n);

/* Returns a static, constant name for a code ("invalid", "not found", ...). */
const char *baton_code_name(int code);

/* Log levels, in increasing order of severity. */
enum baton_log_level {
	BATON_LOG_DEBUG = 0,
	BATON_LOG_INFO = 1,
	BATON_LOG_WARN = 2,
	BATON_LOG_ERROR = 3,
};

/*
 * The library never prints: it hands each log line to this callback, which may be
 * called from any of the engine's threads at once. `workflow_id` is the workflow the
 * line is about, or NULL. `msg` is borrowed for the duration of the call.
 */
typedef void (*baton_log_fn)(void *ud, int level, const char *workflow_id, const char *msg);

/*
 * Called on the engine thread at the end of each of its rounds (a round applies what
 * arrived, commits it and logs what it did), so that the log callback may hold the
 * engine thread's lines and write them at once: one write per round, not per line.
 */
typedef void (*baton_log_flush_fn)(void *ud);

typedef struct baton_engine baton_engine;

/* What one commit changed: a workflow and its resource had new events. */
typedef struct baton_change {
	const char *workflow_id; /* borrowed for the duration of the callback */
	const char *resource;
} baton_change;

/*
 * Called on the engine thread right after each commit that recorded events, with one
 * entry per workflow that had any (so that event streams can wake up). It must be quick
 * and must not call back into the engine.
 */
typedef void (*baton_commit_fn)(void *ud, const baton_change *changes, size_t n);

typedef struct baton_engine_config {
	/* The store: a SQLite file (PATH or sqlite:PATH; its directory must exist), or a
	 * PostgreSQL connection URL (postgresql://... or postgres://...). */
	const char *db_path;
	int threads;	  /* steps running at once, >= 1 */
	int readers;	  /* read-only connections for queries, >= 1 */
	baton_log_fn log; /* may be NULL: no logging */
	void *log_ud;
	int log_level;		      /* lines below this level are not even formatted */
	baton_log_flush_fn log_flush; /* may be NULL */
	/* URL prefixes that HTTP steps may call, NULL-terminated; NULL: no calls at all.
	 * Borrowed: must outlive the engine. */
	const char *const *allow_call;
	baton_commit_fn on_commit; /* may be NULL */
	void *on_commit_ud;
	/* Testing seam: while this file exists, the database's writes fail (SQLITE_FULL when
	 * it starts with "full", else an I/O error). NULL in production. */
	const char *fault_file;
	/* Testing seam: the engine waits at the racing point this file names ("round",
	 * "answers"; lib/seam.c). NULL in production. */
	const char *hold_file;
	/* Finished workflows are deleted (with their steps and events) this long after they
	 * finished, a bounded batch at a time between the engine's rounds; 0 keeps them. */
	int64_t retention_ms;
	/* Idle resources (free, nobody waiting) kept in memory, the most recently used; the
	 * others are read back from the store when a step asks for them. 0: 1024. */
	int idle_resources;
	/* Budget in bytes of the cache of finished workflows' rendered text (reads of them
	 * skip the database): 0 the default (64 MiB), < 0 no cache. One workflow's text is
	 * kept only when it is at most an eighth of the budget. */
	long long cache_bytes;
	/* A cluster (PostgreSQL only; see README "Running a cluster"): this node's id (unique
	 * among the nodes of one database; NULL: the host name and a random suffix) and how
	 * long its ownership lasts without renewal (0: 10000 ms). Ignored on SQLite. */
	const char *node_id;
	int64_t lease_ms;
	/* The base URL (http://host:port) at which the other nodes reach this one's HTTP
	 * API: they pass it the lease and task requests of the resources it drives.
	 * NULL or "": they answer those with 503 instead. */
	const char *advertise_url;
	/* PostgreSQL only: the system_identifier (decimal) of a database to run on although
	 * baton recorded another one there (restored from a dump, upgraded with pg_upgrade).
	 * Opening such a database otherwise fails with BATON_ECONFLICT, naming both. Accepted,
	 * every resource's fencing tokens and every partition's epoch continue above every
	 * one stored. NULL: none. */
	const char *accept_system_identifier;
	/* How long a caller waits for the commit of its round (0: 5000 ms). On PostgreSQL a
	 * commit that the server has not confirmed by then (a synchronous standby that does not
	 * answer) is cancelled, and its outcome is unknown until the round, kept, is written
	 * again: its callers are answered BATON_EBUSY, never success, and a retry of the same
	 * id or request_id gets the outcome once it is known. Every other commit on PostgreSQL
	 * (a block of ids, a delete, a node's lease, the start-up's) is cancelled after it too,
	 * and fails: the engine thread is never held longer by one. */
	int64_t commit_timeout_ms;
	/* PostgreSQL only: every transaction that writes first checks, inside itself, that the
	 * server's synchronous_standby_names is set, and fails (BATON_EBUSY, so nothing of it
	 * is answered as done) when it is not. Ignored on SQLite. */
	int require_sync_replication;
} baton_engine_config;

/*
 * Opens (creating or migrating) the database, loads every unfinished workflow and
 * resumes it: steps that were running when the process stopped run again as a new
 * attempt, retry waits are honoured from their persisted time. On success *out is a
 * new engine, to be closed with baton_engine_close.
 */
int baton_engine_open(const baton_engine_config *cfg, baton_engine **out, baton_error *err);

/*
 * One HTTP exchange with another node, made with libcurl (loaded at the first one, as for
 * HTTP steps): the server passes on the requests that only another node can answer.
 * headers: "Name: value" lines, NULL-terminated. aborted(ud), when set, is asked several
 * times a second and ends the exchange by returning 1. 0 with the answer in p (its body
 * malloc'd, freed by the caller), or -1 with p->why: no answer came (p->status 0).
 * handle, when not NULL, keeps a libcurl handle (and its kept-alive connections) from one
 * exchange to the next of one thread: NULL at first, closed with baton_http_close. Any
 * thread.
 */
typedef struct baton_http_req {
	const char *method, *url;
	const char *const *headers;
	const char *body;
	size_t body_len;
	int64_t timeout_ms;
	int (*aborted)(void *ud);
	void *ud;
	/* 0: aborted() cuts the exchange. Else aborted() half-closes the connection (the
	 * other side sees its client gone) and the answer is still read, for up to drain_ms
	 * more, so that an answer already written is not lost unseen; such an exchange runs
	 * on a connection of its own, closed at its end. */
	int64_t drain_ms;
} baton_http_req;
typedef struct baton_http_resp {
	long status;
	char *body;
	size_t body_len;
	char content_type[128];
	char location[300];
	int retry_after; /* seconds, 0: none */
	char why[256];
} baton_http_resp;
int baton_http_exchange(void **handle, const baton_http_req *q, baton_http_resp *p);
void baton_http_close(void *handle);

/* Sets the URL at which the other nodes reach this one (as advertise_url does at open;
 * for one known only once the server listens), from the next lease renewal on. Any
 * thread. */
void baton_engine_advertise(baton_engine *e, const char *url);

/* The cluster's live nodes: {"nodes": [{"id", "url", "self", "lease_expires_at",
 * "partitions", "resources", "running_steps"}]} (on SQLite this node alone). Any thread. */
int baton_engine_nodes(baton_engine *e, json_t **out, baton_error *err);
/* This node's figures: {"node_id", "clustered", "nodes", "partitions", "lease_expires_at"
 * (ms, 0 when none), "partitions_gained", "partitions_lost", "renew_failures"}. Any thread. */
json_t *baton_engine_cluster(baton_engine *e);
/* What the database promises of this node's commits, as last read (a new reference):
 * {"backend": "sqlite" | "postgresql", "sync_replication": true | false | null,
 * "sync_standbys": N | null}. sync_replication is true when the server's
 * synchronous_standby_names is set (so each commit waits for a standby), null where it
 * does not apply (SQLite) or was not read yet; sync_standbys counts the standbys that
 * pg_stat_replication shows as sync or quorum. Any thread. */
json_t *baton_engine_store(baton_engine *e);

/*
 * A request's round on its own thread. Between baton_engine_hold and baton_engine_help,
 * what the calling thread posts to `e` (a submission, a lease or task request) does not
 * wake the engine thread. baton_engine_help then runs the engine's next round on the
 * calling thread when the engine thread is idle: the request is applied, committed and
 * answered (its callback called) before it returns, with no hand-over between threads
 * and back. Otherwise it wakes the engine thread, as the post would have. On a store
 * whose writes may wait for a network (PostgreSQL), hold does nothing and posts wake the
 * engine thread at once. Every hold must be followed by a help on the same thread, with
 * no lock held that an answer's callback takes. Both accept NULL, and then do nothing.
 */
void baton_engine_hold(baton_engine *e);
void baton_engine_help(baton_engine *e);

/*
 * Stops the engine: no new step starts, running steps get up to `timeout_ms` to finish
 * and be checkpointed; steps still running then are abandoned and run again after the
 * next open, as after a crash. Closes the database. Accepts NULL. Call from one thread,
 * once, after every other call has returned.
 */
void baton_engine_close(baton_engine *e, int64_t timeout_ms);

/*
 * Validates a workflow request (the JSON body of POST /workflows, borrowed) and, when it
 * is new, persists it durably before returning. On success *workflow is a new reference
 * to the workflow as baton_engine_get returns it, and *created is 1 for a new workflow,
 * 0 when the same id was already stored with the same definition. Errors: BATON_EINVAL
 * (err->msg names the offending field), BATON_ECONFLICT (id stored with another
 * definition), BATON_EBUSY (the storage is failing or the engine is stopping).
 */
int baton_engine_submit(baton_engine *e, const json_t *request, json_t **workflow, int *created,
			baton_error *err);

/*
 * Called once, from the engine thread, when an asynchronous submission is answered: rc
 * BATON_OK with the workflow's id (created: 1 when it is new, 0 for an identical
 * re-POST), or an error code and why. It must return quickly and must not call the
 * engine; read the workflow afterwards with baton_engine_get.
 */
typedef void (*baton_submitted_fn)(void *ud, int rc, const char *id, int created, const char *why);
/*
 * baton_engine_submit without waiting for the commit, so that a caller's thread can
 * serve others meanwhile: a request that is not valid, or a full engine inbox, is
 * answered here (and done is never called); otherwise BATON_OK, and done follows once the
 * submission is durable or refused, as baton_engine_submit would have answered.
 */
int baton_engine_submit_async(baton_engine *e, const json_t *request, baton_submitted_fn done,
			      void *ud, baton_error *err);

/*
 * Decodes a request body as one JSON value (duplicate keys refused). On success *out is
 * a new reference. BATON_EINVAL with the line and column of malformed JSON, or
 * BATON_EINTERNAL when memory ran out while decoding.
 */
int baton_decode_json(const char *buf, size_t len, json_t **out, baton_error *err);

/*
 * v as compact JSON text, byte for byte what json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY)
 * writes, followed by `end` (NUL for none, or '\n' for a response body) and a NUL; *len,
 * when not NULL, is its length without the NUL. The text is the caller's to free(). It
 * costs a fraction of json_dumps (no allocation per value, no printf); v is only read.
 * NULL when v is NULL. Any thread. Aborts when memory runs out, as the engine does.
 */
char *baton_json_text(const json_t *v, char end, size_t *len);

/* The committed state of workflow `id`, with its steps; *out is a new reference. */
int baton_engine_get(baton_engine *e, const char *id, json_t **out, baton_error *err);
/* The same as compact JSON text followed by a newline (*text malloc'd, *len its length
 * without the terminating NUL): what an HTTP answer sends. Finished workflows are
 * served from a cache of their text. */
int baton_engine_get_text(baton_engine *e, const char *id, char **text, size_t *len,
			  baton_error *err);

/* Filters of baton_engine_list; NULL or 0 fields do not filter. */
typedef struct baton_list_query {
	const char *status;
	const char *resource;
	int limit;	    /* 1..1000, 0 means 50 */
	const char *cursor; /* next_cursor of a previous page, or NULL */
} baton_list_query;

/* Workflows, newest first: {"workflows": [...], "next_cursor"}; *out is a new reference. */
int baton_engine_list(baton_engine *e, const baton_list_query *q, json_t **out, baton_error *err);

/*
 * Steps of workflow `id` (as in its document) with index > after (-1: from step 0), at
 * most `limit` (>= 1): {"workflow_id", "status", "steps_total", "steps": [...],
 * "next_after"}, next_after the `after` of the next page or null after the last step.
 * BATON_ENOTFOUND when there is no such workflow. New reference.
 */
int baton_engine_steps(baton_engine *e, const char *id, int after, int limit, json_t **out,
		       baton_error *err);

/*
 * Events of workflow `id` with seq > after, at most `limit` of them (0: all):
 * {"workflow_id", "status", "events": [...], "next_after"}, the status read before the
 * events; next_after is the `after` of the next page, null when this one holds the last
 * event stored now. New reference.
 */
int baton_engine_events(baton_engine *e, const char *id, int64_t after, int limit, json_t **out,
			baton_error *err);

/*
 * Cancels workflow `id` (see the API reference for the exact semantics) and returns its
 * state once the cancellation is committed. BATON_ECONFLICT when it already finished.
 */
int baton_engine_cancel(baton_engine *e, const char *id, json_t **out, baton_error *err);

/*
 * Deletes finished workflow `id` with its steps and events, durably before returning;
 * it then answers BATON_ENOTFOUND like any unknown id. BATON_ENOTFOUND when there is
 * none, BATON_ECONFLICT while it is pending or running (cancel it first).
 */
int baton_engine_delete(baton_engine *e, const char *id, baton_error *err);

/*
 * Writes a consistent copy of the whole database to the new file `path` while the engine
 * goes on working (SQLite's online backup, from a read transaction of its own); starting
 * an engine on the copy resumes what was unfinished in it. BATON_ECONFLICT when the store
 * is not copied this way (PostgreSQL: use its own tools). Any thread.
 */
int baton_engine_backup(baton_engine *e, const char *path, baton_error *err);

/*
 * Events about resource `name` (lock_requested, lock_acquired, lock_released,
 * workflow_cancelled) with seq > after, at most `limit` (0: all): {"resource", "events",
 * "next_after"} as for a workflow. New reference.
 */
int baton_engine_resource_events(baton_engine *e, const char *name, int64_t after, int limit,
				 json_t **out, baton_error *err);

/*
 * A snapshot of the engine's counters and histograms since open, as JSON (new
 * reference): {"steps_completed", "steps_failed", "steps_retried", "commits",
 * "checkpoints", "workflows_deleted", "deletes", "commit_seconds": histogram,
 * "checkpoints_per_commit": histogram, "workflows": {status: count}, "resources": {name:
 * {"queue_depth", "holders", "permits_in_use", "limit", "wait_seconds": histogram,
 * "hold_seconds": histogram}}}, where a
 * histogram is
 * {"le": [bounds...], "counts": [cumulative...], "count", "sum"}.
 */
int baton_engine_metrics(baton_engine *e, json_t **out, baton_error *err);

/* ---- leases: the resource's lock for any process (lease.c) ---- */

/*
 * A lease request. resource: a valid name; holder: who asks (a valid name, shown as the
 * holder); ttl_ms >= 1000: how long the lease lasts without a renewal; wait_ms 0..300000:
 * how long to wait in the queue (0: granted only when the resource is free and nobody
 * waits); request_id: NULL, or a valid name that makes a repeated request return the
 * same lease (the lease's id is then "lease-" and the request_id). Each arrival of the
 * request is the lease's next attempt (the answer's "attempt"); a repeated request for a
 * held lease is answered once that attempt is durable.
 */
typedef struct baton_lease_request {
	const char *resource, *holder, *request_id;
	int64_t ttl_ms, wait_ms;
	int exclusive; /* 1: every permit of the resource (see baton_resource_limit) */
} baton_lease_request;

/*
 * The answer to a lease call, on the engine thread: rc BATON_OK with the lease (a new
 * reference the callee owns: {"id", "resource", "holder", "state", "fencing_token",
 * "ttl_ms", "expires_at", ...}), or an error with why; with BATON_ECONFLICT for an
 * acquisition that was not granted, lease is {"holder": ..., "queue_length": N} (who
 * holds the resource, how many wait) when known. created: 1 for a new grant. An
 * acquisition's answer that says "held" names its "attempt": the one that
 * baton_lease_give_back names when the answer cannot be delivered.
 */
typedef void (*baton_lease_fn)(void *ud, int rc, int created, json_t *lease, const char *why);

/*
 * Queues a lease request. BATON_OK and done follows once it is granted and durable (or not
 * granted within wait_ms: BATON_ECONFLICT; or refused); or an error here (invalid input,
 * engine full) and done is never called. The request occupies a place in the resource's
 * FIFO queue, among workflow steps, and the grant takes the next fencing token.
 * *id (33+7 bytes at least: 48) receives the lease's id, for baton_lease_left.
 */
int baton_lease_acquire(baton_engine *e, const baton_lease_request *req, baton_lease_fn done,
			void *ud, char id[48], baton_error *err);
/*
 * Sets resource name's limit: how many may hold it at once, 1 (a mutex, the default) to
 * 10,000. done answers (lease NULL) once the limit is durable, or refuses as a lease call
 * is refused (another node drives the resource: BATON_EBUSY, lease {"node", "url"}).
 * Raising it grants the waiters that now fit; lowering it takes nothing from the holders.
 * BATON_EINVAL here for a bad name or limit (done is never called). Any thread.
 */
int baton_resource_limit(baton_engine *e, const char *name, int64_t limit, baton_lease_fn done,
			 void *ud, baton_error *err);

/*
 * The caller of the baton_lease_acquire whose ud this is went away while it waited: the
 * lease leaves the queue (its done gets BATON_ECONFLICT), unless a retry of its request_id
 * has taken that caller's place since, or it was granted first (then its answer cannot be
 * delivered: baton_lease_give_back). Any thread; nothing is answered.
 */
void baton_lease_left(baton_engine *e, const char *id, const void *ud);
/*
 * Gives back the grant of lease id that was answered to `attempt` (the "attempt" of the
 * answer: 1 for its first acquisition, each retry of its request_id the next) but could not
 * be delivered, or whose commit failed: it is released, unless a later attempt has arrived
 * since (answered or not), which keeps it (done: BATON_ECONFLICT), or it is not held. done
 * NULL: the engine's own, never refused and not answered; else answered as a release is.
 * BATON_EINVAL for an attempt below 1. Any thread.
 */
int baton_lease_give_back(baton_engine *e, const char *id, int64_t attempt, baton_lease_fn done,
			  void *ud, baton_error *err);
/* Renews (ttl_ms > 0: with a new ttl), releases, or reads lease id; done answers
 * (release: once durable). BATON_EGONE when it expired, BATON_ENOTFOUND when there is
 * no such lease. Any thread. Like every call below with a done (and submissions), it
 * returns BATON_EBUSY at once, and done is never called, when 4,096 clients' calls
 * already wait for the engine. */
int baton_lease_renew(baton_engine *e, const char *id, int64_t ttl_ms, baton_lease_fn done,
		      void *ud, baton_error *err);
int baton_lease_release(baton_engine *e, const char *id, baton_lease_fn done, void *ud,
			baton_error *err);
int baton_lease_get(baton_engine *e, const char *id, baton_lease_fn done, void *ud,
		    baton_error *err);
/* Lease id, which another node drives, is of `resource` (from that node's answer, relayed):
 * its renewals, releases and reads through this node are passed on with no read of the
 * store. Any thread; does nothing outside a cluster. */
void baton_lease_note(baton_engine *e, const char *id, const char *resource);
/* ---- external workers (task.c) ---- */

/*
 * Claims a task: the step of a worker {"external": true} that holds its resource and
 * waits to be done (worker, resource: filters, NULL for any). done answers BATON_OK with
 * the task ({"id", "workflow_id", "step", "worker", "resource", "attempt",
 * "fencing_token", "ttl_ms", "expires_at", "claim_attempt", "input"}, once its grant is
 * durable) or with lease NULL when none came within wait_ms (0..300000). The claimer must
 * heartbeat within ttl_ms (1000..86400000), else the attempt fails and is retried under the
 * workflow's retry policy. request_id (a valid name, or NULL): the same claim asked again
 * (its answer lost) is answered the task it claimed, while that claim holds, as its next
 * claim_attempt, once durable; its ttl counts again from then. Any thread.
 */
int baton_task_claim(baton_engine *e, const char *worker, const char *resource,
		     const char *request_id, int64_t wait_ms, int64_t ttl_ms, baton_lease_fn done,
		     void *ud, baton_error *err);
/*
 * Gives back the claim of task id answered to claim_attempt (the answer's "claim_attempt")
 * that could not be delivered or committed: the task is offered again, unless a retry of
 * the claim's request_id arrived since, which keeps it (done: BATON_ECONFLICT), or that
 * attempt is not claimed (BATON_ECONFLICT when the task waits for a claim, BATON_EGONE when
 * the attempt is over). done NULL: the engine's own, never refused and not answered; else
 * answered once durable, or refused as a heartbeat is (another node drives the task:
 * BATON_EBUSY naming it). BATON_EINVAL for a claim_attempt below 1. Any thread.
 */
int baton_task_give_back(baton_engine *e, const char *id, int64_t claim_attempt,
			 baton_lease_fn done, void *ud, baton_error *err);
enum { BATON_TASK_HEARTBEAT, BATON_TASK_COMPLETE, BATON_TASK_FAIL, BATON_TASK_UNCLAIM };
/*
 * Reports on task id ("<workflow id>.<step>.<attempt>"): a heartbeat (answered with the
 * task), its completion with result (stolen; NULL: null), its failure with error (a
 * retryable one is retried under the workflow's policy), or UNCLAIM (its claim could not
 * be delivered: it is offered again; done may be NULL). Completion and failure are
 * answered once durable. BATON_EGONE when the attempt is not the current claimed one
 * (expired, superseded, its workflow ended): nothing changes; BATON_ENOTFOUND when there
 * is no such workflow; BATON_EBUSY when the store could not be read to tell. Any thread.
 */
int baton_task_report(baton_engine *e, const char *id, int op, json_t *result, const char *error,
		      int retryable, baton_lease_fn done, void *ud, baton_error *err);

/* The server stops: every lease acquisition (and task claim) still waiting is answered
 * BATON_EBUSY, leases leave their queue, and new ones are refused. Any thread. */
void baton_lease_stop(baton_engine *e);

/* 1 when the engine is ready for new work: recovered, and its last commit succeeded. */
int baton_engine_ready(baton_engine *e);

/*
 * Resources in `order` (below), at most `limit` (1..BATON_RESOURCE_PAGE_MAX, 0:
 * BATON_RESOURCE_PAGE) after `cursor` (the next_cursor of a previous page, or NULL for the
 * first): {"resources": [...], "next_cursor": string or null}, each with its limit, permits
 * in use, first holder, queue length, oldest waiter's request time, last token and
 * totals. BATON_EINVAL for a bad limit or cursor. New reference.
 */
#define BATON_RESOURCE_PAGE	100
#define BATON_RESOURCE_PAGE_MAX 1000
/* The orders of baton_engine_resources: by name (byte order), or by contention: the
 * longest queues first, then by name. A cursor belongs to the order that returned it. */
enum { BATON_RESOURCES_BY_NAME, BATON_RESOURCES_BY_CONTENTION };
int baton_engine_resources(baton_engine *e, const char *cursor, int limit, int order, json_t **out,
			   baton_error *err);
/* One resource's holder, waiters and totals. New reference. */
int baton_engine_resource(baton_engine *e, const char *name, json_t **out, baton_error *err);

#endif
