/*
 * test_cluster.c - several batond nodes on one PostgreSQL database (issue 14), over HTTP
 * against the real processes: three nodes (tests/harness/cluster.h) with short leases
 * share the work of four resources, each resource's steps calling a fragile server of its
 * own (tests/harness/fragile.h, the oracle: it answers 500 to an overlap and 409 to a
 * stale fencing token, and applies each Idempotency-Key once).
 *
 * What a user of a cluster relies on, whichever node they talk to and whatever happens
 * to one node: every workflow completes; a resource never sees two requests at once nor
 * a stale token; fencing tokens only grow; a finished step never runs again; reads on
 * any node see what another node acknowledged; a kill -9, a pause past the lease, a
 * SIGTERM or a PostgreSQL restart moves the work to the nodes that are left, within a
 * time derived from the lease; event cursors never skip an event.
 *
 * A cluster needs PostgreSQL: on SQLite every test skips. Each test starts its nodes in
 * its body (after the skip) and the teardown stops exactly those processes, by pid, also
 * when the test failed, nodes before the first one (whose database it is).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../harness/calls.h"
#include "../harness/cluster.h"
#include "../harness/prom.h"
#include "../harness/sse.h"

#define NODES	       3
#define ALL_NODES      7u /* bits of node0..node2 */
#define NRES	       4
#define SHORT_LEASE_MS 1500
#define LONG_LEASE_MS  60000
#define WAIT_MS	       30000
#define MAX_WF	       64

typedef struct ctx {
	cluster cl;
	fragile *res[NRES];
	char *url[NRES];     /* the operation each step calls: http://127.0.0.1:PORT/op */
	char *allow[NRES];   /* its --allow-call prefix */
	char name[NRES][48]; /* the baton resource whose steps call res[i] */
	int owner[NRES];     /* the node that drives name[i] when the cluster is balanced */
	char ids[MAX_WF][48];
	int res_of[MAX_WF];
	int steps_of[MAX_WF];
	int nwf;
} ctx;

#define SKIP_UNLESS_PG()                                                                           \
	do {                                                                                       \
		if (!hs_store_is_pg())                                                             \
			skip(); /* a cluster shares one PostgreSQL database */                     \
	} while (0)

static int setup(void **state)
{
	*state = calloc(1, sizeof(ctx));
	return *state ? 0 : -1;
}

/* The nodes first (no call in flight when the resources go away), by pid. */
static int teardown(void **state)
{
	ctx *c = *state;
	int rc = cl_close(&c->cl);
	for (int r = 0; r < NRES; r++) {
		fragile_close(c->res[r]);
		free(c->url[r]);
		free(c->allow[r]);
	}
	free(c);
	return rc;
}

static void dump_nodes(const ctx *c, int via)
{
	hs_response r;
	hs_get(c->cl.node[via], "/nodes", &r);
	fprintf(stderr, "GET /nodes on %s: %ld %s\n", c->cl.id[via], r.status,
		r.body ? r.body : r.error);
	hs_response_fini(&r);
}

/*
 * Starts the resources and three nodes allowed to call them (with `extra` arguments,
 * NULL-terminated, at most 4), waits until the nodes share the 64 partitions fairly, and
 * names the resources so that resource r is driven by node (r + 1) % 3: node1 drives
 * resources 0 and 3, node2 resource 1, node0 resource 2.
 */
static void cluster_up(ctx *c, int lease_ms, const char *const *extra)
{
	const char *args[2 * NRES + 5];
	int k = 0;
	for (int r = 0; r < NRES; r++) {
		c->res[r] = fragile_open();
		assert_non_null(c->res[r]);
		/* A little work per request widens the window in which an overlap would show. */
		fragile_set_default(c->res[r], (fragile_action){.status = 200, .delay_ms = 20});
		c->url[r] = fragile_url(c->res[r], "/op");
		c->allow[r] = fragile_url(c->res[r], "/");
		args[k++] = "--allow-call";
		args[k++] = c->allow[r];
	}
	for (int i = 0; extra && extra[i] && i < 4; i++)
		args[k++] = extra[i];
	args[k] = NULL;
	assert_int_equal(cl_open(&c->cl, NODES, lease_ms, args), 0);
	/* A node learns of a join at its next renewal (every third of the lease), and a
	 * partition handed back whose hint was missed waits for the next one: so the bound
	 * grows with the lease (about 20 s of waiting with a 60 s lease). */
	int balance_ms = WAIT_MS + lease_ms;
	if (!cl_wait_balanced(&c->cl, 0, ALL_NODES, balance_ms)) {
		dump_nodes(c, 0);
		fail_msg("the three nodes did not share the partitions within %d ms", balance_ms);
	}
	unsigned long long used = 0;
	for (int r = 0; r < NRES; r++) {
		c->owner[r] = (r + 1) % NODES;
		cl_pick_resource(&c->cl, c->owner[r], "res", &used, c->name[r], sizeof c->name[r]);
	}
}

/* A workflow of `steps` call steps on resource r: worker wI calls res[r] with {"n": I}. */
static json_t *call_workflow(const ctx *c, const char *id, int r, int steps)
{
	json_t *body = calls_workflow(id, c->url[r], steps, calls_quick_retry(100));
	json_object_set_new(body, "resource", json_string(c->name[r]));
	return body;
}

/*
 * POSTs workflow `id` to node `via`, asserting 201, and reads it back at once from every
 * other running node: 200 (read-your-writes across nodes).
 */
static void submit(ctx *c, int via, const char *id, int r, int steps)
{
	assert_true(c->nwf < MAX_WF);
	json_decref(hs_create_workflow(c->cl.node[via], call_workflow(c, id, r, steps)));
	snprintf(c->ids[c->nwf], sizeof c->ids[0], "%s", id);
	c->res_of[c->nwf] = r;
	c->steps_of[c->nwf] = steps;
	c->nwf++;
	char path[128];
	snprintf(path, sizeof path, "/workflows/%s", id);
	for (int i = 0; i < NODES; i++) {
		if (i == via || !hs_running(c->cl.node[i]))
			continue;
		hs_response resp;
		hs_get(c->cl.node[i], path, &resp);
		if (resp.status != 200)
			fail_msg("right after %s answered 201 for %s, %s answered %ld: %s",
				 c->cl.id[via], id, c->cl.id[i], resp.status,
				 resp.body ? resp.body : resp.error);
		hs_response_fini(&resp);
	}
}

/* Submits `per` workflows of `steps` steps on every resource, to the nodes in turn. */
static void submit_round_robin(ctx *c, const char *prefix, int per, int steps)
{
	int k = 0;
	for (int i = 0; i < per; i++)
		for (int r = 0; r < NRES; r++, k++) {
			char id[48];
			snprintf(id, sizeof id, "%s-r%d-%d", prefix, r, i);
			submit(c, k % NODES, id, r, steps);
		}
}

/* Waits until every submitted workflow completed, as node `via` reads it, before the
 * monotonic time `deadline`; fails naming the first one that did not. */
static void wait_all_completed(const ctx *c, int via, int64_t deadline, const char *why)
{
	for (int w = 0; w < c->nwf; w++) {
		int64_t left = deadline - hs_mono_ms();
		char path[128];
		snprintf(path, sizeof path, "/workflows/%s", c->ids[w]);
		for (;;) {
			json_t *wf = hs_get_json(c->cl.node[via], path, 200);
			const char *status = hs_str(wf, "status");
			bool done = strcmp(status, "completed") == 0;
			if (!done &&
			    (strcmp(status, "failed") == 0 || strcmp(status, "cancelled") == 0))
				fail_msg("%s ended %s: %s", c->ids[w], status,
					 json_dumps(wf, JSON_COMPACT));
			if (!done && left <= 0) {
				for (int i = 0; i < NODES; i++)
					if (hs_running(c->cl.node[i]))
						hs_dump_log(c->cl.node[i], 3000);
				fail_msg("%s was %s, not completed, %s (%d workflows)", c->ids[w],
					 status, why, c->nwf);
			}
			json_decref(wf);
			if (done)
				break;
			hs_pause_ms(50);
			left = deadline - hs_mono_ms();
		}
	}
}

static int attempt_of(const fragile_record *rec)
{
	return rec->attempt ? atoi(rec->attempt) : -1;
}

/*
 * What resource r's server saw, against baton's history as node `via` serves it: no
 * overlap, no stale or bad request, fencing tokens strictly increasing in arrival order;
 * every request is an attempt that baton granted (a lock_acquired event of that step and
 * attempt with that token); every step of every workflow on r completed, its
 * Idempotency-Key applied exactly once, with the token of its last request and as many
 * attempts as grants. With `once`, nothing ran twice: one request per step, attempt 1.
 * With `stale_refused`, the resource may have seen stale tokens (from a node that was
 * paused past its lease), provided it refused them: then only the requests it accepted
 * must carry growing tokens.
 */
static void check_resource(const ctx *c, int r, int via, bool once, bool stale_refused)
{
	fragile_stats sound;
	fragile_get_stats(c->res[r], &sound);
	if (!stale_refused)
		calls_assert_sound(c->res[r]);
	else if (sound.overlaps || sound.bad)
		fail_msg("%s: %zu overlaps, %zu bad requests", c->name[r], sound.overlaps,
			 sound.bad);
	size_t n;
	fragile_record *rec = fragile_records(c->res[r], &n);
	size_t keys = 0;
	long long high = -1;
	for (size_t i = 0; i < n; i++) {
		if (rec[i].outcome == FRAGILE_STALE) {
			assert_int_equal(rec[i].status, 409); /* refused: only with stale_refused */
			continue;
		}
		if (rec[i].token <= high) {
			calls_dump_records(rec, n);
			fail_msg("%s: request %zu carries token %lld after %lld", c->name[r], i,
				 rec[i].token, high);
		}
		high = rec[i].token;
		if (i > 0 && rec[i].arrived_ms < rec[i - 1].finished_ms) {
			calls_dump_records(rec, n);
			fail_msg("%s: request %zu arrived before request %zu was over", c->name[r],
				 i, i - 1);
		}
		if (once && (rec[i].outcome != FRAGILE_ANSWERED || attempt_of(&rec[i]) != 1)) {
			calls_dump_records(rec, n);
			fail_msg("%s: request %zu (%s) is %s, attempt %s: a step ran twice",
				 c->name[r], i, rec[i].idempotency_key,
				 fragile_outcome_name(rec[i].outcome), rec[i].attempt);
		}
	}
	for (int w = 0; w < c->nwf; w++) {
		if (c->res_of[w] != r)
			continue;
		const char *id = c->ids[w];
		json_t *wf = hs_get_workflow(c->cl.node[via], id);
		assert_string_equal(hs_str(wf, "status"), "completed");
		json_t *events = hs_get_events(c->cl.node[via], id);
		for (int s = 0; s < c->steps_of[w]; s++) {
			char *key = calls_key_of(id, s);
			int applied = 0, requests = 0;
			const fragile_record *last = NULL;
			for (size_t i = 0; i < n; i++) {
				if (!rec[i].idempotency_key || strcmp(rec[i].idempotency_key, key))
					continue;
				requests++;
				applied += rec[i].applied;
				if (rec[i].outcome == FRAGILE_STALE)
					continue; /* refused, see above */
				last = &rec[i];
				json_t *grant =
				    hs_event_find(events, "lock_acquired", s, attempt_of(&rec[i]));
				if (!grant ||
				    hs_int(grant, "fencing_token") != (json_int_t)rec[i].token)
					fail_msg(
					    "%s: request %zu (%s attempt %s, token %lld) has no "
					    "grant with that token in the history",
					    c->name[r], i, key, rec[i].attempt, rec[i].token);
			}
			if (applied != 1) {
				calls_dump_records(rec, n);
				fail_msg("%s was applied %d times", key, applied);
			}
			json_t *st = hs_step_at(wf, (size_t)s);
			assert_string_equal(hs_str(st, "status"), "completed");
			json_int_t attempts = hs_int(st, "attempts");
			if (attempts != (json_int_t)hs_event_count(events, "lock_acquired", s, -1))
				fail_msg("%s: %lld attempts, %zu grants", key, (long long)attempts,
					 hs_event_count(events, "lock_acquired", s, -1));
			if (hs_int(st, "fencing_token") != (json_int_t)last->token)
				fail_msg("%s completed under token %lld, its last request carried "
					 "%lld",
					 key, (long long)hs_int(st, "fencing_token"), last->token);
			if (once && (attempts != 1 || requests != 1))
				fail_msg("%s: %lld attempts and %d requests, expected one each",
					 key, (long long)attempts, requests);
			keys++;
			free(key);
		}
		json_decref(events);
		json_decref(wf);
	}
	fragile_stats st;
	fragile_get_stats(c->res[r], &st);
	if (st.applied != keys)
		fail_msg("%s: %zu operations applied, %zu steps", c->name[r], st.applied, keys);
	fragile_records_free(rec, n);
}

static void assert_resource(const ctx *c, int r, int via, bool once)
{
	check_resource(c, r, via, once, false);
}

static void assert_all_resources(const ctx *c, int via, const bool once[NRES])
{
	for (int r = 0; r < NRES; r++)
		assert_resource(c, r, via, once[r]);
}

/* ---- 1. round robin ---------------------------------------------------------------- */

/*
 * 12 workflows of 4 call steps on 4 resources, posted to the three nodes in turn (each
 * read back at once from the two others): all complete; each resource saw one request
 * at a time with growing tokens, each step once, attempt 1.
 */
static void test_round_robin(void **state)
{
	SKIP_UNLESS_PG();
	ctx *c = *state;
	cluster_up(c, SHORT_LEASE_MS, NULL);
	submit_round_robin(c, "rr", 3, 4);
	wait_all_completed(c, 1, hs_mono_ms() + 2 * WAIT_MS, "after 60 s");
	static const bool once[NRES] = {true, true, true, true};
	for (int via = 0; via < NODES; via++)
		assert_all_resources(c, via, once);
}

/* ---- 2. kill -9 ------------------------------------------------------------------ */

/*
 * node1 (which drives resources 0 and 3) is killed with SIGKILL while resource 0 holds
 * one of its calls: the workflows finish on node0 and node2 within the lease + 20 s of the
 * kill; the cut-off attempt ran again as attempt 2 with a higher token (and the history
 * says it was interrupted: taken over from node1 by the node that drives it now); resources 1 and
 * 2, driven by the others, saw each step once.
 */
static void test_kill_node(void **state)
{
	SKIP_UNLESS_PG();
	ctx *c = *state;
	cluster_up(c, SHORT_LEASE_MS, NULL);
	fragile_push(c->res[0], (fragile_action){.status = 200, .delay_ms = 60000});
	submit_round_robin(c, "kill", 2, 3);
	assert_true(fragile_wait_held(c->res[0], 1, WAIT_MS));
	hs_kill(c->cl.node[1]);
	int64_t killed = hs_mono_ms();
	wait_all_completed(c, 0, killed + c->cl.lease_ms + 20000,
			   "within the lease + 20 s of the kill of node1");
	assert_false(cl_lists(&c->cl, 0, 1));

	size_t n;
	fragile_record *rec = fragile_records(c->res[0], &n);
	assert_true(n >= 2);
	assert_int_equal(rec[0].outcome, FRAGILE_CLIENT_GONE); /* cut off by the kill */
	assert_int_equal(attempt_of(&rec[0]), 1);
	const fragile_record *again = NULL;
	for (size_t i = 1; i < n && !again; i++)
		if (strcmp(rec[i].idempotency_key, rec[0].idempotency_key) == 0)
			again = &rec[i];
	if (!again) {
		calls_dump_records(rec, n);
		fail_msg("the call cut off by the kill (%s) was not made again",
			 rec[0].idempotency_key);
	}
	assert_int_equal(attempt_of(again), 2);
	assert_true(again->token > rec[0].token);
	assert_int_equal(again->outcome, FRAGILE_ANSWERED);
	/* The history of that step says that attempt 1 was interrupted. */
	char wf_id[48];
	const char *slash = strrchr(rec[0].idempotency_key, '/');
	snprintf(wf_id, sizeof wf_id, "%.*s", (int)(slash - rec[0].idempotency_key),
		 rec[0].idempotency_key);
	int step = atoi(slash + 1);
	json_t *events = hs_get_events(c->cl.node[2], wf_id);
	const json_t *cut = hs_event_find(events, "step_interrupted", step, 1);
	assert_non_null(cut);
	/* ... and says what happened: node1 stopped renewing, the new owner took it over */
	assert_string_equal(hs_str(cut, "previous_node"), "node1");
	int now = cl_part_owner(&c->cl, cl_part_of(c->name[0]));
	assert_true(now == 0 || now == 2);
	assert_string_equal(hs_str(cut, "node"), c->cl.id[now]);
	json_decref(events);
	fragile_records_free(rec, n);

	static const bool once[NRES] = {false, true, true, false};
	assert_all_resources(c, 2, once);
}

/* ---- 3. a pause past the lease --------------------------------------------------- */

typedef struct taken {
	const ctx *c;
	int node, part;
} taken;

/* node0 no longer lists the paused node, and the partition shows another owner. */
static bool is_taken(void *arg)
{
	const taken *t = arg;
	int owner = cl_part_owner(&t->c->cl, t->part);
	return owner >= 0 && owner != t->node && !cl_lists(&t->c->cl, 0, t->node);
}

/* baton_node_partitions_lost_total on node `who`; -1 when it cannot be read. */
static double partitions_lost(const ctx *c, int who)
{
	hs_response r;
	double v = -1;
	json_t *doc = NULL;
	char err[200];
	if (hs_get(c->cl.node[who], "/metrics", &r) == 0 && r.status == 200 && r.body &&
	    prom_parse(r.body, &doc, err, sizeof err) == 0)
		v = prom_metric(doc, "baton_node_partitions_lost_total", "");
	json_decref(doc);
	hs_response_fini(&r);
	return v;
}

/* The node's counter of lost partitions went up, or its log says it lost partitions. */
static bool lost_some(void *arg)
{
	const taken *t = arg;
	return partitions_lost(t->c, t->node) > 0 ||
	       hs_log_says(t->c->cl.node[t->node], " lost ", "partition");
}

/*
 * node1 is paused (SIGSTOP) while resource 0 holds one of its calls, and stays paused
 * until node0 no longer lists it and resource 0's partition has another owner, which runs
 * the step again; then it resumes (SIGCONT). The resources saw no overlap and accepted
 * no stale token (what the resumed node may still send for what it lost is refused); the
 * step answered while node1 was paused was applied once; the resumed node noticed (its
 * partitions_lost counter) and goes on serving requests, a new submission included; every
 * workflow completes.
 */
static void test_pause_past_lease(void **state)
{
	SKIP_UNLESS_PG();
	ctx *c = *state;
	cluster_up(c, SHORT_LEASE_MS, NULL);
	fragile_push(c->res[0], (fragile_action){.status = 200, .delay_ms = 1000});
	submit_round_robin(c, "pause", 2, 3);
	assert_true(fragile_wait_held(c->res[0], 1, WAIT_MS));
	assert_int_equal(hs_signal(c->cl.node[1], SIGSTOP), 0);
	taken t = {c, 1, cl_part_of(c->name[0])};
	if (!hs_wait_until(is_taken, &t, c->cl.lease_ms + 20000)) {
		dump_nodes(c, 0);
		fail_msg("node1 paused for the lease + 20 s, and its partition %d was not taken",
			 t.part);
	}
	/* The new owner runs the interrupted step again while node1 is still paused. */
	if (!fragile_wait_arrived(c->res[0], 2, WAIT_MS))
		fail_msg("resource 0's work did not go on while node1 was paused");
	assert_int_equal(hs_signal(c->cl.node[1], SIGCONT), 0);
	if (!hs_wait_until(lost_some, &t, c->cl.lease_ms + 20000)) {
		hs_dump_log(c->cl.node[1], 4000);
		fail_msg("node1 resumed and its baton_node_partitions_lost_total stayed %g",
			 partitions_lost(c, 1));
	}

	/* The resumed node serves reads and takes new work. */
	json_decref(hs_get_json(c->cl.node[1], "/healthz", 200));
	json_decref(hs_get_json(c->cl.node[1], "/workflows/pause-r0-0", 200));
	submit(c, 1, "pause-after", 0, 2);
	submit(c, 1, "pause-after-2", 2, 2);
	wait_all_completed(c, 1, hs_mono_ms() + 2 * WAIT_MS, "after node1 resumed");
	/* What node1 drove may have seen a stale token from it after it resumed, refused. */
	for (int r = 0; r < NRES; r++)
		check_resource(c, r, 1, c->owner[r] != 1, c->owner[r] == 1);
	fragile_stats st;
	fragile_get_stats(c->res[0], &st);
	assert_true(st.duplicates >= 1); /* the step answered while node1 was paused */
}

/* ---- 4. SIGTERM with a long lease ---------------------------------------------------- */

/*
 * With a 60 s lease, node1 gets SIGTERM under load (while resource 0 holds one of its
 * calls): it finishes that step, exits 0 and gives its partitions back at once, so the
 * others finish its work well before its lease could have run out (30 s after the
 * SIGTERM), nothing runs twice, and node0 stops listing it as soon.
 */
static void test_sigterm_moves_work(void **state)
{
	SKIP_UNLESS_PG();
	ctx *c = *state;
	cluster_up(c, LONG_LEASE_MS, NULL);
	for (int r = 0; r < NRES; r++)
		fragile_set_default(c->res[r], (fragile_action){.status = 200, .delay_ms = 100});
	submit_round_robin(c, "term", 3, 5);
	assert_true(fragile_wait_held(c->res[0], 1, WAIT_MS));
	int64_t termed = hs_mono_ms();
	assert_int_equal(hs_stop(c->cl.node[1]), 0);
	wait_all_completed(c, 0, termed + 30000,
			   "within 30 s of node1's SIGTERM (its lease is 60 s)");
	assert_false(cl_lists(&c->cl, 0, 1));
	assert_true(cl_wait_balanced(&c->cl, 2, 5u, WAIT_MS));
	assert_true(hs_mono_ms() - termed < LONG_LEASE_MS);
	fragile_stats st;
	fragile_get_stats(c->res[0], &st);
	assert_int_equal(st.requests, 15); /* resource 0's 3 x 5 steps, each called once */
	int moved = 0; /* steps of resource 0 that another node ran after the SIGTERM */
	for (int w = 0; w < c->nwf; w++) {
		if (c->res_of[w] != 0)
			continue;
		json_t *wf = hs_get_workflow(c->cl.node[2], c->ids[w]);
		for (int s = 0; s < c->steps_of[w]; s++) {
			json_t *node = json_object_get(hs_step_at(wf, (size_t)s), "node");
			int who = cl_index(&c->cl, json_string_value(node));
			if (who < 0)
				fail_msg("%s step %d names node %s", c->ids[w], s,
					 json_dumps(node, JSON_ENCODE_ANY));
			moved += who != 1;
		}
		json_decref(wf);
	}
	assert_true(moved > 0);
	static const bool once[NRES] = {true, true, true, true};
	assert_all_resources(c, 2, once);
}

/* ---- 5. PostgreSQL restarted ------------------------------------------------------- */

typedef struct snap {
	char key[64], id[48];
	int step;
	json_int_t attempts, token;
} snap;

static bool all_ready(void *arg)
{
	const ctx *c = arg;
	for (int i = 0; i < NODES; i++) {
		hs_response r;
		long status = hs_get(c->cl.node[i], "/readyz", &r) == 0 ? r.status : 0;
		hs_response_fini(&r);
		if (status != 200)
			return false;
		for (int j = 0; j < NODES; j++)
			if (!cl_lists(&c->cl, i, j))
				return false;
	}
	return true;
}

/*
 * PostgreSQL restarts while the three nodes run 12 workflows: every node is ready again
 * and lists the others, every acknowledged workflow completes, and no step that had
 * completed before the restart was called again or changed; the resources saw no overlap
 * and no stale token, and applied each step once.
 */
static void test_postgres_restart(void **state)
{
	SKIP_UNLESS_PG();
	if (!getenv("BATON_TEST_PG_DIR") || !*getenv("BATON_TEST_PG_DIR"))
		skip();
	ctx *c = *state;
	cluster_up(c, SHORT_LEASE_MS, NULL);
	for (int r = 0; r < NRES; r++)
		fragile_set_default(c->res[r], (fragile_action){.status = 200, .delay_ms = 50});
	submit_round_robin(c, "pg", 3, 5);
	for (int r = 0; r < NRES; r++)
		assert_true(fragile_wait_applied(c->res[r], 2, WAIT_MS));

	static snap done[MAX_WF * 5];
	size_t ndone = 0;
	for (int w = 0; w < c->nwf; w++) {
		json_t *wf = hs_get_workflow(c->cl.node[0], c->ids[w]);
		for (int s = 0; s < c->steps_of[w]; s++) {
			json_t *st = hs_step_at(wf, (size_t)s);
			if (strcmp(hs_str(st, "status"), "completed") != 0)
				continue;
			snprintf(done[ndone].key, sizeof done[0].key, "%s/%d", c->ids[w], s);
			memcpy(done[ndone].id, c->ids[w], sizeof done[0].id);
			done[ndone].step = s;
			done[ndone].attempts = hs_int(st, "attempts");
			done[ndone].token = hs_int(st, "fencing_token");
			ndone++;
		}
		json_decref(wf);
	}
	size_t before[NRES];
	for (int r = 0; r < NRES; r++) {
		fragile_stats st;
		fragile_get_stats(c->res[r], &st);
		before[r] = st.requests;
	}
	assert_true(ndone > 0);
	assert_int_equal(hs_pg_restart(), 0);
	int64_t restarted = hs_mono_ms();
	if (!hs_wait_until(all_ready, c, 2 * WAIT_MS)) {
		for (int i = 0; i < NODES; i++)
			hs_dump_log(c->cl.node[i], 3000);
		fail_msg("the nodes did not all come back within 60 s of PostgreSQL's restart");
	}
	wait_all_completed(c, 2, restarted + 2 * WAIT_MS, "within 60 s of PostgreSQL's restart");

	for (int r = 0; r < NRES; r++) {
		size_t n;
		fragile_record *rec = fragile_records(c->res[r], &n);
		for (size_t i = before[r]; i < n; i++)
			for (size_t d = 0; d < ndone; d++)
				if (strcmp(rec[i].idempotency_key, done[d].key) == 0)
					fail_msg("%s had completed before the restart and was "
						 "called again (attempt %s)",
						 done[d].key, rec[i].attempt);
		fragile_records_free(rec, n);
	}
	for (size_t d = 0; d < ndone; d++) {
		json_t *wf = hs_get_workflow(c->cl.node[1], done[d].id);
		json_t *st = hs_step_at(wf, (size_t)done[d].step);
		if (hs_int(st, "attempts") != done[d].attempts ||
		    hs_int(st, "fencing_token") != done[d].token)
			fail_msg("%s changed after the restart: attempts %lld -> %lld, token %lld "
				 "-> %lld",
				 done[d].key, (long long)done[d].attempts,
				 (long long)hs_int(st, "attempts"), (long long)done[d].token,
				 (long long)hs_int(st, "fencing_token"));
		json_decref(wf);
	}
	static const bool once[NRES] = {false, false, false, false};
	assert_all_resources(c, 0, once);
	if (!cl_wait_balanced(&c->cl, 1, ALL_NODES, WAIT_MS)) {
		dump_nodes(c, 1);
		fail_msg("the nodes did not share the partitions again after the restart");
	}
}

/* ---- 6. idempotent submission across nodes ------------------------------------------- */

typedef struct post_job {
	const hs_server *s;
	const char *body;
	pthread_barrier_t *go;
	long status;
	json_t *json;
	char answer[300];
} post_job;

static void *post_thread(void *arg)
{
	post_job *job = arg;
	hs_response r;
	pthread_barrier_wait(job->go);
	hs_post(job->s, "/workflows", job->body, &r);
	job->status = r.status;
	job->json = r.json ? json_incref(r.json) : NULL;
	snprintf(job->answer, sizeof job->answer, "%s", r.body ? r.body : r.error);
	hs_response_fini(&r);
	return NULL;
}

/*
 * The same id and definition POSTed to two nodes at the same moment (two threads behind
 * a barrier), six times over the resources and node pairs: each time one 201 and one 200
 * with the same workflow, one row, one submission event, each step run once; every node
 * serves the same finished workflow.
 */
static void test_same_submission_two_nodes(void **state)
{
	SKIP_UNLESS_PG();
	ctx *c = *state;
	cluster_up(c, SHORT_LEASE_MS, NULL);
	for (int k = 0; k < 6; k++) {
		char id[48];
		snprintf(id, sizeof id, "twice-%d", k);
		int r = k % NRES;
		json_t *body = call_workflow(c, id, r, 2);
		char *text = json_dumps(body, JSON_COMPACT);
		json_decref(body);
		pthread_barrier_t go;
		pthread_barrier_init(&go, NULL, 2);
		post_job jobs[2] = {{.s = c->cl.node[k % NODES], .body = text, .go = &go},
				    {.s = c->cl.node[(k + 1) % NODES], .body = text, .go = &go}};
		pthread_t t[2];
		for (int j = 0; j < 2; j++)
			assert_int_equal(pthread_create(&t[j], NULL, post_thread, &jobs[j]), 0);
		for (int j = 0; j < 2; j++)
			pthread_join(t[j], NULL);
		pthread_barrier_destroy(&go);
		free(text);
		long lo = jobs[0].status < jobs[1].status ? jobs[0].status : jobs[1].status;
		long hi = jobs[0].status < jobs[1].status ? jobs[1].status : jobs[0].status;
		if (lo != 200 || hi != 201)
			fail_msg("%s POSTed to two nodes at once: %ld (%s) and %ld (%s), expected "
				 "one 201 and one 200",
				 id, jobs[0].status, jobs[0].answer, jobs[1].status,
				 jobs[1].answer);
		for (int j = 0; j < 2; j++) {
			assert_string_equal(hs_str(jobs[j].json, "id"), id);
			assert_string_equal(hs_str(jobs[j].json, "resource"), c->name[r]);
			json_decref(jobs[j].json);
		}
		snprintf(c->ids[c->nwf], sizeof c->ids[0], "%s", id);
		c->res_of[c->nwf] = r;
		c->steps_of[c->nwf] = 2;
		c->nwf++;
	}
	wait_all_completed(c, 0, hs_mono_ms() + 2 * WAIT_MS, "after 60 s");
	for (int w = 0; w < c->nwf; w++) {
		const char *id = c->ids[w];
		json_t *first = hs_get_workflow(c->cl.node[0], id);
		for (int i = 1; i < NODES; i++) {
			json_t *other = hs_get_workflow(c->cl.node[i], id);
			if (!json_equal(first, other))
				fail_msg("%s: node0 serves %s, %s serves %s", id,
					 json_dumps(first, JSON_COMPACT), c->cl.id[i],
					 json_dumps(other, JSON_COMPACT));
			json_decref(other);
		}
		json_decref(first);
		json_t *events = hs_get_events(c->cl.node[2], id);
		assert_int_equal(hs_event_count(events, "workflow_submitted", -1, -1), 1);
		json_decref(events);
		char sql[128];
		snprintf(sql, sizeof sql, "SELECT count(*) FROM workflows WHERE id = '%s'", id);
		assert_int_equal(hs_db_count(c->cl.node[0], sql), 1);
	}
	static const bool once[NRES] = {true, true, true, true};
	assert_all_resources(c, 1, once);
}

/* ---- 7. event cursors ---------------------------------------------------------------- */

typedef struct cursor {
	json_int_t after;
	json_t *got; /* every event read so far, in order */
} cursor;

/* Reads workflow `id`'s events after the cursor, 3 a page, as next_after says. */
static void read_on(const hs_server *s, const char *id, cursor *cur)
{
	for (int pages = 0;; pages++) {
		assert_true(pages < 10000);
		char path[160];
		snprintf(path, sizeof path, "/workflows/%s/events?after=%lld&limit=3", id,
			 (long long)cur->after);
		json_t *doc = hs_get_json(s, path, 200);
		json_t *page = json_object_get(doc, "events"),
		       *next = json_object_get(doc, "next_after");
		size_t i;
		json_t *ev;
		json_array_foreach(page, i, ev)
		{
			json_int_t seq = hs_int(ev, "seq");
			if (seq <= cur->after)
				fail_msg("%s: after=%lld gave seq %lld", id, (long long)cur->after,
					 (long long)seq);
			cur->after = seq;
			json_array_append(cur->got, ev);
		}
		bool more = json_is_integer(next);
		json_decref(doc);
		if (!more)
			return;
	}
}

/* A client that read live's stream up to its fourth event resumes on node1 (which does
 * not drive it either) with Last-Event-ID: it gets exactly the rest. */
static void resume_elsewhere(CURLM *m, const hs_server *s, const json_t *full)
{
	assert_true(json_array_size(full) > 4);
	char hdr[64];
	snprintf(hdr, sizeof hdr, "Last-Event-ID: %lld",
		 (long long)hs_int(json_array_get(full, 3), "seq"));
	const char *const headers[] = {SSE_ACCEPT, hdr, NULL};
	sse *st = sse_open(m, s, "/workflows/live/events", headers);
	if (!sse_pump_until(m, sse_is_done, st, WAIT_MS))
		fail_msg("the resumed stream on node1 did not end (%zu events)", sse_count(st));
	sse_assert_ok(st, "live resumed on node1");
	sse_assert_is(st, full, 4, "live resumed on node1");
	sse_close(m, st);
}

/*
 * Workflows on resources driven by node0 (live) and node1 (six), read while they run by a
 * reader on node2, which drives none of them, with ?after=SEQ paging (3 events a page):
 * each workflow's events arrive exactly once and in order, the same as its full history
 * read at the end on node2 and on its driver. A stream opened on node2 for a workflow
 * that node0 runs shows each step's grant live, while the step's call is still held, and
 * holds the full history; resumed on node1 with Last-Event-ID, it gets exactly the rest.
 */
static void test_event_cursors_across_nodes(void **state)
{
	SKIP_UNLESS_PG();
	ctx *c = *state;
	cluster_up(c, SHORT_LEASE_MS, NULL);
	const hs_server *reader = c->cl.node[2];
	assert_int_equal(c->owner[2], 0); /* cluster_up's layout: node2 drives resource 1 only */
	for (int i = 0; i < 3; i++)
		fragile_push(c->res[2], (fragile_action){.status = 200, .gated = true});
	submit(c, 0, "live", 2, 3);
	/* Not on resource 2: a step of another workflow there would take live's place in the
	 * resource's FIFO queue, and a gated answer with it. */
	static const int used[] = {0, 3};
	for (int i = 0; i < 3; i++)
		for (int k = 0; k < 2; k++) {
			char id[48];
			int r = used[k];
			snprintf(id, sizeof id, "cur-r%d-%d", r, i);
			submit(c, c->owner[r], id, r, 4);
		}
	CURLM *m = curl_multi_init();
	static const char *const accept[] = {SSE_ACCEPT, NULL};
	sse *live = sse_open(m, reader, "/workflows/live/events", accept);
	cursor cur[MAX_WF];
	for (int w = 0; w < c->nwf; w++)
		cur[w] = (cursor){0, json_array()};

	for (int i = 0; i < 3; i++) {
		for (int w = 0; w < c->nwf; w++)
			read_on(reader, c->ids[w], &cur[w]);
		sse_await_event(m, live, "lock_acquired", i, NULL, WAIT_MS);
		json_t *mid = hs_get_workflow(reader, "live");
		if (strcmp(hs_str(hs_step_at(mid, (size_t)i), "status"), "running") != 0)
			fail_msg("step %d's grant reached node2's stream when the step was %s", i,
				 hs_str(hs_step_at(mid, (size_t)i), "status"));
		json_decref(mid);
		fragile_open_gate(c->res[2]);
	}
	int64_t deadline = hs_mono_ms() + 2 * WAIT_MS;
	for (;;) {
		bool all = true;
		for (int w = 0; w < c->nwf; w++) {
			read_on(reader, c->ids[w], &cur[w]);
			size_t got = json_array_size(cur[w].got);
			const char *last =
			    got ? hs_str(json_array_get(cur[w].got, got - 1), "type") : "";
			all = all && strcmp(last, "workflow_completed") == 0;
		}
		sse_pump(m, 20);
		if (all)
			break;
		if (hs_mono_ms() >= deadline)
			fail_msg("the workflows did not complete within 60 s");
	}
	if (!sse_pump_until(m, sse_is_done, live, WAIT_MS))
		fail_msg("node2's stream of live did not end after the workflow (%zu events)",
			 sse_count(live));
	sse_assert_ok(live, "node2's stream of live");
	for (int w = 0; w < c->nwf; w++) {
		const char *id = c->ids[w];
		read_on(reader, id, &cur[w]); /* nothing more */
		json_t *full = hs_get_events(reader, id);
		json_t *driver = hs_get_events(c->cl.node[c->owner[c->res_of[w]]], id);
		if (!json_equal(cur[w].got, full))
			fail_msg("%s: read live with ?after on node2: %s\nfull history: %s", id,
				 json_dumps(cur[w].got, JSON_COMPACT),
				 json_dumps(full, JSON_COMPACT));
		assert_true(json_equal(full, driver));
		if (strcmp(id, "live") == 0) {
			sse_assert_is(live, full, 0, "node2's stream of live");
			resume_elsewhere(m, c->cl.node[1], full);
		}
		json_decref(full);
		json_decref(driver);
		json_decref(cur[w].got);
	}
	sse_close(m, live);
	curl_multi_cleanup(m);
	static const bool once[NRES] = {true, true, true, true};
	assert_all_resources(c, 2, once);
}

/* ---- 8. GET /nodes -------------------------------------------------------------------- */

/* Asserts node `via`'s GET /nodes: exactly the nodes of `live`, itself marked self. */
static void assert_nodes(const ctx *c, int via, unsigned live)
{
	json_t *doc = hs_get_json(c->cl.node[via], "/nodes", 200);
	json_t *nodes = json_object_get(doc, "nodes");
	assert_int_equal(json_array_size(nodes), __builtin_popcount(live));
	unsigned seen = 0;
	json_int_t sum = 0;
	int64_t now = hs_now_ms();
	size_t i;
	json_t *n;
	json_array_foreach(nodes, i, n)
	{
		int who = cl_index(&c->cl, hs_str(n, "id"));
		if (who < 0 || !(live >> who & 1) || (seen >> who & 1))
			fail_msg("%s lists %s", c->cl.id[via], hs_str(n, "id"));
		seen |= 1u << who;
		assert_true(json_is_boolean(json_object_get(n, "self")));
		assert_int_equal(json_is_true(json_object_get(n, "self")), who == via);
		int64_t expires = hs_time(n, "lease_expires_at");
		if (expires < now - c->cl.lease_ms || expires > now + c->cl.lease_ms + 5000)
			fail_msg("%s's lease expires at %lld, now is %lld (lease %d ms)",
				 c->cl.id[who], (long long)expires, (long long)now, c->cl.lease_ms);
		sum += hs_int(n, "partitions");
		assert_true(hs_int(n, "resources") >= 0);
		assert_true(hs_int(n, "running_steps") >= 0);
	}
	assert_int_equal(seen, live);
	assert_int_equal(sum, CL_PARTS);
	json_decref(doc);
}

/* GET /resources/NAME on node `via` names node `want`. */
static void assert_resource_node(const ctx *c, int via, int r, int want)
{
	char path[96];
	snprintf(path, sizeof path, "/resources/%s", c->name[r]);
	json_t *doc = hs_get_json(c->cl.node[via], path, 200);
	json_t *node = json_object_get(doc, "node");
	if (!json_is_string(node) || cl_index(&c->cl, json_string_value(node)) != want)
		fail_msg("%s says %s is driven by %s, expected %s", c->cl.id[via], c->name[r],
			 json_dumps(node, JSON_ENCODE_ANY), c->cl.id[want]);
	json_decref(doc);
}

typedef struct gone {
	const ctx *c;
	int via, who;
} gone;

static bool not_listed(void *arg)
{
	const gone *g = arg;
	return !cl_lists(&g->c->cl, g->via, g->who);
}

/*
 * Every node's GET /nodes lists the three nodes with their leases and partitions summing
 * to 64; GET /resources/NAME on every node names the live node that drives it. After
 * node2's SIGTERM, node0 and node1 list two nodes, which share the 64 partitions, and
 * the resource node2 drove names one of them.
 */
static void test_nodes_listing(void **state)
{
	SKIP_UNLESS_PG();
	ctx *c = *state;
	cluster_up(c, SHORT_LEASE_MS, NULL);
	submit_round_robin(c, "nodes", 1, 1);
	wait_all_completed(c, 0, hs_mono_ms() + WAIT_MS, "after 30 s");
	for (int via = 0; via < NODES; via++) {
		assert_nodes(c, via, ALL_NODES);
		for (int r = 0; r < NRES; r++)
			assert_resource_node(c, via, r, c->owner[r]);
	}
	assert_int_equal(hs_stop(c->cl.node[2]), 0);
	for (int via = 0; via < 2; via++) {
		gone g = {c, via, 2};
		if (!hs_wait_until(not_listed, &g, c->cl.lease_ms + 10000)) {
			dump_nodes(c, via);
			fail_msg("%s still lists node2 after its SIGTERM", c->cl.id[via]);
		}
		assert_true(cl_wait_balanced(&c->cl, via, 3u, WAIT_MS));
		assert_nodes(c, via, 3u);
	}
	/* Resource 1 was node2's: now one of the two drives it, as both say. */
	int now = cl_part_owner(&c->cl, cl_part_of(c->name[1]));
	assert_true(now == 0 || now == 1);
	for (int via = 0; via < 2; via++)
		assert_resource_node(c, via, 1, now);
}

/* ---- 9. the ownership check of every batch -------------------------------------------- */

static bool node0_lost_some(void *arg)
{
	return partitions_lost(arg, 0) > 0;
}

/*
 * The check that stops a stale node, alone: one node with a long lease (its membership
 * thread reads the partitions every 20 s, so it does not learn of the change in time)
 * runs a workflow whose first call the resource holds for a second. Meanwhile its
 * partition passes, in the database, to another node that the database shows as live
 * (as a claim leaves it: a new owner, the epoch raised). The batch that would record the
 * step's end is refused: the step stays running in the database, the second step is never
 * called, and the node counts the partition as lost.
 */
static void test_stale_batch_refused(void **state)
{
	SKIP_UNLESS_PG();
	ctx *c = *state;
	c->res[0] = fragile_open();
	assert_non_null(c->res[0]);
	c->url[0] = fragile_url(c->res[0], "/op");
	c->allow[0] = fragile_url(c->res[0], "/");
	const char *args[] = {"--allow-call", c->allow[0], NULL};
	assert_int_equal(cl_open(&c->cl, 1, LONG_LEASE_MS, args), 0);
	assert_true(cl_wait_balanced(&c->cl, 0, 1u, WAIT_MS));
	unsigned long long used = 0;
	cl_pick_resource(&c->cl, 0, "fence", &used, c->name[0], sizeof c->name[0]);
	fragile_push(c->res[0], (fragile_action){.status = 200, .delay_ms = 1000});
	json_decref(hs_create_workflow(c->cl.node[0], call_workflow(c, "fence-1", 0, 2)));
	assert_true(fragile_wait_held(c->res[0], 1, WAIT_MS));

	char sql[512];
	snprintf(sql, sizeof sql,
		 "WITH n AS (INSERT INTO nodes (id, expires) VALUES ('elsewhere',"
		 " now() + interval '1 hour') RETURNING 1), p AS (UPDATE partitions SET"
		 " owner = 'elsewhere', epoch = epoch + 1 WHERE id = %d RETURNING 1)"
		 " SELECT (SELECT count(*) FROM n) + (SELECT count(*) FROM p)",
		 cl_part_of(c->name[0]));
	assert_int_equal(hs_db_count(c->cl.node[0], sql), 2);
	if (!hs_wait_until(node0_lost_some, c, WAIT_MS)) {
		hs_dump_log(c->cl.node[0], 4000);
		fail_msg("node0's baton_node_partitions_lost_total stayed %g",
			 partitions_lost(c, 0));
	}
	assert_int_equal(hs_db_count(c->cl.node[0],
				     "SELECT count(*) FROM steps s JOIN workflows w ON"
				     " w.seq = s.workflow_seq WHERE w.id = 'fence-1' AND s.idx = 0"
				     " AND s.status = 'running'"),
			 1);
	fragile_stats st;
	fragile_get_stats(c->res[0], &st);
	assert_int_equal(st.requests, 1);
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_round_robin, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_kill_node, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_pause_past_lease, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_sigterm_moves_work, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_postgres_restart, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_same_submission_two_nodes, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_event_cursors_across_nodes, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_nodes_listing, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_stale_batch_refused, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
