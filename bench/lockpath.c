/*
 * lockpath.c - the lock path, measured: baton's acquire + release beside etcd's, and
 * beside the floor, side by side in one run.
 *
 * The systems, all on 127.0.0.1 and all started here: batond on SQLite, batond on
 * PostgreSQL (each on a fresh database), a 2-node batond cluster on another fresh
 * PostgreSQL database, and one etcd 3.4 member (etcd.c) with its data in the same
 * directory as the SQLite database. For each, per round:
 *
 * - a lone pair: one client on one keep-alive connection acquires and releases one lock,
 *   again and again; the figure is the median pair. baton: POST /resources/NAME/leases
 *   (wait_ms) then DELETE /leases/{id}. etcd: POST /v3/lock/lock with the client's lease
 *   then POST /v3/lock/unlock; the lease is granted once per client before the loop,
 *   as etcd's own clients keep one session lease for all their locks. Either way, two
 *   requests and two durable writes (a grant, a release) per pair.
 * - 8 contenders on one lock, each on its own connection (and, for etcd, its own lease),
 *   looping on the same pair: handoffs (pairs) per second.
 * - in the cluster: the lone pair through the node that drives the resource and through
 *   the one that does not, which passes each request on to the owner. A batond that
 *   answers 503 there instead is reported as "not served", with the 503's own round trip
 *   as an aside.
 *
 * The floor of a pair is two commits and two trivial HTTP requests: the median commit of
 * the store's floor (floor.c: SQLite in the same directory, or PostgreSQL's over libpq on
 * the same server) taken in the same round, plus the median keep-alive GET to
 * bench/minjson (a libmicrohttpd handler that does nothing). etcd stands beside the
 * SQLite floor: a local file synced on the same disk. Handoffs stand beside the floor's
 * commits/s, since one commit can carry a release and the next grant.
 *
 * Rounds interleave the systems (floors, then each system in turn), so that the noise of
 * the shared machine falls on all of them alike; every figure is the median of the
 * rounds, every ratio the median of the rounds' ratios. Nothing is asserted: the goal
 * (a lone pair at most 1.5x its floor) is printed beside the figure.
 */
#include "bench.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CONTENDERS 8
#define LOCK_NAME  "bench-lock"
#define ETCD_TTL_S 60

enum sys_kind { SYS_BATON, SYS_ETCD };

/* One lock service under test and its figures over the rounds. */
typedef struct sys {
	const char *label; /* the table's store column */
	const char *what;  /* the lone pair's row, when not "lock pair, lone" */
	int kind;	   /* enum sys_kind */
	int port;
	int up;	     /* started and answering */
	int floor;   /* 0: SQLite's floor, 1: PostgreSQL's */
	int refused; /* the last failed request's status (503: not served) */
	dvec lone_us, lone_ratio, hand, hand_ratio;
	dvec acq_us;		   /* the acquire's part of the median pair, per round */
	dvec behind_ratio;	   /* this / the pair behind HTTP of the round (SQLite's floor) */
	dvec srv_us, commit_us;	   /* batond's own time per request, and per commit: means */
	dvec lone_etcd, hand_etcd; /* this / etcd, per round */
} sys;

/* What one round's floors measured. */
typedef struct round_floor {
	double commit_us[2]; /* median commit: SQLite, PostgreSQL */
	double rate[2];	     /* commits/s */
	double get_us;	     /* median keep-alive GET to minjson */
	double behind_us[2]; /* median pair of requests behind commits (minjson --commit) */
} round_floor;

/* ---- one client's acquire and release ---- */

typedef struct session {
	char lease[64]; /* etcd: the client's lease */
	char key[512];	/* baton: the lease's path; etcd: the lock's key */
} session;

static int session_open(sys *s, session *c)
{
	memset(c, 0, sizeof *c);
	if (s->kind != SYS_ETCD)
		return 0;
	int st = etcd_lease_grant(s->port, ETCD_TTL_S, c->lease, sizeof c->lease);
	return st == 200 ? 0 : (s->refused = st, -1);
}

static void session_close(sys *s, session *c)
{
	if (s->kind == SYS_ETCD && c->lease[0])
		etcd_lease_revoke(s->port, c->lease);
}

/* Acquires the lock, waiting; 0, or -1 with the status in s->refused. */
static int acquire(sys *s, session *c, const char *holder)
{
	int st;
	if (s->kind == SYS_ETCD) {
		st = etcd_lock(s->port, LOCK_NAME, c->lease, c->key, sizeof c->key);
		return st == 200 ? 0 : (s->refused = st, -1);
	}
	char body[160], *resp = NULL;
	snprintf(body, sizeof body, "{\"holder\":\"%s\",\"wait_ms\":300000}", holder);
	st = http_do(s->port, "POST", "/resources/" LOCK_NAME "/leases", body, &resp);
	json_t *j = st == 201 && resp ? json_loads(resp, 0, NULL) : NULL;
	const char *id = json_string_value(json_object_get(j, "id"));
	if (id)
		snprintf(c->key, sizeof c->key, "/leases/%s", id);
	json_decref(j);
	free(resp);
	return id ? 0 : (s->refused = st, -1);
}

static int release(sys *s, session *c)
{
	int st = s->kind == SYS_ETCD ? etcd_unlock(s->port, c->key)
				     : http_do(s->port, "DELETE", c->key, NULL, NULL);
	int want = s->kind == SYS_ETCD ? 200 : 204;
	return st == want ? 0 : (s->refused = st, -1);
}

/* ---- the lone pair ---- */

/* Median pair in us over up to max_pairs pairs or max_s seconds, and the median
 * acquire within them; -1 on a failure. */
static int lone_run(sys *s, long max_pairs, double max_s, double *us, double *acq_us)
{
	session c;
	dvec lat = {0}, acq = {0};
	int rc = session_open(s, &c);
	/* One pair first, untimed: the connection is open and the resource known. */
	if (rc == 0)
		rc = acquire(s, &c, "bench-lone") || release(s, &c) ? -1 : 0;
	double until = now_s() + max_s;
	for (long i = 0; rc == 0 && i < max_pairs && now_s() < until; i++) {
		double t0 = now_s(), t1;
		if (acquire(s, &c, "bench-lone") || (t1 = now_s(), release(s, &c))) {
			rc = -1;
		} else {
			dvec_push(&lat, (now_s() - t0) * 1e6);
			dvec_push(&acq, (t1 - t0) * 1e6);
		}
	}
	session_close(s, &c);
	*us = median(lat.v, lat.n);
	*acq_us = median(acq.v, acq.n);
	dvec_free(&lat);
	dvec_free(&acq);
	return rc;
}

/* The median round trip of an acquire answered 503 (a node that does not drive the
 * resource), in us; -1 when the node served the pair instead (or failed otherwise). */
static double refused_us(sys *s, long n)
{
	session c = {.lease = {0}};
	dvec lat = {0};
	double us = -1;
	if (acquire(s, &c, "bench-lone") == 0) {
		release(s, &c);
		return -1;
	}
	for (long i = 0; s->refused == 503 && i < n; i++) {
		double t0 = now_s();
		s->refused = http_do(s->port, "POST", "/resources/" LOCK_NAME "/leases",
				     "{\"holder\":\"bench-lone\",\"wait_ms\":300000}", NULL);
		if (s->refused == 503)
			dvec_push(&lat, (now_s() - t0) * 1e6);
	}
	if (s->refused == 503)
		us = median(lat.v, lat.n);
	dvec_free(&lat);
	return us;
}

/* ---- contenders ---- */

typedef struct contender {
	sys *s;
	int no;
	long *left;
	double until;
	pthread_mutex_t *mu;
	pthread_barrier_t *start;
	long done;
	int failed;
} contender;

static int take_one(contender *t)
{
	pthread_mutex_lock(t->mu);
	int more = *t->left > 0 && now_s() < t->until;
	*t->left -= more;
	pthread_mutex_unlock(t->mu);
	return more;
}

static void *contend_loop(void *arg)
{
	contender *t = arg;
	session c;
	char holder[32];
	snprintf(holder, sizeof holder, "bench-c%d", t->no);
	t->failed = session_open(t->s, &c) != 0;
	pthread_barrier_wait(t->start);
	while (!t->failed && take_one(t)) {
		if (acquire(t->s, &c, holder) || release(t->s, &c))
			t->failed = 1;
		else
			t->done++;
	}
	session_close(t->s, &c);
	http_thread_done();
	return NULL;
}

/* Handoffs/s of CONTENDERS clients on one lock; -1 on a failure. */
static int contend_run(sys *s, long max_pairs, double max_s, double *rate)
{
	contender t[CONTENDERS];
	pthread_t th[CONTENDERS];
	pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	pthread_barrier_t start;
	long left = max_pairs;
	int n = 0, failed = 0;
	pthread_barrier_init(&start, NULL, CONTENDERS + 1);
	for (; n < CONTENDERS; n++) {
		t[n] = (contender){.s = s, .no = n, .left = &left, .mu = &mu, .start = &start};
		if (pthread_create(&th[n], NULL, contend_loop, &t[n]) != 0)
			abort(); /* the barrier, counted for all of them, would never open */
	}
	double t0 = now_s();
	for (int i = 0; i < n; i++)
		t[i].until = t0 + max_s;
	pthread_barrier_wait(&start);
	t0 = now_s();
	long done = 0;
	for (int i = 0; i < n; i++) {
		pthread_join(th[i], NULL);
		done += t[i].done;
		failed |= t[i].failed;
	}
	double secs = now_s() - t0;
	pthread_barrier_destroy(&start);
	*rate = done / secs;
	return failed || done == 0 ? -1 : 0;
}

/* ---- the floors of a round ---- */

/* The median pair of a POST and a DELETE to minjson --commit, each answered once its
 * commit of the floor's shape is durable: the floor's two commits and two requests, with
 * the requests waiting for the commits. -1 on a failure. */
static double behind_pair_us(int port, long max_pairs, double max_s)
{
	static const char body[] = "{\"holder\":\"bench-lone\",\"wait_ms\":300000}";
	dvec lat = {0};
	double us = -1, until = now_s() + max_s;
	int ok = http_do(port, "POST", "/behind", body, NULL) == 201 &&
		 http_do(port, "DELETE", "/behind/1", NULL, NULL) == 204;
	for (long i = 0; ok && i < max_pairs && now_s() < until; i++) {
		double t0 = now_s();
		ok = http_do(port, "POST", "/behind", body, NULL) == 201 &&
		     http_do(port, "DELETE", "/behind/1", NULL, NULL) == 204;
		if (ok)
			dvec_push(&lat, (now_s() - t0) * 1e6);
	}
	if (ok && lat.n)
		us = median(lat.v, lat.n);
	dvec_free(&lat);
	return us;
}

static int round_floors(const char *dir, int minjson_port, const int behind_port[2], round_floor *f)
{
	floor_result r;
	long commits = opt.smoke ? 200 : 2000;
	double secs = opt.smoke ? 0.2 : 0.6;
	int store = opt.store;
	memset(f, 0, sizeof *f);
	for (int k = STORE_SQLITE; k <= STORE_POSTGRES; k++) {
		if (k == STORE_POSTGRES && !(opt.stores & (1 << STORE_POSTGRES)))
			continue;
		opt.store = k;
		int rc = floor_measure(dir, 1, commits, secs, &r);
		opt.store = store;
		if (rc)
			return -1;
		f->commit_us[k] = r.commit_ms * 1000;
		f->rate[k] = r.commits_per_s;
	}
	dvec lat = {0};
	double until = now_s() + secs;
	http_do(minjson_port, "GET", "/floor", NULL, NULL);
	for (int i = 0; i < (opt.smoke ? 100 : 1000) && now_s() < until; i++) {
		double t0 = now_s();
		if (http_do(minjson_port, "GET", "/floor", NULL, NULL) != 200)
			break;
		dvec_push(&lat, (now_s() - t0) * 1e6);
	}
	size_t gets = lat.n;
	f->get_us = median(lat.v, lat.n);
	dvec_free(&lat);
	printf("  floors: SQLite commit %.0f us (%.0f/s)", f->commit_us[0], f->rate[0]);
	if (opt.stores & (1 << STORE_POSTGRES))
		printf(", PostgreSQL commit %.0f us (%.0f/s)", f->commit_us[1], f->rate[1]);
	printf(", keep-alive GET %.0f us\n", f->get_us);
	for (int k = 0; k < 2; k++) {
		if (behind_port[k] <= 0)
			continue;
		f->behind_us[k] =
		    behind_pair_us(behind_port[k], opt.smoke ? 20 : 400, opt.smoke ? 0.5 : 2);
		if (f->behind_us[k] < 0) {
			printf("  minjson --commit failed\n");
			return -1;
		}
		printf("  a pair of requests behind %s commits %.0f us\n",
		       k ? "PostgreSQL" : "SQLite", f->behind_us[k]);
	}
	return gets ? 0 : -1;
}

static double pair_floor_us(const round_floor *f, int k)
{
	return 2 * f->commit_us[k] + 2 * f->get_us;
}

/* ---- the benchmark ---- */

typedef struct lockpath {
	char dir[BENCH_PATH_MAX];
	server sq, pg;
	cluster cl;
	etcd et;
	pid_t minjson, behind[2]; /* behind: minjson --commit, on SQLite and PostgreSQL */
	int minjson_port, behind_port[2];
	sys s_sq, s_pg, s_et, s_own, s_other;
	dvec fl_us[2], fl_rate[2], get_us, behind_us[2], other_503;
	int other_served;
} lockpath;

static int subdir(char *out, size_t len, const char *dir, const char *name)
{
	snprintf(out, len, "%.4000s/%s", dir, name);
	return mkdir(out, 0700);
}

/* Which cluster node drives LOCK_NAME: a pair through each (one may be refused), then
 * GET /resources/NAME's `node`. -1 when neither answers it. */
static int cluster_owner(lockpath *L)
{
	for (int k = 0; k < 2; k++) {
		sys s = {.kind = SYS_BATON, .port = L->cl.node[k].port};
		session c = {.lease = {0}};
		if (acquire(&s, &c, "bench-probe") == 0)
			release(&s, &c);
	}
	char *text = NULL;
	int owner = -1;
	if (http_do(L->cl.node[0].port, "GET", "/resources/" LOCK_NAME, NULL, &text) == 200) {
		json_t *j = text ? json_loads(text, 0, NULL) : NULL;
		owner = cluster_node_index(&L->cl, json_string_value(json_object_get(j, "node")));
		json_decref(j);
	}
	free(text);
	return owner;
}

static int start_all(lockpath *L)
{
	char d[BENCH_PATH_MAX + 16];
	int pg = (opt.stores & (1 << STORE_POSTGRES)) != 0, store = opt.store;
	if (minjson_start(L->dir, NULL, &L->minjson, &L->minjson_port) != 0)
		return -1;
	if (opt.stores & (1 << STORE_SQLITE)) {
		snprintf(d, sizeof d, "%.4000s/behind.db", L->dir);
		if (minjson_start(L->dir, d, &L->behind[0], &L->behind_port[0]) != 0)
			return -1;
	}
	if (pg && minjson_start(L->dir, opt.pg_url, &L->behind[1], &L->behind_port[1]) != 0)
		return -1;
	if (opt.stores & (1 << STORE_SQLITE)) {
		opt.store = STORE_SQLITE;
		if (subdir(d, sizeof d, L->dir, "sqlite") || server_start(&L->sq, d, NULL))
			goto fail;
		L->s_sq.port = L->sq.port;
		L->s_sq.up = 1;
	}
	opt.store = STORE_POSTGRES;
	if (pg && (subdir(d, sizeof d, L->dir, "pg") || server_start(&L->pg, d, NULL)))
		goto fail;
	L->s_pg.port = L->pg.port;
	L->s_pg.up = pg;
	if (pg && (cluster_start(&L->cl, 2) || cluster_settle(&L->cl, 60) < 0))
		goto fail;
	if (pg) {
		int own = cluster_owner(L);
		if (own < 0) {
			fprintf(stderr, "bench: lockpath: no cluster node drives " LOCK_NAME "\n");
			goto fail;
		}
		L->s_own.port = L->cl.node[own].port;
		L->s_other.port = L->cl.node[1 - own].port;
		L->s_own.up = L->s_other.up = 1;
		printf("  cluster: %s drives " LOCK_NAME ", %s does not\n", L->cl.id[own],
		       L->cl.id[1 - own]);
	}
	opt.store = store;
	/* etcd may be missing or fail to start: its rows say so, the rest still runs. */
	if (subdir(d, sizeof d, L->dir, "etcd") == 0 && etcd_start(&L->et, d) == 0) {
		L->s_et.port = L->et.port;
		L->s_et.up = 1;
		printf("  etcd %s on 127.0.0.1:%d (pid %d)\n", L->et.version, L->et.port,
		       (int)L->et.pid);
	} else {
		printf("  etcd: %s\n", L->et.why[0] ? L->et.why : "no directory");
	}
	return 0;
fail:
	opt.store = store;
	return -1;
}

static void stop_all(lockpath *L)
{
	int store = opt.store;
	etcd_stop(&L->et);
	opt.store = STORE_SQLITE;
	server_stop(&L->sq);
	opt.store = STORE_POSTGRES;
	server_stop(&L->pg);
	if (L->cl.dir[0])
		cluster_stop(&L->cl);
	opt.store = store;
	if (L->minjson > 0)
		child_stop(L->minjson);
	for (int k = 0; k < 2; k++)
		if (L->behind[k] > 0)
			child_stop(L->behind[k]);
}

static const char *pair_name(const sys *s)
{
	return s->what ? s->what : "lone pair";
}

/* batond's own clocks, from its /metrics: the sums and counts of its request durations
 * (from the request's first byte to its answer queued) and of its commits. */
enum { T_REQ_S, T_REQ_N, T_COMMIT_S, T_COMMIT_N, T_N };

static int batond_clocks(int port, double v[T_N])
{
	static const char *const series[T_N] = {
	    "baton_http_request_duration_seconds_sum", "baton_http_request_duration_seconds_count",
	    "baton_commit_duration_seconds_sum", "baton_commit_duration_seconds_count"};
	for (int i = 0; i < T_N; i++)
		if ((v[i] = server_metric(port, series[i])) < 0)
			return -1;
	return 0;
}

/* Where a batond's lone pairs spent their time: its mean request and its mean commit over
 * the run, in us, pushed for the round and printed; nothing when it made no commit (a
 * node that passes the requests on: the owner commits). */
static void lone_clocks(sys *s, const double a[T_N], const double b[T_N])
{
	double req = b[T_REQ_N] - a[T_REQ_N], commits = b[T_COMMIT_N] - a[T_COMMIT_N];
	if (req <= 0 || commits <= 0)
		return;
	double srv = (b[T_REQ_S] - a[T_REQ_S]) / req * 1e6;
	double commit = (b[T_COMMIT_S] - a[T_COMMIT_S]) / commits * 1e6;
	dvec_push(&s->srv_us, srv);
	dvec_push(&s->commit_us, commit);
	printf("; in batond %.0f us a request, %.0f us a commit (means)", srv, commit);
}

/* One system's lone pairs and contenders in one round, against its floor. */
static int measure(sys *s, const round_floor *f, int contend)
{
	double us, acq, rate, before[T_N], after[T_N];
	long pairs = opt.smoke ? 20 : 400, hand = opt.smoke ? 40 : 1000;
	double secs = opt.smoke ? 0.5 : 2.0;
	if (!s->up)
		return 0;
	int clocks = s->kind == SYS_BATON && batond_clocks(s->port, before) == 0;
	if (lone_run(s, pairs, secs, &us, &acq) != 0) {
		printf("  %-19s %s: failed with status %d\n", s->label, pair_name(s), s->refused);
		return -1;
	}
	dvec_push(&s->lone_us, us);
	dvec_push(&s->acq_us, acq);
	dvec_push(&s->lone_ratio, us / pair_floor_us(f, s->floor));
	printf("  %-19s %s %.0f us (acquire %.0f us; %.2fx its floor)", s->label, pair_name(s), us,
	       acq, us / pair_floor_us(f, s->floor));
	if (f->behind_us[s->floor] > 0) {
		dvec_push(&s->behind_ratio, us / f->behind_us[s->floor]);
		printf("; %.2fx the pair behind commits", us / f->behind_us[s->floor]);
	}
	if (clocks && batond_clocks(s->port, after) == 0)
		lone_clocks(s, before, after);
	if (contend) {
		if (contend_run(s, hand, opt.smoke ? 0.5 : 3.0, &rate) != 0) {
			printf("; %d contenders failed with status %d\n", CONTENDERS, s->refused);
			return -1;
		}
		dvec_push(&s->hand, rate);
		dvec_push(&s->hand_ratio, rate / f->rate[s->floor]);
		printf("; %d contenders %.0f handoffs/s (%.2fx its floor's commits/s)", CONTENDERS,
		       rate, rate / f->rate[s->floor]);
	}
	printf("\n");
	return 0;
}

static double last(const dvec *d)
{
	return d->n ? d->v[d->n - 1] : 0;
}

/* This round's figures of s over etcd's, measured in the same round. */
static void versus_etcd(sys *s, const sys *et)
{
	if (!s->up)
		return;
	dvec_push(&s->lone_etcd, last(&s->lone_us) / last(&et->lone_us));
	if (s->hand.n == s->lone_us.n)
		dvec_push(&s->hand_etcd, last(&s->hand) / last(&et->hand));
}

static int one_round(lockpath *L, int i)
{
	round_floor f;
	printf("  round %d\n", i + 1);
	if (round_floors(L->dir, L->minjson_port, L->behind_port, &f) != 0)
		return -1;
	for (int k = 0; k < 2; k++) {
		dvec_push(&L->fl_us[k], pair_floor_us(&f, k));
		dvec_push(&L->fl_rate[k], f.rate[k]);
	}
	dvec_push(&L->get_us, f.get_us);
	for (int k = 0; k < 2; k++)
		if (f.behind_us[k] > 0)
			dvec_push(&L->behind_us[k], f.behind_us[k]);
	if (measure(&L->s_sq, &f, 1) || measure(&L->s_pg, &f, 1))
		return -1;
	if (L->s_et.up && measure(&L->s_et, &f, 1) != 0) {
		L->s_et.up = 0; /* reported as failed; baton's rows go on */
		snprintf(L->et.why, sizeof L->et.why,
			 "a request failed with status %d (see %.200s)", L->s_et.refused,
			 L->et.log);
	}
	if (measure(&L->s_own, &f, 0))
		return -1;
	if (L->s_et.up) {
		sys *all[] = {&L->s_sq, &L->s_pg, &L->s_own};
		for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
			versus_etcd(all[k], &L->s_et);
	}
	if (L->s_other.up && !L->other_served) {
		double us = refused_us(&L->s_other, opt.smoke ? 20 : 200);
		if (us >= 0) {
			dvec_push(&L->other_503, us);
			printf("  %-19s %s: not served (503), the 503 answered in %.0f us\n",
			       L->s_other.label, pair_name(&L->s_other), us);
			return 0;
		}
		if (L->s_other.refused != 503 && L->s_other.refused != 201 &&
		    L->s_other.refused != 0)
			return -1;
		L->other_served = 1; /* it answers leases now: measure the pair */
	}
	if (!L->other_served)
		return 0;
	if (measure(&L->s_other, &f, 0))
		return -1;
	if (L->s_et.up)
		versus_etcd(&L->s_other, &L->s_et);
	return 0;
}

/* ---- rows ---- */

static void row_floor(lockpath *L, int k, const char *label)
{
	row r = {.verdict = V_INFO};
	snprintf(r.store, sizeof r.store, "%s", label);
	snprintf(r.what, sizeof r.what, "lock pair floor");
	snprintf(r.figure, sizeof r.figure, "%.0f us", median(L->fl_us[k].v, L->fl_us[k].n));
	snprintf(r.floor, sizeof r.floor, "(the reference)");
	snprintf(r.ratio, sizeof r.ratio, "1x");
	snprintf(r.target, sizeof r.target, "-");
	snprintf(r.note, sizeof r.note,
		 "two commits and two keep-alive GETs to minjson (%.0f us each); commits %.0f/s;"
		 " medians of %zu rounds",
		 median(L->get_us.v, L->get_us.n), median(L->fl_rate[k].v, L->fl_rate[k].n),
		 L->fl_us[k].n);
	table_add(&r);
}

/* The pair behind commits: the floor's commits and requests, the requests waiting. */
static void row_behind(lockpath *L, int k, const char *label)
{
	row r = {.verdict = V_INFO};
	const dvec *b = &L->behind_us[k];
	if (!b->n)
		return;
	double us = median(b->v, b->n), fl = median(L->fl_us[k].v, L->fl_us[k].n);
	snprintf(r.store, sizeof r.store, "%s", label);
	snprintf(r.what, sizeof r.what, "pair behind commits");
	snprintf(r.figure, sizeof r.figure, "%.0f us", us);
	snprintf(r.floor, sizeof r.floor, "%.0f us (%s)", fl, label);
	snprintf(r.ratio, sizeof r.ratio, "%.2fx", us / fl);
	snprintf(r.target, sizeof r.target, "-");
	snprintf(r.note, sizeof r.note,
		 "a POST and a DELETE to minjson --commit, each answered once a commit of the"
		 " floor's shape is durable: what the floor's parts cost put together; medians of"
		 " %zu rounds",
		 b->n);
	table_add(&r);
}

static void row_sys(lockpath *L, sys *s, int contend)
{
	const char *fl = s->floor ? "PostgreSQL" : "SQLite";
	row r = {.verdict = V_INFO};
	snprintf(r.store, sizeof r.store, "%s", s->label);
	if (!s->up && s->kind == SYS_ETCD) {
		snprintf(r.what, sizeof r.what, "lock pair, lone");
		snprintf(r.figure, sizeof r.figure, "not measured");
		snprintf(r.target, sizeof r.target, "-");
		snprintf(r.note, sizeof r.note, "etcd: %s", L->et.why);
		table_add(&r);
		return;
	}
	double et = median(L->s_et.lone_us.v, L->s_et.lone_us.n);
	double us = median(s->lone_us.v, s->lone_us.n);
	snprintf(r.what, sizeof r.what, "%s", s->what ? s->what : "lock pair, lone");
	snprintf(r.figure, sizeof r.figure, "%.0f us", us);
	snprintf(r.floor, sizeof r.floor, "%.0f us (%s)",
		 median(L->fl_us[s->floor].v, L->fl_us[s->floor].n), fl);
	snprintf(r.ratio, sizeof r.ratio, "%.2fx", median(s->lone_ratio.v, s->lone_ratio.n));
	snprintf(r.target, sizeof r.target, "%s", s->kind == SYS_ETCD ? "-" : "goal <= 1.5x");
	int n = snprintf(r.note, sizeof r.note,
			 "median pair of each round (acquire %.0f us of it), median of %zu rounds",
			 median(s->acq_us.v, s->acq_us.n), s->lone_us.n);
	if (s->behind_ratio.n)
		n += snprintf(r.note + n, sizeof r.note - n, "; %.2fx the pair behind commits",
			      median(s->behind_ratio.v, s->behind_ratio.n));
	if (s->srv_us.n)
		n += snprintf(r.note + n, sizeof r.note - n,
			      "; in batond (its /metrics, means) %.0f us a request, of it %.0f us"
			      " its commit",
			      median(s->srv_us.v, s->srv_us.n),
			      median(s->commit_us.v, s->commit_us.n));
	if (s->lone_etcd.n)
		snprintf(r.note + n, sizeof r.note - n,
			 "; etcd in the same rounds %.0f us (this/etcd %.2fx)", et,
			 median(s->lone_etcd.v, s->lone_etcd.n));
	table_add(&r);
	if (!contend)
		return;
	double eh = median(L->s_et.hand.v, L->s_et.hand.n);
	double h = median(s->hand.v, s->hand.n);
	snprintf(r.what, sizeof r.what, "%d contenders, one lock", CONTENDERS);
	snprintf(r.figure, sizeof r.figure, "%.0f handoffs/s", h);
	snprintf(r.floor, sizeof r.floor, "%.0f commits/s (%s)",
		 median(L->fl_rate[s->floor].v, L->fl_rate[s->floor].n), fl);
	snprintf(r.ratio, sizeof r.ratio, "%.2fx", median(s->hand_ratio.v, s->hand_ratio.n));
	snprintf(r.target, sizeof r.target, "-");
	n = snprintf(r.note, sizeof r.note, "median of %zu rounds", s->hand.n);
	if (s->hand_etcd.n)
		snprintf(r.note + n, sizeof r.note - n,
			 "; etcd in the same rounds %.0f handoffs/s (this/etcd %.2fx)", eh,
			 median(s->hand_etcd.v, s->hand_etcd.n));
	table_add(&r);
}

static void row_other(lockpath *L)
{
	sys *s = &L->s_other;
	if (L->other_served) {
		row_sys(L, s, 0);
		return;
	}
	row r = {.verdict = V_INFO};
	snprintf(r.store, sizeof r.store, "%s", s->label);
	snprintf(r.what, sizeof r.what, "%s", s->what);
	snprintf(r.figure, sizeof r.figure, "not served (503)");
	snprintf(r.floor, sizeof r.floor, "%.0f us (PostgreSQL)",
		 median(L->fl_us[1].v, L->fl_us[1].n));
	snprintf(r.ratio, sizeof r.ratio, "-");
	snprintf(r.target, sizeof r.target, "goal <= 1.5x");
	snprintf(r.note, sizeof r.note,
		 "a node answers 503 for a lease on a resource it does not drive; aside: that 503"
		 " takes %.0f us (median of %zu rounds)",
		 median(L->other_503.v, L->other_503.n), L->other_503.n);
	table_add(&r);
}

static void lockpath_free(lockpath *L)
{
	sys *all[] = {&L->s_sq, &L->s_pg, &L->s_et, &L->s_own, &L->s_other};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
		dvec_free(&all[i]->lone_us);
		dvec_free(&all[i]->lone_ratio);
		dvec_free(&all[i]->hand);
		dvec_free(&all[i]->hand_ratio);
		dvec_free(&all[i]->acq_us);
		dvec_free(&all[i]->behind_ratio);
		dvec_free(&all[i]->srv_us);
		dvec_free(&all[i]->commit_us);
		dvec_free(&all[i]->lone_etcd);
		dvec_free(&all[i]->hand_etcd);
	}
	for (int k = 0; k < 2; k++) {
		dvec_free(&L->fl_us[k]);
		dvec_free(&L->fl_rate[k]);
	}
	dvec_free(&L->get_us);
	dvec_free(&L->behind_us[0]);
	dvec_free(&L->behind_us[1]);
	dvec_free(&L->other_503);
}

int bench_lockpath(void)
{
	const char *what = "lock path";
	static lockpath L; /* large (the cluster's paths): not on the stack */
	int rounds = opt.smoke ? 1 : 3, rc = 0, pg = (opt.stores & (1 << STORE_POSTGRES)) != 0;
	memset(&L, 0, sizeof L);
	L.s_sq = (sys){.label = "SQLite", .kind = SYS_BATON};
	L.s_pg = (sys){.label = "PostgreSQL", .kind = SYS_BATON, .floor = 1};
	L.s_et = (sys){.label = "etcd 3.4", .kind = SYS_ETCD};
	L.s_own = (sys){.label = "PostgreSQL, 2 nodes",
			.kind = SYS_BATON,
			.floor = 1,
			.what = "lock pair via its owner"};
	L.s_other = (sys){.label = "PostgreSQL, 2 nodes",
			  .kind = SYS_BATON,
			  .floor = 1,
			  .what = "lock pair via the other"};
	printf("\n== %s: lone acquire + release, %d contenders, %d interleaved rounds: batond%s%s,"
	       " etcd\n",
	       what, CONTENDERS, rounds, opt.stores & (1 << STORE_SQLITE) ? " on SQLite" : "",
	       pg ? " on PostgreSQL and a 2-node cluster" : "");
	if (tmpdir_new(L.dir, sizeof L.dir) != 0) {
		table_fail(what, "no temporary directory");
		return -1;
	}
	if (start_all(&L) != 0) {
		stop_all(&L);
		tmpdir_remove(L.dir);
		table_fail(what, "could not start batond (see above)");
		return -1;
	}
	for (int i = 0; i < rounds && rc == 0; i++)
		rc = one_round(&L, i);
	stop_all(&L);
	tmpdir_remove(L.dir);
	if (rc) {
		lockpath_free(&L);
		table_fail(what, "a run failed (see above)");
		return -1;
	}
	if (opt.stores & (1 << STORE_SQLITE)) {
		row_floor(&L, 0, "SQLite");
		row_behind(&L, 0, "SQLite");
		row_sys(&L, &L.s_sq, 1);
	}
	if (pg) {
		row_floor(&L, 1, "PostgreSQL");
		row_behind(&L, 1, "PostgreSQL");
		row_sys(&L, &L.s_pg, 1);
	}
	row_sys(&L, &L.s_et, 1);
	if (pg) {
		row_sys(&L, &L.s_own, 0);
		row_other(&L);
	}
	lockpath_free(&L);
	return 0;
}
