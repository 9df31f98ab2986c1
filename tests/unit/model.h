/*
 * model.h - a breadth-first search over every interleaving of a model's moves, for the
 * exhaustive checks of the pure machines (test_model.c: leases, test_model_tasks.c: tasks).
 *
 * A model's state is a small plain struct; a move turns one state into the next through
 * the real machines of lib/. The search keeps every state it has seen (hashed), so each is
 * expanded once, and goes breadth first, so the first trace found to a broken invariant is
 * a shortest one; it prints the states explored and, for each invariant broken, that trace
 * replayed step by step with what each step did. A move that breaks a rule by itself (an
 * answer given without its backing) is reported for that rule alone and not followed, so
 * that each invariant's trace shows its own cause.
 *
 * MODEL_DEPTH=N overrides the depth of every scenario; under a sanitizer the search goes
 * less deep (it runs no thread: TSan only slows it down).
 */
#ifndef BATON_MODEL_H
#define BATON_MODEL_H

#include "unit.h"

#include <stdio.h>

#define NC	  3 /* callers (and tasks) at most */
#define MAX_TRIES 2 /* requests a client sends for one request_id */

/* How much shallower the search goes under a sanitizer: it runs no thread, so TSan only
 * slows it down. */
#if defined(__SANITIZE_THREAD__)
#define SHALLOWER 5
#elif defined(__SANITIZE_ADDRESS__)
#define SHALLOWER 3
#else
#define SHALLOWER 0
#endif

enum client_phase {
	C_IDLE,	  /* has not asked yet */
	C_ASKING, /* its request (number att) waits for an answer on a live connection */
	C_GONE,	  /* its connection failed or it was told 503: it may ask again, same request_id */
	C_HOLDS,  /* told "you hold it" (token ctok), and its ttl has not run out */
	C_DONE	  /* released, refused or told it lost: it asks no more */
};

/* Appends what a move did to its note (a step's note/n), when it has one. */
#define MOVE(...)                                                                                  \
	(note ? (void)snprintf(note + strlen(note), n - strlen(note), __VA_ARGS__) : (void)0)

/* ---- a breadth-first search over states that are plain bytes ---- */

typedef struct model {
	const char *name;
	size_t size; /* of a state */
	int nacts;   /* actions tried from every state */
	const void *init;
	/* Action a from s into t: 0 when it is not enabled. note: what happened (may be NULL);
	 * *bad: the invariants the move itself broke (an answer given without its backing). */
	int (*step)(const void *s, int a, void *t, char *note, size_t n, unsigned *bad);
	unsigned (*check)(const void *s); /* the invariants a state breaks */
	const char *const *invariants;
	int ninv;
} model;

typedef struct search {
	const model *m;
	unsigned char *states; /* m->size bytes each, in the order found */
	int32_t *parent;
	int16_t *act;
	uint8_t *depth;
	size_t n, cap;
	int32_t *table; /* open addressing: index + 1, 0 empty */
	size_t tsize;
	int32_t broken_at[32]; /* the first state that broke invariant k, -1 none */
} search;

static uint64_t hash_bytes(const void *p, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (const unsigned char *c = p; n--; c++)
		h = (h ^ *c) * 1099511628211ull;
	return h;
}

static void *state_at(const search *s, size_t i)
{
	return s->states + i * s->m->size;
}

static void rehash(search *s)
{
	free(s->table);
	s->tsize = s->tsize ? s->tsize * 2 : 1 << 16;
	s->table = calloc(s->tsize, sizeof *s->table);
	assert_non_null(s->table);
	for (size_t i = 0; i < s->n; i++) {
		size_t h = hash_bytes(state_at(s, i), s->m->size) & (s->tsize - 1);
		while (s->table[h])
			h = (h + 1) & (s->tsize - 1);
		s->table[h] = (int32_t)i + 1;
	}
}

/* Adds state t unless it is known (or, forced, as one more way to it, outside the table:
 * the trace of a move that broke an invariant); 1 when it was added. */
static int add_state(search *s, const void *t, int32_t parent, int act, int depth, int forced)
{
	if ((s->n + 1) * 2 > s->tsize)
		rehash(s);
	size_t h = hash_bytes(t, s->m->size) & (s->tsize - 1);
	while (!forced && s->table[h]) {
		if (memcmp(state_at(s, (size_t)s->table[h] - 1), t, s->m->size) == 0)
			return 0;
		h = (h + 1) & (s->tsize - 1);
	}
	if (s->n == s->cap) {
		s->cap = s->cap ? s->cap * 2 : 1 << 14;
		s->states = realloc(s->states, s->cap * s->m->size);
		s->parent = realloc(s->parent, s->cap * sizeof *s->parent);
		s->act = realloc(s->act, s->cap * sizeof *s->act);
		s->depth = realloc(s->depth, s->cap * sizeof *s->depth);
		assert_true(s->states && s->parent && s->act && s->depth);
	}
	memcpy(state_at(s, s->n), t, s->m->size);
	s->parent[s->n] = parent;
	s->act[s->n] = (int16_t)act;
	s->depth[s->n] = (uint8_t)(forced ? 255 : depth);
	s->n++;
	if (!forced)
		s->table[h] = (int32_t)s->n;
	return 1;
}

/* Prints the shortest trace to state i, replayed from the start with what each step did. */
static void print_trace(const search *s, size_t i)
{
	int32_t path[256];
	int len = 0;
	for (int32_t k = (int32_t)i; k > 0 && len < 256; k = s->parent[k])
		path[len++] = k;
	unsigned char *cur = malloc(s->m->size), *next = malloc(s->m->size);
	memcpy(cur, s->m->init, s->m->size);
	for (int k = len - 1; k >= 0; k--) {
		char note[400] = "";
		unsigned bad = 0;
		s->m->step(cur, s->act[path[k]], next, note, sizeof note, &bad);
		printf("    %2d. %s\n", len - k, note);
		memcpy(cur, next, s->m->size);
	}
	free(cur);
	free(next);
}

/* Fails the test when an invariant broke (its shortest trace was printed). */
static void expect_none_broken(int broken)
{
	if (broken)
		fail_msg("%d invariant(s) broken: the shortest trace of each is printed above",
			 broken);
}

static int depth_of(int plain)
{
	const char *env = getenv("MODEL_DEPTH");
	if (env && atoi(env) > 0)
		return atoi(env);
	return plain - SHALLOWER;
}

/* Explores every interleaving up to depth; prints the states explored and, for each
 * invariant broken, its shortest trace. Returns how many invariants were broken. */
static int explore(const model *m, int plain_depth)
{
	int depth = depth_of(plain_depth);
	search s = {.m = m};
	for (int k = 0; k < 32; k++)
		s.broken_at[k] = -1;
	add_state(&s, m->init, -1, 0, 0, 0);
	unsigned char *t = malloc(m->size);
	for (size_t i = 0; i < s.n; i++) {
		if (s.depth[i] >= depth)
			continue;
		for (int a = 0; a < m->nacts; a++) {
			unsigned bad = 0;
			if (!m->step(state_at(&s, i), a, t, NULL, 0, &bad))
				continue;
			/* A move that broke a rule itself (an answer without its backing) is
			 * reported for that rule alone, and not followed: what follows from it
			 * would hide the other invariants' own shortest causes. */
			int followed = !bad;
			if (followed)
				bad = m->check(t);
			unsigned fresh = 0;
			for (int k = 0; k < m->ninv; k++)
				if (bad >> k & 1 && s.broken_at[k] < 0)
					fresh |= 1u << k;
			int added = followed ? add_state(&s, t, (int32_t)i, a, s.depth[i] + 1, 0)
				    : fresh  ? add_state(&s, t, (int32_t)i, a, s.depth[i] + 1, 1)
					     : 0;
			if (!added || !fresh)
				continue;
			for (int k = 0; k < m->ninv; k++)
				if (fresh >> k & 1)
					s.broken_at[k] = (int32_t)s.n - 1;
		}
	}
	free(t);
	int broken = 0;
	printf("  %s: %zu states explored, depth %d\n", m->name, s.n, depth);
	for (int k = 0; k < m->ninv; k++) {
		if (s.broken_at[k] < 0)
			continue;
		broken++;
		printf("  BROKEN: %s; shortest trace:\n", m->invariants[k]);
		print_trace(&s, (size_t)s.broken_at[k]);
	}
	fflush(stdout);
	free(s.states);
	free(s.parent);
	free(s.act);
	free(s.depth);
	free(s.table);
	return broken;
}

/* Whether the lock's holds (hold[0..nh), their slots in slot[]) each have a slot of their
 * own below the limit, as lock.c's free slot promises. */
static int slots_apart(const int8_t *hold, int nh, const int8_t *slot, int limit)
{
	unsigned seen = 0;
	for (int k = 0; k < nh; k++) {
		int sl = slot[hold[k]];
		if (sl < 0 || sl >= limit || seen >> sl & 1)
			return 0;
		seen |= 1u << sl;
	}
	return 1;
}

/* ---- the lock of lib/lock.c, rebuilt from a state and read back ---- */

/* Rebuilds lk as a state has it: caller i is rows[i] (its step steps[i], token tok[i]);
 * the holds hold[0..nh) in their order, each on its slot; the queue q[0..nq), oldest
 * first; the resource's last token and its permits. */
static inline void model_lock_load(res_lock *lk, int limit, int last, wf_row *rows, step_row *steps,
				   const int8_t *tok, const int8_t *slot, const int8_t *hold,
				   int nh, const int8_t *q, int nq)
{
	lock_clear_holds(lk);
	while (lock_pop(lk))
		;
	lk->row.permits = limit;
	lk->row.last_token = last;
	for (int i = 0; i < NC; i++)
		steps[i].token = tok[i];
	for (int k = 0; k < nh; k++)
		lock_restore(lk, &rows[hold[k]], slot[hold[k]], 0);
	for (int k = 0; k < nq; k++)
		lock_enqueue(lk, &rows[q[k]]);
}

/* Reads lk back into a state's fields, as model_lock_load takes them. */
static inline void model_lock_save(const res_lock *lk, const wf_row *rows, int8_t *slot,
				   int8_t *hold, int8_t *nh, int8_t *q, int8_t *nq, int8_t *last)
{
	memset(hold, 0, NC);
	memset(q, 0, NC);
	*nh = (int8_t)lk->nholds;
	for (int k = 0; k < lk->nholds; k++) {
		int i = (int)(lk->holds[k].wf - rows);
		hold[k] = (int8_t)i;
		slot[i] = (int8_t)lk->holds[k].slot;
	}
	*nq = 0;
	for (lock_waiter *x = lk->head; x; x = x->next)
		q[(*nq)++] = (int8_t)(x->wf - rows);
	*last = (int8_t)lk->row.last_token;
}

#endif
