/*
 * engine.h - the engine's private state, shared by engine.c (inbox, transitions, the
 * loop and the public API), commit.c (group commit and its effects) and recover.c.
 * Everything here belongs to the engine thread unless a comment names a lock.
 */
#ifndef BATON_ENGINE_H
#define BATON_ENGINE_H

#include "store.h"

enum msg_type {
	MSG_SUBMIT,
	MSG_CANCEL,
	MSG_OUTCOME,
	MSG_DELETE,
	MSG_OWNERSHIP, /* members.c: what the membership thread read */
	MSG_INBOX,     /* members.c: another node stored work for this one */
	MSG_LEASE,     /* from here on: leases and tasks */
	MSG_LEASE_OP,
	MSG_LEASE_STOP,
	MSG_TASK_CLAIM,
	MSG_TASK_OP,
	MSG_LIMIT /* permits.c: a resource's new limit */
};

/* Clients' calls (submissions, lease and task calls) waiting for the engine at most; more
 * are refused with BATON_EBUSY (eng_post_call). */
#define MAX_PENDING_SUBMITS 4096

/* A caller blocked until the engine has committed its request. */
/* The caller of a submission or cancel: waiting on cv, or (async) called back. */
typedef struct waiter {
	baton_submitted_fn cb; /* async: called once and the waiter freed; else cv */
	void *ud;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done;
	int rc;
	int created;
	baton_lease_fn lease_cb; /* a lease call (lease.c): answered with lease */
	json_t *lease;
	char id[MAX_NAME + 1];
	char msg[512];
} waiter;

typedef struct msg {
	int type;
	wf_row *wf;		 /* SUBMIT: the new row (owned); OUTCOME: the running workflow */
	char *id;		 /* CANCEL, DELETE */
	waiter *w;		 /* SUBMIT, CANCEL, DELETE */
	int idx, attempt;	 /* OUTCOME; LEASE_OP, TASK_OP: idx is the event */
	int64_t lease_attempt;	 /* LEASE_OP: the attempt a give-back undoes */
	const void *who;	 /* LEASE_OP: the acquisition whose caller left (its ud) */
	int64_t ttl_ms, wait_ms; /* LEASE, LEASE_OP, TASK_CLAIM; LIMIT: ttl_ms is the limit */
	int64_t wait_until;	 /* TASK_CLAIM, once it waits: its deadline */
	char *worker, *resource; /* TASK_CLAIM: its filters (NULL: any); LIMIT: the resource */
	step_output out;	 /* OUTCOME */
	store_ownership *own;	 /* OWNERSHIP (owned) */
	int64_t arrived;	 /* mono_ms when it was posted (under mu: in the inbox's order) */
	unsigned counted : 1;	 /* a client's call, counted in pending_submits (eng_post_call) */
	struct msg *next;
} msg;

typedef struct pending_event {
	int64_t seq;  /* 0 until a write numbers it; kept when that write is tried again */
	unsigned gen; /* the write that numbered it: rows never mix two writes' events */
	int64_t ts;
	wf_row *wf;
	const char *type; /* static string from machine.c */
	json_t *data;
} pending_event;

typedef struct timer {
	int64_t at;
	char *id;
} timer;

/* A growable array of any element type. */
#define VEC(T)                                                                                     \
	struct {                                                                                   \
		T *v;                                                                              \
		size_t n, cap;                                                                     \
	}
#define VEC_PUSH(vec, x)                                                                           \
	do {                                                                                       \
		if ((vec).n == (vec).cap) {                                                        \
			(vec).cap = (vec).cap ? (vec).cap * 2 : 16;                                \
			(vec).v = realloc((vec).v, (vec).cap * sizeof *(vec).v);                   \
			if (!(vec).v)                                                              \
				abort();                                                           \
		}                                                                                  \
		(vec).v[(vec).n++] = (x);                                                          \
	} while (0)

typedef struct dispatch {
	wf_row *wf;
	int idx, attempt;
	int64_t token;
} dispatch;

/*
 * An answer owed once this round commits (eng_reply). Its kind says what it tells its
 * caller, and so what becomes of it when the round is not committed (commit.c):
 */
enum reply_kind {
	REPLY_CHANGED,	     /* rc (200): a change was recorded; 503 when the round fails */
	REPLY_STORED,	     /* 201: a new workflow was stored; taken back with it when not */
	REPLY_LEASE_GRANTED, /* 201: "you hold it", a lease; when the round fails the caller is
				told 503 and the grant undone (a new lease taken back, an older
				one released), so nothing is held for nobody */
	REPLY_LEASE_HELD,    /* 200: "you hold it", to a retry of a lease's acquisition; when the
				round fails the caller is told 503 and its attempt given back */
	REPLY_TASK_CLAIMED   /* 200: "you hold it", a task; when not, offered again */
};
/* `part`: the partition of the resource the answer is about, -1 for none; when the ownership
 * check refuses the round and that partition leaves memory, the answer becomes a 503, since
 * what it reports was not written. A submission stored for another node (wf_row.foreign)
 * has none: it stays in the batch whoever drives its partition. */
typedef struct reply {
	waiter *w;
	int rc;
	int kind;
	int part;
} reply;

/* Metrics of one resource, read by other threads under metrics_mu. */
typedef struct res_metrics {
	char *name;
	int64_t queue_depth, holders, permits_in_use, limit;
	histogram wait, hold;
} res_metrics;

struct baton_engine {
	logger log;
	baton_commit_fn on_commit;
	void *on_commit_ud;
	VEC(baton_change) changes;

	pthread_mutex_t metrics_mu; /* guards the metrics below */
	uint64_t steps_completed, steps_failed, steps_retried, commits, checkpoints;
	uint64_t workflows_deleted, deletes; /* workflows, and the transactions deleting them */
	histogram commit_seconds, checkpoints_per_commit;
	strmap *res_metrics; /* name -> res_metrics */

	store *st;
	sched *pool;
	const workflow_def *def;
	const char *const *allow_call;
	pthread_t thread;
	int thread_started; /* the main thread's: set once the engine thread runs */
	int recovered;	    /* eng_recover ran once (at open, before the engine thread) */

	pthread_mutex_t mu; /* guards the inbox and the flags below */
	pthread_cond_t cv;
	msg *inbox, *inbox_tail;
	int stop;		   /* the engine thread must finish its work and exit */
	int pending_submits;	   /* clients' calls posted and not yet taken: bounds the inbox */
	int draining;		   /* no new grants: shutting down */
	int in_round;		   /* a thread runs a round: the engine thread or a helper */
	pthread_cond_t round_over; /* a round ended while draining (baton_engine_close) */
	int64_t sleep_until;	   /* mono_ms the idle engine thread waits for; INT64_MAX: a post */
	int64_t taken_mono; /* mono_ms when the round took its messages: each arrived before */
	char *hold_file;    /* the testing seam's control file (seam.c); NULL in production */

	/* The thread that runs a round only (the engine thread, or a helper: in_round). */
	int faulty;			  /* commits are failing */
	char fault_why[300];		  /* what callers are told while they do */
	int no_new_work;		  /* copy of draining, taken with each round */
	strmap *wfs;			  /* id -> wf_row, unfinished workflows */
	strmap *locks;			  /* resource name -> res_lock */
	int64_t wf_seq, wf_seq_end;	  /* workflow seqs handed out by the store: (wf_seq, end] */
	int64_t event_seq, event_seq_end; /* likewise for event seqs */
	/* A block of ids could not be taken (batch.c take_ids): until ids_retry_at (mono_ms) no
	 * other is asked for, and callers are told ids_why. */
	int64_t ids_retry_at;
	char ids_why[300];
	int64_t lock_seq;
	unsigned write_gen; /* writes tried so far (batch.c) */
	/* A write's outcome was unknown and no write has succeeded since: until one does,
	 * what that write held may be in the database, so nothing of it is taken back. */
	int write_unknown;
	/* How long a caller waits for its round's commit (baton_engine_config), and since when
	 * (mono_ms) the oldest answer owed now has waited. */
	int64_t commit_timeout_ms, replies_since;
	int64_t now; /* the current round's time (ms since the epoch) */
	VEC(wf_row *) dirty_wfs;
	VEC(res_lock *) dirty_locks;
	VEC(pending_event) events;
	VEC(dispatch) dispatches;
	VEC(reply) replies;
	VEC(wf_row *) finished;
	VEC(timer) timers; /* binary min-heap on .at */
	int64_t fault_backoff_ms, retry_commit_at;
	int64_t retention_ms;	 /* 0: finished workflows are kept */
	int64_t purge_at;	 /* mono_ms of the next retention pass */
	int leases_stopped;	 /* no lease waits any more: the server is stopping */
	VEC(char *) tasks_ready; /* ids of workflows whose external step waits for a claim */
	VEC(msg *) claims;	 /* claims waiting for a task, oldest first */
	uint64_t leases_granted, leases_released, leases_expired, leases_refused; /* metrics_mu */
	size_t timers_pending; /* metrics_mu: the timer heap's size, as of the last round */
	textbuf text;	       /* the event rows being written (batch.c) */
	VEC(store_event_row) event_rows;
	VEC(const resource_row *) res_rows;
	/* Idle resources kept in memory, least recently used first (idle.c). */
	res_lock *idle_head, *idle_tail;
	size_t idle_n, idle_max;
	VEC(res_lock *) unloaded; /* their stored row could not be read yet */
	int64_t load_retry_at;	  /* mono_ms of the next try; 0: none due */
	int load_failing;	  /* logged once per outage */

	/* A cluster (members.c). Without one (SQLite) this node drives every resource. */
	int clustered;
	char node_id[MAX_NAME + 1];
	char advertise_url[MAX_URL + 1];    /* where the other nodes reach this one */
	int64_t epoch[PARTS];		    /* the partitions this node drives, under which epoch */
	int64_t released[PARTS];	    /* the epoch under which it gave each up */
	unsigned char leaving[PARTS];	    /* being handed over: no new grants */
	char owner[PARTS][MAX_NAME + 1];    /* every partition's owner, as last read */
	char owner_url[PARTS][MAX_URL + 1]; /* and where that owner is reached */
	int want;			    /* this node's fair share */
	int64_t owners_read_at; /* proof_ms when what epoch[] says was read (store_ownership) */
	int inbox_due;		/* under mu: a hint came */
	int64_t inbox_at;	/* mono_ms of the next poll of the inbox */
	uint64_t parts_gained, parts_lost; /* metrics_mu */
	int parts_held;			   /* metrics_mu */
	int parts_logged;		   /* the count the log last reported */
	int64_t parts_log_at;		   /* mono_ms: report a changed count then */
	/* The resource of leases that another node drives, as this node passed them on
	 * (lease.c, "Where a lease passed on lives"): allocated at the first, under hints_mu. */
	struct lease_hint *hints;
	pthread_mutex_t hints_mu;
};

/* seam.c: a test may hold the engine at point ("round": m is the round's messages, and
 * those posted while it waits join them; "answers": m NULL). */
void eng_seam(baton_engine *e, const char *point, msg **m);
/* The wall-clock time (the round's clock, ms) at which m arrived. Engine thread. */
int64_t eng_arrival(const baton_engine *e, const msg *m, int64_t now);

/* engine.c */
void eng_waiter_done(waiter *w, int rc, int created, const char *msg_text);
void eng_timer_push(baton_engine *e, int64_t at, const char *id);
/* A timer for wf's lease or claim at `at`, unless one at or before it is pending: a
 * renewal or a heartbeat, which only moves a deadline later, adds no timer. When the
 * pending one fires early, the next deadline (lease_deadline, the claim's expiry) is
 * armed again. */
void eng_timer_arm(baton_engine *e, wf_row *wf, int64_t at);
/* The next time a lease's timer must fire: its expiry, grace or wait deadline; 0: none. */
int64_t lease_deadline(const wf_row *wf);
void eng_on_event(void *ctx, const wf_row *wf, const char *type, json_t *data);
void eng_touch_wf(baton_engine *e, wf_row *wf);
void eng_touch_lock(baton_engine *e, res_lock *l);
void eng_request(baton_engine *e, wf_row *wf, int idx, int64_t now);
void eng_follow(baton_engine *e, wf_row *wf, transition t, int64_t now);
void eng_grant(baton_engine *e, int64_t now);
void eng_post(baton_engine *e, msg *m);
/* Posts m, a client's call, unless MAX_PENDING_SUBMITS of them wait for the engine already:
 * BATON_OK, or BATON_EBUSY with why in err (m not posted; still the caller's). What the
 * engine owes others (a grant given back, a waiter that left) goes through eng_post. Any
 * thread. */
int eng_post_call(baton_engine *e, msg *m, baton_error *err);
void eng_grant_lock(baton_engine *e, res_lock *l, int64_t now);

/* lease.c */
void lease_apply(baton_engine *e, msg *m, int64_t now);
/* A lease was granted in grant_lock: its expiry timer, its caller's answer. */
void lease_granted(baton_engine *e, wf_row *wf, int64_t now);
/* A timer of a lease fired: expiry, or the end of its wait. */
void lease_timer(baton_engine *e, wf_row *wf, int64_t now);
/* The caller of lease id was told 503 while the round of its grant (or of a retry's hold)
 * may still commit: held, it is kept a grace for that caller to come back, then released. */
void lease_unconfirmed(baton_engine *e, const char *id, int64_t now);
/* The lease was cancelled as a workflow: its waiting caller is told. */
void lease_cancelled(baton_engine *e, wf_row *wf);
/* Recovery: a stored lease step; 1 when it was taken care of. */
int lease_recover(baton_engine *e, wf_row *wf);
/* At recovery: an external step that was claimed stays claimed (1), for its stored ttl
 * counted from now; 0 when wf's step is not such a claim. */
int task_recover(baton_engine *e, wf_row *wf);
/* Every lease caller still waiting is answered (the engine is closing). */
void lease_stop(baton_engine *e);

/* permits.c: sets a resource's limit (MSG_LIMIT); its caller is answered after the commit. */
void permits_apply(baton_engine *e, msg *m, int64_t now);

/* task.c: external workers */
#define TASK_CLAIMS_TIMER "\001claims" /* the timer id of waiting claims */
int task_is_external(const step_row *st);
/* An external step was granted: it goes to a waiting claim, or waits for one. */
void task_ready(baton_engine *e, wf_row *wf, int64_t now);
/* A timer of wf fired: 1 when it was its claim's expiry (handled). */
int task_timer(baton_engine *e, wf_row *wf, int64_t now);
void task_claims_timer(baton_engine *e, int64_t now);
/* The workflow was cancelled: its external step, granted and not claimed, ends (a claimed
 * one ends with its claimer's outcome or the claim's expiry). */
void task_cancelled(baton_engine *e, wf_row *wf, int64_t now);
void task_apply(baton_engine *e, msg *m, int64_t now);
void task_stop(baton_engine *e);
void task_free_all(baton_engine *e);

/* idle.c: l leaves memory (its partition went to another node). */
void eng_drop_lock(baton_engine *e, res_lock *l);
/* idle.c: a resource's lock, from memory or read back from the store (unloaded when
 * the read failed: it queues but does not grant until eng_load_pending reads it). */
res_lock *eng_lock_of(baton_engine *e, const char *name);
void eng_load_pending(baton_engine *e);
/* After a commit: l, when idle, joins the idle resources kept in memory; the least
 * recently used beyond idle_max leave memory. */
void eng_park(baton_engine *e, res_lock *l);

/* batch.c: writes the round's changes in one transaction (store_write). */
int eng_write_batch(baton_engine *e, store_write_failure *why, baton_error *err);
/* A new workflow seq from the store's blocks; BATON_OK or the store's error. */
int eng_next_wf_seq(baton_engine *e, int64_t *seq, baton_error *err);

/* commit.c: commits the round; on success performs its effects, on failure keeps
 * everything pending and schedules a retry. */
void eng_flush(baton_engine *e);

/* recover.c: loads the unfinished workflows of the partitions in parts and queues them
 * again; inbox: only those another node stored for this one (members.c). */
int eng_recover(baton_engine *e, uint64_t parts, int inbox, baton_error *err);

/* engine.c: cancels a workflow in memory (not finished) */
void eng_cancel_wf(baton_engine *e, wf_row *wf, int64_t now);

/* members.c: the engine's side of a cluster */
int members_join(baton_engine *e, const baton_engine_config *cfg, baton_error *err);
/* 1 when this node drives the resource now (and grants it). */
int eng_drives(const baton_engine *e, const char *resource);
/* The partitions whose workflows this node drives, as a batch's fence needs them. */
uint64_t members_parts(const baton_engine *e, const char *resource);
void members_apply(baton_engine *e, msg *m, int64_t now);
/* Each round, after the messages: the inbox, hand-overs. */
void members_round(baton_engine *e, int64_t now);
/* A write was refused because this node lost a partition: what it lost leaves memory.
 * BATON_OK, or the store's error when it could not tell what it holds. */
int members_fenced(baton_engine *e, baton_error *err);
/* When (proof_ms) a step granted now must not send its call any more (step_input.send_by),
 * 0 without a cluster. Engine thread. */
int64_t members_send_by(baton_engine *e);
/*
 * May this node tell a client "you hold it" (a renewal, a heartbeat, a held lease or claim
 * answered from memory: hold_move.proof) for `resource` now? Only while it drives the
 * resource's partition and, in a cluster, its node lease as the database last confirmed it
 * has not run out by this node's monotonic clock, less a tenth for clock-rate drift
 * (members_send_by): until then no other node can claim the partition, and one that claims
 * it later counts every lease's ttl again from its claim, after any expiry promised here.
 * 1: it may. 0: it may not, and w (if any) is answered 503 with why and, when another node
 * drives the resource, w->lease = {"node", "url"}: that node, to which the HTTP layer passes
 * the request on. The one check before every answer that promises from memory; what is
 * answered after a commit is proven by the commit's ownership check. Engine thread.
 */
int eng_promise(baton_engine *e, waiter *w, const char *resource);
/* Answers w 503 for a resource that another node drives (or that this one is taking over
 * and has not loaded yet), naming that node as eng_promise does. Engine thread. */
void eng_pass_on(baton_engine *e, waiter *w, const char *resource);
/* Whether another node drives resource, as last read, and says where it is reached. */
int members_elsewhere(const baton_engine *e, const char *resource);
/* Whether the node lease is fresh enough to call this node ready (/readyz): false from half
 * a lease without a confirmed renewal, before eng_promise refuses. Any thread. */
int members_ready(baton_engine *e);
/* Sets (value: stolen) or removes (NULL) a key of step idx's params, which are written with
 * this round (step_row.params_dirty): what a lease or a claim must keep across a restart or
 * a failover. The params object is copied first: it may be shared. */
void eng_set_param(baton_engine *e, wf_row *wf, int idx, const char *key, json_t *value);
/* Owes w the answer rc once this round commits (see reply); resource may be NULL. */
void eng_reply(baton_engine *e, waiter *w, int rc, int kind, const char *resource);
/* For a 503: who drives the resource. */
void members_who(const baton_engine *e, const char *resource, char *out, size_t n);

#endif
