/*
 * internal.h - what the files of lib/ share and nobody else sees.
 *
 * The rows below are the engine's in-memory state and, field for field, what store.c
 * persists: the engine mutates them on its own thread, store.c writes them in the next
 * group commit, and read queries rebuild the same rows from the database to render JSON.
 * Times are milliseconds since the Unix epoch; 0 means "not set".
 */
#ifndef BATON_INTERNAL_H
#define BATON_INTERNAL_H

#include "baton.h"

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

enum wf_status { WF_PENDING, WF_RUNNING, WF_COMPLETED, WF_FAILED, WF_CANCELLED, WF_NSTATUS };
enum step_status {
	ST_PENDING,  /* not reached yet */
	ST_WAITING,  /* queued for the resource */
	ST_RUNNING,  /* holds the resource, its attempt is executing */
	ST_RETRYING, /* failed, waits for next_attempt_at */
	ST_COMPLETED,
	ST_FAILED,
	ST_CANCELLED,
	ST_NSTATUS
};
enum on_failure { ON_FAILURE_FAIL, ON_FAILURE_CONTINUE };

#define MAX_WORKERS 10000
/*
 * A workflow's step results together, as compact JSON, at most (each one is also capped:
 * an HTTP answer's body at 1 MiB). The workflow's own result, its workflow_completed
 * event and its GET answer carry them all again, so this bounds every row, event and
 * answer of the workflow far below what SQLite and PostgreSQL accept (1 GB). A step whose
 * result would pass it fails for good (no retry) with an error that says so.
 */
#define MAX_WORKFLOW_RESULTS (16 * 1024 * 1024)

#define MAX_NAME 128
#define MAX_URL	 255 /* a node's --advertise-url */

const char *wf_status_name(int s);
int wf_status_parse(const char *s); /* -1 when unknown */
const char *step_status_name(int s);
int step_status_parse(const char *s);

/* Retry n (n >= 1) waits min(first_retry_ms * backoff^(n-1), max_delay_ms). */
typedef struct retry_policy {
	int max_attempts;
	int64_t first_retry_ms;
	double backoff;
	int64_t max_delay_ms;
} retry_policy;

typedef struct step_row {
	int index;
	char *worker;
	json_t *params; /* normalized worker object: {"name", "work_ms", "fail_attempts"} */
	int status;
	int attempts;
	int64_t lock_seq; /* FIFO order of the current lock request */
	int64_t requested_at;
	int64_t token; /* fencing token of the latest grant, 0 = none */
	int64_t started_at, finished_at;
	int64_t duration_ms; /* -1 = none */
	int64_t next_attempt_at;
	char *error;
	json_t *result;
	int queue_position; /* reads only: 1 = next to be granted, 0 = not waiting */
	char *node;	    /* reads only: the cluster node that drove its latest attempt */
	unsigned dirty : 1;
	unsigned stored : 1;	   /* the row exists in the database (a pending step has none) */
	unsigned params_dirty : 1; /* params changed since the row was stored (a lease's ttl) */
} step_row;

typedef struct wf_row {
	int64_t seq; /* insertion order */
	char *id;
	char *resource;
	char *definition; /* normalized request, compared on re-POST */
	int status;
	int cancel_requested;
	int64_t created_at, started_at, finished_at;
	int steps_total, steps_completed;
	json_t *result;
	char *error;
	retry_policy retry;
	int on_failure;
	step_row *steps;
	/* engine-only */
	int cur;		/* index of the step in progress, steps_total when done */
	int dirty_lo, dirty_hi; /* steps [lo, hi) may be dirty */
	int in_flight;		/* an attempt of steps[cur] is executing on a step thread */
	int stored_status;	/* status as last committed, -1 before the first commit */
	size_t results_bytes;	/* compact JSON of the completed steps' results, together */
	/* dirty: a column of the workflow's own row changed, other than steps_completed
	 * (which the row stores only once the workflow ends; until then it is counted
	 * from the step rows) */
	unsigned dirty : 1, is_new : 1, done : 1, in_batch : 1, noted : 1;
	/* Cluster (members.c). foreign: submitted here for a resource another node drives:
	 * stored for that node to adopt, then dropped from memory. lost: its partition went to
	 * another node while an attempt ran here; freed when the attempt's outcome comes. */
	unsigned foreign : 1, lost : 1;
	/* A lease (lease.c): a one-step workflow whose step an outside process holds until
	 * it releases it or stops renewing it. In memory only: expires_at, the caller.
	 * lease_named: asked for with a request_id, so its caller can come back for it (its
	 * wait deadline is stored). lease_grace_until > 0: granted while no caller waited for
	 * it (kept across a restart); released then unless a caller came back for it. */
	unsigned lease : 1, lease_named : 1;
	int64_t lease_ttl_ms, lease_expires_at, lease_wait_until, lease_grace_until;
	struct waiter *lease_w; /* the acquisition's caller until it is answered */
	/* The arrivals of its acquisition so far: the first request is attempt 1, each retry
	 * of its request_id the next. Stored with the round of each retry ("attempt"). */
	int64_t lease_attempt;
	/* An external step (task.c) that a process has claimed, until when, for how long. */
	unsigned task_claimed : 1;
	int64_t task_expires_at, task_ttl_ms;
	/* The claim's request_id (NULL: none) and its arrivals so far (the first claim is 1,
	 * each retry of its request_id the next); both stored with the claim. */
	char *task_claim_rid;
	int64_t task_claim_attempt;
	/* The earliest timer pending for its lease or claim (eng_timer_arm), 0: none. */
	int64_t hold_timer_at;
} wf_row;

/* The compact JSON size of the completed steps' results (recovery counts them again). */
size_t wf_results_bytes(const wf_row *wf);

typedef struct resource_row {
	char *name;
	int64_t last_token;
	int64_t grants, total_hold_ms, max_hold_ms, total_wait_ms, max_wait_ms;
	int64_t holder_seq; /* the first holder's workflow seq, 0 when free (for reads) */
	int holder_idx;
	int permits; /* the limit: how many may hold it at once (1: a mutex) */
	/* For reads: every holder as JSON [[seq, idx], ...] when more than one holds, else
	 * NULL (the first holder says it all); owned, rebuilt with each write (batch.c). */
	char *holders;
} resource_row;

void wf_row_free(wf_row *wf); /* frees the row, its steps and the struct itself */

/* Marks step idx as changed since the last commit. */
static inline void wf_mark_step(wf_row *wf, int idx)
{
	wf->steps[idx].dirty = 1;
	if (idx < wf->dirty_lo)
		wf->dirty_lo = idx;
	if (idx + 1 > wf->dirty_hi)
		wf->dirty_hi = idx + 1;
}
/* After a commit: what was dirty is now stored. */
static inline void wf_clear_dirty(wf_row *wf)
{
	for (int i = wf->dirty_lo; i < wf->dirty_hi; i++) {
		wf->steps[i].stored |= wf->steps[i].dirty;
		wf->steps[i].params_dirty &= !wf->steps[i].dirty;
		wf->steps[i].dirty = 0;
	}
	wf->dirty_lo = wf->steps_total;
	wf->dirty_hi = 0;
	wf->dirty = 0;
	wf->is_new = 0;
}
void resource_row_fini(resource_row *r);

/* ---- util.c ---- */
/*
 * baton's clock, in ms since the epoch: the wall clock as it read at the first call, carried
 * on by CLOCK_MONOTONIC. Every timer, expiry, wait and timestamp of the engine reads it, so
 * a step of the wall clock while batond runs (an NTP step, a VM resumed) moves none of
 * them; the timestamps it shows stay a wall time that ignores steps since the start. Thread
 * safe.
 */
int64_t now_ms(void);
int64_t mono_ms(void);
/*
 * The clock of a node's proof that it still drives its partitions (members.c, pg_cluster.c)
 * and of an HTTP step's send-by bound (call.c), in ms: CLOCK_BOOTTIME, which keeps counting
 * while the machine is suspended. CLOCK_MONOTONIC stops then: a node resumed after a suspend
 * longer than its lease would count a lease that ran out meanwhile, and another node may
 * have claimed its partitions. Only differences of its values mean anything. Thread safe.
 */
#define PROOF_CLOCK CLOCK_BOOTTIME
int64_t proof_ms(void);
/* The wall clock itself (CLOCK_REALTIME), for what another machine dated: an HTTP date. */
int64_t wall_ms(void);
/* A condition variable whose timed waits take CLOCK_MONOTONIC deadlines (mono_ms). */
void cond_init_monotonic(pthread_cond_t *c);
void format_time(int64_t ms, char buf[32]);
json_t *time_json(int64_t ms); /* new reference: string or null */
int err_set(baton_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4))); /* returns code */
int random_id(char out[33]);		   /* 128 random bits as hex */
uint32_t fnv1a(const char *s);
/* A cluster's unit of ownership (members.c): every resource belongs to one of PARTS
 * partitions, and one node at a time drives all the resources of a partition. */
#define PARTS 64
/*
 * The generation of the database a cluster runs on (pg_store.c): it rises at every promotion
 * of a standby, and a partition's epoch and a resource's fencing tokens granted under a
 * generation start at its floor, GENERATION_STEP times the generation, so that they outrank
 * everything granted under earlier ones, even what the promoted standby never received.
 * Tokens stay below 2^53 (exact in every JSON client) for generations below 2^13.
 */
#define GENERATION_BITS 40
#define GENERATION_STEP ((int64_t)1 << GENERATION_BITS)
static inline int64_t generation_floor(int64_t epoch)
{
	return epoch & ~(GENERATION_STEP - 1);
}
static inline int part_of(const char *resource)
{
	return (int)(fnv1a(resource) % PARTS);
}
char *xstrdup(const char *s); /* aborts on out of memory */
void *xcalloc(size_t n, size_t size);

/* A string-keyed hash map of borrowed pointers (keys are borrowed too). */
typedef struct strmap strmap;
strmap *strmap_new(void);
void strmap_free(strmap *m);
void *strmap_get(const strmap *m, const char *key);
void strmap_put(strmap *m, const char *key, void *value); /* replaces */
void strmap_del(strmap *m, const char *key);
size_t strmap_len(const strmap *m);
void strmap_free_values(strmap *m, void (*fn)(void *)); /* calls fn on each value, frees m */
void strmap_each(const strmap *m, void (*fn)(void *ctx, void *value), void *ctx);

/*
 * jansson's allocations go through a tracker that notes a failure in json_oom (this
 * thread's flag), so that code building JSON can tell "out of memory" from "invalid".
 * json_alloc_track(NULL) installs it over malloc; tests pass a failing allocator.
 */
extern _Thread_local int json_oom;
void json_alloc_track(void *(*inner)(size_t));

/* ---- log.c ---- */
typedef struct logger {
	baton_log_fn fn;
	void *ud;
	int level;
	baton_log_flush_fn flush;
} logger;
void logf_(const logger *lg, int level, const char *wf_id, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define log_at(lg, lvl, wf, ...)                                                                   \
	do {                                                                                       \
		if ((lg)->fn && (lvl) >= (lg)->level)                                              \
			logf_((lg), (lvl), (wf), __VA_ARGS__);                                     \
	} while (0)

/* ---- metrics.c ---- */
#define HIST_BUCKETS 16
typedef struct histogram {
	uint64_t buckets[HIST_BUCKETS]; /* not cumulative; above the last bound only in count */
	uint64_t count;
	double sum;
} histogram;
extern const double hist_seconds[HIST_BUCKETS];
extern const double hist_counts[HIST_BUCKETS];
void hist_observe(histogram *h, const double *bounds, double v);
json_t *hist_json(const histogram *h, const double *bounds); /* new reference */

/* ---- retry policy (machine.c) ---- */
/* Wait before retry n (n >= 1): min(first_retry_ms * backoff^(n-1), max_delay_ms). */
int64_t retry_delay_ms(const retry_policy *p, int n);

/* ---- steps and workflow definitions ---- */
typedef struct step_input {
	const char *workflow_id;
	const char *resource;
	const char *worker;
	int index;
	int attempt;
	int64_t fencing_token;
	const json_t *params;			/* borrowed */
	int (*sleep_ms)(void *ctx, int64_t ms); /* returns non-zero when aborted */
	int (*aborted)(void *ctx);		/* non-zero once the engine stops */
	void *sleep_ctx;
	/* proof_ms() after which an HTTP call must not be sent, 0 for no limit: in a cluster,
	 * when this node's lease may have run out and another node may run the step. */
	int64_t send_by;
} step_input;

typedef struct step_output {
	json_t *result;		/* new reference on success */
	char error[256];	/* on failure */
	int retryable;		/* a failure that may succeed on a later attempt */
	int64_t retry_after_ms; /* minimum wait asked for by the resource, 0 = none */
	int64_t duration_ms;
	int aborted;	/* the engine is stopping: nothing to record */
	json_t *detail; /* new reference or NULL: added to the attempt's event */
} step_output;

/*
 * A kind of workflow on top of the general engine: how one step runs, and how the
 * workflow's result is made from its finished steps.
 */
typedef struct workflow_def {
	const char *kind;
	void (*run_step)(const step_input *in, step_output *out);
	json_t *(*result)(const wf_row *wf); /* new reference */
} workflow_def;

extern const workflow_def mutex_workflow; /* mutex.c */

/* call.c: the HTTP step (params.call), and loading libcurl. */
void call_run(const step_input *in, step_output *out);
/* Loads libcurl (once it worked, at once): 0 when HTTP steps can run, else -1 with the
 * reason in why. A failed load is tried again at the next call. */
int call_load(char *why, size_t n);

/*
 * answer.c: what a resource sent back, as a new JSON object that any store and reader
 * accepts (valid UTF-8, no NUL): {"status", "content_type" (string or null), "body" (the
 * JSON value, a UTF-8 string, or base64 with "encoding": "base64"), "truncated": true
 * when cut}. body may be NULL (len 0). NULL only when out of memory.
 */
json_t *answer_json(long status, const char *content_type, const char *body, size_t len,
		    int truncated);
/* Drops an incomplete UTF-8 sequence at the end of s (a cut made by snprintf). */
void utf8_trim(char *s);

/* ---- machine.c: pure transitions, no threads, no I/O ---- */
typedef struct event_sink {
	void (*emit)(void *ctx, const wf_row *wf, const char *type, json_t *data /* stolen */);
	void *ctx;
} event_sink;

/* What the engine must do after a transition. */
typedef struct transition {
	int release;	  /* the step's hold on the resource ends */
	int request;	  /* index of a step that must queue for the resource, or -1 */
	int64_t timer_at; /* > 0: wake the workflow at this time (retry wait) */
	int finished;	  /* the workflow reached a final status */
} transition;

void machine_request(wf_row *wf, int idx, int64_t lock_seq, int64_t now, const event_sink *ev);
/* slot: the grant's (lock.c), -1 for an exclusive one. */
void machine_grant(wf_row *wf, int64_t token, int slot, int64_t waited_ms, int64_t now,
		   const event_sink *ev);
transition machine_outcome(wf_row *wf, const step_output *out, const workflow_def *def, int64_t now,
			   const event_sink *ev);
transition machine_timer(wf_row *wf, int64_t now);
/* 1 for the event types that also belong to their resource's history. */
int machine_resource_event(const char *type);
transition machine_cancel(wf_row *wf, const workflow_def *def, int64_t now, const event_sink *ev);
void machine_interrupted(wf_row *wf, const event_sink *ev);

/* ---- lease_machine.c, task_machine.c: what an outside process holds, pure ---- */

/* How the caller of an event is answered. */
enum hold_answer {
	HOLD_SILENT,	/* the event has no caller to answer */
	HOLD_PROMISE,	/* "you hold it", from memory: only once eng_promise proves it */
	HOLD_READ,	/* its state as it is now: a read that promises nothing */
	HOLD_COMMITTED, /* its state once this round is durable, under the ownership check */
	HOLD_GRANT,	/* "you hold it" once the grant is durable; given back when it is not */
	HOLD_HELD,	/* "you hold it" to a retry, once this round (the grant, the retry's
			   attempt) is durable; its attempt given back when it is not */
	HOLD_WAIT,	/* the caller waits for a later event (its grant, its wait deadline) */
	HOLD_REFUSE,	/* refused: code and why; nothing changed */
	HOLD_PASS_ON	/* another node drives it: 503 naming that node, which the HTTP layer
			   asks in the caller's stead */
};

/* One transition: the state after, what the engine does, how the caller is answered. */
typedef struct hold_move {
	int to;		 /* the state after */
	int act;	 /* LEASE_KEEP ... or TASK_KEEP ...: the engine's part */
	int answer;	 /* enum hold_answer */
	int proof;	 /* made only once eng_promise proves this node drives the resource;
			    otherwise the caller is refused and nothing changes */
	int code;	 /* HOLD_REFUSE: a BATON_E* code */
	const char *why; /* HOLD_REFUSE: why; LEASE_LEAVE: what its waiting caller is told */
} hold_move;

/* A lease, as the API names its states. */
enum lease_state { LEASE_WAITING, LEASE_HELD, LEASE_RELEASED, LEASE_EXPIRED, LEASE_ABANDONED };
enum lease_event {
	LEASE_ACQUIRE,	   /* its request_id is asked for again: the next attempt arrived */
	LEASE_RENEW,	   /* its holder renews it (maybe with a new ttl) */
	LEASE_RELEASE,	   /* its holder releases it (or gives up its wait) */
	LEASE_GET,	   /* somebody reads it */
	LEASE_LEFT,	   /* the caller waiting for its grant went away (it names that caller) */
	LEASE_UNDELIVERED, /* the give-back of a grant that could not be told (or committed) to
			      the caller of one attempt (it names that attempt) */
	LEASE_GRANTED,	   /* its resource's queue granted it */
	LEASE_TIMER,	   /* one of its deadlines came (lease_facts says which) */
	LEASE_STOP,	   /* the server stops */
	LEASE_UNCONFIRMED  /* its caller was told 503: the round of its grant (or of a retry's
			      hold) is not confirmed yet, and may still commit */
};
enum lease_act {
	LEASE_KEEP,	    /* nothing changes */
	LEASE_EXTEND,	    /* its expiry counted again from now */
	LEASE_NEW_TTL,	    /* its new ttl written with this round; its expiry from now */
	LEASE_ADOPT,	    /* a caller came back for it: no grace any more; expiry from now; its
			       attempt written with this round */
	LEASE_REATTACH,	    /* the caller takes the waiting one's place (it is told 409) */
	LEASE_START,	    /* granted: its expiry from now; its caller answered once durable */
	LEASE_START_UNSEEN, /* granted while nobody waits for it: kept a grace for its caller to
			       come back with its request_id, then released */
	LEASE_GRACE,	    /* held, and nobody knows it: kept a grace, as LEASE_START_UNSEEN */
	LEASE_END_RELEASED, /* the hold ends; the resource goes to the next waiter */
	LEASE_END_EXPIRED,  /* the hold ends, expired; the resource goes to the next waiter */
	LEASE_LEAVE	    /* leaves its queue ungranted; its waiting caller is told why (409) */
};
/* What the engine knows of the lease when the event comes. */
typedef struct lease_facts {
	int here;      /* this node has it in memory, not ended (else: as the store has it) */
	int elsewhere; /* not here, not ended: another node drives it and can be asked */
	int caller;    /* somebody waits for the answer to its acquisition */
	int new_ttl;   /* LEASE_RENEW: with a ttl other than its own */
	int expired, grace_over, wait_over; /* LEASE_TIMER: which of its deadlines came */
	/* LEASE_UNDELIVERED, LEASE_LEFT: the attempt or the caller it names is not the latest:
	 * a retry of the same request_id arrived since (answered or not). */
	int superseded;
	/* LEASE_RENEW, LEASE_RELEASE: the request arrived (as stamped when it was posted) at
	 * or after the lease's expiry, whatever the engine's round applies first. */
	int late;
} lease_facts;
hold_move lease_next(int state, int event, const lease_facts *f);
/* "waiting", "held", ... (static), and back; an unknown name reads as abandoned. */
const char *lease_state_name(int state);
int lease_state_of(const char *name);

/* An external step's attempt (a task). */
enum task_state {
	TASK_READY,   /* its step holds the resource and waits for a claim */
	TASK_CLAIMED, /* a worker claimed this attempt */
	TASK_OVER,    /* not the claimed attempt: it ended, expired or was given back */
	TASK_UNKNOWN  /* no such task */
};
enum task_event {
	TASK_HEARTBEAT = BATON_TASK_HEARTBEAT,
	TASK_COMPLETE = BATON_TASK_COMPLETE,
	TASK_FAIL = BATON_TASK_FAIL,
	TASK_UNCLAIM = BATON_TASK_UNCLAIM, /* its claim is given back: its claimer was not told */
	TASK_CLAIM,			   /* a waiting claim matches it */
	TASK_TIMER,			   /* its claim's deadline came */
	TASK_CANCEL			   /* its workflow is cancelled */
};
enum task_act {
	TASK_KEEP,	    /* nothing changes */
	TASK_ASSIGN,	    /* the claim's ttl written with this round; expiry from now */
	TASK_EXTEND,	    /* expiry from now */
	TASK_OFFER,	    /* offered to the next claim */
	TASK_END,	    /* the attempt ends with its worker's outcome */
	TASK_END_EXPIRED,   /* the attempt fails, retryable: no heartbeat in time */
	TASK_END_CANCELLED, /* the attempt fails: cancelled before a worker claimed it */
};
typedef struct task_facts {
	int here;      /* this node has its workflow in memory, not ended */
	int elsewhere; /* not here, not ended: another node drives the workflow */
	int expired;   /* TASK_TIMER: its claim's deadline came */
	/* TASK_UNCLAIM: the claim attempt it gives back is not the latest: a retry of the
	 * claim's request_id arrived since (answered or not) */
	int superseded;
	int unread; /* not here, and the database could not be read to say more */
	/* TASK_UNCLAIM: somebody waits for its answer (another node passed on the give-back of
	 * a claim it could not deliver); the engine's own give-back has none */
	int caller;
} task_facts;
hold_move task_next(int state, int event, const task_facts *f);

/* ---- lock.c: per-resource FIFO queue of permits, pure ---- */
#define MAX_PERMITS 10000 /* a resource's limit, at most */

typedef struct lock_waiter {
	wf_row *wf;
	struct lock_waiter *next;
} lock_waiter;

/* One grant that holds: a plain one holds one permit and its slot (0 to limit-1); an
 * exclusive one (slot -1) holds them all. */
typedef struct lock_hold {
	wf_row *wf;
	int slot;
	int64_t since;
} lock_hold;

typedef struct res_lock {
	resource_row row; /* row.permits: the limit */
	lock_hold *holds; /* lowest fencing token first */
	int nholds, holds_cap;
	uint64_t *slots; /* the slots the plain holds take, a bit each (slot_words words) */
	int slot_words;
	lock_waiter *head, *tail;
	int queue_len;
	unsigned dirty : 1, in_batch : 1;
	/* row holds the stored token and totals (a lock whose row could not be read yet
	 * grants nothing: its next token is unknown). */
	unsigned loaded : 1;
	/* Among the idle locks kept in memory (idle.c), least recently used first. */
	unsigned parked : 1;
	struct res_lock *idle_prev, *idle_next;
} res_lock;

res_lock *lock_new(const char *name);
void lock_free(res_lock *l);
void lock_enqueue(res_lock *l, wf_row *wf);	/* at the tail */
int lock_remove(res_lock *l, const wf_row *wf); /* 1 when it was queued */
wf_row *lock_pop(res_lock *l);			/* head, or NULL */
/* 1 when wf's current step asks for every permit of its resource. */
int lock_wants_all(const wf_row *wf);
/* The slot of a step's latest grant, as its params keep it (0 as no key): -1 when the step
 * is exclusive. */
int lock_params_slot(const json_t *params);
/* The same for wf's current step. */
int lock_granted_slot(const wf_row *wf);
/* 1 when a request (exclusive or not) would be granted at once: it fits beside the holders
 * and nobody waits before it. */
int lock_fits_now(const res_lock *l, int exclusive);
/* Grants the head waiter its permits when they are free; returns it, or NULL. Nobody
 * behind the head is granted before it, even when its request would fit. The new hold,
 * with the highest token, is the last of l->holds. */
wf_row *lock_grant_next(res_lock *l, int64_t now, int64_t *waited_ms);
/* wf's hold on l (borrowed), or NULL when wf holds nothing of it. */
const lock_hold *lock_hold_of(const res_lock *l, const wf_row *wf);
/* The holder with the lowest token, NULL when nobody holds l. */
wf_row *lock_first_holder(const res_lock *l);
/* Permits held: one per plain holder, the limit for an exclusive one. */
int lock_permits_in_use(const res_lock *l);
/* Ends wf's hold at `now` and accounts for it (nothing when wf holds nothing). */
void lock_release(res_lock *l, const wf_row *wf, int64_t now);
/* Undoes wf's grant, which no commit recorded and nobody saw: its permits are free again
 * and its grant is not counted; its token is given again only when no later grant took
 * one (tokens never go back). */
void lock_ungrant(res_lock *l, const wf_row *wf);
/* Recovery: wf held l when the process stopped and holds it still (a lease, a claim),
 * with its slot (-1: exclusive) and token unchanged, since `since`. */
void lock_restore(res_lock *l, wf_row *wf, int slot, int64_t since);
/* Every hold ends without accounting (the resource left memory). */
void lock_clear_holds(res_lock *l);
/* 1 when nobody holds or waits for l and all of it is committed: it may leave memory. */
int lock_idle(const res_lock *l);

/* ---- sched.c: step threads (a pool in the manner of redis bio.c) ---- */
typedef struct sched sched;
/* A job owns arg and frees it; a job dropped by sched_free has arg freed with free(). */
typedef void (*sched_job_fn)(void *arg, sched *s);
sched *sched_new(int threads);
void sched_submit(sched *s, sched_job_fn fn, void *arg);
int sched_sleep(sched *s, int64_t ms); /* non-zero when aborted */
int sched_aborted(sched *s);
void sched_abort(sched *s);		       /* wakes every sched_sleep with "aborted" */
int sched_drain(sched *s, int64_t timeout_ms); /* waits for idle; 0 when idle */
void sched_free(sched *s);		       /* joins the threads; jobs left are dropped */

/* ---- codec.c: JSON in and out, all input validation ---- */
int valid_name(const char *s);
/* Fills wf (id may be NULL: none given) from a request; wf->definition is set.
 * allow_call: NULL-terminated URL prefixes that HTTP steps may call (NULL: none). */
int codec_parse_request(const json_t *req, wf_row *wf, const char *const *allow_call,
			baton_error *err);
json_t *codec_workflow(const wf_row *wf);	  /* new reference */
json_t *codec_workflow_summary(const wf_row *wf); /* new reference */
/* A step as the API shows it (new reference); ended: its workflow failed or was
 * cancelled, so a step still pending is shown "skipped". */
json_t *codec_step(const step_row *st, int ended);
json_t *codec_params_defaults(const char *name); /* worker object with defaults */
/* Fills the steps of wf that have no worker yet as pending steps of the stored
 * definition (normalized request text); -1 when it does not describe wf's steps. */
int codec_pending_steps(wf_row *wf, const char *definition);
/* A retry policy as stored (compact JSON, malloc'd) and read back; a text stored before
 * first_retry_ms (with initial_delay_ms) reads as the same policy. */
char *codec_retry_text(const retry_policy *p);
int codec_parse_retry(const char *text, retry_policy *p);
/* Whether a stored definition and a new one (normalized texts, as codec_parse_request
 * makes them) describe the same workflow: equal texts, or equal once the stored retry
 * policy, written before first_retry_ms, is normalized as it would be now. */
int codec_same_definition(const char *stored, const char *def);

/* ---- text.c: JSON text as jansson's compact dump writes it, for hot rows ---- */

/* A growing text buffer (not NUL-terminated); aborts on out of memory like xcalloc. */
typedef struct textbuf {
	char *v;
	size_t len, cap;
} textbuf;
void textbuf_reserve(textbuf *b, size_t n); /* room for n more bytes */
void textbuf_put(textbuf *b, const char *p, size_t n);
void textbuf_int(textbuf *b, int64_t x); /* in decimal, as printf's %lld writes it */
/* Appends ,"key":value for each member of obj, as json_dumps(JSON_COMPACT) writes them
 * (the hot path of every event row). */
void codec_text_members(textbuf *b, const json_t *obj);
/* Appends v as json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) writes it. */
void codec_text(textbuf *b, const json_t *v);
/* v as json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS) writes it: a new malloc'd string;
 * NULL when v is NULL. */
char *codec_text_sorted(const json_t *v);

/* ---- the store (store.h is the seam; its backends are the only files with SQL) ---- */
typedef struct store store;

#endif
