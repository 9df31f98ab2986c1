/*
 * seam.c - a testing seam that holds the engine at a racing point.
 *
 * Some races are a matter of which of two messages the engine applies first: a retry and
 * the give-back of its first attempt's grant, a retry and the commit of that grant. Over
 * plain HTTP they happen only sometimes. With engine config hold_file (batond: the
 * environment variable BATON_TEST_HOLD_FILE), a test names a point in that file, and the
 * engine, when it gets there, waits while the file still names it:
 *  - "round": before a round applies its messages; the messages posted meanwhile join the
 *    round, after those it took, in the order they came;
 *  - "answers": after a round's commit, before its callers are answered and its steps
 *    dispatched.
 * While it waits, it writes "<hold_file>.held": the point's name, then one line for each
 * lease or task message of the round and of the inbox, in order ("acquire lease-x",
 * "undelivered lease-x", ...), so that a test waits for exactly the messages it needs, in the order
 * it needs. The file is removed once the engine goes on. Without hold_file (production) this costs
 * a test of a pointer.
 */
#include "engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* 1 when the control file names point. */
static int names(const char *path, const char *point)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	char word[32] = "";
	size_t n = fread(word, 1, sizeof word - 1, f);
	fclose(f);
	word[n] = 0;
	word[strcspn(word, " \t\r\n")] = 0;
	return strcmp(word, point) == 0;
}

static const char *kind(const msg *m)
{
	static const char *const ops[] = {"renew",	 "release", "get",   "left",
					  "undelivered", "granted", "timer", "stop"};
	switch (m->type) {
	case MSG_LEASE:
		return "acquire";
	case MSG_LEASE_OP:
		return m->idx >= LEASE_RENEW && m->idx <= LEASE_STOP ? ops[m->idx - 1] : "lease";
	case MSG_TASK_CLAIM:
		return "claim";
	case MSG_TASK_OP:
		return "task";
	default:
		return "other";
	}
}

/* The lease and task messages (those a test races); the cluster's own are left out. */
static void list(FILE *f, const msg *m)
{
	for (; m; m = m->next) {
		const char *id = m->type == MSG_LEASE && m->wf ? m->wf->id : m->id;
		if (m->type >= MSG_LEASE)
			fprintf(f, "%s %s\n", kind(m), id ? id : "-");
	}
}

static void report(const baton_engine *e, const char *held, const char *point, const msg *m)
{
	char tmp[4200];
	snprintf(tmp, sizeof tmp, "%s.tmp", held);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return;
	fprintf(f, "%s\n", point);
	list(f, m);
	pthread_mutex_lock((pthread_mutex_t *)&e->mu);
	list(f, e->inbox);
	pthread_mutex_unlock((pthread_mutex_t *)&e->mu);
	fclose(f);
	rename(tmp, held); /* a reader sees the whole list or the previous one */
}

void eng_seam(baton_engine *e, const char *point, msg **m)
{
	if (!e->hold_file || !names(e->hold_file, point))
		return;
	char held[4100];
	snprintf(held, sizeof held, "%s.held", e->hold_file);
	do {
		report(e, held, point, m ? *m : NULL);
		struct timespec ts = {0, 5 * 1000000L};
		nanosleep(&ts, NULL);
	} while (names(e->hold_file, point));
	unlink(held);
	if (!m)
		return;
	/* What came meanwhile joins this round, after what it took. */
	pthread_mutex_lock(&e->mu);
	msg *more = e->inbox, **tail = m;
	e->inbox = e->inbox_tail = NULL;
	for (msg *x = more; x; x = x->next)
		e->pending_submits -= x->counted;
	e->taken_mono = mono_ms();
	pthread_mutex_unlock(&e->mu);
	while (*tail)
		tail = &(*tail)->next;
	*tail = more;
}
