/*
 * test_model_tasks.c - every interleaving of a few workers claiming the external steps of a
 * few workflows on one resource, through the real task machine (task_next) and the real
 * queue of lock.c, up to a bounded depth (the search is model.h's).
 *
 * Design. What task.c and commit.c do around task_next is modelled here in a few lines
 * each, as test_model.c does for leases: claims that take a ready task or wait for one, the
 * round's grants and its commit that succeeds or fails (a failed one gives its claims back),
 * answers on their way that are delivered, undeliverable (given back, naming the attempt) or
 * lost, heartbeats, completions, a claim whose ttl runs out and the workflow's next attempt.
 * A worker's claim names a request_id: one that lost its answer asks again with the same
 * request_id (the same claim, its next claim attempt) or claims anew with another.
 *
 * The invariants, checked after every step: no more workers hold an unexpired claim than
 * the limit allows, and no two the same attempt; every claim and heartbeat answer is backed
 * by a committed claim, when it is given and as long as its worker relies on it; every hold
 * of the lock has a slot of its own below the limit.
 */
#include "model.h"

#define NCLAIMS 8 /* claims waiting at once, at most (a gone worker's claim still waits) */

static res_lock *lk;
static wf_row rows[NC];
static step_row steps[NC];

/* ---- tasks: task_next, lock.c and the engine's round around them ---- */

enum task_phase_model {
	T_QUEUED,   /* its step waits for the resource */
	T_READY,    /* granted: waits for a claim */
	T_CLAIMED,  /* a worker's claim took it */
	T_RETRYING, /* its attempt failed (a claim expired): the next one is due later */
	T_OVER	    /* completed, or failed for good */
};

typedef struct task_world {
	/* the engine's memory: workflow j, one external step */
	int8_t st[NC], att[NC], tok[NC], slot[NC];
	/* its claim: the worker and the request_id it named (crid, 0: none), the claim's
	 * arrivals so far (cat: the attempt a give-back names) */
	int8_t by[NC], crid[NC], cat[NC];
	int8_t rq[NC], nrq; /* tasks_ready */
	/* the claims that wait, oldest first: worker, its request, its request_id */
	int8_t cq[NCLAIMS], cqtry[NCLAIMS], cqrid[NCLAIMS], ncq;
	int8_t q[NC], nq, hold[NC], nh, last;
	/* worker v's claim answer owed, once durable: the task, the request, the claim attempt */
	int8_t rep[NC], repwf[NC], reptry[NC], repcat[NC];
	int8_t faulty, fails;
	int8_t unknown, unknowns; /* a commit of unknown outcome pends (write_unknown); so far */
	/* durable */
	int8_t dst[NC], datt[NC], dtok[NC];
	/* the HTTP layer: committed claim answers on their way; give-backs by attempt */
	int8_t out[NC], outwf[NC], outtry[NC], outcat[NC], outatt[NC], outtok[NC];
	uint16_t unclaim[NC]; /* give-backs posted: bit GB(step attempt, claim attempt) */
	/* the workers: rid, the request_id of its latest claim */
	int8_t ph[NC], tries[NC], cur[NC], rid[NC], hwf[NC], hatt[NC], htok[NC];
} task_world;

typedef struct task_cfg {
	int workflows, workers, limit, max_fails, max_claims, max_attempts, max_unknowns;
} task_cfg;

static task_cfg tc;

enum task_inv { J_LIMIT, J_PROMISED, J_BACKED, J_ONE, J_SLOT, J_NINV };
static const char *const task_invariants[] = {
    "more workers hold an unexpired claim than the limit allows",
    "a claim or heartbeat answered before the claim was committed",
    "a worker's committed claim was ended while it still holds it",
    "two workers hold the same attempt",
    "two holds share a slot, or one has a slot past the limit",
};

enum task_act_kind {
	K_CLAIM,	/* worker w asks for a task, with a new request_id */
	K_RECLAIM,	/* worker w asks again with the same request_id, its answer lost */
	K_DROP,		/* worker w's connection fails */
	K_LOSE,		/* a claim's answer sent is lost on the way: nobody notices */
	K_DELIVER,	/* a committed claim reaches its worker */
	K_HEARTBEAT,	/* worker w heartbeats its task */
	K_COMPLETE,	/* worker w completes its task */
	K_UNCLAIM,	/* the give-back of workflow j's claim is applied */
	K_UNCLAIM_LAST, /* the same, of the latest claim attempt given back, when two are */
	K_EXPIRE,	/* workflow j's claim is not heartbeaten in time */
	K_RETRY,	/* workflow j's next attempt is due */
	K_COMMIT,	/* the round ends: grants, then the commit succeeds (0) or fails (1) */
	K_UNKNOWN,	/* the round ends: grants, then its commit's outcome is unknown */
	K_UNCONFIRMED,	/* the callers of an unconfirmed round have waited the commit timeout */
	K_NKINDS
};

/* The state the lock holds now, when it is known (a move rebuilds the lock only when it
 * starts from another state: most moves tried are not enabled and touch nothing). */
static task_world lock_of;
static int lock_known;

static void task_lock_load(const task_world *w)
{
	if (lock_known && memcmp(&lock_of, w, sizeof *w) == 0)
		return;
	lock_of = *w;
	lock_known = 1;
	model_lock_load(lk, tc.limit, w->last, rows, steps, w->tok, w->slot, w->hold, w->nh, w->q,
			w->nq);
}

static void task_lock_save(task_world *w)
{
	model_lock_save(lk, rows, w->slot, w->hold, &w->nh, w->q, &w->nq, &w->last);
}

/* The machine's state of attempt att of workflow j (task.c's state_of). */
static int task_state(const task_world *w, int j, int att)
{
	if (w->att[j] != att || (w->st[j] != T_READY && w->st[j] != T_CLAIMED))
		return TASK_OVER;
	return w->st[j] == T_CLAIMED ? TASK_CLAIMED : TASK_READY;
}

/* task.c's assign: workflow j to worker v's claim (try t); answered once durable. */
/* A give-back's bit: the step attempt its task id names, the claim attempt it undoes. */
#define GB(att, cat) (1u << (((att)-1) * 8 + (cat)-1))
#define MAX_CAT	     8 /* the claim attempts a give-back's bit can name */

/* The claim answer owed to worker v's request t: task j, its claim attempt, once durable. */
static void owe_claim(task_world *w, int v, int t, int j)
{
	w->rep[v] = 1;
	w->repwf[v] = (int8_t)j;
	w->reptry[v] = (int8_t)t;
	w->repcat[v] = w->cat[j];
}

/* task.c's assign: workflow j to worker v's claim (request t, request_id r). */
static void assign(task_world *w, int j, int v, int t, int r, char *note, size_t n)
{
	task_facts f = {.here = 1};
	hold_move mv = task_next(task_state(w, j, w->att[j]), TASK_CLAIM, &f);
	assert_int_equal(mv.act, TASK_ASSIGN);
	w->st[j] = T_CLAIMED;
	w->by[j] = (int8_t)v;
	w->crid[j] = (int8_t)r;
	w->cat[j]++; /* numbered after every claim of the step before it */
	assert_true(w->cat[j] <= MAX_CAT);
	owe_claim(w, v, t, j);
	MOVE("; W%d's claim takes task %d.%d", v, j, w->att[j]);
}

/* task.c's forget_claim: the claim ended or was given back (its attempts' count runs on). */
static void forget_claim(task_world *w, int j)
{
	w->by[j] = w->crid[j] = 0;
}

/* task.c's task_ready: to the oldest waiting claim, else to the ready list. */
static void offer(task_world *w, int j, char *note, size_t n)
{
	w->st[j] = T_READY;
	forget_claim(w, j);
	if (w->ncq) {
		int v = w->cq[0], t = w->cqtry[0], r = w->cqrid[0];
		memmove(w->cq, w->cq + 1, NCLAIMS - 1);
		memmove(w->cqtry, w->cqtry + 1, NCLAIMS - 1);
		memmove(w->cqrid, w->cqrid + 1, NCLAIMS - 1);
		w->cq[NCLAIMS - 1] = w->cqtry[NCLAIMS - 1] = w->cqrid[NCLAIMS - 1] = 0;
		w->ncq--;
		assign(w, j, v, t, r, note, n);
	} else {
		w->rq[w->nrq++] = (int8_t)j;
	}
}

static void task_grant_next(task_world *w, char *note, size_t n)
{
	int64_t waited;
	wf_row *wf;
	while ((wf = lock_grant_next(lk, 0, &waited))) {
		int j = (int)(wf - rows);
		w->tok[j] = (int8_t)lk->row.last_token;
		steps[j].token = w->tok[j];
		w->att[j]++;
		MOVE("; task %d.%d granted (token %d)", j, w->att[j], w->tok[j]);
		offer(w, j, note, n);
	}
}

/* The attempt ends (task.c's outcome): the resource to the next waiter. */
static void task_end(task_world *w, int j, int retry, char *note, size_t n)
{
	lock_release(lk, &rows[j], 0);
	forget_claim(w, j);
	w->st[j] = retry && w->att[j] < tc.max_attempts ? T_RETRYING : T_OVER;
	task_grant_next(w, note, n);
}

static void told_claim(task_world *w, int v, int j, int att, int tok, unsigned *bad)
{
	w->ph[v] = C_HOLDS;
	w->hwf[v] = (int8_t)j;
	w->hatt[v] = (int8_t)att;
	w->htok[v] = (int8_t)tok;
	if (w->dst[j] != T_CLAIMED || w->datt[j] != att || w->dtok[j] != tok)
		*bad |= 1u << J_PROMISED;
}

/* task.c's apply_claim for worker v's request naming request_id r: a retry of the request_id
 * of a claim that holds is that claim's next attempt, answered the same task once durable
 * (claim_again); else the oldest ready task, else it waits. */
static void claim(task_world *w, int v, int r, char *note, size_t n)
{
	for (int j = 0; j < tc.workflows; j++)
		if (w->st[j] == T_CLAIMED && w->by[j] == v && w->crid[j] == r) {
			w->cat[j]++;
			assert_true(w->cat[j] <= MAX_CAT);
			owe_claim(w, v, w->cur[v], j);
			MOVE(": the same claim of task %d.%d (claim attempt %d), once durable", j,
			     w->att[j], w->cat[j]);
			return;
		}
	if (w->nrq) {
		int j = w->rq[0];
		memmove(w->rq, w->rq + 1, NC - 1);
		w->rq[NC - 1] = 0;
		w->nrq--;
		assign(w, j, v, w->cur[v], r, note, n);
	} else {
		assert_true(w->ncq < NCLAIMS);
		w->cq[w->ncq] = (int8_t)v;
		w->cqtry[w->ncq] = w->cur[v];
		w->cqrid[w->ncq++] = (int8_t)r;
		MOVE(": waits");
	}
}

/* Whether a claim answer about task j is on its way (owed by the round, or being sent). */
static int owed_claim(const task_world *w, int j)
{
	for (int v = 0; v < tc.workers; v++)
		if ((w->rep[v] && w->repwf[v] == j) || (w->out[v] && w->outwf[v] == j))
			return 1;
	return 0;
}

static int task_step(const void *sv, int a, void *tv, char *note, size_t n, unsigned *bad)
{
	const task_world *s = sv;
	task_world *w = tv;
	int kind = a / NC, i = a % NC;
	if (kind >= K_NKINDS)
		return 0;
	*w = *s;
	if (note)
		note[0] = 0;
	task_facts here = {.here = 1};
	task_lock_load(w);
	switch (kind) {
	case K_CLAIM:
	case K_RECLAIM:
		if (i >= tc.workers || w->ph[i] == C_ASKING || w->ph[i] == C_HOLDS ||
		    w->tries[i] >= tc.max_claims ||
		    (kind == K_RECLAIM && (w->ph[i] != C_GONE || !w->rid[i])))
			return 0;
		if (kind == K_CLAIM)
			w->rid[i]++;
		w->cur[i] = ++w->tries[i];
		w->ph[i] = C_ASKING;
		MOVE("W%d claims (request %d, request_id %d%s)", i, w->cur[i], w->rid[i],
		     kind == K_RECLAIM ? ", again" : "");
		claim(w, i, w->rid[i], note, n);
		break;
	case K_DROP:
		if (i >= tc.workers || w->ph[i] != C_ASKING)
			return 0;
		w->ph[i] = C_GONE;
		MOVE("W%d's connection fails (claim %d)", i, w->cur[i]);
		if (w->out[i] && w->outtry[i] == w->cur[i]) {
			int j = w->outwf[i];
			w->unclaim[j] |= (uint16_t)GB(w->outatt[i], w->outcat[i]);
			w->out[i] = 0;
			MOVE("; its claim's answer is undeliverable: claim attempt %d given back",
			     w->outcat[i]);
		}
		break;
	case K_LOSE:
		if (i >= tc.workers || !w->out[i] || w->ph[i] != C_ASKING ||
		    w->outtry[i] != w->cur[i])
			return 0;
		MOVE("W%d's claim answer is lost on the way", i);
		w->ph[i] = C_GONE;
		w->out[i] = 0;
		break;
	case K_DELIVER:
		if (i >= tc.workers || !w->out[i] || w->ph[i] != C_ASKING ||
		    w->outtry[i] != w->cur[i])
			return 0;
		MOVE("W%d is told it claimed task %d.%d, token %d", i, w->outwf[i], w->outatt[i],
		     w->outtok[i]);
		told_claim(w, i, w->outwf[i], w->outatt[i], w->outtok[i], bad);
		w->out[i] = 0;
		break;
	case K_HEARTBEAT:
	case K_COMPLETE: {
		if (i >= tc.workers || w->ph[i] != C_HOLDS)
			return 0;
		int j = w->hwf[i], att = w->hatt[i];
		int ev = kind == K_HEARTBEAT ? TASK_HEARTBEAT : TASK_COMPLETE;
		hold_move mv = task_next(task_state(w, j, att), ev, &here);
		MOVE("W%d %s task %d.%d", i, kind == K_HEARTBEAT ? "heartbeats" : "completes", j,
		     att);
		if (kind == K_COMPLETE)
			w->ph[i] = C_GONE; /* it relies on the claim no more */
		if (mv.answer == HOLD_PROMISE) {
			MOVE(": answered from memory");
			told_claim(w, i, j, att, w->htok[i], bad);
		} else if (mv.answer == HOLD_REFUSE) {
			MOVE(": refused, the attempt is over");
			w->ph[i] = C_GONE;
		}
		if (mv.act == TASK_END) {
			MOVE("; the attempt ends");
			task_end(w, j, 0, note, n);
		}
		break;
	}
	case K_UNCLAIM:
	case K_UNCLAIM_LAST: {
		/* posted by other threads: applied in any order (the latest first, too) */
		unsigned bits = w->unclaim[i];
		if (i >= tc.workflows || !bits ||
		    (kind == K_UNCLAIM_LAST && __builtin_popcount(bits) < 2))
			return 0;
		int bit = kind == K_UNCLAIM_LAST ? 31 - __builtin_clz(bits) : __builtin_ctz(bits);
		int att = bit / 8 + 1, cat = bit % 8 + 1;
		w->unclaim[i] &= (uint16_t) ~(1u << bit);
		task_facts f = {.here = 1, .superseded = cat < w->cat[i]};
		hold_move mv = task_next(task_state(w, i, att), TASK_UNCLAIM, &f);
		MOVE("the give-back of task %d.%d, claim attempt %d, is applied", i, att, cat);
		if (mv.act == TASK_OFFER) {
			MOVE(": offered again");
			offer(w, i, note, n);
		}
		break;
	}
	case K_EXPIRE: {
		if (i >= tc.workflows || w->st[i] != T_CLAIMED || owed_claim(w, i))
			return 0; /* an answer on its way arrives (or fails) before the ttl ends */
		task_facts due = {.here = 1, .expired = 1};
		hold_move mv = task_next(TASK_CLAIMED, TASK_TIMER, &due);
		MOVE("task %d.%d: its claim's ttl runs out", i, w->att[i]);
		for (int v = 0; v < tc.workers; v++) /* its worker's own ttl ran out first */
			if (w->ph[v] == C_HOLDS && w->hwf[v] == i && w->hatt[v] == w->att[i])
				w->ph[v] = C_GONE;
		if (mv.act == TASK_END_EXPIRED)
			task_end(w, i, 1, note, n);
		break;
	}
	case K_RETRY:
		if (i >= tc.workflows || w->st[i] != T_RETRYING)
			return 0;
		MOVE("task %d: its next attempt asks for the resource", i);
		w->st[i] = T_QUEUED;
		lock_enqueue(lk, &rows[i]);
		break;
	case K_UNKNOWN:
		/* nothing is answered or taken back: the round is written again later */
		if (i > 0 || w->unknowns >= tc.max_unknowns)
			return 0;
		MOVE("the round ends");
		task_grant_next(w, note, n);
		MOVE("; its commit's outcome is UNKNOWN: nobody answered, the round kept");
		w->unknown = w->faulty = 1;
		w->unknowns++;
		break;
	case K_UNCONFIRMED: {
		/* commit.c's answer_unconfirmed: each claim given back, its worker told 503 */
		int owed = 0;
		for (int v = 0; v < tc.workers; v++)
			owed |= w->rep[v];
		if (i > 0 || !w->unknown || !owed)
			return 0;
		MOVE("the commit timeout passes with the round unconfirmed");
		for (int v = 0; v < tc.workers; v++) {
			if (!w->rep[v])
				continue;
			int j = w->repwf[v];
			w->unclaim[j] |= (uint16_t)GB(w->att[j], w->repcat[v]);
			MOVE("; W%d's claim attempt %d given back", v, w->repcat[v]);
			if (w->ph[v] == C_ASKING && w->cur[v] == w->reptry[v]) {
				w->ph[v] = C_GONE;
				MOVE("; W%d told 503", v);
			}
			w->rep[v] = 0;
		}
		break;
	}
	case K_COMMIT:
		/* a failure while an outcome is unknown takes nothing back either: it is the
		 * same as one more unknown outcome */
		if (i > 1 || (i == 1 && (w->fails >= tc.max_fails || w->unknown)))
			return 0;
		MOVE("the round ends");
		task_grant_next(w, note, n);
		if (i == 0) {
			MOVE("; its commit succeeds");
			for (int j = 0; j < tc.workflows; j++) {
				w->dst[j] = w->st[j];
				w->datt[j] = w->att[j];
				w->dtok[j] = w->tok[j];
			}
			w->faulty = w->unknown = 0;
		} else {
			MOVE("; its commit FAILS");
			w->faulty = 1;
			w->fails++;
		}
		for (int v = 0; v < tc.workers; v++) {
			if (!w->rep[v])
				continue;
			int j = w->repwf[v],
			    alive = w->ph[v] == C_ASKING && w->cur[v] == w->reptry[v];
			if (i == 0 && alive) {
				w->out[v] = 1;
				w->outwf[v] = (int8_t)j;
				w->outtry[v] = w->reptry[v];
				w->outcat[v] = w->repcat[v];
				w->outatt[v] = w->att[j];
				w->outtok[v] = w->tok[j];
			} else { /* given back: told 503, or its worker has gone */
				w->unclaim[j] |= (uint16_t)GB(w->att[j], w->repcat[v]);
				MOVE("; W%d's claim attempt %d given back", v, w->repcat[v]);
				if (alive)
					w->ph[v] = C_GONE;
			}
			w->rep[v] = 0;
		}
		break;
	}
	task_lock_save(w);
	lock_known = 0; /* the move changed it */
	for (int v = 0; v < NC; v++) {
		if (!w->rep[v])
			w->repwf[v] = w->reptry[v] = w->repcat[v] = 0;
		if (!w->out[v])
			w->outwf[v] = w->outtry[v] = w->outcat[v] = w->outatt[v] = w->outtok[v] = 0;
		if (w->ph[v] != C_HOLDS)
			w->hwf[v] = w->hatt[v] = w->htok[v] = 0;
	}
	for (int j = 0; j < NC; j++) {
		if (w->st[j] != T_CLAIMED)
			w->by[j] = w->crid[j] = 0;
		if (w->st[j] != T_READY && w->st[j] != T_CLAIMED)
			w->slot[j] = 0;
	}
	return 1;
}

static unsigned task_check(const void *sv)
{
	const task_world *w = sv;
	unsigned bad = 0;
	int holders = 0;
	for (int v = 0; v < tc.workers; v++) {
		if (w->ph[v] != C_HOLDS)
			continue;
		holders++;
		int j = w->hwf[v];
		if (w->dst[j] != T_CLAIMED || w->datt[j] != w->hatt[v])
			bad |= 1u << J_BACKED;
		for (int u = 0; u < v; u++)
			if (w->ph[u] == C_HOLDS && w->hwf[u] == j && w->hatt[u] == w->hatt[v])
				bad |= 1u << J_ONE;
	}
	if (holders > tc.limit || w->nh > tc.limit)
		bad |= 1u << J_LIMIT;
	if (!slots_apart(w->hold, w->nh, w->slot, tc.limit))
		bad |= 1u << J_SLOT;
	return bad;
}

static int check_tasks(task_cfg cfg, int depth)
{
	tc = cfg;
	lk = lock_new("r");
	lock_known = 0;
	for (int j = 0; j < NC; j++) {
		rows[j] = (wf_row){.steps = &steps[j], .steps_total = 1};
		steps[j] = (step_row){.params = json_object()};
	}
	task_world init;
	memset(&init, 0, sizeof init);
	for (int j = 0; j < tc.workflows; j++) { /* submitted and committed, each queued */
		init.q[init.nq++] = (int8_t)j;
		init.st[j] = init.dst[j] = T_QUEUED;
	}
	char name[160];
	snprintf(name, sizeof name,
		 "tasks: %d workflows, %d workers, limit %d, up to %d failed commit(s), %d of"
		 " unknown outcome",
		 tc.workflows, tc.workers, tc.limit, tc.max_fails, tc.max_unknowns);
	model m = {name,      sizeof(task_world), K_NKINDS * NC,   &init,
		   task_step, task_check,	  task_invariants, J_NINV};
	int broken = explore(&m, depth);
	for (int j = 0; j < NC; j++)
		json_decref(steps[j].params);
	lock_free(lk);
	return broken;
}

static void test_tasks_limit_one(void **state)
{
	(void)state;
	expect_none_broken(check_tasks((task_cfg){2, 2, 1, 1, 3, 2, 0}, 12));
}

static void test_tasks_limit_two(void **state)
{
	(void)state;
	expect_none_broken(check_tasks((task_cfg){3, 2, 2, 1, 3, 2, 0}, 10));
}

/* A round's commit of unknown outcome: its claims are given back and their workers told 503
 * once they have waited, while the round, kept, may still commit. */
static void test_tasks_commit_unknown(void **state)
{
	(void)state;
	expect_none_broken(check_tasks((task_cfg){2, 2, 1, 0, 3, 2, 1}, 14));
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_tasks_limit_one),
	    cmocka_unit_test(test_tasks_limit_two),
	    cmocka_unit_test(test_tasks_commit_unknown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
