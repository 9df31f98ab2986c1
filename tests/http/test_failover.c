/*
 * test_failover.c - PostgreSQL itself failing over under batond, on servers this suite
 * starts and stops itself: a primary (scripts/pg.sh) and a streaming standby copied from it
 * with `pg_basebackup -R -X stream -c fast`, both on loopback in directories of their own,
 * batond on a libpq multi-host URL that names both with target_session_attrs=read-write.
 * The standby is made to miss commits by stopping it, the primary is stopped with
 * `pg_ctl stop -m immediate` (a crash) and the standby promoted with `pg_ctl promote`, as
 * PostgreSQL's own src/test/recovery/t/004_timeline_switch.pl does.
 *
 *  - batond, a cluster of two nodes, follows the promotion by itself, without a restart:
 *    one holder at a time, tokens increasing, both nodes serving again;
 *  - after an asynchronous promotion that lost acknowledged grants (asserted: the new
 *    primary's stored token is below the highest one acknowledged), no fencing token repeats:
 *    every one granted after it is above every one granted before;
 *  - after a synchronous promotion, nothing acknowledged is lost (asserted first that it was
 *    acknowledged): tokens, a held lease, a workflow; a grant asked for with the standby down
 *    is not acknowledged (a batond committing locally would, and the test then fails);
 *  - a task claim acknowledged and lost with the old primary: its step runs again under a
 *    new token, above the one its first worker holds;
 *  - with the synchronous standby down, a commit whose wait for it is cancelled (committed
 *    on the primary only) is never answered as done; the same request_id gets the outcome;
 *  - with the synchronous standby down, a grant is answered 503 with Retry-After once
 *    --commit-timeout-ms has passed, never success, also the first one, whose block of
 *    ids must commit first; a batond started then exits saying why; a request_id answered
 *    503, asked again once the standby is back, gets the lease, and a grant nobody came
 *    back for is released;
 *  - batond shows whether its commits are replicated synchronously (/metrics, GET /nodes),
 *    also after a reload empties synchronous_standby_names; with
 *    --require-sync-replication it then answers grants 503 and stores nothing of them;
 *  - a database of another system identifier is refused, naming both, until accepted with
 *    --accept-system-identifier (this test on the run's own server).
 *
 * Only on PostgreSQL (BATON_TEST_PG set, which hs_new needs); on SQLite every test skips.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <libpq-fe.h>
#include <pthread.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../harness/harness.h"
#include "../harness/pg.h"
#include "../harness/pgpair.h"

#define WAIT_MS 60000

/* batond on the multi-host URL of both servers, primary first, with more arguments
 * (NULL-terminated). */
static hs_server *start_batond_with(pair *p, const char *const *more)
{
	const char *args[16] = {"--lease-ms", "1000", "--node-id", "fo-1"};
	size_t n = 4;
	while (*more && n < 15)
		args[n++] = *more++;
	args[n] = NULL;
	char url[256];
	snprintf(url, sizeof url,
		 "postgresql://postgres@127.0.0.1:%d,127.0.0.1:%d/baton"
		 "?target_session_attrs=read-write",
		 p->n[0].port, p->n[1].port);
	hs_server *s = hs_new(NULL, args);
	assert_non_null(s);
	p->s = s;
	assert_int_equal(hs_set_db(s, url), 0);
	assert_int_equal(hs_start(s), 0);
	return s;
}

static hs_server *start_batond(pair *p)
{
	static const char *const none[] = {NULL};
	return start_batond_with(p, none);
}

/* ---- leases: a grant, its token, its release -------------------------------------- */

/* A lease on resource granted at once: its token; *id gets its id. Any other answer
 * (503 while the database fails over) is -1. */
static long long try_grant(const hs_server *s, const char *resource, char *id, size_t n)
{
	char path[128];
	snprintf(path, sizeof path, "/resources/%s/leases", resource);
	hs_response r;
	long long token = -1;
	if (hs_post(s, path, "{\"holder\": \"t\", \"ttl_ms\": 60000}", &r) == 0 &&
	    r.status == 201) {
		token = hs_int(r.json, "fencing_token");
		snprintf(id, n, "%s", hs_str(r.json, "id"));
	}
	hs_response_fini(&r);
	return token;
}

static long long grant(const hs_server *s, const char *resource, char *id, size_t n)
{
	long long token = try_grant(s, resource, id, n);
	if (token < 0)
		fail_msg("the lease on %s was not granted", resource);
	return token;
}

/* Grants when it can, as a client retries through a failover. */
static long long grant_eventually(const hs_server *s, const char *resource, char *id, size_t n)
{
	int64_t deadline = hs_mono_ms() + WAIT_MS;
	long long token;
	while ((token = try_grant(s, resource, id, n)) < 0) {
		if (hs_mono_ms() > deadline)
			fail_msg("no lease on %s was granted within %d ms", resource, WAIT_MS);
		hs_pause_ms(50);
	}
	return token;
}

/* Releases lease id; -1 when it was not answered 204. */
static int try_release(const hs_server *s, const char *id)
{
	char path[160];
	snprintf(path, sizeof path, "/leases/%s", id);
	hs_request req = {.method = "DELETE", .path = path};
	hs_response r;
	int rc = hs_send(s, &req, &r) == 0 && r.status == 204 ? 0 : -1;
	hs_response_fini(&r);
	return rc;
}

static void release_eventually(const hs_server *s, const char *id)
{
	int64_t deadline = hs_mono_ms() + WAIT_MS;
	while (try_release(s, id) != 0) {
		if (hs_mono_ms() > deadline)
			fail_msg("lease %s was not released within %d ms", id, WAIT_MS);
		hs_pause_ms(50);
	}
}

/* A claim of worker ext's task: its token, or -1 when none was answered 200. */
static long long try_claim(const hs_server *s, int wait_ms)
{
	char body[96];
	snprintf(body, sizeof body, "{\"worker\": \"ext\", \"wait_ms\": %d}", wait_ms);
	hs_response r;
	long long token = -1;
	if (hs_post(s, "/tasks/claim", body, &r) == 0 && r.status == 200)
		token = hs_int(r.json, "fencing_token");
	hs_response_fini(&r);
	return token;
}

static void release(const hs_server *s, const char *id)
{
	char path[160];
	snprintf(path, sizeof path, "/leases/%s", id);
	hs_request req = {.method = "DELETE", .path = path};
	hs_response r;
	assert_int_equal(hs_send(s, &req, &r), 0);
	assert_int_equal(r.status, 204);
	hs_response_fini(&r);
}

/* ---- the tests ------------------------------------------------------------------- */

/* A lease on resource through s, asked for while another may hold it: 1 granted (its id in
 * id), 0 refused because it is held (409), -1 anything else (503 while failing over). */
static int try_hold(const hs_server *s, const char *resource, char *id, size_t n)
{
	char path[128];
	snprintf(path, sizeof path, "/resources/%s/leases", resource);
	hs_response r;
	int rc = -1;
	if (hs_post(s, path, "{\"holder\": \"t\", \"ttl_ms\": 60000}", &r) == 0)
		rc = r.status == 201 ? 1 : r.status == 409 ? 0 : -1;
	if (rc == 1)
		snprintf(id, n, "%s", hs_str(r.json, "id"));
	hs_response_fini(&r);
	return rc;
}

/* The primary crashes and its standby, caught up, is promoted under a cluster of two nodes
 * that names both servers: the same nodes, never restarted, serve again on the new primary:
 * one holder at a time, each token above the last, stored there. */
static void test_batond_follows_the_promoted_standby(void **state)
{
	pair *p = *state;
	if (!hs_store_is_pg())
		skip();
	hs_server *s = start_batond(p);
	static const char *const args[] = {"--lease-ms", "1000", "--node-id", "fo-2", NULL};
	p->node = hs_new(s, args);
	assert_non_null(p->node);
	assert_int_equal(hs_start(p->node), 0);
	char id[128], other[128];
	/* While the second node joins, the resource's partition may be on its way to it. */
	long long before = grant_eventually(s, "db", id, sizeof id);
	release_eventually(s, id);
	before = grant_eventually(p->node, "db", id, sizeof id);
	release_eventually(p->node, id);
	wait_caught_up(p);
	node_crash(&p->n[0]);
	node_promote(&p->n[1]);
	long long after = grant_eventually(s, "db", id, sizeof id);
	assert_true(after > before);
	/* Held through one node: the other grants nobody else. */
	int64_t deadline = hs_mono_ms() + WAIT_MS;
	int held;
	while ((held = try_hold(p->node, "db", other, sizeof other)) < 0 && hs_mono_ms() < deadline)
		hs_pause_ms(50);
	assert_int_equal(held, 0);
	assert_true(hs_alive(s));
	assert_true(hs_alive(p->node));
	assert_int_equal(node_value(&p->n[1], "SELECT last_token FROM resources WHERE name = 'db'"),
			 after);
	/* Reads, from the pool of connections, come from the new primary too. */
	deadline = hs_mono_ms() + WAIT_MS;
	for (;;) {
		hs_response r;
		long long seen = -1;
		if (hs_get(s, "/resources/db", &r) == 0 && r.status == 200)
			seen = hs_int(r.json, "last_fencing_token");
		hs_response_fini(&r);
		if (seen == after)
			break;
		if (hs_mono_ms() > deadline)
			fail_msg("GET /resources/db still shows token %lld, not %lld", seen, after);
		hs_pause_ms(50);
	}
	release_eventually(s, id);
	assert_true(grant_eventually(p->node, "db", id, sizeof id) > after);
	release_eventually(p->node, id);
}

/* Asynchronous replication loses the last acknowledged grants with the primary: the
 * standby is stopped, so that it misses them, then the primary crashes with batond and
 * the standby is promoted. Every token granted after that is above every token granted
 * before, acknowledged or lost, and none repeats. */
static void test_no_token_repeats_after_an_asynchronous_promotion(void **state)
{
	pair *p = *state;
	if (!hs_store_is_pg())
		skip();
	hs_server *s = start_batond(p);
	char id[128];
	for (int i = 0; i < 5; i++)
		release(s, (grant(s, "db", id, sizeof id), id));
	wait_caught_up(p);
	node_stop(&p->n[1]);
	long long acknowledged = 0;
	for (int i = 0; i < 5; i++) {
		acknowledged = grant(s, "db", id, sizeof id);
		release(s, id);
	}
	hs_kill(s);
	node_crash(&p->n[0]);
	assert_int_equal(node_start(&p->n[1]), 0);
	node_promote(&p->n[1]);
	/* The loss happened: the new primary knows fewer grants than were acknowledged. */
	long long stored =
	    node_value(&p->n[1], "SELECT last_token FROM resources WHERE name = 'db'");
	assert_true(stored >= 5);
	assert_true(stored < acknowledged);

	assert_int_equal(hs_start(s), 0);
	long long last = acknowledged;
	for (int i = 0; i < 5; i++) {
		long long t = grant_eventually(s, "db", id, sizeof id);
		if (t <= last)
			fail_msg("token %lld granted after %lld (highest acknowledged before the "
				 "promotion: %lld)",
				 t, last, acknowledged);
		assert_true(t < (1LL << 53));
		last = t;
		release(s, id);
	}
}

/* A task claimed, acknowledged and lost with the old primary: its step is granted again
 * on the new one, and its new worker works under a new token, never under the token the
 * first worker still holds. */
static void test_a_lost_claim_runs_again_under_a_new_token(void **state)
{
	pair *p = *state;
	if (!hs_store_is_pg())
		skip();
	hs_server *s = start_batond(p);
	char lease[128];
	grant(s, "q", lease, sizeof lease);
	json_decref(
	    hs_create_workflow(s, json_pack("{s:s, s:s, s:[{s:s, s:b}]}", "id", "w1", "resource",
					    "q", "workers", "name", "ext", "external", 1)));
	wait_caught_up(p);
	node_stop(&p->n[1]);
	release(s, lease);
	long long first = try_claim(s, 30000);
	assert_true(first > 0);
	hs_kill(s);
	node_crash(&p->n[0]);
	assert_int_equal(node_start(&p->n[1]), 0);
	node_promote(&p->n[1]);
	/* The loss happened: the grant of the claimed step is not on the new primary. */
	assert_true(node_value(&p->n[1], "SELECT last_token FROM resources WHERE name = 'q'") <
		    first);

	assert_int_equal(hs_start(s), 0);
	release_eventually(s, lease);
	int64_t deadline = hs_mono_ms() + WAIT_MS;
	long long again;
	while ((again = try_claim(s, 1000)) < 0) {
		if (hs_mono_ms() > deadline)
			fail_msg("the step of w1 was not offered again within %d ms", WAIT_MS);
		hs_pause_ms(50);
	}
	if (again <= first)
		fail_msg("the step runs again under token %lld, its lost claim had %lld", again,
			 first);
}

/* ---- a synchronous standby ------------------------------------------------------ */

/* A lease request sent on a thread of its own: its answer, and when it came. */
typedef struct posted {
	const hs_server *s;
	long status; /* 0: no answer (the client's timeout) */
	long long token;
	int done; /* under mu */
	pthread_mutex_t mu;
} posted;

static void *post_lease(void *arg)
{
	posted *p = arg;
	hs_response r;
	long status = 0;
	long long token = -1;
	if (hs_post(p->s, "/resources/db/leases",
		    "{\"holder\": \"t\", \"ttl_ms\": 60000, \"request_id\": \"sync-1\"}",
		    &r) == 0) {
		status = r.status;
		if (r.status == 201 || r.status == 200)
			token = hs_int(r.json, "fencing_token");
	}
	hs_response_fini(&r);
	pthread_mutex_lock(&p->mu);
	p->status = status;
	p->token = token;
	p->done = 1;
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

static int is_done(posted *p)
{
	pthread_mutex_lock(&p->mu);
	int d = p->done;
	pthread_mutex_unlock(&p->mu);
	return d;
}

/* The pid of a batond session writing a round (not a node's lease: its statements name
 * the nodes table) that waits for the synchronous standby, other than `not`; 0. */
static long long sync_waiter(const pair *p, long long not )
{
	char sql[256];
	snprintf(sql, sizeof sql,
		 "SELECT coalesce(max(pid), 0) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
		 " AND application_name = 'batond' AND query NOT LIKE '%%nodes%%' AND pid <> %lld",
		 not );
	return node_value(&p->n[0], sql);
}

/* With its synchronous standby down, a commit waits; when that wait is cancelled
 * (pg_cancel_backend, as a statement timeout or an HA tool would), PostgreSQL commits on
 * the primary only and merely warns. batond answers nothing as done then: it drops the
 * session, writes the round again on a new one (which waits for the standby again), and
 * answers once the standby has it; the same request_id posted again gets that outcome. */
static void test_a_cancelled_synchronous_commit_is_no_success(void **state)
{
	pair *p = *state;
	if (!hs_store_is_pg())
		skip();
	assert_int_equal(node_sql(&p->n[0], "ALTER SYSTEM SET synchronous_standby_names = '*'"), 0);
	assert_int_equal(node_sql(&p->n[0], "SELECT pg_reload_conf()"), 0);
	int64_t deadline = hs_mono_ms() + WAIT_MS;
	while (node_value(&p->n[0], "SELECT count(*) FROM pg_stat_replication"
				    " WHERE sync_state = 'sync'") != 1) {
		if (hs_mono_ms() > deadline)
			fail_msg("the standby did not become synchronous within %d ms", WAIT_MS);
		hs_pause_ms(20);
	}
	hs_server *s = start_batond(p);
	char id[128];
	long long before = grant(s, "db", id, sizeof id);
	release(s, id);
	node_stop(&p->n[1]);

	posted req = {.s = s, .mu = PTHREAD_MUTEX_INITIALIZER};
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, post_lease, &req), 0);
	long long waiting = 0;
	deadline = hs_mono_ms() + WAIT_MS;
	while (!(waiting = sync_waiter(p, 0)) && hs_mono_ms() < deadline)
		hs_pause_ms(20);
	if (!waiting) {
		pthread_join(t, NULL);
		fail_msg("no commit of batond waited for the synchronous standby");
	}
	char sql[96];
	snprintf(sql, sizeof sql, "SELECT pg_cancel_backend(%lld)::int", waiting);
	assert_int_equal(node_value(&p->n[0], sql), 1);
	/* Either batond answers now, or it writes the round again on a new session, which
	 * waits for the standby again: then it must not have answered. */
	while (!is_done(&req) && !sync_waiter(p, waiting) && hs_mono_ms() < deadline)
		hs_pause_ms(20);
	int answered_early = is_done(&req) && req.status == 201;
	assert_int_equal(node_start(&p->n[1]), 0);
	pthread_join(t, NULL);
	if (answered_early)
		fail_msg("a commit only on the primary was answered as granted (token %lld)",
			 req.token);
	/* Answered once the standby had it, or not before the client gave up: the same
	 * request_id gets the real outcome. */
	assert_true(req.status == 201 || req.status == 0 || req.status == 503);
	posted again = {.s = s, .mu = PTHREAD_MUTEX_INITIALIZER};
	deadline = hs_mono_ms() + WAIT_MS;
	do {
		again.done = 0;
		post_lease(&again);
	} while (again.status != 200 && hs_mono_ms() < deadline && (hs_pause_ms(50), 1));
	assert_int_equal(again.status, 200); /* the lease of that request, found again */
	assert_true(again.token > before);
	if (req.status == 201)
		assert_int_equal(again.token, req.token);
}

/* Makes the standby of p synchronous (synchronous_standby_names = '*', by a reload) and
 * waits until the primary counts it as such. */
static void make_synchronous(pair *p)
{
	assert_int_equal(node_sql(&p->n[0], "ALTER SYSTEM SET synchronous_standby_names = '*'"), 0);
	assert_int_equal(node_sql(&p->n[0], "SELECT pg_reload_conf()"), 0);
	int64_t deadline = hs_mono_ms() + WAIT_MS;
	while (node_value(&p->n[0], "SELECT count(*) FROM pg_stat_replication"
				    " WHERE sync_state = 'sync'") != 1) {
		if (hs_mono_ms() > deadline)
			fail_msg("the standby did not become synchronous within %d ms", WAIT_MS);
		hs_pause_ms(20);
	}
}

/* An acquire of resource's lease with request_id: its status (0: no answer within the
 * client's timeout); its token and id (200, 201); whether a 503 said when to come back. */
static long acquire_as(const hs_server *s, const char *resource, const char *request_id,
		       long long *token, char id[128], int *retry_after)
{
	char path[128], body[160];
	snprintf(path, sizeof path, "/resources/%s/leases", resource);
	snprintf(body, sizeof body,
		 "{\"holder\": \"t\", \"ttl_ms\": 600000, \"request_id\": \"%s\"}", request_id);
	hs_response r;
	long status = 0;
	*token = -1;
	*retry_after = 0;
	if (hs_post(s, path, body, &r) == 0) {
		status = r.status;
		if (status == 200 || status == 201) {
			*token = hs_int(r.json, "fencing_token");
			snprintf(id, 128, "%s", hs_str(r.json, "id"));
		}
		*retry_after = r.retry_after && atoi(r.retry_after) > 0;
	}
	hs_response_fini(&r);
	return status;
}

/* With the synchronous standby down, a grant's commit waits for it: batond answers 503 with
 * Retry-After once --commit-timeout has passed (well before the client's own timeout),
 * never success. Once the standby is back, the grant lands: the same request_id asked
 * again gets that lease; a 503-answered grant whose caller never comes back is released
 * within its grace, so that nobody holds what nobody was told it holds. The first grant,
 * which takes a block of ids, and a batond's start-up commit too are given up in time. */
static void test_a_commit_waiting_for_the_standby_is_answered_503(void **state)
{
	pair *p = *state;
	if (!hs_store_is_pg())
		skip();
	make_synchronous(p);
	static const char *const more[] = {"--commit-timeout-ms", "1000", NULL};
	hs_server *s = start_batond_with(p, more);
	char id[128];
	long long token;
	int retry_after;
	/* Nothing is numbered yet: the grant needs a block of ids first, whose allocation
	 * commits too, and is answered 503 within the bound as well. */
	node_stop(&p->n[1]);
	long status = acquire_as(s, "db", "sync-0", &token, id, &retry_after);
	if (status != 503 || !retry_after)
		fail_msg("with the synchronous standby down, the first grant was answered %ld%s",
			 status, status == 503 ? " without Retry-After" : "");
	/* A batond started now cannot record what it must at start-up: it exits, saying so. */
	char url[256], out[4096];
	snprintf(url, sizeof url,
		 "postgresql://postgres@127.0.0.1:%d,127.0.0.1:%d/baton"
		 "?target_session_attrs=read-write",
		 p->n[0].port, p->n[1].port);
	const char *args[] = {"--listen", "127.0.0.1:0",	 "--db", url, "--node-id",
			      "fo-2",	  "--commit-timeout-ms", "500",	 NULL};
	int st = hs_run_batond(args, NULL, NULL, 30000, out, sizeof out);
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 1 || !strstr(out, "not confirm"))
		fail_msg("a batond started with the synchronous standby down did not exit saying"
			 " that the database did not confirm its commit (wait status %d): %s",
			 st, out);
	assert_int_equal(node_start(&p->n[1]), 0);
	long long before = grant_eventually(s, "db", id, sizeof id);
	release(s, id);
	for (int round = 0; round < 2; round++) {
		node_stop(&p->n[1]);
		const char *rid = round == 0 ? "sync-1" : "sync-2";
		status = acquire_as(s, "db", rid, &token, id, &retry_after);
		if (status != 503 || !retry_after)
			fail_msg("with the synchronous standby down, %s was answered %ld%s", rid,
				 status, status == 503 ? " without Retry-After" : "");
		assert_int_equal(node_start(&p->n[1]), 0);
		if (round == 1)
			break;
		/* The same request_id, retried, gets the lease once its grant is durable. */
		int64_t deadline = hs_mono_ms() + WAIT_MS;
		while ((status = acquire_as(s, "db", rid, &token, id, &retry_after)) == 503 &&
		       hs_mono_ms() < deadline)
			hs_pause_ms(100);
		assert_int_equal(status, 200);
		assert_true(token > before);
		before = token;
		release_eventually(s, id);
	}
	/* Nobody came back for sync-2: its grant, if it landed, ends within its grace. */
	assert_true(grant_eventually(s, "db", id, sizeof id) > before);
	release(s, id);
}

/* With a synchronous standby, a promotion loses nothing that batond acknowledged. Acknowledged
 * while the standby streams: grants and releases on "db" (their tokens), a lease still held on
 * "held", a workflow submitted. Then the standby stops and one more grant is asked for, which
 * a correct batond cannot acknowledge (its commit waits for the standby: 503 after
 * --commit-timeout-ms) but a batond that committed locally would; the primary crashes, and
 * the standby, which never saw that grant, is promoted. Asserted first that something was
 * acknowledged, then that the new primary has all of it: the token of every grant answered
 * (the last one included, if it was answered), the lease still held, the workflow. */
static void test_nothing_acknowledged_is_lost_in_a_synchronous_promotion(void **state)
{
	pair *p = *state;
	if (!hs_store_is_pg())
		skip();
	make_synchronous(p);
	static const char *const more[] = {"--commit-timeout-ms", "1000", NULL};
	hs_server *s = start_batond_with(p, more);
	char id[128], held[128];
	long long last = 0;
	for (int i = 0; i < 5; i++) {
		last = grant(s, "db", id, sizeof id);
		release(s, id);
	}
	long long held_token = grant(s, "held", held, sizeof held);
	hs_response r;
	assert_int_equal(hs_post(s, "/workflows",
				 "{\"id\": \"sync-wf\", \"resource\": \"sync-w\", \"workers\":"
				 " [{\"name\": \"w\", \"external\": true}]}",
				 &r),
			 0);
	long submitted = r.status;
	hs_response_fini(&r);
	assert_int_equal(submitted, 201);
	assert_true(last > 0 && held_token > 0); /* all of it acknowledged */
	node_stop(&p->n[1]);
	long long token = 0;
	int retry_after;
	long late = acquire_as(s, "db", "sync-late", &token, id, &retry_after);
	if (late == 200 || late == 201)
		last = token; /* acknowledged: it must survive too */
	node_crash(&p->n[0]);
	assert_int_equal(node_start(&p->n[1]), 0);
	node_promote(&p->n[1]);
	long long stored =
	    node_value(&p->n[1], "SELECT last_token FROM resources WHERE name = 'db'");
	if (stored < last)
		fail_msg("the new primary's last token of db is %lld, below %lld, acknowledged"
			 " (the grant asked for with the standby down was answered %ld)",
			 stored, last, late);
	assert_int_equal(
	    node_value(&p->n[1], "SELECT last_token FROM resources WHERE name = 'held'"),
	    held_token);
	assert_int_equal(
	    node_value(&p->n[1], "SELECT count(*) FROM workflows WHERE id = 'sync-wf'"), 1);
	/* batond follows the promotion; the lease it acknowledged still holds "held". */
	int64_t deadline = hs_mono_ms() + WAIT_MS;
	long status = 0;
	for (;;) {
		char path[160];
		snprintf(path, sizeof path, "/leases/%s", held);
		if (hs_get(s, path, &r) == 0)
			status = r.status;
		const char *st = status == 200 ? hs_str(r.json, "state") : NULL;
		int ok = st && strcmp(st, "held") == 0;
		hs_response_fini(&r);
		if (ok)
			break;
		if (hs_mono_ms() > deadline)
			fail_msg("lease %s, acknowledged as held, is not held after the promotion"
				 " (HTTP %ld)",
				 held, status);
		hs_pause_ms(50);
	}
	char other[128];
	int got;
	deadline = hs_mono_ms() + WAIT_MS;
	while ((got = try_hold(s, "held", other, sizeof other)) < 0 && hs_mono_ms() < deadline)
		hs_pause_ms(50);
	assert_int_equal(got, 0);
	assert_true(grant_eventually(s, "db", id, sizeof id) > last);
	release(s, id);
}

/* What batond says of its commits' replication: /metrics' baton_store_sync_replication
 * (-1 when absent), and GET /nodes' store.sync_replication (1, 0, -1 null or absent). */
static void sync_shown(const hs_server *s, int *metric, int *nodes)
{
	hs_response r;
	*metric = *nodes = -1;
	if (hs_get(s, "/metrics", &r) == 0 && r.status == 200 && r.body) {
		const char *at = strstr(r.body, "\nbaton_store_sync_replication ");
		if (at)
			*metric = atoi(at + strlen("\nbaton_store_sync_replication "));
	}
	hs_response_fini(&r);
	if (hs_get(s, "/nodes", &r) == 0 && r.status == 200) {
		json_t *v = json_object_get(json_object_get(r.json, "store"), "sync_replication");
		*nodes = json_is_boolean(v) ? json_is_true(v) : -1;
	}
	hs_response_fini(&r);
}

/* Waits until both /metrics and GET /nodes say `want`. */
static void wait_sync_shown(const hs_server *s, int want)
{
	int64_t deadline = hs_mono_ms() + WAIT_MS;
	int metric, nodes;
	for (sync_shown(s, &metric, &nodes); metric != want || nodes != want;
	     sync_shown(s, &metric, &nodes)) {
		if (hs_mono_ms() > deadline)
			fail_msg("batond shows synchronous replication as %d (/metrics) and %d "
				 "(/nodes), not %d",
				 metric, nodes, want);
		hs_pause_ms(100);
	}
}

/* Turns synchronous replication off or on by a reload, as Patroni's non-strict mode does,
 * and waits until a new session sees it. */
static void set_sync_names(pair *p, const char *names)
{
	char sql[128];
	snprintf(sql, sizeof sql, "ALTER SYSTEM SET synchronous_standby_names = '%s'", names);
	assert_int_equal(node_sql(&p->n[0], sql), 0);
	assert_int_equal(node_sql(&p->n[0], "SELECT pg_reload_conf()"), 0);
	snprintf(sql, sizeof sql,
		 "SELECT (current_setting('synchronous_standby_names') = '%s')::int", names);
	int64_t deadline = hs_mono_ms() + WAIT_MS;
	while (node_value(&p->n[0], sql) != 1) {
		if (hs_mono_ms() > deadline)
			fail_msg("synchronous_standby_names did not become '%s'", names);
		hs_pause_ms(20);
	}
}

/* batond reads whether its commits are replicated synchronously, and shows it in /metrics
 * and GET /nodes; a reload that turns it off is seen without a reconnect. With
 * --require-sync-replication, a grant while it is off is answered 503 with Retry-After
 * and a detail that says why, and nothing of it is stored; once it is on again, grants
 * succeed. */
static void test_sync_replication_is_shown_and_required(void **state)
{
	pair *p = *state;
	if (!hs_store_is_pg())
		skip();
	make_synchronous(p);
	static const char *const more[] = {"--require-sync-replication", NULL};
	hs_server *s = start_batond_with(p, more);
	wait_sync_shown(s, 1);
	char id[128];
	long long before = grant(s, "db", id, sizeof id), token;
	release(s, id);

	set_sync_names(p, "");
	wait_sync_shown(s, 0);
	hs_response r;
	assert_int_equal(
	    hs_post(s, "/resources/db/leases",
		    "{\"holder\": \"t\", \"ttl_ms\": 60000, \"request_id\": \"off-1\"}", &r),
	    0);
	const char *detail = json_string_value(json_object_get(r.json, "detail"));
	if (r.status != 503 || !r.retry_after || !detail ||
	    !strstr(detail, "synchronous replication is off"))
		fail_msg("with synchronous replication off, a grant was answered %d: %s",
			 (int)r.status, r.body ? r.body : "");
	hs_response_fini(&r);
	assert_int_equal(node_value(&p->n[0], "SELECT last_token FROM resources WHERE name = 'db'"),
			 before);
	assert_int_equal(
	    node_value(&p->n[0], "SELECT count(*) FROM steps WHERE status = 'running'"), 0);

	set_sync_names(p, "*");
	wait_sync_shown(s, 1);
	token = grant_eventually(s, "db", id, sizeof id);
	assert_true(token > before);
	release(s, id);
}

/* A database of another PostgreSQL cluster (a dump restored, pg_upgrade): batond refuses
 * it, naming both system identifiers, until the operator accepts the new one; tokens then
 * continue above every one stored, and later starts need nothing more. */
static void test_another_system_identifier_is_refused_until_accepted(void **state)
{
	hs_server *s = *state;
	if (!s)
		skip();
	char id[128];
	long long before = 0;
	for (int i = 0; i < 3; i++) {
		before = grant(s, "db", id, sizeof id);
		release(s, id);
	}
	assert_int_equal(hs_stop(s), 0);
	char now[32];
	snprintf(now, sizeof now, "%lld",
		 pg_db_count(hs_db_url(s), "SELECT system_identifier FROM pg_control_system()"));
	/* As a dump restored into another cluster carries it: not this cluster's identifier. */
	assert_int_equal(
	    pg_db_count(hs_db_url(s),
			"WITH u AS (INSERT INTO baton_meta VALUES ('system_identifier',"
			" 4242) ON CONFLICT (key) DO UPDATE SET value = 4242 RETURNING 1)"
			" SELECT count(*) FROM u"),
	    1);
	char out[4096];
	const char *args[] = {"--listen", "127.0.0.1:0", "--db", hs_db_url(s), NULL};
	int st = hs_run_batond(args, NULL, NULL, 30000, out, sizeof out);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
	char says[128];
	snprintf(says, sizeof says, "system_identifier %s, but baton recorded 4242", now);
	if (!strstr(out, says))
		fail_msg("batond's refusal does not say \"%s\": %s", says, out);
	snprintf(says, sizeof says, "--accept-system-identifier %s", now);
	assert_non_null(strstr(out, says));

	const char *accept[] = {"--accept-system-identifier", now, NULL};
	assert_int_equal(hs_set_args(s, accept), 0);
	assert_int_equal(hs_start(s), 0);
	long long after = grant(s, "db", id, sizeof id);
	if (after <= before || after < (1LL << 40) || after >= (1LL << 53))
		fail_msg("token %lld after the new generation began (%lld before)", after, before);
	release(s, id);
	assert_int_equal(hs_stop(s), 0);
	assert_int_equal(hs_set_args(s, NULL), 0);
	assert_int_equal(hs_start(s), 0);
	assert_true(grant(s, "db", id, sizeof id) > after);
	release(s, id);
}

static int pg_server_setup(void **state)
{
	*state = NULL;
	return hs_store_is_pg() ? hs_setup(state) : 0;
}

static int pg_server_teardown(void **state)
{
	return *state ? hs_teardown(state) : 0;
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_batond_follows_the_promoted_standby, pair_setup,
					    pair_teardown),
	    cmocka_unit_test_setup_teardown(test_no_token_repeats_after_an_asynchronous_promotion,
					    pair_setup, pair_teardown),
	    cmocka_unit_test_setup_teardown(test_a_lost_claim_runs_again_under_a_new_token,
					    pair_setup, pair_teardown),
	    cmocka_unit_test_setup_teardown(test_a_cancelled_synchronous_commit_is_no_success,
					    pair_setup, pair_teardown),
	    cmocka_unit_test_setup_teardown(test_a_commit_waiting_for_the_standby_is_answered_503,
					    pair_setup, pair_teardown),
	    cmocka_unit_test_setup_teardown(
		test_nothing_acknowledged_is_lost_in_a_synchronous_promotion, pair_setup,
		pair_teardown),
	    cmocka_unit_test_setup_teardown(test_sync_replication_is_shown_and_required, pair_setup,
					    pair_teardown),
	    cmocka_unit_test_setup_teardown(
		test_another_system_identifier_is_refused_until_accepted, pg_server_setup,
		pg_server_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
