/*
 * test_retries.c - a retried lease request against the real batond, at the racing points.
 *
 * A client that lost an answer asks again with the same request_id. What its first attempt
 * set off (the give-back of a grant that could not be delivered, a grant whose commit
 * fails) then races the retry. Over plain HTTP those races happen only sometimes, so these
 * tests hold the engine where they race, through the engine's testing seam (lib/seam.c:
 * BATON_TEST_HOLD_FILE names the point, and the engine lists what waits there), and let it
 * go on once exactly the messages of the race wait, in their order. Then:
 *  - the give-back of a first attempt's grant does nothing once the retry arrived, on one
 *    node and through a node that passes both on (a cluster, on PostgreSQL);
 *  - a grant the owner wrote to a node that passed the acquire on, whose client left
 *    meanwhile, is given back, not held for nobody until its ttl; a claim passed on so,
 *    likewise;
 *  - a retry that arrives in the round of the grant is answered once the grant is durable,
 *    and told 503 with it when its commit fails;
 *  - a renewal that arrives after its lease expired answers 410, in the expiry's round too;
 *  - a grant that nobody took is released within seconds, across a kill -9;
 *  - baton worker asks a claim whose answer was lost again with its request_id, and gets
 *    the same claim.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../harness/client.h"
#include "../harness/cluster.h"
#include "../harness/harness.h"

#define WAIT_MS 60000

typedef struct fixture {
	hs_server *s;
	char dir[512], hold[600], fault[600], held[620];
} fixture;

static int setup(void **state)
{
	fixture *f = calloc(1, sizeof *f);
	const char *tmp = getenv("TMPDIR");
	if (!f)
		return -1;
	snprintf(f->dir, sizeof f->dir, "%s/baton-retries-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(f->dir)) {
		free(f);
		return -1;
	}
	snprintf(f->hold, sizeof f->hold, "%s/hold", f->dir);
	snprintf(f->held, sizeof f->held, "%s/hold.held", f->dir);
	snprintf(f->fault, sizeof f->fault, "%s/fail-writes", f->dir);
	/* kept for the restarts of the same test (hs_start) */
	setenv("BATON_TEST_HOLD_FILE", f->hold, 1);
	setenv("BATON_TEST_FAULT_FILE", f->fault, 1);
	f->s = hs_open(NULL);
	if (!f->s) {
		rmdir(f->dir);
		free(f);
		return -1;
	}
	*state = f;
	return 0;
}

/* Two nodes on PostgreSQL: node0, held by the seam, drives the resource; node1 passes the
 * requests it gets on to node0. *state is a fixture whose s is NULL and whose cluster is
 * in cl. */
typedef struct cfixture {
	fixture f;
	cluster cl;
} cfixture;

static int cluster_setup(void **state)
{
	cfixture *c = calloc(1, sizeof *c);
	if (!c)
		return -1;
	*state = c;
	if (!hs_store_is_pg())
		return 0; /* the test skips */
	const char *tmp = getenv("TMPDIR");
	snprintf(c->f.dir, sizeof c->f.dir, "%s/baton-retries-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(c->f.dir))
		return -1;
	snprintf(c->f.hold, sizeof c->f.hold, "%s/hold", c->f.dir);
	snprintf(c->f.held, sizeof c->f.held, "%s/hold.held", c->f.dir);
	const char *holds[] = {c->f.hold, ""}; /* "": node1 has no seam */
	if (cl_open_proxied_env(&c->cl, 2, 3000, NULL, "BATON_TEST_HOLD_FILE", holds)) {
		rmdir(c->f.dir);
		c->f.dir[0] = 0;
		return -1;
	}
	return 0;
}

static int cluster_teardown(void **state)
{
	cfixture *c = *state;
	int rc = 0;
	if (c->f.dir[0]) {
		if (getenv("DEBUG_DUMP")) {
			hs_dump_log(c->cl.node[0], 6000);
			hs_dump_log(c->cl.node[1], 6000);
		}
		unlink(c->f.hold);
		rc = cl_close(&c->cl);
		unlink(c->f.held);
		rmdir(c->f.dir);
	}
	free(c);
	return rc;
}

static int teardown(void **state)
{
	fixture *f = *state;
	unlink(f->hold);
	unlink(f->fault);
	int rc = hs_close(f->s);
	unlink(f->held);
	rmdir(f->dir);
	unsetenv("BATON_TEST_HOLD_FILE");
	unsetenv("BATON_TEST_FAULT_FILE");
	client_free_all();
	free(f);
	return rc;
}

/* ---- the seam ---- */

static void write_file(const char *path, const char *text)
{
	char tmp[700];
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	FILE *fp = fopen(tmp, "w");
	assert_non_null(fp);
	fputs(text, fp);
	fclose(fp);
	assert_int_equal(rename(tmp, path), 0);
}

typedef struct held_wait {
	const fixture *f;
	const char *point, *line;
} held_wait;

/* The engine waits at the point, and (line not NULL) that message waits there. */
static bool holds(void *arg)
{
	const held_wait *h = arg;
	char text[8192] = "";
	FILE *fp = fopen(h->f->held, "r");
	if (!fp)
		return false;
	size_t n = fread(text, 1, sizeof text - 1, fp);
	fclose(fp);
	text[n] = 0;
	size_t len = strlen(h->point);
	if (strncmp(text, h->point, len) != 0 || text[len] != '\n')
		return false;
	if (!h->line)
		return true;
	char want[256];
	snprintf(want, sizeof want, "\n%s\n", h->line);
	return strstr(text, want) != NULL;
}

static void hold_wait(const fixture *f, const char *point, const char *line)
{
	held_wait h = {f, point, line};
	if (hs_wait_until(holds, &h, WAIT_MS))
		return;
	char text[4096] = "";
	FILE *fp = fopen(f->held, "r");
	if (fp) {
		text[fread(text, 1, sizeof text - 1, fp)] = 0;
		fclose(fp);
	}
	fail_msg("the engine never held at \"%s\" with \"%s\"; it held with:\n%s", point,
		 line ? line : "", text);
}

/* ---- raw connections: the test decides when a client goes away ---- */

static int raw_send(const hs_server *s, const char *method, const char *path, const char *body)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	struct timeval tv = {WAIT_MS / 1000, 0};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)hs_port(s))};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
	char req[2048];
	int n = snprintf(req, sizeof req,
			 "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
			 "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
			 method, path, body ? strlen(body) : 0, body ? body : "");
	assert_int_equal(write(fd, req, (size_t)n), n);
	return fd;
}

/* Reads the whole answer; its status (0: none), *out its JSON body (or NULL). */
static long raw_read(int fd, json_t **out)
{
	static char resp[65536];
	size_t len = 0;
	ssize_t got;
	while (len < sizeof resp - 1 && (got = read(fd, resp + len, sizeof resp - 1 - len)) > 0)
		len += (size_t)got;
	resp[len] = 0;
	close(fd);
	long status = 0;
	if (sscanf(resp, "HTTP/1.1 %ld", &status) != 1)
		status = 0;
	const char *b = strstr(resp, "\r\n\r\n");
	json_t *j = b ? json_loads(b + 4, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
	if (out)
		*out = j;
	else
		json_decref(j);
	return status;
}

/* The connection is reset, as a client that crashes or a network that fails does. */
static void raw_reset(int fd)
{
	struct linger lg = {1, 0};
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
	close(fd);
}

/* ---- requests ---- */

static json_t *acquire_ok(const hs_server *s, const char *body)
{
	hs_response r;
	if (hs_post(s, "/resources/r/leases", body, &r) != 0)
		fail_msg("POST: %s", r.error);
	if (r.status != 201)
		fail_msg("lease answered %ld: %s", r.status, r.body ? r.body : "");
	json_t *j = json_incref(r.json);
	hs_response_fini(&r);
	return j;
}

static json_t *lease_get(const hs_server *s, const char *id)
{
	char path[256];
	snprintf(path, sizeof path, "/leases/%s", id);
	return hs_get_json(s, path, 200);
}

typedef struct queue_wait {
	const hs_server *s;
	size_t n;
	const char *resource; /* NULL: r */
} queue_wait;

static bool has_waiters(void *arg)
{
	queue_wait *q = arg;
	char path[200];
	snprintf(path, sizeof path, "/resources/%s", q->resource ? q->resource : "r");
	json_t *r = hs_get_json(q->s, path, 200);
	bool ok = json_array_size(json_object_get(r, "waiters")) == q->n;
	json_decref(r);
	return ok;
}

static void wait_waiters_on(const hs_server *s, const char *resource, size_t n)
{
	queue_wait q = {s, n, resource};
	if (!hs_wait_until(has_waiters, &q, WAIT_MS))
		fail_msg("resource %s never had %zu waiters", resource ? resource : "r", n);
}

static void wait_waiters(const hs_server *s, size_t n)
{
	wait_waiters_on(s, NULL, n);
}

static bool past(void *arg)
{
	return hs_now_ms() > *(int64_t *)arg;
}

/* ---- tests ---- */

/* Item: a retry races the give-back of its own first grant. The first attempt is granted,
 * its connection is reset before the answer, and the retry arrives before the give-back
 * that the failed answer sets off: the retry is told it holds the lease, and it does. */
static void test_give_back_does_nothing_once_the_retry_arrived(void **state)
{
	fixture *f = *state;
	const hs_server *s = f->s;
	json_t *a = acquire_ok(s, "{\"holder\": \"a\", \"ttl_ms\": 60000}");
	const char *x = "{\"holder\": \"x\", \"request_id\": \"x-1\", \"wait_ms\": 60000,"
			" \"ttl_ms\": 60000}";
	int x1 = raw_send(s, "POST", "/resources/r/leases", x);
	wait_waiters(s, 1);
	int y = raw_send(s, "POST", "/resources/r/leases",
			 "{\"holder\": \"y\", \"wait_ms\": 60000, \"ttl_ms\": 60000}");
	wait_waiters(s, 2);
	/* a's release grants x-1: held once committed, before anybody is answered */
	write_file(f->hold, "answers");
	char path[128];
	snprintf(path, sizeof path, "/leases/%s", hs_str(a, "id"));
	int d = raw_send(s, "DELETE", path, NULL);
	hold_wait(f, "answers", NULL);
	raw_reset(x1); /* the grant's answer cannot be delivered */
	int x2 = raw_send(s, "POST", "/resources/r/leases", x);
	hold_wait(f, "answers", "acquire lease-x-1");
	/* the retry waits in the engine's inbox, ahead of the give-back that follows */
	write_file(f->hold, "round");
	hold_wait(f, "round", "undelivered lease-x-1");
	unlink(f->hold);
	json_t *got;
	assert_int_equal(raw_read(x2, &got), 200);
	assert_string_equal(hs_str(got, "id"), "lease-x-1");
	assert_string_equal(hs_str(got, "state"), "held");
	assert_int_equal(raw_read(d, NULL), 204);
	/* the give-back came after the retry: x-1 still holds r, y still waits */
	json_t *l = lease_get(s, "lease-x-1");
	assert_string_equal(hs_str(l, "state"), "held");
	json_decref(l);
	assert_int_equal(hs_int(got, "attempt"), 2); /* its give-back would name it */
	json_decref(got);
	wait_waiters(s, 1);
	/* a give-back of the first attempt, as another node passes it on, changes nothing */
	hs_request give = {.method = "DELETE", .path = "/leases/lease-x-1?attempt=1"};
	hs_response r;
	assert_int_equal(hs_send(s, &give, &r), 0);
	hs_assert_problem(&r, 409, "conflict", "a give-back after a later attempt");
	hs_response_fini(&r);
	hs_request bad = {.method = "DELETE", .path = "/leases/lease-x-1?attempt=0"};
	assert_int_equal(hs_send(s, &bad, &r), 0);
	hs_assert_problem(&r, 400, "invalid-request", "a give-back of attempt 0");
	hs_response_fini(&r);
	l = lease_get(s, "lease-x-1");
	assert_string_equal(hs_str(l, "state"), "held");
	json_decref(l);
	/* x releases: y is granted, after it */
	hs_request rel = {.method = "DELETE", .path = "/leases/lease-x-1"};
	assert_int_equal(hs_send(s, &rel, &r), 0);
	assert_int_equal(r.status, 204);
	hs_response_fini(&r);
	assert_int_equal(raw_read(y, &got), 201);
	assert_int_equal(hs_int(got, "fencing_token"), 3);
	json_decref(got);
	json_decref(a);
}

/* The same race through a node that passes the requests on: the client asks node1, which
 * passes its acquisition and its retry on to node0, which drives the resource; the
 * give-back of the first attempt's grant comes through node1 too, as node1 sends it when it
 * cannot deliver a grant (DELETE ?attempt=1, passed on with its attempt). The retry arrives
 * at node0 first: it keeps the lease, and the give-back changes nothing. */
static void test_give_back_through_another_node(void **state)
{
	cfixture *c = *state;
	if (!hs_store_is_pg())
		skip(); /* a cluster runs on PostgreSQL */
	fixture *f = &c->f;
	const hs_server *owner = c->cl.node[0], *via = c->cl.node[1];
	assert_true(cl_wait_balanced(&c->cl, 0, 3, WAIT_MS));
	char res[64], path[200];
	unsigned long long avoid = 0;
	cl_pick_resource(&c->cl, 0, "retry", &avoid, res, sizeof res);
	snprintf(path, sizeof path, "/resources/%s/leases", res);
	hs_response r;
	assert_int_equal(hs_post(owner, path, "{\"holder\": \"a\", \"ttl_ms\": 60000}", &r), 0);
	assert_int_equal(r.status, 201);
	char release[128];
	snprintf(release, sizeof release, "/leases/%s", hs_str(r.json, "id"));
	hs_response_fini(&r);
	const char *x = "{\"holder\": \"x\", \"request_id\": \"xc-1\", \"wait_ms\": 60000,"
			" \"ttl_ms\": 60000}";
	int x1 = raw_send(via, "POST", path, x);
	wait_waiters_on(owner, res, 1);
	int y = raw_send(owner, "POST", path,
			 "{\"holder\": \"y\", \"wait_ms\": 60000, \"ttl_ms\": 60000}");
	wait_waiters_on(owner, res, 2);
	/* a's release grants x's first attempt; its retry reaches node0 before any answer */
	write_file(f->hold, "answers");
	int d = raw_send(owner, "DELETE", release, NULL);
	hold_wait(f, "answers", NULL);
	int x2 = raw_send(via, "POST", path, x);
	hold_wait(f, "answers", "acquire lease-xc-1");
	write_file(f->hold, "round");
	hold_wait(f, "round", "acquire lease-xc-1");
	json_t *first, *got;
	assert_int_equal(raw_read(x1, &first), 201);
	/* then the give-back of the first attempt, through node1 */
	int g = raw_send(via, "DELETE", "/leases/lease-xc-1?attempt=1", NULL);
	hold_wait(f, "round", "undelivered lease-xc-1");
	unlink(f->hold);
	assert_int_equal(raw_read(x2, &got), 200);
	assert_string_equal(hs_str(got, "state"), "held");
	assert_int_equal(raw_read(d, NULL), 204);
	assert_int_equal(raw_read(g, NULL), 409);
	json_t *l = hs_get_json(owner, "/leases/lease-xc-1", 200);
	assert_string_equal(hs_str(l, "state"), "held");
	json_decref(l);
	assert_int_equal(hs_int(first, "attempt"), 1);
	assert_int_equal(hs_int(got, "attempt"), 2);
	json_decref(first);
	json_decref(got);
	wait_waiters_on(owner, res, 1);
	hs_request rel = {.method = "DELETE", .path = "/leases/lease-xc-1"};
	assert_int_equal(hs_send(via, &rel, &r), 0);
	assert_int_equal(r.status, 204);
	hs_response_fini(&r);
	assert_int_equal(raw_read(y, &got), 201);
	assert_int_equal(hs_int(got, "fencing_token"), 3);
	json_decref(got);
}

typedef struct granted_to {
	const hs_server *s;
	const char *path;
} granted_to;

/* An acquire that does not wait is granted (201); one refused changes nothing. */
static bool granted(void *arg)
{
	const granted_to *g = arg;
	hs_response r;
	bool ok = hs_post(g->s, g->path, "{\"holder\": \"y\", \"ttl_ms\": 60000}", &r) == 0 &&
		  r.status == 201;
	hs_response_fini(&r);
	return ok;
}

/* A grant passed on through node1 whose client left: node1 is stopped while its client
 * goes and node0 writes the grant, so node0 counts it as delivered; when node1 goes on,
 * it finds its client gone with the grant waiting to be read. It must read it and give it
 * back, naming its attempt, rather than cut the exchange and leave the lease held for
 * nobody until its ttl runs out. */
static void test_grant_through_another_node_for_a_client_gone(void **state)
{
	cfixture *c = *state;
	if (!hs_store_is_pg())
		skip(); /* a cluster runs on PostgreSQL */
	fixture *f = &c->f;
	const hs_server *owner = c->cl.node[0], *via = c->cl.node[1];
	assert_true(cl_wait_balanced(&c->cl, 0, 3, WAIT_MS));
	char res[64], path[200];
	unsigned long long avoid = 0;
	cl_pick_resource(&c->cl, 0, "gone", &avoid, res, sizeof res);
	snprintf(path, sizeof path, "/resources/%s/leases", res);
	hs_response r;
	assert_int_equal(hs_post(owner, path, "{\"holder\": \"a\", \"ttl_ms\": 60000}", &r), 0);
	assert_int_equal(r.status, 201);
	char release[128];
	snprintf(release, sizeof release, "/leases/%s", hs_str(r.json, "id"));
	hs_response_fini(&r);
	int x = raw_send(via, "POST", path,
			 "{\"holder\": \"x\", \"wait_ms\": 60000, \"ttl_ms\": 600000}");
	wait_waiters_on(owner, res, 1);
	write_file(f->hold, "answers");
	int d = raw_send(owner, "DELETE", release, NULL);
	hold_wait(f, "answers", NULL); /* x is granted; the answers wait */
	assert_int_equal(kill(hs_pid(via), SIGSTOP), 0);
	raw_reset(x);
	unlink(f->hold);
	int rd = raw_read(d, NULL);
	assert_int_equal(kill(hs_pid(via), SIGCONT), 0);
	assert_int_equal(rd, 204);
	/* the grant nobody took is given back, long before its ttl: y is granted */
	granted_to g = {owner, path};
	if (!hs_wait_until(granted, &g, 20000))
		fail_msg("%s stayed held for nobody", res);
}

typedef struct claimed_from {
	const hs_server *s;
	const char *body;
	json_t *task; /* the task claimed, once claimed */
} claimed_from;

/* A claim that does not wait is given a task (200); one answered 204 changes nothing. */
static bool claimed(void *arg)
{
	claimed_from *c = arg;
	hs_response r;
	bool ok = hs_post(c->s, "/tasks/claim", c->body, &r) == 0 && r.status == 200;
	if (ok)
		c->task = json_incref(r.json);
	hs_response_fini(&r);
	return ok;
}

/* Gives back task id's claim_attempt through s; its status. */
static long give_back_claim(const hs_server *s, const char *id, const char *body)
{
	char path[200];
	snprintf(path, sizeof path, "/tasks/%s/give-back", id);
	hs_response r;
	assert_int_equal(hs_post(s, path, body, &r), 0);
	long status = r.status;
	hs_response_fini(&r);
	return status;
}

/* A claim passed on through node1, granted by node0, whose worker left before the answer
 * reached it: node0 holds the answer until the worker's connection is reset, then answers
 * node1, which finds its worker gone. node1 gives the claim back at node0, naming its
 * claim_attempt, rather than leave the step claimed for nobody until its ttl runs out: a
 * claim that does not wait gets the task, long before the ttl of 60 s. */
static void test_claim_through_another_node_for_a_worker_gone(void **state)
{
	cfixture *c = *state;
	if (!hs_store_is_pg())
		skip(); /* a cluster runs on PostgreSQL */
	fixture *f = &c->f;
	const hs_server *owner = c->cl.node[0], *via = c->cl.node[1];
	assert_true(cl_wait_balanced(&c->cl, 0, 3, WAIT_MS));
	char res[64], body[256];
	unsigned long long avoid = 0;
	cl_pick_resource(&c->cl, 0, "claim", &avoid, res, sizeof res);
	json_decref(hs_create_workflow(owner, json_pack("{s:s, s:s, s:[{s:s, s:b}]}", "id",
							"far-job", "resource", res, "workers",
							"name", "ext", "external", 1)));
	json_decref(hs_wait_step(owner, "far-job", 0, "running", WAIT_MS));
	snprintf(body, sizeof body,
		 "{\"worker\": \"ext\", \"resource\": \"%s\", \"request_id\": \"far-1\","
		 " \"wait_ms\": 0, \"ttl_ms\": 60000}",
		 res);
	write_file(f->hold, "round");
	int w = raw_send(via, "POST", "/tasks/claim", body);
	hold_wait(f, "round", "claim far-1");
	write_file(f->hold, "answers");
	hold_wait(f, "answers", NULL); /* claimed and durable; its answer waits */
	raw_reset(w);
	unlink(f->hold);
	snprintf(body, sizeof body, "{\"resource\": \"%s\", \"wait_ms\": 0}", res);
	claimed_from again = {owner, body, NULL};
	if (!hs_wait_until(claimed, &again, 20000))
		fail_msg("far-job's step stayed claimed for a worker that had gone");
	assert_string_equal(hs_str(again.task, "id"), "far-job.0.1");
	assert_int_equal(hs_int(again.task, "claim_attempt"), 2);
	/* a give-back of the first claim, passed on by node1, leaves the second one alone */
	assert_int_equal(give_back_claim(via, "far-job.0.1", "{\"claim_attempt\": 1}"), 409);
	assert_int_equal(give_back_claim(via, "far-job.0.1", "{\"claim_attempt\": 0}"), 400);
	assert_int_equal(give_back_claim(via, "far-job.0.1", "{}"), 400);
	hs_response r;
	assert_int_equal(hs_post(owner, "/tasks/claim", body, &r), 0);
	assert_int_equal(r.status, 204);
	hs_response_fini(&r);
	/* the second one's own give-back offers the task again */
	assert_int_equal(give_back_claim(via, "far-job.0.1", "{\"claim_attempt\": 2}"), 204);
	assert_int_equal(give_back_claim(via, "far-job.0.1", "{\"claim_attempt\": 2}"), 409);
	assert_int_equal(give_back_claim(owner, "far-job.9.1", "{\"claim_attempt\": 1}"), 410);
	json_decref(again.task);
	again.task = NULL;
	assert_true(claimed(&again));
	assert_int_equal(hs_int(again.task, "claim_attempt"), 3);
	json_decref(again.task);
}

/* Item: "held" is promised only for a committed grant. The retry arrives in the round that
 * grants its lease, and that round's commit fails: the retry is told 503, as the first
 * attempt is, and the grant is given back. */
static void test_retry_waits_for_the_grants_commit(void **state)
{
	fixture *f = *state;
	const hs_server *s = f->s;
	if (hs_store_is_pg())
		skip(); /* the writes fail through SQLite's VFS (lib/vfs.c) */
	json_t *a = acquire_ok(s, "{\"holder\": \"a\", \"ttl_ms\": 60000}");
	const char *x = "{\"holder\": \"x\", \"request_id\": \"x-2\", \"wait_ms\": 60000,"
			" \"ttl_ms\": 60000}";
	int x1 = raw_send(s, "POST", "/resources/r/leases", x);
	wait_waiters(s, 1);
	write_file(f->hold, "round");
	char path[128], line[160];
	snprintf(path, sizeof path, "/leases/%s", hs_str(a, "id"));
	snprintf(line, sizeof line, "release %s", hs_str(a, "id"));
	int d = raw_send(s, "DELETE", path, NULL);
	hold_wait(f, "round", line);
	int x2 = raw_send(s, "POST", "/resources/r/leases", x);
	hold_wait(f, "round", "acquire lease-x-2");
	/* the round that releases a, grants x-2 and takes its retry cannot be committed */
	write_file(f->fault, "io");
	unlink(f->hold);
	json_t *got;
	long st = raw_read(x2, &got);
	if (st != 503)
		fail_msg("the retry was answered %ld (%s) before its grant was durable", st,
			 got ? hs_str(got, "state") : "");
	json_decref(got);
	assert_int_equal(raw_read(x1, NULL), 503);
	assert_int_equal(raw_read(d, NULL), 503);
	unlink(f->fault);
	json_decref(a);
}

/* Item: a renewal that arrives after the lease's expiry answers 410, also when the engine
 * applies it in the round whose timer expires the lease (messages go before timers). */
static void test_renewal_after_expiry_answers_410_in_the_expirys_round(void **state)
{
	fixture *f = *state;
	const hs_server *s = f->s;
	json_t *l = acquire_ok(s, "{\"holder\": \"a\", \"ttl_ms\": 1000}");
	int64_t expires = hs_time(l, "expires_at");
	write_file(f->hold, "round"); /* the round of the expiry's timer, at the latest */
	hold_wait(f, "round", NULL);
	assert_true(hs_wait_until(past, &expires, WAIT_MS));
	char path[128], line[160];
	snprintf(path, sizeof path, "/leases/%s/renew", hs_str(l, "id"));
	snprintf(line, sizeof line, "renew %s", hs_str(l, "id"));
	int fd = raw_send(s, "POST", path, NULL);
	hold_wait(f, "round", line);
	unlink(f->hold);
	json_t *got;
	long st = raw_read(fd, &got);
	if (st != 410)
		fail_msg("a renewal that arrived after the expiry was answered %ld", st);
	json_decref(got);
	json_t *now = lease_get(s, hs_str(l, "id"));
	assert_string_equal(hs_str(now, "state"), "expired");
	json_decref(now);
	json_decref(l);
}

/* Liveness: a grant that nobody took is released within seconds, across restarts. b's
 * caller is cut off by a kill -9; after the restart b is granted while nobody waits for it,
 * then batond is killed again: b is still released after its grace, not after its ttl. */
static void test_grace_of_a_grant_nobody_took_survives_kill9(void **state)
{
	fixture *f = *state;
	hs_server *s = f->s;
	json_t *a = acquire_ok(s, "{\"holder\": \"a\", \"ttl_ms\": 60000}");
	int b = raw_send(s, "POST", "/resources/r/leases",
			 "{\"holder\": \"b\", \"request_id\": \"b-1\", \"wait_ms\": 60000,"
			 " \"ttl_ms\": 3600000}");
	wait_waiters(s, 1);
	hs_kill(s);
	raw_read(b, NULL);
	assert_int_equal(hs_start(s), 0);
	wait_waiters(s, 1);
	hs_request rel = {.method = "DELETE", .path = NULL};
	char path[128];
	snprintf(path, sizeof path, "/leases/%s", hs_str(a, "id"));
	rel.path = path;
	hs_response r;
	assert_int_equal(hs_send(s, &rel, &r), 0);
	assert_int_equal(r.status, 204); /* b's grant to nobody is durable with it */
	hs_response_fini(&r);
	json_t *got = lease_get(s, "lease-b-1");
	assert_string_equal(hs_str(got, "state"), "held");
	json_decref(got);
	hs_kill(s);
	assert_int_equal(hs_start(s), 0);
	/* c waits far less than b's ttl of an hour */
	assert_int_equal(
	    hs_post(s, "/resources/r/leases", "{\"holder\": \"c\", \"wait_ms\": 10000}", &r), 0);
	if (r.status != 201)
		fail_msg("c was answered %ld: b's grant to nobody outlived the restart", r.status);
	hs_response_fini(&r);
	got = lease_get(s, "lease-b-1");
	assert_string_equal(hs_str(got, "state"), "released");
	json_decref(got);
	json_decref(a);
}

/* Task claims get the same rule: a claim with a request_id whose answer is lost (its
 * connection reset) and that is retried before the give-back of its first answer arrives is
 * answered the same claim, and the give-back does not offer the task to anyone else. */
static void test_claim_retry_keeps_its_claim(void **state)
{
	fixture *f = *state;
	const hs_server *s = f->s;
	json_decref(
	    hs_create_workflow(s, json_pack("{s:s, s:s, s:[{s:s, s:b}]}", "id", "job-1", "resource",
					    "t", "workers", "name", "ext", "external", 1)));
	json_decref(hs_wait_step(s, "job-1", 0, "running", WAIT_MS));
	hs_response r;
	assert_int_equal(hs_post(s, "/tasks/claim", "{\"request_id\": \"no spaces\"}", &r), 0);
	hs_assert_problem(&r, 400, "invalid-request", "a claim's request_id that is no name");
	hs_response_fini(&r);
	const char *c = "{\"worker\": \"ext\", \"request_id\": \"w-1\", \"wait_ms\": 0,"
			" \"ttl_ms\": 60000}";
	write_file(f->hold, "answers");
	int c1 = raw_send(s, "POST", "/tasks/claim", c);
	hold_wait(f, "answers", NULL);
	raw_reset(c1); /* the claim's answer cannot be delivered */
	int c2 = raw_send(s, "POST", "/tasks/claim", c);
	hold_wait(f, "answers", "claim w-1");
	write_file(f->hold, "round");
	hold_wait(f, "round", "task job-1.0.1"); /* the give-back, after the retry */
	unlink(f->hold);
	json_t *t;
	assert_int_equal(raw_read(c2, &t), 200);
	assert_string_equal(hs_str(t, "id"), "job-1.0.1");
	/* nobody else is given the step: the give-back changed nothing */
	assert_int_equal(hs_post(s, "/tasks/claim", "{\"wait_ms\": 0}", &r), 0);
	assert_int_equal(r.status, 204);
	hs_response_fini(&r);
	assert_int_equal(hs_int(t, "claim_attempt"), 2);
	/* as another node would send it: the first attempt's give-back keeps the second's */
	assert_int_equal(give_back_claim(s, "job-1.0.1", "{\"claim_attempt\": 1}"), 409);
	assert_int_equal(hs_post(s, "/tasks/job-1.0.1/complete", "{\"result\": 1}", &r), 0);
	assert_int_equal(r.status, 200);
	hs_response_fini(&r);
	json_decref(hs_wait_workflow(s, "job-1", "completed", WAIT_MS));
	json_decref(t);
}

typedef struct held_answer {
	hs_proxy *px;
} held_answer;

static bool answer_held(void *arg)
{
	return hs_proxy_held_bytes(((held_answer *)arg)->px) > 0;
}

/* baton worker reaches the server through a proxy that keeps its claim's answer: the
 * server wrote it, so it counts the claim as delivered and gives nothing back. The proxy
 * then drops the connection; the worker asks the next server of its list with the same
 * request_id and runs the task it claimed, not the next one. */
static void test_worker_retries_a_lost_claim_with_its_request_id(void **state)
{
	fixture *f = *state;
	const hs_server *s = f->s;
	hs_response r;
	const char *limit = "{\"limit\": 2}"; /* both steps run at once */
	hs_request put = {.method = "PUT",
			  .path = "/resources/t",
			  .content_type = "application/json",
			  .body = limit,
			  .body_len = strlen(limit)};
	assert_int_equal(hs_send(s, &put, &r), 0);
	assert_int_equal(r.status, 200);
	hs_response_fini(&r);
	for (int i = 1; i <= 2; i++) {
		char id[16];
		snprintf(id, sizeof id, "job-%d", i);
		json_decref(hs_create_workflow(s, json_pack("{s:s, s:s, s:[{s:s, s:b}]}", "id", id,
							    "resource", "t", "workers", "name",
							    "ext", "external", 1)));
		json_decref(hs_wait_step(s, id, 0, "running", WAIT_MS));
	}
	hs_proxy *px = hs_proxy_open(hs_port(s));
	assert_non_null(px);
	hs_proxy_hold(px);
	char servers[128];
	snprintf(servers, sizeof servers, "http://127.0.0.1:%d,http://127.0.0.1:%d",
		 hs_proxy_port(px), hs_port(s));
	const char *const args[] = {
	    "worker", "--worker", "ext", "--resource", "t",
	    "--once", "--",	  "sh",	 "-c",	       "echo \"\\\"$BATON_TASK_ID\\\"\"",
	    NULL};
	client_proc *p = client_spawn(args, servers, false);
	held_answer h = {px};
	if (!hs_wait_until(answer_held, &h, WAIT_MS)) {
		hs_proxy_close(px);
		fail_msg("the claim's answer never reached the proxy");
	}
	hs_proxy_cut(px); /* the answer is lost; the server delivered it */
	int rc = client_finish(p);
	hs_proxy_close(px);
	assert_int_equal(rc, 0);
	/* the worker completed the task it claimed before it exited */
	assert_int_equal(hs_get(s, "/workflows/job-1", &r), 0);
	assert_int_equal(r.status, 200);
	assert_string_equal(hs_str(r.json, "status"), "completed");
	const json_t *st = hs_step_at(r.json, 0);
	assert_string_equal(json_string_value(json_object_get(st, "result")), "job-1.0.1");
	hs_response_fini(&r);
	/* the worker claimed nothing else: job-2 is still there for the next claim */
	assert_int_equal(hs_post(s, "/tasks/claim", "{\"wait_ms\": 0}", &r), 0);
	assert_int_equal(r.status, 200);
	assert_string_equal(hs_str(r.json, "id"), "job-2.0.1");
	hs_response_fini(&r);
	client_free(p);
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_give_back_does_nothing_once_the_retry_arrived,
					    setup, teardown),
	    cmocka_unit_test_setup_teardown(test_give_back_through_another_node, cluster_setup,
					    cluster_teardown),
	    cmocka_unit_test_setup_teardown(test_grant_through_another_node_for_a_client_gone,
					    cluster_setup, cluster_teardown),
	    cmocka_unit_test_setup_teardown(test_claim_through_another_node_for_a_worker_gone,
					    cluster_setup, cluster_teardown),
	    cmocka_unit_test_setup_teardown(test_retry_waits_for_the_grants_commit, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(
		test_renewal_after_expiry_answers_410_in_the_expirys_round, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_grace_of_a_grant_nobody_took_survives_kill9, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_claim_retry_keeps_its_claim, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_worker_retries_a_lost_claim_with_its_request_id,
					    setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
