/*
 * audit.c - the crash torture's checks, run once every acknowledged workflow finished
 * and its state and history were read back from the API (see torture.c).
 *
 * Sources: GET /workflows/{id} and /workflows/{id}/events (the history batond committed),
 * the records of the fragile resources (every request as the resource saw it, with its
 * Idempotency-Key, Baton-Attempt and Baton-Fencing-Token), and the database itself (the
 * SQLite file, or the PostgreSQL database through libpq, with the same SQL).
 * The history is checked against the resources: a request must carry the token of the
 * grant of its own attempt, so neither side can hide a replay of the other.
 */
#include "torture.h"

#include <libpq-fe.h>
#include <math.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kind_names[] = {"call", "simulated", "fails-for-good"};

void violation(check *c, const char *fmt, ...)
{
	if (c->violations < SHOWN) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(c->shown[c->violations], sizeof c->shown[0], fmt, ap);
		va_end(ap);
	}
	c->violations++;
}

const char *res_name(int i)
{
	static const char *const names[NRES] = {"torture-0", "torture-1", "torture-2",
						"torture-3", "torture-4", "torture-5"};
	return names[i];
}

int report(const check *c)
{
	int ok = c->violations == 0;
	printf("[%s] %s (%s)\n", ok ? "pass" : "FAIL", c->name, c->note);
	if (!ok)
		printf("       %zu violation%s, the first:\n", c->violations,
		       c->violations == 1 ? "" : "s");
	for (size_t i = 0; i < c->violations && i < SHOWN; i++)
		printf("       - %s\n", c->shown[i]);
	return ok;
}

/* ---- check 1: every acknowledged workflow finished as expected ---------------- */

void check_final(run *r, check *c)
{
	for (size_t i = 0; i < r->n; i++) {
		wf *w = r->wfs[i];
		if (!w->acked)
			continue;
		c->examined++;
		const char *want = w->kind == K_FAIL && !w->cont ? "failed" : "completed";
		if (strcmp(w->final, want) != 0) {
			violation(c, "%s (%s, %s): status \"%s\", expected \"%s\"", w->id,
				  kind_names[w->kind], res_name(w->res), w->final, want);
			continue;
		}
		for (int s = 0; s < w->n; s++) {
			const char *st = s == w->fail_step ? "failed"
					 : w->fail_step >= 0 && s > w->fail_step && !w->cont
					     ? "skipped"
					     : "completed";
			if (strcmp(w->step_status[s], st) != 0)
				violation(c, "%s step %d: \"%s\", expected \"%s\"", w->id, s,
					  w->step_status[s], st);
		}
	}
	snprintf(c->note, sizeof c->note, "%zu workflows", c->examined);
}

/* ---- check 2: no completed step ran again -------------------------------------- */

/* From the history: attempts 1, 2, ... granted once each, none after the completion. */
static void check_history_steps(const wf *w, check *c)
{
	for (int s = 0; s < w->n; s++) {
		int next = 1, done = 0;
		for (size_t k = 0; k < w->nev; k++) {
			const evt *e = &w->ev[k];
			if (e->step != s || (e->type != E_ACQ && e->type != E_DONE))
				continue;
			if (e->type == E_DONE) {
				done++;
				continue;
			}
			if (done)
				violation(c,
					  "%s step %d: attempt %d granted after the step completed",
					  w->id, s, e->attempt);
			if (e->attempt != next)
				violation(c, "%s step %d: attempt %d granted, expected %d", w->id,
					  s, e->attempt, next);
			next = e->attempt + 1;
		}
		int completed = strcmp(w->step_status[s], "completed") == 0;
		if (done != completed)
			violation(c, "%s step %d (%s): %d step_completed events", w->id, s,
				  w->step_status[s], done);
		if (next - 1 != w->attempts[s])
			violation(c, "%s step %d: attempts %d but %d grants", w->id, s,
				  w->attempts[s], next - 1);
	}
}

static const char *key_of(const fragile_record *rec)
{
	return rec->idempotency_key ? rec->idempotency_key : "";
}

static int cmp_rec(const void *a, const void *b)
{
	const fragile_record *x = *(fragile_record *const *)a, *y = *(fragile_record *const *)b;
	int k = strcmp(key_of(x), key_of(y));
	return k ? k : (x->seq > y->seq) - (x->seq < y->seq);
}

/* The first of the sorted records with `key`, or n. */
static size_t first_with_key(fragile_record **v, size_t n, const char *key)
{
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (strcmp(key_of(v[mid]), key) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* When the history shows attempt `attempt` of `step` interrupted (its node lost the
 * resource: killed, or stopped past its lease; another attempt took over): the time of
 * that event (ms since the epoch). 0 when it was not. */
static int64_t interrupted(const wf *w, int step, int attempt)
{
	for (size_t k = 0; k < w->nev; k++)
		if (w->ev[k].type == E_INT && w->ev[k].step == step && w->ev[k].attempt == attempt)
			return w->ev[k].ts > 0 ? w->ev[k].ts : 1;
	return 0;
}

/* In the cluster, a call the resource refused (stale token, overlap) that came from an
 * attempt taken over meanwhile: the node that lost the resource made it late, and it
 * changed nothing. check_resources judges it; the per-step order leaves it out. */
static int refused_late(const run *r, const wf *w, int s, const fragile_record *rec)
{
	return r->nodes && (rec->outcome == FRAGILE_STALE || rec->outcome == FRAGILE_OVERLAP) &&
	       rec->attempt && interrupted(w, s, atoi(rec->attempt)) != 0;
}

/* In the cluster, a call the resource accepted from an attempt that had been taken over
 * when it arrived (more than TS_SLACK_MS after the step_interrupted event): the node that
 * lost the resource called before the new holder did, so its token was still the
 * highest the resource had seen. Fencing cannot refuse such a call; the Idempotency-Key
 * makes the new holder's call of the same step a duplicate. Counted, not a violation. */
static int accepted_late(const run *r, const wf *w, int s, const fragile_record *rec)
{
	if (!r->nodes || !rec->attempt || rec->outcome == FRAGILE_STALE ||
	    rec->outcome == FRAGILE_OVERLAP || rec->outcome == FRAGILE_BAD)
		return 0;
	int64_t cut = interrupted(w, s, atoi(rec->attempt));
	return cut > 0 && rec->arrived_ms + r->real_offset > cut + TS_SLACK_MS;
}

static int64_t granted_token(const wf *w, int step, int attempt)
{
	for (size_t k = 0; k < w->nev; k++)
		if (w->ev[k].type == E_ACQ && w->ev[k].step == step && w->ev[k].attempt == attempt)
			return w->ev[k].token;
	return -1;
}

/* The kill nearest to fragile time `t` (ms since the start), for the details. */
static void print_nearest_kill(const run *r, int64_t t)
{
	int best = -1;
	for (int k = 0; k < r->kills_done; k++)
		if (best < 0 || llabs(r->killed_at[k] - t) < llabs(r->killed_at[best] - t))
			best = k;
	if (best >= 0)
		printf("         nearest %s: #%d %s at %+lld ms, serving again at %+lld ms\n",
		       r->nodes ? "fault" : "kill", best + 1,
		       r->nodes ? r->fault_what[best] : "SIGKILL", (long long)r->killed_at[best],
		       (long long)r->up_at[best]);
}

static void print_record(const run *r, const fragile_record *rec)
{
	printf("         seq %zu key %s attempt %s token %lld: arrived %+lld ms, finished %+lld ms,"
	       " %s %d%s\n",
	       rec->seq, rec->idempotency_key ? rec->idempotency_key : "-",
	       rec->attempt ? rec->attempt : "-", rec->token, (long long)(rec->arrived_ms - r->t0),
	       rec->finished_ms ? (long long)(rec->finished_ms - r->t0) : -1LL,
	       fragile_outcome_name(rec->outcome), rec->status, rec->applied ? ", applied" : "");
}

/*
 * One step against the requests its resource saw (records sorted by key, then arrival),
 * all with its Idempotency-Key "<id>/<index>": Baton-Attempt never above the step's
 * attempts, each attempt called at most once and in increasing order, and for a
 * completed step the last request is its final attempt, answered 2xx (or as a duplicate),
 * with exactly one request applied. A simulated step calls nothing. A request whose token
 * is not the one its attempt was granted counts against the fencing check `fc`.
 */
static void check_call_step(const run *r, const wf *w, int s, fragile_record **v, size_t nv,
			    unsigned char *used, check *c, check *fc)
{
	static int dumps;
	size_t before = c->violations + fc->violations;
	char key[96];
	snprintf(key, sizeof key, "%s/%d", w->id, s);
	int completed = strcmp(w->step_status[s], "completed") == 0;
	int last = 0, applied = 0, final_ok = 0;
	size_t i = first_with_key(v, nv, key), n = 0;
	for (; i < nv && strcmp(key_of(v[i]), key) == 0; i++, n++) {
		const fragile_record *rec = v[i];
		used[i] = 1;
		if (refused_late(r, w, s, rec))
			continue;
		int a = rec->attempt ? atoi(rec->attempt) : 0;
		if (a > w->attempts[s])
			violation(c,
				  "%s: request with Baton-Attempt %d, but the step has %d attempts",
				  key, a, w->attempts[s]);
		if (a <= last)
			violation(c, "%s: attempt %d called again (after attempt %d)", key, a,
				  last);
		if (completed && final_ok)
			violation(c, "%s: request (attempt %d) after the completing attempt", key,
				  a);
		if (rec->token != granted_token(w, s, a))
			violation(fc, "%s attempt %d: called with token %lld, granted %lld", key, a,
				  rec->token, (long long)granted_token(w, s, a));
		last = a;
		applied += rec->applied;
		final_ok = a == w->attempts[s] && rec->status >= 200 && rec->status < 300;
	}
	if (!w->is_call[s]) {
		if (n)
			violation(c, "%s: a simulated step made %zu requests", key, n);
		return;
	}
	if (completed && !final_ok)
		violation(c, "%s: completed, but its final attempt %d has no 2xx answer", key,
			  w->attempts[s]);
	if (completed && applied != 1)
		violation(c, "%s: completed, applied %d times by the resource", key, applied);
	if (c->violations + fc->violations > before && dumps++ < 3) {
		printf("torture: the requests of %s (times since the start):\n", key);
		for (i = first_with_key(v, nv, key); i < nv && strcmp(key_of(v[i]), key) == 0; i++)
			print_record(r, v[i]);
		print_nearest_kill(r, v[first_with_key(v, nv, key)]->arrived_ms - r->t0);
	}
}

void check_no_rerun(run *r, check *c, check *fc)
{
	fragile_record *recs[NRES];
	fragile_record **sorted[NRES];
	unsigned char *used[NRES];
	size_t nrec[NRES];
	for (int i = 0; i < r->nres; i++) {
		recs[i] = fragile_records(r->res[i], &nrec[i]);
		sorted[i] = calloc(nrec[i] + 1, sizeof *sorted[i]);
		used[i] = calloc(nrec[i] + 1, 1);
		for (size_t k = 0; k < nrec[i]; k++)
			sorted[i][k] = &recs[i][k];
		qsort(sorted[i], nrec[i], sizeof *sorted[i], cmp_rec);
	}
	size_t calls = 0;
	for (size_t i = 0; i < r->n; i++) {
		const wf *w = r->wfs[i];
		if (!w->acked)
			continue;
		check_history_steps(w, c);
		for (int s = 0; s < w->n; s++) {
			c->examined++;
			check_call_step(r, w, s, sorted[w->res], nrec[w->res], used[w->res], c, fc);
		}
	}
	for (int i = 0; i < r->nres; i++) {
		for (size_t k = 0; k < nrec[i]; k++)
			if (!used[i][k])
				violation(c, "%s: a call with key \"%s\" of no acknowledged step",
					  res_name(i),
					  sorted[i][k]->idempotency_key
					      ? sorted[i][k]->idempotency_key
					      : "(none)");
		free(used[i]);
		calls += nrec[i];
		free(sorted[i]);
		fragile_records_free(recs[i], nrec[i]);
	}
	snprintf(c->note, sizeof c->note, "%zu steps, %zu requests to the resources", c->examined,
		 calls);
}

/* ---- check 3: holds never overlap, tokens only grow ---------------------------- */

typedef struct hold {
	int res;
	int64_t seq, token, start, end; /* end -1: never ended */
	const wf *w;
	int step, attempt;
} hold;

static int cmp_hold(const void *a, const void *b)
{
	const hold *x = a, *y = b;
	if (x->res != y->res)
		return x->res - y->res;
	return (x->seq > y->seq) - (x->seq < y->seq);
}

/* The holds of every acknowledged workflow: from lock_acquired to lock_released, or to
 * step_interrupted (written at the restart after the kill that ended the hold). */
static hold *gather_holds(run *r, size_t *nh)
{
	size_t cap = 1024, n = 0;
	hold *h = malloc(cap * sizeof *h);
	for (size_t i = 0; i < r->n; i++) {
		const wf *w = r->wfs[i];
		size_t first = n;
		for (size_t k = 0; w->acked && k < w->nev; k++) {
			const evt *e = &w->ev[k];
			if (e->type == E_ACQ) {
				if (n == cap)
					h = realloc(h, (cap *= 2) * sizeof *h);
				h[n++] = (hold){w->res, e->seq, e->token, e->ts,
						-1,	w,	e->step,  e->attempt};
			} else if (e->type == E_REL || e->type == E_INT) {
				for (size_t x = n; x-- > first;)
					if (h[x].step == e->step && h[x].attempt == e->attempt &&
					    h[x].end < 0) {
						h[x].end = e->ts;
						break;
					}
			}
		}
	}
	qsort(h, n, sizeof *h, cmp_hold);
	*nh = n;
	return h;
}

void check_holds(run *r, check *c, int64_t last_token[NRES], int64_t grants[NRES])
{
	size_t n;
	hold *h = gather_holds(r, &n);
	size_t interrupted = 0;
	for (size_t i = 0; i < n; i++) {
		const hold *x = &h[i], *p = i && h[i - 1].res == x->res ? &h[i - 1] : NULL;
		c->examined++;
		grants[x->res]++;
		if (x->end >= 0 && x->end < x->start)
			violation(c, "%s: %s step %d attempt %d: the hold ended before it began",
				  res_name(x->res), x->w->id, x->step, x->attempt);
		if (x->end < 0)
			violation(c, "%s: %s step %d attempt %d: the hold never ended",
				  res_name(x->res), x->w->id, x->step, x->attempt);
		if (p && x->token <= p->token)
			violation(c, "%s: token %lld granted after token %lld (%s/%d, then %s/%d)",
				  res_name(x->res), (long long)x->token, (long long)p->token,
				  p->w->id, p->step, x->w->id, x->step);
		if (p && p->end >= 0 && x->start < p->end)
			violation(c,
				  "%s: hold of %s/%d (token %lld) began %lld ms before the hold of"
				  " %s/%d (token %lld) ended",
				  res_name(x->res), x->w->id, x->step, (long long)x->token,
				  (long long)(p->end - x->start), p->w->id, p->step,
				  (long long)p->token);
		if (!p && x->token < 1)
			violation(c, "%s: first token %lld", res_name(x->res), (long long)x->token);
		if (x->token > last_token[x->res])
			last_token[x->res] = x->token;
	}
	for (size_t i = 0; i < r->n; i++)
		for (size_t k = 0; k < r->wfs[i]->nev; k++)
			interrupted += r->wfs[i]->acked && r->wfs[i]->ev[k].type == E_INT;
	snprintf(c->note, sizeof c->note, "%zu holds, %zu cut off by a kill", n, interrupted);
	free(h);
}

/* ---- check 4: retry waits were respected ---------------------------------------- */

/* The time of the event before index k of type `type` for (step, attempt); -1 if none. */
static int64_t ts_before(const wf *w, size_t k, int type, int step, int attempt)
{
	while (k-- > 0)
		if (w->ev[k].type == type && w->ev[k].step == step && w->ev[k].attempt == attempt)
			return w->ev[k].ts;
	return -1;
}

/*
 * For each step_failed with a retry: retry_in_ms is at least the policy's wait; the wait
 * counts from the failure (next_attempt_at - retry_in_ms lies between the failed
 * attempt's grant and the step_failed event); the next grant of the step comes no earlier
 * than next_attempt_at, nor than the event's ts + retry_in_ms - TS_SLACK_MS. The event's
 * ts is taken when the engine appends it, which under load can be some ms after the time
 * the transition computed with; that lag is reported, and only counts as a violation
 * when next_attempt_at was not honoured either.
 */
void check_retry_waits(run *r, check *c)
{
	int64_t min_slack = INT64_MAX, max_lag = 0;
	size_t lagged = 0;
	for (size_t i = 0; i < r->n; i++) {
		const wf *w = r->wfs[i];
		for (size_t k = 0; w->acked && k < w->nev; k++) {
			const evt *f = &w->ev[k];
			if (f->type != E_FAIL || f->retry_in < 0)
				continue;
			c->examined++;
			double d = w->first_retry * pow(w->backoff, f->attempt - 1);
			int64_t policy = d < w->max_delay ? (int64_t)d : w->max_delay;
			if (f->retry_in < policy)
				violation(c,
					  "%s step %d attempt %d: retry_in_ms %lld below the "
					  "policy's %lld",
					  w->id, f->step, f->attempt, (long long)f->retry_in,
					  (long long)policy);
			int64_t failed_at = f->next_at - f->retry_in;
			int64_t granted = ts_before(w, k, E_ACQ, f->step, f->attempt);
			if (f->next_at < 0 || failed_at > f->ts + TS_SLACK_MS ||
			    failed_at < granted - TS_SLACK_MS)
				violation(c,
					  "%s step %d attempt %d: next_attempt_at - retry_in_ms is "
					  "%+lld ms"
					  " from the failure event, %+lld ms from the grant",
					  w->id, f->step, f->attempt,
					  (long long)(failed_at - f->ts),
					  (long long)(failed_at - granted));
			if (f->ts - failed_at > max_lag)
				max_lag = f->ts - failed_at;
			const evt *g = NULL;
			for (size_t x = k + 1; x < w->nev && !g; x++)
				if (w->ev[x].type == E_ACQ && w->ev[x].step == f->step)
					g = &w->ev[x];
			if (!g) {
				violation(c, "%s step %d attempt %d: the retry never came", w->id,
					  f->step, f->attempt);
				continue;
			}
			int64_t slack = g->ts - f->next_at;
			if (slack < min_slack)
				min_slack = slack;
			if (g->ts >= f->next_at) {
				lagged += g->ts < f->ts + f->retry_in - TS_SLACK_MS;
				continue;
			}
			violation(c,
				  "%s step %d: attempt %d granted %lld ms after the failure of"
				  " attempt %d, which asked to wait %lld ms (%lld ms early)",
				  w->id, f->step, g->attempt, (long long)(g->ts - f->ts),
				  f->attempt, (long long)f->retry_in, (long long)-slack);
		}
	}
	snprintf(c->note, sizeof c->note,
		 "%zu retries, the earliest granted %lld ms after next_attempt_at; step_failed ts"
		 " up to %lld ms after the time its wait counts from, %zu grants earlier than"
		 " ts + retry_in_ms - %d",
		 c->examined, c->examined ? (long long)min_slack : 0LL, (long long)max_lag, lagged,
		 TS_SLACK_MS);
}

/* ---- check 5: the database ------------------------------------------------------ */

/*
 * The store under test, read directly: the SQLite file (batond stopped), or its
 * PostgreSQL database through libpq. The same SQL runs on both; rows come as text.
 */
typedef struct reader {
	sqlite3 *lite;
	PGconn *pg;
} reader;

typedef void (*row_fn)(void *arg, const char *const *cols);

static int reader_open(reader *d, const hs_server *s, check *c)
{
	*d = (reader){0};
	if (hs_store_is_pg()) {
		const char *const keys[] = {"dbname", "connect_timeout", NULL};
		const char *const values[] = {hs_db_url(s), "10", NULL};
		d->pg = PQconnectdbParams(keys, values, 1);
		if (d->pg && PQstatus(d->pg) == CONNECTION_OK)
			return 0;
		violation(c, "cannot connect to %s: %s", hs_db_url(s),
			  d->pg ? PQerrorMessage(d->pg) : "out of memory");
		return -1;
	}
	if (sqlite3_open_v2(hs_db_path(s), &d->lite, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK)
		return 0;
	violation(c, "cannot open %s: %s", hs_db_path(s), sqlite3_errmsg(d->lite));
	return -1;
}

static void reader_close(reader *d)
{
	sqlite3_close(d->lite);
	PQfinish(d->pg);
}

/* Calls fn for each row of `sql` (one text parameter $1, or none when NULL), with its
 * first `ncols` columns (NULL for SQL NULL). A failed query is a violation. */
static void reader_rows(reader *d, check *c, const char *sql, const char *param, int ncols,
			row_fn fn, void *arg)
{
	const char *cols[4] = {0};
	if (d->pg) {
		PGresult *res =
		    PQexecParams(d->pg, sql, param ? 1 : 0, NULL, &param, NULL, NULL, 0);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
			violation(c, "%s: %s", sql, PQresultErrorMessage(res));
		for (int row = 0; PQresultStatus(res) == PGRES_TUPLES_OK && row < PQntuples(res);
		     row++) {
			for (int i = 0; i < ncols; i++)
				cols[i] = PQgetisnull(res, row, i) ? NULL : PQgetvalue(res, row, i);
			fn(arg, cols);
		}
		PQclear(res);
		return;
	}
	sqlite3_stmt *q = NULL;
	if (sqlite3_prepare_v2(d->lite, sql, -1, &q, NULL) != SQLITE_OK ||
	    (param && sqlite3_bind_text(q, 1, param, -1, SQLITE_STATIC) != SQLITE_OK)) {
		violation(c, "%s: %s", sql, sqlite3_errmsg(d->lite));
		sqlite3_finalize(q);
		return;
	}
	while (sqlite3_step(q) == SQLITE_ROW) {
		for (int i = 0; i < ncols; i++)
			cols[i] = (const char *)sqlite3_column_text(q, i);
		fn(arg, cols);
	}
	sqlite3_finalize(q);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

typedef struct db_check {
	check *c;
	char **ids; /* acknowledged, sorted */
	size_t acked, stored;
	int found;
	long long last_token, grants;
} db_check;

static void on_integrity(void *arg, const char *const *cols)
{
	db_check *k = arg;
	if (!cols[0] || strcmp(cols[0], "ok") != 0)
		violation(k->c, "integrity_check: %s", cols[0] ? cols[0] : "(null)");
}

static void on_workflow(void *arg, const char *const *cols)
{
	db_check *k = arg;
	const char *id = cols[0] ? cols[0] : "(null)";
	k->stored++;
	if (!bsearch(&id, k->ids, k->acked, sizeof *k->ids, cmp_str))
		violation(k->c, "workflow %s (%s) is stored but was never acknowledged", id,
			  cols[1] ? cols[1] : "(null)");
}

static void on_resource(void *arg, const char *const *cols)
{
	db_check *k = arg;
	k->found = 1;
	k->last_token = cols[0] ? strtoll(cols[0], NULL, 10) : -1;
	k->grants = cols[1] ? strtoll(cols[1], NULL, 10) : -1;
}

void check_database(run *r, check *c, const int64_t last_token[NRES], const int64_t grants[NRES])
{
	reader d;
	if (reader_open(&d, r->srv, c) != 0) {
		reader_close(&d);
		return;
	}
	db_check k = {.c = c, .ids = malloc((r->n + 1) * sizeof(char *))};
	if (d.lite) /* PostgreSQL checks its pages itself (and has no such statement) */
		reader_rows(&d, c, "PRAGMA integrity_check", NULL, 1, on_integrity, &k);
	/* Every stored workflow was acknowledged, and every acknowledged one is stored. */
	for (size_t i = 0; i < r->n; i++)
		if (r->wfs[i]->acked)
			k.ids[k.acked++] = r->wfs[i]->id;
	qsort(k.ids, k.acked, sizeof *k.ids, cmp_str);
	reader_rows(&d, c, "SELECT id, status FROM workflows", NULL, 2, on_workflow, &k);
	if (k.stored != k.acked)
		violation(c, "%zu workflows stored, %zu acknowledged", k.stored, k.acked);
	free(k.ids);
	/* The resources' high-water marks agree with the history. */
	for (int i = 0; i < r->nres; i++) {
		k.found = 0;
		reader_rows(&d, c, "SELECT last_token, grants FROM resources WHERE name=$1",
			    res_name(i), 2, on_resource, &k);
		if (k.found) {
			if (k.last_token < last_token[i])
				violation(c, "%s: last_token %lld below the highest granted %lld",
					  res_name(i), k.last_token, (long long)last_token[i]);
			if (k.grants != grants[i])
				violation(c, "%s: %lld grants stored, %lld lock_acquired events",
					  res_name(i), k.grants, (long long)grants[i]);
		} else if (grants[i]) {
			violation(c, "%s: no resource row", res_name(i));
		}
	}
	snprintf(c->note, sizeof c->note, "%zu workflows stored%s", k.stored,
		 d.lite ? "" : " (PostgreSQL: no integrity_check)");
	reader_close(&d);
}

/* ---- check 6: the resources never saw a stale token, an overlap or a bad call --- */

/* The workflow of Idempotency-Key "<id>/<step>", and the step; NULL when none. */
static const wf *wf_of_key(const run *r, const char *key, int *step)
{
	const char *slash = key ? strrchr(key, '/') : NULL;
	for (size_t i = 0; slash && i < r->n; i++)
		if (strlen(r->wfs[i]->id) == (size_t)(slash - key) &&
		    strncmp(r->wfs[i]->id, key, (size_t)(slash - key)) == 0) {
			*step = atoi(slash + 1);
			return r->wfs[i];
		}
	return NULL;
}

/*
 * The cluster: the stale tokens the resource refused, each of which must come from an
 * attempt the history shows interrupted (its node had lost the resource: a node stopped
 * past its lease that woke up). A refusal of the current holder is a violation; so is,
 * in the cluster too, any overlap. The count of refusals goes to *late.
 */
static size_t check_stale(const run *r, int i, check *c, size_t *late, size_t *accepted)
{
	size_t n, holder = 0;
	fragile_record *recs = fragile_records(r->res[i], &n);
	for (size_t k = 0; k < n; k++) {
		int s = -1;
		const wf *w = wf_of_key(r, recs[k].idempotency_key, &s);
		if (w && accepted_late(r, w, s, &recs[k]))
			(*accepted)++;
		if (recs[k].outcome != FRAGILE_STALE)
			continue;
		if (w && refused_late(r, w, s, &recs[k])) {
			(*late)++;
			continue;
		}
		holder++;
		violation(c,
			  "%s: call of %s attempt %s refused as stale (token %lld), but the"
			  " history shows that attempt not taken over",
			  res_name(i), recs[k].idempotency_key ? recs[k].idempotency_key : "-",
			  recs[k].attempt ? recs[k].attempt : "-", recs[k].token);
	}
	fragile_records_free(recs, n);
	return holder;
}

void check_resources(run *r, check *c)
{
	size_t total = 0, dup = 0, gone = 0, dropped = 0, late = 0, accepted = 0;
	for (int i = 0; i < r->nres; i++) {
		fragile_stats st;
		fragile_get_stats(r->res[i], &st);
		total += st.requests;
		dup += st.duplicates;
		gone += st.client_gone;
		dropped += st.dropped;
		size_t stale = r->nodes ? check_stale(r, i, c, &late, &accepted) : st.stale;
		if (stale && !r->nodes)
			violation(c, "%s: %zu calls with a stale token (409)", res_name(i),
				  st.stale);
		if (st.overlaps)
			violation(c, "%s: %zu overlapping calls (max %zu in flight)", res_name(i),
				  st.overlaps, st.max_in_flight);
		if (st.bad)
			violation(c, "%s: %zu calls without key or token", res_name(i), st.bad);
		c->examined += st.requests;
		if (!stale && !st.overlaps)
			continue;
		size_t n;
		fragile_record *recs = fragile_records(r->res[i], &n);
		printf("torture: %s: stale and overlapping calls, with their neighbours:\n",
		       res_name(i));
		for (size_t k = 0; k < n; k++) {
			if (recs[k].outcome != FRAGILE_STALE && recs[k].outcome != FRAGILE_OVERLAP)
				continue;
			for (size_t x = k > 2 ? k - 2 : 0; x < n && x <= k + 1; x++)
				print_record(r, &recs[x]);
			print_nearest_kill(r, recs[k].arrived_ms - r->t0);
		}
		fragile_records_free(recs, n);
	}
	snprintf(c->note, sizeof c->note,
		 "%zu calls, %zu answered as duplicates, %zu answers dropped, %zu abandoned%s",
		 total, dup, dropped, gone, "");
	if (r->nodes) {
		size_t len = strlen(c->note);
		snprintf(c->note + len, sizeof c->note - len,
			 "; calls of attempts already taken over: %zu refused by their stale token,"
			 " %zu accepted before the new holder called (absorbed as duplicates)",
			 late, accepted);
	}
}
