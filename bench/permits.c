/*
 * permits.c - a resource with several permits (issue 28), beside the mutex, on one batond.
 *
 * Three phases on the same batond (one per store, on a fresh database), each with CLIENTS
 * threads, each thread on its own keep-alive libcurl connection to 127.0.0.1, looping on
 * POST /resources/NAME/leases (waiting in the queue) and, as soon as it is answered,
 * DELETE /leases/{id}, for a fixed time (and at most a fixed count):
 *
 * - mutex: a resource of limit 1: grants (handoffs) per second;
 * - permits: a resource of limit PERMITS, every request plain: grants per second;
 * - a writer among readers: limit PERMITS, CLIENTS - 1 plain readers and one writer that
 *   asks "exclusive": true: the grants per second of each side, and the mean wait of
 *   each (from its POST sent to its 201 read).
 *
 * Each phase has a resource of its own, whose limit is set (PUT /resources/NAME) and read
 * back first. Each grant is checked against the API: a plain one names a slot in
 * 0..limit-1, an exclusive one slot null; after each phase the resource must show no
 * holder and no permit in use. The figure the issue aims at is permits / mutex (at least
 * 3x with 4 permits), both measured in the same round on the same server.
 *
 * With no hold time, the mutex is bounded by its commits: the next grant waits for a
 * release, which waits for the previous grant's answer, and a release and the next grant
 * share one commit. With 4 permits up to 4 releases can share a commit, if nothing else
 * gives out first. What gives out is in the notes: commits per grant
 * (baton_commits_total), batond's mean commit and the share of the phase it spent
 * committing (baton_commit_duration_seconds; near 100%, the commits are the limit); the
 * CPU per grant of batond (and its busiest thread), of the clients (this process) and,
 * on PostgreSQL, of its server (and its busiest process), with the grants/s the machine's
 * cores would allow at that cost; the cores busy over the phase, of these processes
 * and of the whole machine (/proc/stat: the machine is shared); and the share of the
 * phase batond's engine thread, the single writer, spent on a core and ready to run but
 * waiting for one (its schedstat): what the writer loses to a machine whose cores the
 * clients, batond's HTTP threads and PostgreSQL share.
 *
 * Rounds: a floor (under a second of commits, floor.c), then the three phases in an order
 * rotated from round to round, so that a trend of the noisy machine does not fall on one
 * phase. Figures are the medians of the rounds, ratios the medians of each round's.
 */
#include "bench.h"

#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CLIENTS	   16
#define PERMITS	   4
#define WAIT_MS	   300000
#define MAX_ROUNDS 5

enum { PH_MUTEX, PH_PERMITS, PH_RW, PH_N };

static const struct phase_def {
	const char *name;
	const char *resource;
	int limit;
	int writers; /* clients that ask "exclusive": true */
} phases[PH_N] = {
    {"mutex", "bench-mutex", 1, 0},
    {"permits", "bench-permits", PERMITS, 0},
    {"writer among readers", "bench-rw", PERMITS, 1},
};

/* What one phase measured: F_ indices, so that the rounds' medians are one loop. */
enum {
	F_RATE,	      /* grants/s of the plain clients */
	F_XRATE,      /* grants/s of the exclusive ones */
	F_WAIT,	      /* mean wait of a plain acquisition, ms */
	F_XWAIT,      /* mean wait of an exclusive one, ms */
	F_COMMITS,    /* commits per grant */
	F_COMMIT_MS,  /* batond's mean commit */
	F_COMMITTING, /* the share of the phase's time batond spent in its commits */
	F_US_BATOND,  /* CPU per grant, us: batond */
	F_US_BUSIEST, /* its busiest thread */
	F_US_CLIENTS, /* this process (the clients) */
	F_US_PG,      /* PostgreSQL's processes */
	F_US_PG_MOST, /* its busiest process (batond's writer connection, so far) */
	F_HOLDERS,    /* holders at once, on average (Little: the holds' time / the phase's) */
	F_HOLD_MS,    /* mean hold, from its grant's round to its release's (batond's clock) */
	F_CEILING,    /* the grants/s the machine's cores allow at that CPU per grant */
	F_OURS,	      /* cores busy over the phase: batond, the clients, PostgreSQL */
	F_MACHINE,    /* cores busy over the phase: the whole machine (/proc/stat) */
	F_ENG_RUN,    /* the share of the phase batond's engine thread ran on a core... */
	F_ENG_WAIT,   /* ...and was ready to, waiting for one (its schedstat) */
	F_N
};

typedef struct phase_out {
	double v[F_N];
	char busiest[32]; /* the busiest batond thread's name */
} phase_out;

/* ---- one contender ---- */

typedef struct client {
	int port, no, exclusive, limit;
	const char *resource;
	double *until; /* shared, as left is: under mu */
	long *left;
	pthread_mutex_t *mu;
	pthread_barrier_t *start;
	long grants;
	double wait_s; /* its acquisitions' times, summed */
	int failed;
	char why[200];
} client;

static int take_one(client *c)
{
	pthread_mutex_lock(c->mu);
	int more = *c->left > 0 && now_s() < *c->until;
	*c->left -= more;
	pthread_mutex_unlock(c->mu);
	return more;
}

/* Whether a grant's slot and exclusive are what issue 28 says; c->why when not. */
static int grant_ok(client *c, json_t *lease)
{
	json_t *slot = json_object_get(lease, "slot"), *ex = json_object_get(lease, "exclusive");
	json_int_t k = json_integer_value(slot);
	int ok = c->exclusive
		     ? json_is_null(slot) && json_is_true(ex)
		     : json_is_integer(slot) && k >= 0 && k < c->limit && json_is_false(ex);
	if (!ok) {
		char *s = slot ? json_dumps(slot, JSON_ENCODE_ANY) : NULL;
		char *e = ex ? json_dumps(ex, JSON_ENCODE_ANY) : NULL;
		snprintf(c->why, sizeof c->why,
			 "a %s grant on %s (limit %d) came with slot %s, exclusive %s",
			 c->exclusive ? "exclusive" : "plain", c->resource, c->limit,
			 s ? s : "(none)", e ? e : "(none)");
		free(s);
		free(e);
	}
	return ok;
}

/* Acquires, waiting; the lease's path in path. 0 when granted (checked or not: *ok says),
 * -1 with c->why when not granted. */
static int acquire(client *c, char *path, size_t len, int *ok)
{
	char body[160], url[160], *resp = NULL;
	snprintf(body, sizeof body, "{\"holder\":\"bench-p%d\",\"wait_ms\":%d%s}", c->no, WAIT_MS,
		 c->exclusive ? ",\"exclusive\":true" : "");
	snprintf(url, sizeof url, "/resources/%s/leases", c->resource);
	int st = http_do(c->port, "POST", url, body, &resp);
	json_t *j = st == 201 && resp ? json_loads(resp, 0, NULL) : NULL;
	const char *id = json_string_value(json_object_get(j, "id"));
	if (id) {
		snprintf(path, len, "/leases/%s", id);
		*ok = grant_ok(c, j);
	} else {
		snprintf(c->why, sizeof c->why, "POST %s answered %d: %.120s", url, st,
			 resp ? resp : "");
	}
	json_decref(j);
	free(resp);
	return id ? 0 : -1;
}

static void *client_main(void *arg)
{
	client *c = arg;
	char path[160];
	/* The connection is opened before the start, not in the measured time. */
	snprintf(path, sizeof path, "/resources/%s", c->resource);
	if (http_do(c->port, "GET", path, NULL, NULL) != 200) {
		c->failed = 1;
		snprintf(c->why, sizeof c->why, "GET %s failed", path);
	}
	pthread_barrier_wait(c->start);
	while (!c->failed && take_one(c)) {
		int ok = 0;
		double t0 = now_s();
		if (acquire(c, path, sizeof path, &ok) != 0) {
			c->failed = 1;
			break;
		}
		c->wait_s += now_s() - t0;
		/* Released even when the grant looked wrong, so that nobody waits behind it. */
		int st = http_do(c->port, "DELETE", path, NULL, NULL);
		if (st != 204 && ok) {
			snprintf(c->why, sizeof c->why, "DELETE %s answered %d", path, st);
			ok = 0;
		}
		c->failed = !ok;
		c->grants += ok;
	}
	http_thread_done();
	return NULL;
}

/* ---- the costs around a phase ---- */

typedef struct snap {
	double t, commits, commit_s, commit_n;
	double machine_s; /* CPU time of the whole machine, every core, every process */
	double engine_run_s, engine_wait_s; /* batond's engine thread: on a core, waiting for one */
	double hold_ms;			    /* the resource's totals.total_hold_ms */
	cpu_snap batond, self;
	pg_snap pg;
} snap;

/* The machine's busy CPU seconds so far (/proc/stat: all but idle and iowait). */
static double machine_busy_s(void)
{
	unsigned long long user, nice, sys, idle, iowait, irq, softirq, steal;
	FILE *f = fopen("/proc/stat", "r");
	int n = f ? fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &user, &nice, &sys,
			   &idle, &iowait, &irq, &softirq, &steal)
		  : 0;
	if (f)
		fclose(f);
	if (n != 8)
		return 0;
	return (double)(user + nice + sys + irq + softirq + steal) / (double)sysconf(_SC_CLK_TCK);
}

/*
 * The time batond's engine thread (the single writer) has run on a core and has waited
 * for one while ready to run, in seconds (the first two fields of its
 * /proc/PID/task/TID/schedstat, in ns); 0 when it cannot be read.
 */
static void engine_sched_s(pid_t pid, double *run, double *wait)
{
	char path[128], line[64];
	*run = *wait = 0;
	snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
	DIR *d = opendir(path);
	struct dirent *de;
	while (d && (de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof path, "/proc/%d/task/%.16s/comm", (int)pid, de->d_name);
		FILE *f = fopen(path, "r");
		int engine =
		    f && fgets(line, sizeof line, f) && strcmp(line, "baton-engine\n") == 0;
		if (f)
			fclose(f);
		if (!engine)
			continue;
		unsigned long long run_ns = 0, wait_ns = 0;
		snprintf(path, sizeof path, "/proc/%d/task/%.16s/schedstat", (int)pid, de->d_name);
		if ((f = fopen(path, "r"))) {
			if (fscanf(f, "%llu %llu", &run_ns, &wait_ns) == 2) {
				*run = (double)run_ns / 1e9;
				*wait = (double)wait_ns / 1e9;
			}
			fclose(f);
		}
		break;
	}
	if (d)
		closedir(d);
}

/* The resource's total time held, in ms (GET /resources/NAME's totals); -1 on failure. */
static double hold_total_ms(int port, const char *resource)
{
	char path[128], *text = NULL;
	double ms = -1;
	snprintf(path, sizeof path, "/resources/%s", resource);
	if (http_do(port, "GET", path, NULL, &text) == 200 && text) {
		json_t *j = json_loads(text, 0, NULL);
		json_t *v = json_object_get(json_object_get(j, "totals"), "total_hold_ms");
		ms = json_is_integer(v) ? (double)json_integer_value(v) : -1;
		json_decref(j);
	}
	free(text);
	return ms;
}

static int snap_take(const server *s, const char *resource, snap *out)
{
	char *text = NULL;
	int st = http_do(s->port, "GET", "/metrics", NULL, &text);
	out->hold_ms = hold_total_ms(s->port, resource);
	out->commits = text ? metric_value(text, "baton_commits_total") : -1;
	out->commit_s = text ? metric_value(text, "baton_commit_duration_seconds_sum") : -1;
	out->commit_n = text ? metric_value(text, "baton_commit_duration_seconds_count") : -1;
	free(text);
	cpu_take(s->pid, &out->batond);
	cpu_take(getpid(), &out->self);
	if (opt.store == STORE_POSTGRES)
		pg_snap_take(&out->pg, 0);
	out->machine_s = machine_busy_s();
	engine_sched_s(s->pid, &out->engine_run_s, &out->engine_wait_s);
	out->t = now_s();
	return st == 200 && out->commits >= 0 && out->commit_n >= 0 && out->hold_ms >= 0 ? 0 : -1;
}

/* The busiest thread of pid between two snapshots: its CPU seconds, and its name. */
static double busiest_thread(pid_t pid, const cpu_snap *a, const cpu_snap *b, char *name,
			     size_t len)
{
	double most = 0;
	int tid = 0;
	for (int i = 0; i < b->n; i++) {
		double before = 0;
		for (int j = 0; j < a->n; j++)
			if (a->tid[j] == b->tid[i])
				before = a->s[j];
		if (b->s[i] - before > most) {
			most = b->s[i] - before;
			tid = b->tid[i];
		}
	}
	char path[96];
	snprintf(name, len, "-"); /* none used a whole tick */
	snprintf(path, sizeof path, "/proc/%d/task/%d/comm", (int)pid, tid);
	FILE *f = tid ? fopen(path, "r") : NULL;
	if (f && fgets(name, (int)len, f))
		name[strcspn(name, "\n")] = 0;
	if (f)
		fclose(f);
	return most;
}

static void costs(const server *s, const snap *a, const snap *b, long grants, phase_out *o)
{
	double wall = b->t - a->t, busiest, pg = 0, most = 0, per = 1e6 / (double)grants;
	double n = b->commit_n - a->commit_n;
	o->v[F_COMMITS] = (b->commits - a->commits) / (double)grants;
	o->v[F_COMMIT_MS] = n > 0 ? (b->commit_s - a->commit_s) / n * 1000 : 0;
	o->v[F_COMMITTING] = (b->commit_s - a->commit_s) / wall;
	o->v[F_HOLDERS] = (b->hold_ms - a->hold_ms) / 1000 / wall;
	o->v[F_HOLD_MS] = (b->hold_ms - a->hold_ms) / (double)grants;
	double batond = cpu_delta(&a->batond, &b->batond, &busiest);
	busiest = busiest_thread(s->pid, &a->batond, &b->batond, o->busiest, sizeof o->busiest);
	double mine, clients = cpu_delta(&a->self, &b->self, &mine);
	if (opt.store == STORE_POSTGRES) {
		char title[80];
		double waits;
		pg = pg_snap_delta(&a->pg, &b->pg, &most, &waits, title, sizeof title);
	}
	o->v[F_US_BATOND] = batond * per;
	o->v[F_US_BUSIEST] = busiest * per;
	o->v[F_US_CLIENTS] = clients * per;
	o->v[F_US_PG] = pg * per;
	o->v[F_US_PG_MOST] = most * per;
	o->v[F_CEILING] =
	    (double)sysconf(_SC_NPROCESSORS_ONLN) * (double)grants / (batond + clients + pg);
	o->v[F_OURS] = (batond + clients + pg) / wall;
	o->v[F_MACHINE] = (b->machine_s - a->machine_s) / wall;
	o->v[F_ENG_RUN] = (b->engine_run_s - a->engine_run_s) / wall;
	o->v[F_ENG_WAIT] = (b->engine_wait_s - a->engine_wait_s) / wall;
}

/* "; 0.44 commits/grant of 0.828 ms, ...; CPU per grant: ...": what gave out first. */
static void cost_text(const phase_out *o, char *buf, size_t len)
{
	const double *v = o->v;
	char pg[64] = "";
	if (opt.store == STORE_POSTGRES)
		snprintf(pg, sizeof pg, ", PostgreSQL %.0f us (busiest process %.0f)", v[F_US_PG],
			 v[F_US_PG_MOST]);
	snprintf(buf, len,
		 "; holders at once %.2f, mean hold %.2f ms; %.2f commits/grant of %.3f ms,"
		 " committing %.0f%% of the time; CPU/grant: batond %.0f us (%s %.0f), clients"
		 " %.0f us%s: %ld cores allow %.0f/s; cores busy: ours %.2f, machine %.2f;"
		 " the engine thread on a core %.0f%% of the time, ready but waiting for one"
		 " %.0f%%",
		 v[F_HOLDERS], v[F_HOLD_MS], v[F_COMMITS], v[F_COMMIT_MS], 100 * v[F_COMMITTING],
		 v[F_US_BATOND], o->busiest, v[F_US_BUSIEST], v[F_US_CLIENTS], pg,
		 sysconf(_SC_NPROCESSORS_ONLN), v[F_CEILING], v[F_OURS], v[F_MACHINE],
		 100 * v[F_ENG_RUN], 100 * v[F_ENG_WAIT]);
}

/* ---- one phase ---- */

/* Sets the phase's resource's limit and reads it back; with `idle`, also wants no holder
 * and no permit in use. 0, or -1 with a message. */
static int resource_check(int port, const struct phase_def *p, int put, int idle)
{
	char path[128], body[32], *text = NULL;
	snprintf(path, sizeof path, "/resources/%s", p->resource);
	snprintf(body, sizeof body, "{\"limit\":%d}", p->limit);
	int st =
	    put ? http_do(port, "PUT", path, body, &text) : http_do(port, "GET", path, NULL, &text);
	json_t *j = st == 200 && text ? json_loads(text, 0, NULL) : NULL;
	json_t *limit = json_object_get(j, "limit"), *in_use = json_object_get(j, "permits_in_use");
	int ok = json_integer_value(limit) == p->limit && json_is_integer(in_use) &&
		 (!idle || (json_integer_value(in_use) == 0 &&
			    json_array_size(json_object_get(j, "holders")) == 0 &&
			    json_is_array(json_object_get(j, "holders"))));
	if (!ok)
		fprintf(stderr, "bench: permits: %s %s answered %d, wanted limit %d%s: %.300s\n",
			put ? "PUT" : "GET", path, st, p->limit,
			idle ? ", no holder, no permit in use" : "", text ? text : "");
	json_decref(j);
	free(text);
	return ok ? 0 : -1;
}

/* Starts the clients, waits for them; the grants and waits of each side into o, how many
 * grants in all into *total. */
static int contend(const server *s, const struct phase_def *p, double secs, long max_pairs,
		   phase_out *o, long *total)
{
	client c[CLIENTS];
	pthread_t th[CLIENTS];
	pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	pthread_barrier_t start;
	long left = max_pairs, grants[2] = {0, 0};
	/* Far off until the clients have their connections and the clock starts. */
	double until = now_s() + 600, wait[2] = {0, 0};
	int failed = 0;
	pthread_barrier_init(&start, NULL, CLIENTS + 1);
	for (int i = 0; i < CLIENTS; i++) {
		c[i] = (client){.port = s->port,
				.no = i,
				.exclusive = i < p->writers,
				.limit = p->limit,
				.resource = p->resource,
				.until = &until,
				.left = &left,
				.mu = &mu,
				.start = &start};
		if (pthread_create(&th[i], NULL, client_main, &c[i]) != 0)
			abort(); /* the barrier, counted for all of them, would never open */
	}
	pthread_barrier_wait(&start);
	double t0 = now_s();
	pthread_mutex_lock(&mu);
	until = t0 + secs;
	pthread_mutex_unlock(&mu);
	for (int i = 0; i < CLIENTS; i++) {
		pthread_join(th[i], NULL);
		grants[c[i].exclusive] += c[i].grants;
		wait[c[i].exclusive] += c[i].wait_s;
		if (c[i].failed && !failed++)
			fprintf(stderr, "bench: permits: %s: client %d: %s\n", p->name, i,
				c[i].why);
	}
	double wall = now_s() - t0;
	pthread_barrier_destroy(&start);
	for (int k = 0; k < 2; k++) {
		o->v[k ? F_XRATE : F_RATE] = (double)grants[k] / wall;
		o->v[k ? F_XWAIT : F_WAIT] = grants[k] ? wait[k] / (double)grants[k] * 1000 : 0;
	}
	*total = grants[0] + grants[1];
	return failed || grants[0] == 0 || (p->writers && grants[1] == 0) ? -1 : 0;
}

static int phase_run(const server *s, int ph, double secs, long max_pairs, phase_out *o)
{
	const struct phase_def *p = &phases[ph];
	snap a, b;
	long grants = 0;
	memset(o, 0, sizeof *o);
	if (resource_check(s->port, p, 1, 1) || snap_take(s, p->resource, &a) ||
	    contend(s, p, secs, max_pairs, o, &grants) || snap_take(s, p->resource, &b) ||
	    resource_check(s->port, p, 0, 1))
		return -1;
	costs(s, &a, &b, grants, o);
	printf("    %-20s %6.0f grants/s", p->name, o->v[F_RATE] + o->v[F_XRATE]);
	if (p->writers)
		printf(" (readers %.0f/s wait %.2f ms, writer %.1f/s wait %.2f ms)", o->v[F_RATE],
		       o->v[F_WAIT], o->v[F_XRATE], o->v[F_XWAIT]);
	else
		printf(" (wait %.2f ms)", o->v[F_WAIT]);
	char cost[400];
	cost_text(o, cost, sizeof cost);
	printf("%s\n", cost);
	return 0;
}

/* ---- rounds ---- */

typedef struct permits_run {
	int rounds;
	double floor_rate[MAX_ROUNDS];
	phase_out out[MAX_ROUNDS][PH_N];
} permits_run;

static int one_round(const server *s, const char *dir, int i, double secs, long max_pairs,
		     permits_run *R)
{
	floor_result f;
	if (floor_measure(dir, 1, opt.smoke ? 300 : 3000, opt.smoke ? 0.2 : 0.6, &f) != 0)
		return -1;
	R->floor_rate[i] = f.commits_per_s;
	printf("  round %d: floor %.0f commits/s\n", i + 1, f.commits_per_s);
	for (int k = 0; k < PH_N; k++) {
		int ph = (i + k) % PH_N;
		if (phase_run(s, ph, secs, max_pairs, &R->out[i][ph]) != 0)
			return -1;
	}
	R->rounds = i + 1;
	return 0;
}

static double grants_of(const phase_out *o)
{
	return o->v[F_RATE] + o->v[F_XRATE];
}

/* The median over the rounds of one figure of one phase. */
static double med(const permits_run *R, int ph, int f)
{
	double v[MAX_ROUNDS];
	for (int i = 0; i < R->rounds; i++)
		v[i] = R->out[i][ph].v[f];
	return median(v, (size_t)R->rounds);
}

/* The median over the rounds of each round's x / y. */
static double med_ratio(const double *x, const double *y, int n)
{
	double v[MAX_ROUNDS];
	for (int i = 0; i < n; i++)
		v[i] = y[i] > 0 ? x[i] / y[i] : 0;
	return median(v, (size_t)n);
}

/* Per round: the grants/s of a phase (both sides, or f's side alone). */
static void rates(const permits_run *R, int ph, int f, double *v)
{
	for (int i = 0; i < R->rounds; i++)
		v[i] = f < 0 ? grants_of(&R->out[i][ph]) : R->out[i][ph].v[f];
}

/* A phase's costs for its row: the medians of the rounds, with the busiest thread's name
 * of the round whose busiest thread gave the median. */
static void costs_text(const permits_run *R, int ph, char *buf, size_t len)
{
	phase_out m = R->out[R->rounds - 1][ph];
	for (int f = 0; f < F_N; f++)
		m.v[f] = med(R, ph, f);
	for (int i = 0; i < R->rounds; i++)
		if (R->out[i][ph].v[F_US_BUSIEST] == m.v[F_US_BUSIEST])
			memcpy(m.busiest, R->out[i][ph].busiest, sizeof m.busiest);
	cost_text(&m, buf, len);
}

/* The rounds' figures, side by side, as the rows need them. */
typedef struct sums {
	int n;
	double mutex[MAX_ROUNDS], perm[MAX_ROUNDS], readers[MAX_ROUNDS], rw[MAX_ROUNDS];
	double m, floor; /* medians: the mutex's grants/s, the floors' commits/s */
} sums;

static void sums_of(const permits_run *R, sums *S)
{
	double fl[MAX_ROUNDS];
	S->n = R->rounds;
	rates(R, PH_MUTEX, -1, S->mutex);
	rates(R, PH_PERMITS, -1, S->perm);
	rates(R, PH_RW, F_RATE, S->readers);
	rates(R, PH_RW, -1, S->rw);
	memcpy(fl, R->floor_rate, sizeof fl);
	S->floor = median(fl, (size_t)S->n);
	S->m = med(R, PH_MUTEX, F_RATE);
}

static void row_mutex(const permits_run *R, const sums *S, double secs)
{
	row r = {.verdict = V_INFO};
	char cost[400];
	costs_text(R, PH_MUTEX, cost, sizeof cost);
	snprintf(r.what, sizeof r.what, "mutex: %d contenders, limit 1", CLIENTS);
	snprintf(r.figure, sizeof r.figure, "%.0f grants/s", S->m);
	snprintf(r.floor, sizeof r.floor, "%.0f commits/s", S->floor);
	snprintf(r.ratio, sizeof r.ratio, "%.2fx", med_ratio(S->mutex, R->floor_rate, S->n));
	snprintf(r.target, sizeof r.target, "-");
	snprintf(r.note, sizeof r.note,
		 "acquire (waiting) + release at once, a connection each; medians of %d rounds"
		 " of %.1f s on one batond; mean wait %.2f ms%s",
		 S->n, secs, med(R, PH_MUTEX, F_WAIT), cost);
	table_add(&r);
}

static void row_permits(const permits_run *R, const sums *S)
{
	double ratio = med_ratio(S->perm, S->mutex, S->n);
	row r = {.verdict = ratio >= 3 ? V_PASS : V_MISS};
	char cost[400];
	costs_text(R, PH_PERMITS, cost, sizeof cost);
	snprintf(r.what, sizeof r.what, "%d permits: %d contenders", PERMITS, CLIENTS);
	snprintf(r.figure, sizeof r.figure, "%.0f grants/s", med(R, PH_PERMITS, F_RATE));
	snprintf(r.floor, sizeof r.floor, "mutex %.0f grants/s", S->m);
	snprintf(r.ratio, sizeof r.ratio, "%.2fx", ratio);
	snprintf(r.target, sizeof r.target, ">= 3x the mutex");
	snprintf(r.note, sizeof r.note,
		 "plain requests on a resource of limit %d, the mutex's loop; ratio: the median"
		 " of each round's permits/mutex; mean wait %.2f ms%s",
		 PERMITS, med(R, PH_PERMITS, F_WAIT), cost);
	table_add(&r);
}

static void row_readers(const permits_run *R, const sums *S)
{
	row r = {.verdict = V_INFO};
	char cost[400];
	costs_text(R, PH_RW, cost, sizeof cost);
	snprintf(r.what, sizeof r.what, "%d permits: %d readers, 1 writer", PERMITS, CLIENTS - 1);
	snprintf(r.figure, sizeof r.figure, "%.0f grants/s (readers)", med(R, PH_RW, F_RATE));
	snprintf(r.floor, sizeof r.floor, "mutex %.0f grants/s", S->m);
	snprintf(r.ratio, sizeof r.ratio, "%.2fx", med_ratio(S->readers, S->mutex, S->n));
	snprintf(r.target, sizeof r.target, "-");
	snprintf(r.note, sizeof r.note,
		 "%d plain readers and one client asking \"exclusive\": true, the mutex's loop;"
		 " readers' mean wait %.2f ms; all grants %.2fx the mutex's%s",
		 CLIENTS - 1, med(R, PH_RW, F_WAIT), med_ratio(S->rw, S->mutex, S->n), cost);
	table_add(&r);
}

static void row_writer(const permits_run *R, const sums *S)
{
	double xw[MAX_ROUNDS], w[MAX_ROUNDS], share[MAX_ROUNDS];
	for (int i = 0; i < S->n; i++) {
		xw[i] = R->out[i][PH_RW].v[F_XWAIT];
		w[i] = R->out[i][PH_RW].v[F_WAIT];
		share[i] = R->out[i][PH_RW].v[F_XRATE] / S->rw[i] * 100;
	}
	row r = {.verdict = V_INFO};
	snprintf(r.what, sizeof r.what, "%d permits: the writer (exclusive)", PERMITS);
	snprintf(r.figure, sizeof r.figure, "%.1f grants/s, mean wait %.2f ms",
		 med(R, PH_RW, F_XRATE), med(R, PH_RW, F_XWAIT));
	snprintf(r.floor, sizeof r.floor, "readers' wait %.2f ms", med(R, PH_RW, F_WAIT));
	snprintf(r.ratio, sizeof r.ratio, "%.2fx", med_ratio(xw, w, S->n));
	snprintf(r.target, sizeof r.target, "-");
	snprintf(r.note, sizeof r.note,
		 "wait: from its POST sent to its 201 read; ratio: its mean wait over the"
		 " readers'; its share of the grants %.1f%% (1 client of %d: %.1f%%)",
		 median(share, (size_t)S->n), CLIENTS, 100.0 / CLIENTS);
	table_add(&r);
}

int bench_permits(void)
{
	const char *what = "permits";
	static permits_run R; /* the rounds' figures: not on the stack */
	char dir[BENCH_PATH_MAX];
	server s;
	int rounds = opt.smoke ? 1 : 3, rc = 0;
	double secs = opt.smoke ? 0.4 : 3.0;
	long max_pairs = opt.smoke ? 2000 : 1000000;
	memset(&R, 0, sizeof R);
	printf("\n== %s (issue 28): %d contenders, acquire (waiting) + release; limit 1, limit %d,"
	       " limit %d with one exclusive writer; %d rounds of %.1f s on one batond\n",
	       what, CLIENTS, PERMITS, PERMITS, rounds, secs);
	if (server_setup(what, dir, sizeof dir, &s) != 0)
		return -1;
	for (int i = 0; i < rounds && rc == 0; i++)
		rc = one_round(&s, dir, i, secs, max_pairs, &R);
	server_stop(&s);
	tmpdir_remove(dir);
	if (rc) {
		table_fail(what, "a phase failed (see above)");
		return -1;
	}
	sums S;
	sums_of(&R, &S);
	row_mutex(&R, &S, secs);
	row_permits(&R, &S);
	row_readers(&R, &S);
	row_writer(&R, &S);
	return 0;
}
