/*
 * torture.c - the crash torture test of issue 6: many workflows over several resources
 * while batond is SIGKILLed and restarted at random moments; then an audit (audit.c) of
 * what survived, from the API, from the resources' own records and from the database.
 *
 * Design. One fragile resource (tests/harness/fragile.h) per baton resource: fragile
 * judges overlap over all its requests, so each instance must see one resource's calls.
 * A submitter thread POSTs workflows with ids of its own, keeping a bounded backlog:
 * HTTP-call workflows (3-6 steps, most of them calls to their resource's fragile
 * instance, whose script answers a share of 5xx, 429 with Retry-After and lost answers),
 * simulated workflows (work_ms, some fail_attempts), and a few that fail for good
 * (fail_attempts past max_attempts; on_failure "fail" or "continue"): every workflow has
 * one expected outcome. A POST answered 201 is acknowledged; one that got no answer
 * (batond was killed) is unknown and is POSTed again with the same id and body until
 * answered: it must then be 200 (it had been stored) or 201 (it had not).
 * The main thread is the killer: a random 50-800 ms after each restart, SIGKILL, then a
 * restart on the same database, N times. Before restarting it waits (bounded) until the
 * resources are done with every request the dead process had sent, including those the
 * kernel still holds: such a request can otherwise reach the resource after the new
 * process's retry (seen: 200 ms late). It is refused there by its older fencing token,
 * which is what tokens are for, but it is not the live batond's doing, and the checks
 * are about what the live batond does.
 * Afterwards every acknowledged workflow must finish, the checks run, each prints
 * pass/fail with its first violations, and the run closes with "N passed, N failed".
 *
 * On PostgreSQL the same workload then runs on a cluster of nodes on one database, whose
 * nodes are killed, paused and stopped at random moments (cluster.c); one closing line
 * counts the checks of both.
 *
 * Usage: torture [KILLS]   (or TORTURE_KILLS; default 20). TORTURE_ROUNDS: the cluster's
 * fault rounds (default 16; 0: no cluster); TORTURE_FAULTS: which faults it draws ("kill",
 * "stop", "term" or a list of them; default all). TORTURE_SEED=N repeats the workload, the
 * scripts, the kill delays and the cluster's choice of faults (the interleaving still
 * varies).
 * TORTURE_TIMEOUTS=1 adds answers slower than the calls' timeout (see the note at
 * script_resource). BATOND is the server (default ./server/batond); BATON_TEST_KEEP
 * keeps the temporary directory, as it is kept anyway when a check fails.
 */
#include "../../common/curl_req.h"
#include "torture.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BACKLOG		 24	/* unfinished workflows the submitter allows */
#define SCRIPT_LEN	 40000	/* scripted answers per fragile instance */
#define CALL_TIMEOUT_MS	 400	/* the calls' timeout_ms */
#define SETTLE_MS	 3000	/* for the resources to finish with a killed batond */
#define POST_DEADLINE_MS 60000	/* to get an answer to one POST, restarts included */
#define DRAIN_MS	 180000 /* for every acknowledged workflow to finish */

/* ---- small utilities ------------------------------------------------------------- */

uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

int rnd(uint64_t *s, int lo, int hi)
{
	return lo + (int)(splitmix(s) % (uint64_t)(hi - lo + 1));
}

int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/* ---- a small HTTP client (its own, so that the port can change under it) ----- */

/* The port of batond, or in the cluster of the next live node after the last one asked;
 * 0 when none is up. */
static int pick_port(run *r, client *cl)
{
	if (!r->nodes)
		return atomic_load(&r->port);
	for (int i = 0; i < r->nodes; i++) {
		int k = (cl->next + i) % r->nodes, port = atomic_load(&r->node_port[k]);
		if (port) {
			cl->next = (k + 1) % r->nodes;
			return port;
		}
	}
	return 0;
}

void client_fini(client *cl)
{
	if (cl->c)
		curl_easy_cleanup(cl->c);
	cl->c = NULL;
}

/* 0 when an answer arrived, -1 when none did (batond down, killed meanwhile, or too
 * slow). */
int api(run *r, client *cl, const char *method, const char *path, const char *body, long *status,
	json_t **json)
{
	int port = pick_port(r, cl);
	if (json)
		*json = NULL;
	if (!port)
		return -1;
	if (!cl->c && !(cl->c = curl_easy_init()))
		return -1;
	CURL *c = cl->c;
	char url[512];
	snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
	struct curl_slist *h = curl_slist_append(NULL, "Expect:");
	h = curl_slist_append(h, "Content-Type: application/json");
	curl_body b = {0};
	curl_req req = {.method = method,
			.url = url,
			.body = body,
			.body_len = body ? strlen(body) : 0,
			.headers = h,
			.connect_timeout_ms = 2000,
			.timeout_ms = 15000};
	curl_easy_reset(c);
	curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
	CURLcode rc;
	long answered = curl_req_perform(c, &req, &b, &rc);
	curl_slist_free_all(h);
	if (rc != CURLE_OK) {
		curl_body_fini(&b);
		return -1;
	}
	*status = answered;
	if (json && b.data)
		*json = json_loadb(b.data, b.len, 0, NULL);
	curl_body_fini(&b);
	return 0;
}

/* GET that insists (batond is up after the last restart); NULL after `tries`. */
static json_t *get_json(run *r, client *cl, const char *path, int tries)
{
	for (int i = 0; i < tries; i++) {
		long st = 0;
		json_t *j = NULL;
		if (api(r, cl, "GET", path, NULL, &st, &j) == 0 && st == 200 && j)
			return j;
		json_decref(j);
		sleep_ms(50);
	}
	return NULL;
}

/* Unfinished workflows (pending + running, retrying ones included); -1 when unknown. */
static int unfinished(run *r, client *cl)
{
	static const char *const paths[] = {"/workflows?status=pending&limit=1000",
					    "/workflows?status=running&limit=1000"};
	int n = 0;
	for (int i = 0; i < 2; i++) {
		long st = 0;
		json_t *j = NULL;
		if (api(r, cl, "GET", paths[i], NULL, &st, &j) != 0 || st != 200 || !j) {
			json_decref(j);
			return -1;
		}
		n += (int)json_array_size(json_object_get(j, "workflows"));
		json_decref(j);
	}
	return n;
}

/* ---- the workload ------------------------------------------------------------- */

static json_t *call_worker(run *r, const wf *w, int i)
{
	char name[16];
	snprintf(name, sizeof name, "w%d", i);
	return json_pack("{s:s, s:{s:s, s:s, s:i, s:{s:s, s:i}}}", "name", name, "call", "url",
			 r->op_url[w->res], "method", "POST", "timeout_ms", CALL_TIMEOUT_MS, "body",
			 "workflow", w->id, "step", i);
}

static json_t *sim_worker(int i, int work_ms, int fail_attempts)
{
	char name[16];
	snprintf(name, sizeof name, "w%d", i);
	return json_pack("{s:s, s:i, s:i}", "name", name, "work_ms", work_ms, "fail_attempts",
			 fail_attempts);
}

/* The n-th workflow of the run, drawn from the submitter's stream. */
static wf *make_workflow(run *r, uint64_t *rng, size_t n)
{
	wf *w = calloc(1, sizeof *w);
	snprintf(w->id, sizeof w->id, "%s%llu-%zu", r->nodes ? "c" : "t",
		 (unsigned long long)(r->seed % 1000000), n);
	w->res = rnd(rng, 0, r->nres - 1);
	int k = rnd(rng, 0, 99);
	w->kind = k < 60 ? K_CALL : k < 92 ? K_SIM : K_FAIL;
	w->n = rnd(rng, 3, MAX_STEPS);
	w->backoff = 1.5;
	w->first_retry = (int)(rnd(rng, 50, 200) * w->backoff);
	w->max_delay = 800;
	w->max_attempts = w->kind == K_FAIL ? rnd(rng, 2, 3) : 30;
	w->fail_step = w->kind == K_FAIL ? rnd(rng, 0, w->n - 1) : -1;
	w->cont = w->kind == K_FAIL && rnd(rng, 0, 1);
	json_t *workers = json_array();
	for (int i = 0; i < w->n; i++) {
		if (w->kind == K_CALL && rnd(rng, 0, 4) != 0) {
			w->is_call[i] = 1;
			json_array_append_new(workers, call_worker(r, w, i));
		} else {
			int fails = 0;
			if (w->kind == K_FAIL)
				fails = i == w->fail_step ? 1000 : 0; /* one outcome only */
			else if (rnd(rng, 0, 9) < 3)
				fails = rnd(rng, 1, 2);
			json_array_append_new(workers, sim_worker(i, rnd(rng, 2, 30), fails));
		}
	}
	json_t *body =
	    json_pack("{s:s, s:s, s:o, s:{s:i, s:i, s:f, s:i}, s:s}", "id", w->id, "resource",
		      res_name(w->res), "workers", workers, "retry", "max_attempts",
		      w->max_attempts, "first_retry_ms", w->first_retry, "backoff", w->backoff,
		      "max_delay_ms", w->max_delay, "on_failure", w->cont ? "continue" : "fail");
	w->body = json_dumps(body, JSON_COMPACT);
	json_decref(body);
	return w;
}

/* POSTs until answered: batond may be killed in the middle, or be down for a while. */
static void submit(run *r, client *cl, wf *w)
{
	int64_t deadline = mono_ms() + POST_DEADLINE_MS;
	while (mono_ms() < deadline) {
		long st = 0;
		w->posts++;
		r->posts++;
		if (api(r, cl, "POST", "/workflows", w->body, &st, NULL) != 0) {
			w->unknown = 1;
			r->no_answer++;
			sleep_ms(10);
			continue;
		}
		if (st == 503) { /* not taken: try again */
			r->busy++;
			sleep_ms(20);
			continue;
		}
		w->status = st;
		if (st == 201 || (st == 200 && w->unknown)) {
			w->acked = 1;
			if (w->unknown)
				(*(st == 200 ? &r->reposted_200 : &r->reposted_201))++;
		} else {
			violation(&r->submit, "%s: POST answered %ld%s", w->id, st,
				  w->unknown ? " after a POST without answer" : "");
		}
		return;
	}
	violation(&r->submit, "%s: no answer to POST within %d ms", w->id, POST_DEADLINE_MS);
}

void *submitter(void *arg)
{
	run *r = arg;
	client cl = {0};
	uint64_t rng = r->seed ^ 0x5eedULL;
	for (size_t i = 0; !atomic_load(&r->stop); i++) {
		int backlog;
		while (!atomic_load(&r->stop) &&
		       ((backlog = unfinished(r, &cl)) < 0 || backlog >= BACKLOG))
			sleep_ms(20);
		if (atomic_load(&r->stop))
			break;
		wf *w = make_workflow(r, &rng, i);
		submit(r, &cl, w);
		pthread_mutex_lock(&r->mu);
		if (r->n == r->cap) {
			r->cap = r->cap ? r->cap * 2 : 256;
			r->wfs = realloc(r->wfs, r->cap * sizeof *r->wfs);
		}
		r->wfs[r->n++] = w;
		pthread_mutex_unlock(&r->mu);
	}
	client_fini(&cl);
	return NULL;
}

/*
 * The resource's answers: mostly 200 (after 0-10 ms), 503, 500, 429 with Retry-After: 1,
 * and lost answers (applied, then the connection closed), so that retries happen, also
 * across kills. With `timeouts`, 2% of the answers also come after the call's timeout.
 * Those are off by default because of a false positive of fragile: batond hangs up at
 * the timeout, records the failure and grants the resource to the next step, whose call
 * can arrive before fragile's 5 ms poll has noticed the hang-up; fragile then counts an
 * overlap (seen with seeds 547858870 and 525836085: the next request arrives in the very
 * millisecond the timed-out one is marked "client gone").
 */
void script_resource(fragile *f, uint64_t *rng, int timeouts)
{
	for (int i = 0; i < SCRIPT_LEN; i++) {
		int k = rnd(rng, 0, 99);
		fragile_action a = {.status = 200, .delay_ms = rnd(rng, 0, 10)};
		if (k < 18)
			a = (fragile_action){.status = 503, .delay_ms = rnd(rng, 0, 5)};
		else if (k < 22)
			a = (fragile_action){.status = 500};
		else if (k < 25)
			a = (fragile_action){.status = 429, .retry_after = "1"};
		else if (k < 30)
			a = (fragile_action){.drop = true, .delay_ms = rnd(rng, 0, 20)};
		else if (k < 32 && timeouts)
			a = (fragile_action){.status = 200, .delay_ms = CALL_TIMEOUT_MS + 200};
		fragile_push(f, a);
	}
}

/* ---- the killer ------------------------------------------------------------- */

/*
 * Connections to the resources that the kernel still carries for the killed batond:
 * client side (remote port a fragile port) still sending: established, SYN sent, or
 * closed with data not yet acknowledged (states 01, 02, 04); server side (local port a
 * fragile port) that fragile has not finished with: established, half-open, closed by
 * the peer only (01, 03, 08). A request written just before the SIGKILL can wait there,
 * unseen by fragile, and arrive after the restarted batond's retry (seen in practice:
 * 200 ms late, a TCP retransmission of the dead process's orphaned socket).
 */
static int pending_connections(const run *r)
{
	static const unsigned client_states[] = {0x01, 0x02, 0x04},
			      server_states[] = {0x01, 0x03, 0x08};
	FILE *f = fopen("/proc/net/tcp", "r");
	if (!f)
		return 0;
	char line[512];
	int n = 0;
	while (fgets(line, sizeof line, f)) {
		unsigned local, remote, state;
		if (sscanf(line, " %*d: %*8x:%x %*8x:%x %x", &local, &remote, &state) != 3)
			continue;
		for (int i = 0; i < r->nres; i++) {
			unsigned port = (unsigned)fragile_port(r->res[i]);
			for (int k = 0; k < 3; k++)
				n += (remote == port && state == client_states[k]) ||
				     (local == port && state == server_states[k]);
		}
	}
	fclose(f);
	return n;
}

/* Waits (bounded) until the resources are done with every request of the dead batond:
 * none in flight in fragile, none still on its way in the kernel. */
static void settle(run *r)
{
	int64_t t0 = mono_ms();
	int waited = 0;
	for (;;) {
		size_t busy = 0;
		for (int i = 0; i < r->nres; i++) {
			fragile_stats st;
			fragile_get_stats(r->res[i], &st);
			busy += st.in_flight;
		}
		if (!busy)
			busy = (size_t)pending_connections(r);
		if (!busy)
			break;
		if (!waited++)
			r->settle_waits++;
		if (mono_ms() - t0 >= SETTLE_MS) {
			r->settle_timeouts++;
			break;
		}
		sleep_ms(2);
	}
	if (waited && mono_ms() - t0 > r->settle_max_ms)
		r->settle_max_ms = mono_ms() - t0;
}

/* 0, or -1 when batond could not be started again. */
static int kill_loop(run *r)
{
	uint64_t rng = r->seed ^ 0xdeadULL;
	int64_t t0 = mono_ms();
	for (int k = 1; k <= r->kills; k++) {
		sleep_ms(rnd(&rng, 50, 800));
		atomic_store(&r->port, 0);
		r->killed_at[k - 1] = mono_ms() - r->t0;
		hs_kill(r->srv);
		r->kills_done++;
		settle(r);
		if (hs_start(r->srv) != 0) {
			r->restarts_failed++;
			fprintf(stderr, "torture: batond did not start again after kill %d\n", k);
			return -1;
		}
		atomic_store(&r->port, hs_port(r->srv));
		r->up_at[k - 1] = mono_ms() - r->t0;
		/* On PostgreSQL, every fourth round also restarts the database under the running
		 * batond, which must reconnect and go on without losing or repeating work. */
		if (hs_store_is_pg() && k % 4 == 0) {
			sleep_ms(rnd(&rng, 50, 400));
			if (hs_pg_restart() != 0) {
				fprintf(stderr,
					"torture: PostgreSQL did not restart after kill %d\n", k);
				return -1;
			}
			r->db_restarts++;
		}
		if (k % 10 == 0 || k == r->kills) {
			pthread_mutex_lock(&r->mu);
			size_t n = r->n;
			pthread_mutex_unlock(&r->mu);
			printf("torture: %d/%d kills, %d database restarts, %.1f s, %zu workflows"
			       " submitted\n",
			       k, r->kills, r->db_restarts, (double)(mono_ms() - t0) / 1000.0, n);
			fflush(stdout);
		}
	}
	return 0;
}

/* ---- collecting the outcome ---------------------------------------------------- */

static int64_t time_of(const json_t *v)
{
	int64_t ms = -1;
	if (json_is_string(v) && rfc3339_parse_ms(json_string_value(v), &ms) != 0)
		ms = -1;
	return ms;
}

static int ev_type(const char *t)
{
	if (!t)
		return E_OTHER;
	static const char *const names[] = {"lock_acquired", "lock_released", "step_completed",
					    "step_failed", "step_interrupted"};
	for (int i = 0; i < E_OTHER; i++)
		if (strcmp(t, names[i]) == 0)
			return i;
	return E_OTHER;
}

/* Reads the workflow and its whole history. 0, or -1 when batond did not answer. */
int collect(run *r, client *cl, wf *w)
{
	char path[256];
	snprintf(path, sizeof path, "/workflows/%s", w->id);
	json_t *j = get_json(r, cl, path, 40);
	if (!j)
		return -1;
	const char *status = json_string_value(json_object_get(j, "status"));
	snprintf(w->final, sizeof w->final, "%s", status ? status : "?");
	json_t *steps = json_object_get(j, "steps");
	for (int i = 0; i < w->n && i < (int)json_array_size(steps); i++) {
		json_t *s = json_array_get(steps, (size_t)i);
		const char *st = json_string_value(json_object_get(s, "status"));
		snprintf(w->step_status[i], sizeof w->step_status[i], "%s", st ? st : "?");
		w->attempts[i] = (int)json_integer_value(json_object_get(s, "attempts"));
		const char *node = json_string_value(json_object_get(s, "node"));
		snprintf(w->node[i], sizeof w->node[i], "%s", node ? node : "");
	}
	json_decref(j);
	int64_t after = 0;
	size_t cap = 0;
	for (;;) {
		snprintf(path, sizeof path, "/workflows/%s/events?after=%lld", w->id,
			 (long long)after);
		if (!(j = get_json(r, cl, path, 40)))
			return -1;
		json_t *list = json_object_get(j, "events"), *e;
		size_t i;
		json_array_foreach(list, i, e)
		{
			if (w->nev == cap) {
				cap = cap ? cap * 2 : 64;
				w->ev = realloc(w->ev, cap * sizeof *w->ev);
			}
			json_t *retry = json_object_get(e, "retry_in_ms");
			w->ev[w->nev++] = (evt){
			    .seq = json_integer_value(json_object_get(e, "seq")),
			    .ts = time_of(json_object_get(e, "ts")),
			    .type = ev_type(json_string_value(json_object_get(e, "type"))),
			    .step = (int)json_integer_value(json_object_get(e, "step")),
			    .attempt = (int)json_integer_value(json_object_get(e, "attempt")),
			    .token = json_integer_value(json_object_get(e, "fencing_token")),
			    .retry_in = json_is_integer(retry) ? json_integer_value(retry) : -1,
			    .next_at = time_of(json_object_get(e, "next_attempt_at")),
			};
			after = w->ev[w->nev - 1].seq;
		}
		size_t got = json_array_size(list);
		json_decref(j);
		if (got < 10000)
			return 0;
	}
}

/* ---- main ------------------------------------------------------------------------ */

static int parse_kills(int argc, char **argv)
{
	const char *v = argc > 1 ? argv[1] : getenv("TORTURE_KILLS");
	if (!v || !*v)
		return 20;
	char *end;
	long k = strtol(v, &end, 10);
	if (*end || k < 1 || k > 100000) {
		fprintf(stderr, "usage: torture [KILLS]   (KILLS or TORTURE_KILLS: 1..100000)\n");
		exit(2);
	}
	return (int)k;
}

static uint64_t parse_seed(void)
{
	const char *v = getenv("TORTURE_SEED");
	if (v && *v)
		return strtoull(v, NULL, 10);
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t s = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid();
	return splitmix(&s) % 1000000000ULL;
}

/* BATOND defaults to ./server/batond, made absolute. */
static int find_batond(void)
{
	const char *b = getenv("BATOND");
	char path[PATH_MAX];
	if (!b || !*b) {
		if (!realpath("server/batond", path)) {
			fprintf(stderr, "torture: set BATOND to the batond binary\n");
			return -1;
		}
		setenv("BATOND", path, 1);
	}
	return 0;
}

/* The harness's temporary directories go under one of our own, out of the way of
 * whatever else cleans /tmp/baton-http-* on a shared machine. */
static int private_tmpdir(char dir[PATH_MAX])
{
	const char *tmp = getenv("TMPDIR");
	snprintf(dir, PATH_MAX, "%s/baton-torture-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dir)) {
		fprintf(stderr, "torture: mkdtemp %s: %s\n", dir, strerror(errno));
		return -1;
	}
	setenv("TMPDIR", dir, 1);
	return 0;
}

hs_server *open_batond(run *r, const hs_server *first, const char *const *more)
{
	const char *args[2 * NRES + 16] = {0};
	char *prefixes[NRES];
	int n = 0;
	for (int i = 0; i < r->nres; i++) {
		prefixes[i] = fragile_url(r->res[i], "/");
		args[n++] = "--allow-call";
		args[n++] = prefixes[i];
	}
	for (int i = 0; more && more[i] && n < (int)(sizeof args / sizeof *args) - 1; i++)
		args[n++] = more[i];
	hs_server *s = first ? hs_open_node(first, args) : hs_open(args);
	for (int i = 0; i < r->nres; i++)
		free(prefixes[i]);
	return s;
}

/* Waits until no acknowledged workflow is unfinished; the time it took, -1 on timeout. */
int64_t drain(run *r, client *cl)
{
	int64_t t0 = mono_ms();
	while (mono_ms() - t0 < DRAIN_MS) {
		if (unfinished(r, cl) == 0)
			return mono_ms() - t0;
		for (int i = 0; i < (r->nodes ? r->nodes : 1); i++)
			if (!hs_alive(r->nodes ? r->node[i] : r->srv))
				return -1;
		sleep_ms(100);
	}
	return -1;
}

/* Opens the resources and batond; 0, or -1 after printing why. */
int setup(run *r, int timeouts)
{
	uint64_t rng = r->seed ^ 0xf4a61eULL;
	for (int i = 0; i < r->nres; i++) {
		if (!(r->res[i] = fragile_open()))
			return -1;
		r->op_url[i] = fragile_url(r->res[i], "/op");
		script_resource(r->res[i], &rng, timeouts);
	}
	if (r->nodes) /* the cluster opens its nodes itself */
		return 0;
	if (!(r->srv = open_batond(r, NULL, NULL)))
		return -1;
	atomic_store(&r->port, hs_port(r->srv));
	return 0;
}

/* The submitter against the killer; then the wait for every acknowledged workflow to
 * finish, and the read-back of each. */
static void chaos(run *r, check *restarts)
{
	pthread_t sub;
	pthread_create(&sub, NULL, submitter, r);
	if (kill_loop(r) != 0)
		violation(restarts, "batond did not start again after kill %d", r->kills_done);
	atomic_store(&r->stop, true);
	pthread_join(sub, NULL);
	int64_t t_chaos = mono_ms() - r->t0;
	client cl = {0};
	int64_t drained = r->restarts_failed ? -1 : drain(r, &cl);
	if (r->srv && !r->restarts_failed && !hs_alive(r->srv))
		violation(restarts, "batond died after the last restart");
	size_t acked = 0;
	int reachable = !r->restarts_failed; /* once batond stops answering, ask no more */
	for (size_t i = 0; i < r->n; i++) {
		wf *w = r->wfs[i];
		acked += w->acked;
		if (w->acked && !(reachable && (reachable = collect(r, &cl, w) == 0)))
			snprintf(w->final, sizeof w->final, "(no answer)");
	}
	client_fini(&cl);
	printf("torture: %zu workflows acknowledged (%zu POSTs, %zu without answer, %zu busy;"
	       " re-POSTed after a lost answer: %zu had been stored (200), %zu not (201))\n",
	       acked, r->posts, r->no_answer, r->busy, r->reposted_200, r->reposted_201);
	printf("torture: chaos %.1f s, drained in %.1f s%s; %d restarts waited for the resources"
	       " to finish with the killed batond's requests (longest %lld ms, %d gave up)\n",
	       (double)t_chaos / 1000.0, (double)drained / 1000.0,
	       drained < 0 ? " (timed out)" : "", r->settle_waits, (long long)r->settle_max_ms,
	       r->settle_timeouts);
	snprintf(r->submit.note, sizeof r->submit.note, "%zu POSTs, %zu without answer, %zu busy",
		 r->posts, r->no_answer, r->busy);
}

/* The checks; batond is stopped (SIGTERM, exit 0 expected) before the database's. */
static void audit(run *r, check *checks)
{
	check *restarts = &checks[6];
	int64_t last_token[NRES] = {0}, grants[NRES] = {0};
	check_final(r, &checks[0]);
	check_no_rerun(r, &checks[1], &checks[2]);
	check_holds(r, &checks[2], last_token, grants);
	check_retry_waits(r, &checks[3]);
	check_resources(r, &checks[5]);
	int st = hs_stop(r->srv);
	if (st != 0)
		violation(restarts, "batond exited with %d after SIGTERM, expected 0", st);
	check_database(r, &checks[4], last_token, grants);
	snprintf(restarts->note, sizeof restarts->note,
		 "%d kills, %d database restarts, %d restarts failed", r->kills_done,
		 r->db_restarts, r->restarts_failed);
}

static void teardown(run *r, check *restarts, int failing)
{
	if (failing)
		setenv("BATON_TEST_KEEP", "1", 0); /* hs_close says where */
	if (hs_close(r->srv) != 0)
		violation(restarts, "batond's logs hold a sanitizer report or a bad start");
	run_free(r);
}

void run_free(run *r)
{
	for (int i = 0; i < r->nres; i++) {
		fragile_close(r->res[i]);
		free(r->op_url[i]);
	}
	for (size_t i = 0; i < r->n; i++) {
		free(r->wfs[i]->body);
		free(r->wfs[i]->ev);
		free(r->wfs[i]);
	}
	free(r->wfs);
	free(r->killed_at);
	free(r->up_at);
	pthread_mutex_destroy(&r->mu);
}

/* TORTURE_ROUNDS: the cluster torture's fault rounds (0: none; default 16). */
static int parse_rounds(void)
{
	const char *v = getenv("TORTURE_ROUNDS");
	if (!v || !*v)
		return 16;
	char *end;
	long k = strtol(v, &end, 10);
	if (*end || k < 0 || k > 100000) {
		fprintf(stderr, "torture: TORTURE_ROUNDS is 0..100000\n");
		exit(2);
	}
	return (int)k;
}

/* The single-node torture: adds its checks' counts to *passed and *failed. */
static void single_torture(uint64_t seed, int kills, int *passed, int *failed)
{
	run r = {.kills = kills, .seed = seed, .nres = 3, .t0 = mono_ms()};
	r.submit.name = "8. every POST answered 201, or 200/201 when re-POSTed after a lost answer";
	check checks[] = {
	    {.name = "1. every acknowledged workflow finished as expected"},
	    {.name = "2. no completed step ran again"},
	    {.name = "3. per resource, holds never overlap and fencing tokens only grow"},
	    {.name = "4. retry waits were respected"},
	    {.name = "5. database: integrity_check ok (SQLite), matches what was acknowledged"},
	    {.name = "6. resources: no stale token, no overlap, no bad call"},
	    {.name = "7. batond restarted after every kill, stopped cleanly, clean logs"},
	};
	const char *t = getenv("TORTURE_TIMEOUTS");
	int timeouts = t && *t && strcmp(t, "0") != 0;
	r.killed_at = calloc((size_t)r.kills, sizeof *r.killed_at);
	r.up_at = calloc((size_t)r.kills, sizeof *r.up_at);
	pthread_mutex_init(&r.mu, NULL);
	printf("torture: seed %llu (TORTURE_SEED=%llu repeats it), %d kills, %d resources%s\n",
	       (unsigned long long)r.seed, (unsigned long long)r.seed, r.kills, r.nres,
	       timeouts ? ", 2% of the answers after the call's timeout" : "");
	if (setup(&r, timeouts) != 0) {
		teardown(&r, &checks[6], 0);
		(*failed)++;
		return;
	}
	chaos(&r, &checks[6]);
	audit(&r, checks);
	int failing = r.submit.violations > 0;
	for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++)
		failing |= checks[i].violations > 0;
	teardown(&r, &checks[6], failing);

	int p = 0, f = 0;
	for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++)
		report(&checks[i]) ? p++ : f++;
	report(&r.submit) ? p++ : f++;
	if (f)
		printf("torture: repeat with TORTURE_SEED=%llu TORTURE_KILLS=%d (the interleaving"
		       " varies)\n",
		       (unsigned long long)r.seed, r.kills);
	printf("torture: single node, %.1f s\n", (double)(mono_ms() - r.t0) / 1000.0);
	*passed += p;
	*failed += f;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	int64_t t0 = mono_ms();
	int kills = parse_kills(argc, argv), rounds = parse_rounds();
	uint64_t seed = parse_seed();
	char tmpdir[PATH_MAX];
	curl_global_init(CURL_GLOBAL_DEFAULT);
	if (find_batond() != 0 || private_tmpdir(tmpdir) != 0)
		return 2;
	int passed = 0, failed = 0;
	single_torture(seed, kills, &passed, &failed);
	/* On PostgreSQL, then the same workload on a cluster of nodes (cluster.c). */
	if (hs_store_is_pg() && rounds > 0)
		cluster_torture(seed, rounds, &passed, &failed);
	if (!getenv("BATON_TEST_KEEP") && !failed)
		rmdir(tmpdir);
	printf("torture: %.1f s in all\n", (double)(mono_ms() - t0) / 1000.0);
	printf("%d passed, %d failed\n", passed, failed);
	curl_global_cleanup();
	return failed ? 1 : 0;
}
