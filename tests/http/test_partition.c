/*
 * test_partition.c - a node cut off from PostgreSQL while its clients still reach it: what
 * it may still tell them. Two nodes, each reaching the database through a proxy of its own
 * (tests/harness/proxy.h) that the test cuts. PostgreSQL only (a cluster shares one
 * database); on SQLite the tests skip.
 *
 * The safety property, as a holder sees it: a renewal answered 200 promises the holder its
 * lease until the renewal's send + ttl (that is how `baton lock` counts). No other holder may
 * be granted the resource before that. So every 200 the cut node gives must come while it
 * can still prove its ownership (before its node lease runs out, as last confirmed before
 * the cut), and the other node's grant must come after every such promise has ended.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <pthread.h>
#include <stdatomic.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../harness/calls.h"
#include "../harness/cluster.h"
#include "../harness/harness.h"
#include "../harness/prom.h"

#define WAIT_MS	 60000
#define LEASE_MS 3000 /* the nodes' --lease-ms */
#define TTL_MS	 6000 /* the holder's lease */
#define POLL_MS	 200

#define SKIP_UNLESS_PG()                                                                           \
	do {                                                                                       \
		if (!hs_store_is_pg())                                                             \
			skip(); /* a cluster shares one PostgreSQL database */                     \
	} while (0)

static int setup(void **state)
{
	*state = calloc(1, sizeof(cluster));
	return *state ? 0 : -1;
}

/* A test's lock on the database (hs_db_hold), released by the teardown if it failed. */
static void *lock_held;

static int teardown(void **state)
{
	hs_db_unhold(lock_held);
	lock_held = NULL;
	cluster *c = *state;
	int rc = cl_close(c);
	free(c);
	return rc;
}

/* Waits up to ms for child pid to exit (killed with SIGKILL after that); its status. */
static int wait_child(pid_t pid, int64_t ms)
{
	int status = -1;
	for (int64_t end = hs_mono_ms() + ms; hs_mono_ms() < end;) {
		if (waitpid(pid, &status, WNOHANG) == pid)
			return status;
		hs_pause_ms(100);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	return status;
}

/* Two nodes, balanced: each drives its share of the partitions; with a prefix, res is a
 * resource node 0 drives, named from it. */
static void two_nodes(cluster *c, const char *prefix, char res[64])
{
	assert_int_equal(cl_open(c, 2, LEASE_MS, NULL), 0);
	assert_true(cl_wait_balanced(c, 0, 3, WAIT_MS));
	unsigned long long avoid = 0;
	if (prefix)
		cl_pick_resource(c, 0, prefix, &avoid, res, 64);
}

/* One request, asked again while the answer is 503 with Retry-After when `again` (as
 * clients are told to: a node that has just claimed a partition answers so until it has
 * loaded what the partition holds); its status (0 when no answer came) and JSON (new
 * reference, or NULL). */
static long ask(const hs_server *s, const char *method, const char *path, const char *body,
		json_t **out, bool again)
{
	hs_request req = {.method = method,
			  .path = path,
			  .content_type = body ? "application/json" : NULL,
			  .body = body,
			  .body_len = body ? strlen(body) : 0};
	int64_t deadline = hs_mono_ms() + WAIT_MS;
	for (;;) {
		hs_response r;
		long status = hs_send(s, &req, &r) == 0 ? r.status : 0;
		bool retry = again && status == 503 && r.retry_after && hs_mono_ms() < deadline;
		const char *why = json_string_value(json_object_get(r.json, "detail"));
		if (retry)
			print_message("%s %s: 503 (%s), asked again\n", method, path,
				      why ? why : "no detail");
		else if (out)
			*out = status ? json_incref(r.json) : NULL;
		hs_response_fini(&r);
		if (!retry)
			return status;
		hs_pause_ms(200);
	}
}

/* One request, answered as it comes. */
static long call(const hs_server *s, const char *method, const char *path, const char *body,
		 json_t **out)
{
	return ask(s, method, path, body, out, false);
}

/* One request, asked again while the answer is 503 with Retry-After. */
static long call_again(const hs_server *s, const char *method, const char *path, const char *body,
		       json_t **out)
{
	return ask(s, method, path, body, out, true);
}

/* Two nodes, each reaching PostgreSQL through a proxy the test can cut, balanced; res: a
 * resource node0 drives, named from prefix, and path its leases. */
static void two_proxied(cluster *c, const char *prefix, char res[64], char path[200])
{
	assert_int_equal(cl_open_proxied(c, 2, LEASE_MS, NULL), 0);
	assert_true(cl_wait_balanced(c, 0, 3, WAIT_MS));
	unsigned long long avoid = 0;
	cl_pick_resource(c, 0, prefix, &avoid, res, 64);
	snprintf(path, 200, "/resources/%s/leases", res);
}

/* A holder renews through the node that was cut while another holder tries the other node:
 * no 200 after the cut node's lease ran out, /readyz 503 before it does, and the other
 * node's grant after every promise made. */
static void test_cut_node_promises_nothing_it_cannot_keep(void **state)
{
	SKIP_UNLESS_PG();
	cluster *c = *state;
	char res[64], path[200], body[128];
	two_proxied(c, "cut", res, path);
	snprintf(body, sizeof body, "{\"holder\": \"first\", \"ttl_ms\": %d}", TTL_MS);
	json_t *first;
	assert_int_equal(call(c->node[0], "POST", path, body, &first), 201);
	char renew[200];
	snprintf(renew, sizeof renew, "/leases/%s/renew", hs_str(first, "id"));

	int64_t cut = hs_mono_ms();
	cl_cut(c, 0);
	int64_t last_ok = -1, first_refused = -1, unready = -1, last_ready = -1, granted = -1;
	json_t *second = NULL;
	while (hs_mono_ms() < cut + WAIT_MS && granted < 0) {
		int64_t sent = hs_mono_ms();
		long st = call(c->node[0], "POST", renew, NULL, NULL);
		if (st == 200)
			last_ok = sent;
		else if (st == 503 && first_refused < 0)
			first_refused = sent;
		sent = hs_mono_ms();
		long ready = call(c->node[0], "GET", "/readyz", NULL, NULL);
		if (ready == 200)
			last_ready = sent;
		else if (ready == 503 && unready < 0)
			unready = sent;
		snprintf(body, sizeof body, "{\"holder\": \"second\", \"wait_ms\": 0}");
		if (call(c->node[1], "POST", path, body, &second) == 201)
			granted = hs_mono_ms();
		else {
			json_decref(second);
			second = NULL;
			hs_pause_ms(POLL_MS);
		}
	}
	print_message("cut at 0 ms: last renewal answered 200 sent at %lld, first 503 at %lld,"
		      " /readyz last 200 at %lld, first 503 at %lld, the other node granted at"
		      " %lld\n",
		      (long long)(last_ok < 0 ? -1 : last_ok - cut),
		      (long long)(first_refused < 0 ? -1 : first_refused - cut),
		      (long long)(last_ready < 0 ? -1 : last_ready - cut),
		      (long long)(unready < 0 ? -1 : unready - cut),
		      (long long)(granted < 0 ? -1 : granted - cut));
	/* live: the other node takes the resource over, at a higher token */
	assert_true(granted > 0);
	assert_true(hs_int(second, "fencing_token") > hs_int(first, "fencing_token"));
	/* the cut node stops promising before its node lease can have run out, and says so:
	 * 503 to the holder, and /readyz 503 (never ready again while cut) */
	assert_true(last_ok < cut + LEASE_MS);
	assert_true(first_refused > last_ok);
	assert_true(unready > 0);
	assert_true(last_ready < cut + LEASE_MS && last_ready < unready);
	/* one holder: the second grant comes after every promise the first holder was given */
	assert_true(last_ok + TTL_MS <= granted);
	json_decref(first);
	json_decref(second);
}

/* A resource whose connects hang: a listening socket (backlog 0) whose one queue slot a
 * first connection fills, so that the kernel drops the SYNs of the next connect until the
 * test accepts that first one. Returns the listener; *port, *filler set. */
static int hanging_listener(int *port, int *filler)
{
	int l = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof a;
	assert_true(l >= 0);
	assert_int_equal(bind(l, (struct sockaddr *)&a, sizeof a), 0);
	assert_int_equal(listen(l, 0), 0);
	assert_int_equal(getsockname(l, (struct sockaddr *)&a, &len), 0);
	*port = ntohs(a.sin_port);
	*filler = socket(AF_INET, SOCK_STREAM, 0);
	assert_int_equal(connect(*filler, (struct sockaddr *)&a, sizeof a), 0);
	return l;
}

/* The bytes that arrive on the next connection to l within ms, until its end or the end
 * of a request's head: 0 when none came, -1 when no connection came. */
static long bytes_on_next(int l, int ms)
{
	struct pollfd p = {.fd = l, .events = POLLIN};
	if (poll(&p, 1, ms) != 1)
		return -1;
	int fd = accept(l, NULL, NULL);
	assert_true(fd >= 0);
	long total = 0;
	char buf[8192];
	for (int64_t end = hs_mono_ms() + ms; hs_mono_ms() < end;) {
		struct pollfd q = {.fd = fd, .events = POLLIN};
		if (poll(&q, 1, 200) != 1)
			continue;
		ssize_t n = read(fd, buf + total, sizeof buf - 1 - (size_t)total);
		if (n <= 0)
			break;
		total += n;
		buf[total] = 0;
		if (strstr(buf, "\r\n\r\n") || total == sizeof buf - 1)
			break;
	}
	close(fd);
	return total;
}

struct renewing {
	const hs_server *s;
	const char *path;
};

static bool renewal_refused(void *arg)
{
	const struct renewing *r = arg;
	return call(r->s, "POST", r->path, NULL, NULL) == 503;
}

/* An HTTP step whose connect took until after its node lost the proof that it drives the
 * resource sends nothing: the request would reach the resource with the token of a holder
 * another node may have replaced. Before, send_by was checked only before connecting, and
 * the request went out once the connect succeeded. One node (a cluster of one on
 * PostgreSQL), so that no other node's attempt comes to the resource meanwhile. */
static void test_late_connect_sends_nothing(void **state)
{
	SKIP_UNLESS_PG();
	cluster *c = *state;
	int port, filler, l = hanging_listener(&port, &filler);
	char allow[64], url[80];
	snprintf(allow, sizeof allow, "http://127.0.0.1:%d/", port);
	snprintf(url, sizeof url, "http://127.0.0.1:%d/op", port);
	const char *const extra[] = {"--allow-call", allow, NULL};
	assert_int_equal(cl_open_proxied(c, 1, LEASE_MS, extra), 0);
	assert_true(cl_wait_balanced(c, 0, 1, WAIT_MS));
	unsigned long long avoid = 0;
	char res[64], other[64], path[200], body[256];
	cl_pick_resource(c, 0, "late", &avoid, res, sizeof res);
	cl_pick_resource(c, 0, "probe", &avoid, other, sizeof other);
	/* a lease through node 0, whose renewals say when node 0 has lost its proof */
	snprintf(path, sizeof path, "/resources/%s/leases", other);
	json_t *lease;
	assert_int_equal(call(c->node[0], "POST", path, "{\"holder\": \"probe\"}", &lease), 201);
	char renew[200];
	snprintf(renew, sizeof renew, "/leases/%s/renew", hs_str(lease, "id"));
	json_decref(lease);

	snprintf(body, sizeof body,
		 "{\"id\": \"late-1\", \"resource\": \"%s\", \"workers\": [\"w\"], \"call\":"
		 " {\"url\": \"%s\"}, \"retry\": {\"max_attempts\": 1}}",
		 res, url);
	assert_int_equal(call(c->node[0], "POST", "/workflows", body, NULL), 201);
	json_decref(hs_wait_step(c->node[0], "late-1", 0, "running", WAIT_MS)); /* connecting */
	cl_cut(c, 0);
	struct renewing r = {c->node[0], renew};
	assert_true(hs_wait_until(renewal_refused, &r, WAIT_MS));
	close(filler); /* ... and the slot is free: the step's next SYN gets through */
	int fd = accept(l, NULL, NULL);
	assert_true(fd >= 0);
	close(fd);
	long sent = bytes_on_next(l, 20000);
	print_message("bytes of the step's request that reached the resource: %ld\n", sent);
	assert_int_equal(sent, 0);
	close(l);
}

/* A count read through node `via`'s route to the database, and the count it waits for. */
struct counted {
	hs_server *via; /* hs_db_count may stop and restart a SQLite server */
	const char *sql;
	long long want;
};

static bool count_reached(void *arg)
{
	const struct counted *q = arg;
	return hs_db_count(q->via, q->sql) == q->want;
}

/* The client_port of the k-th session (by port) whose last statement is one of the
 * membership thread's (a join or renewal, the read of the partitions, a claim); 0 when
 * there are fewer. Read through node `via`. */
static int membership_port(const cluster *c, int via, int k)
{
	char sql[640];
	snprintf(sql, sizeof sql,
		 "SELECT coalesce((SELECT client_port FROM pg_stat_activity WHERE"
		 " application_name = 'batond' AND (query LIKE 'UPDATE nodes SET expires%%' OR"
		 " query LIKE 'INSERT INTO nodes%%' OR query LIKE 'SELECT p.id, p.epoch%%' OR"
		 " query LIKE 'UPDATE partitions p SET owner%%') ORDER BY client_port"
		 " OFFSET %d LIMIT 1), 0)",
		 k);
	return (int)hs_db_count(c->node[via], sql);
}

static bool node0_says_lost(void *arg)
{
	const cluster *c = arg;
	return hs_log_says(c->node[0], " lost ", "partition");
}

/*
 * A step granted just before its node loses the resource is not sent once another node may
 * hold it, whatever the node learns between its commit and the step's dispatch. What
 * PostgreSQL answers node 0 is held (proxy.h: its statements run, their answers wait) while
 * its commit of step 0's end and step 1's grant goes through; its node lease runs out, and
 * node 1 takes the partition and calls step 1 itself. Then node 0's membership session gets
 * its answers first and renews node 0's lease (a renewal after the lease ran out goes
 * through: the row is still node 0's), and only then does the commit's answer come. Before,
 * the time by which the step had to be sent was taken from the lease as it stood at the
 * dispatch, just renewed: node 0 called the resource with its stale token after node 1.
 */
static void test_dispatch_after_lost_lease_sends_nothing(void **state)
{
	SKIP_UNLESS_PG();
	cluster *c = *state;
	fragile *res = fragile_open();
	assert_non_null(res);
	char *allow = fragile_url(res, "/"), *url = fragile_url(res, "/op");
	const char *const extra[] = {"--allow-call", allow, NULL};
	assert_int_equal(cl_open_proxied(c, 2, LEASE_MS, extra), 0);
	assert_true(cl_wait_balanced(c, 0, 3, WAIT_MS));
	unsigned long long avoid = 0;
	char name[64], body[512], done[320], live[160];
	cl_pick_resource(c, 0, "held", &avoid, name, sizeof name);
	fragile_push(res, (fragile_action){.status = 200, .gated = true});
	snprintf(body, sizeof body,
		 "{\"id\": \"held-1\", \"resource\": \"%s\", \"workers\": [\"w0\", \"w1\"],"
		 " \"call\": {\"url\": \"%s\"}}",
		 name, url);
	assert_int_equal(call(c->node[0], "POST", "/workflows", body, NULL), 201);
	assert_true(fragile_wait_held(res, 1, WAIT_MS)); /* step 0, called by node 0 */

	hs_proxy_hold(c->px[0]);
	fragile_open_gate(res);
	snprintf(done, sizeof done,
		 "SELECT count(*) FROM steps s JOIN workflows w ON w.seq = s.workflow_seq WHERE"
		 " w.id = 'held-1' AND s.idx = 0 AND s.status = 'completed'");
	struct counted committed = {c->node[1], done, 1};
	assert_true(hs_wait_until(count_reached, &committed, WAIT_MS));
	/* node 0 waits for that commit's answer: the second call is node 1's */
	assert_true(fragile_wait_applied(res, 2, WAIT_MS));
	int released = 0;
	for (int k = 0, port; (port = membership_port(c, 1, k)) > 0; k++)
		released += hs_proxy_release(c->px[0], port);
	assert_int_equal(released, 1);
	snprintf(live, sizeof live,
		 "SELECT count(*) FROM nodes WHERE id = '%s' AND expires > now()", c->id[0]);
	struct counted renewed = {c->node[1], live, 1};
	assert_true(hs_wait_until(count_reached, &renewed, WAIT_MS));
	hs_proxy_release(c->px[0], 0);
	assert_true(hs_wait_until(node0_says_lost, c, WAIT_MS));
	assert_int_equal(hs_stop(c->node[0]), 0); /* what its steps were to send is sent */

	fragile_stats st;
	fragile_get_stats(res, &st);
	if (st.requests != 2) {
		size_t n;
		fragile_record *r = fragile_records(res, &n);
		calls_dump_records(r, n);
		fragile_records_free(r, n);
		fail_msg(
		    "the resource had %zu calls, expected 2 (step 0 by node 0, step 1 by node 1)",
		    st.requests);
	}
	calls_assert_sound(res);
	fragile_close(res);
	free(allow);
	free(url);
}

/*
 * A node paused past its lease, whose partition another node took meanwhile, promises
 * nothing once it runs again and has renewed its lease, until it has read again who drives
 * what. Node 0 drives the resource of a lease; it is SIGSTOPped until node 1 has claimed
 * the partition (and counts the lease's ttl from that claim), and the partitions table is
 * locked so that node 0's read of it waits. Continued, node 0 renews its lease (the row is
 * still its own) and the holder renews through it: a 200 would promise the holder its
 * ttl from now, past the end node 1 counts. Before, node 0 answered 200.
 */
static void test_renewal_after_lapse_promises_nothing(void **state)
{
	SKIP_UNLESS_PG();
	cluster *c = *state;
	char res[64], path[200], renew[200], live[160];
	two_nodes(c, "lapse", res);
	snprintf(path, sizeof path, "/resources/%s/leases", res);
	json_t *lease;
	assert_int_equal(
	    call(c->node[0], "POST", path, "{\"holder\": \"h\", \"ttl_ms\": 60000}", &lease), 201);
	snprintf(renew, sizeof renew, "/leases/%s/renew", hs_str(lease, "id"));
	json_decref(lease);

	assert_int_equal(hs_signal(c->node[0], SIGSTOP), 0);
	int p = cl_part_of(res);
	for (int64_t end = hs_mono_ms() + WAIT_MS; cl_part_owner(c, p) != 1;) {
		assert_true(hs_mono_ms() < end);
		hs_pause_ms(POLL_MS);
	}
	lock_held = hs_db_hold(c->node[1], "LOCK TABLE partitions IN ACCESS EXCLUSIVE MODE");
	assert_non_null(lock_held);
	assert_int_equal(hs_signal(c->node[0], SIGCONT), 0);
	snprintf(live, sizeof live,
		 "SELECT count(*) FROM nodes WHERE id = '%s' AND expires > now()", c->id[0]);
	struct counted renewed = {c->node[1], live, 1};
	assert_true(hs_wait_until(count_reached, &renewed, WAIT_MS));
	json_t *out = NULL;
	long status = call(c->node[0], "POST", renew, NULL, &out);
	char *said = out ? json_dumps(out, JSON_COMPACT) : NULL;
	print_message("node 0, renewed after its lease ran out, answered the renewal %ld: %s\n",
		      status, said ? said : "");
	free(said);
	json_decref(out);
	assert_int_equal(status, 503);
	hs_db_unhold(lock_held);
	lock_held = NULL;
	/* Once it has read the partitions, it passes the renewal on to node 1. */
	assert_int_equal(call_again(c->node[0], "POST", renew, NULL, NULL), 200);
}

/* Moves partition p, in the database, to a live node "elsewhere" (as its claim would leave
 * it: a new owner, the epoch raised); node0 learns it at its next commit or read. */
static void steal(cluster *c, int p)
{
	char sql[512];
	snprintf(sql, sizeof sql,
		 "WITH n AS (INSERT INTO nodes (id, expires) VALUES ('elsewhere',"
		 " now() + interval '1 hour') ON CONFLICT (id) DO UPDATE SET expires ="
		 " excluded.expires RETURNING 1), p AS (UPDATE partitions SET owner = 'elsewhere',"
		 " epoch = epoch + 1 WHERE id = %d RETURNING 1)"
		 " SELECT (SELECT count(*) FROM n) + (SELECT count(*) FROM p)",
		 p);
	assert_int_equal(hs_db_count(c->node[0], sql), 2);
}

/* A change that the ownership check refused, or that this node no longer drives, is not
 * answered as done: a lease DELETE, a task's complete and a cancel get 503, and the database
 * shows that none of them happened. */
static void test_refused_changes_are_not_answered_done(void **state)
{
	SKIP_UNLESS_PG();
	cluster *c = *state;
	assert_int_equal(cl_open(c, 1, 10000, NULL), 0);
	assert_true(cl_wait_balanced(c, 0, 1, WAIT_MS));
	unsigned long long avoid = 0;
	char lres[64], tres[64], wres[64], path[256], body[512];
	cl_pick_resource(c, 0, "lease", &avoid, lres, sizeof lres);
	cl_pick_resource(c, 0, "task", &avoid, tres, sizeof tres);
	cl_pick_resource(c, 0, "wf", &avoid, wres, sizeof wres);

	json_t *lease;
	snprintf(path, sizeof path, "/resources/%s/leases", lres);
	assert_int_equal(call(c->node[0], "POST", path, "{\"holder\": \"h\"}", &lease), 201);
	snprintf(body, sizeof body,
		 "{\"id\": \"ext\", \"resource\": \"%s\", \"workers\": [{\"name\": \"x\","
		 " \"external\": true}]}",
		 tres);
	assert_int_equal(call(c->node[0], "POST", "/workflows", body, NULL), 201);
	json_t *task;
	assert_int_equal(call(c->node[0], "POST", "/tasks/claim",
			      "{\"worker\": \"x\", \"wait_ms\": 60000}", &task),
			 200);
	snprintf(body, sizeof body,
		 "{\"id\": \"slow\", \"resource\": \"%s\", \"workers\": [{\"name\": \"y\","
		 " \"external\": true}]}",
		 wres);
	assert_int_equal(call(c->node[0], "POST", "/workflows", body, NULL), 201);

	steal(c, cl_part_of(lres));
	steal(c, cl_part_of(tres));
	steal(c, cl_part_of(wres));
	/* The first of these meets the ownership check's refusal, or finds the partition gone
	 * if node0 read the owners first; either way the answer must be the truth. */
	long cancelled = call(c->node[0], "POST", "/workflows/slow/cancel", NULL, NULL);
	snprintf(path, sizeof path, "/leases/%s", hs_str(lease, "id"));
	long released = call(c->node[0], "DELETE", path, NULL, NULL);
	snprintf(path, sizeof path, "/tasks/%s/complete", hs_str(task, "id"));
	long completed = call(c->node[0], "POST", path, "{\"result\": 1}", NULL);
	print_message("after the steal: cancel %ld, DELETE %ld, complete %ld\n", cancelled,
		      released, completed);
	assert_int_equal(released, 503);
	assert_int_equal(completed, 503);
	/* the lease is still held and the task still claimed in the database */
	snprintf(body, sizeof body,
		 "SELECT count(*) FROM steps s JOIN workflows w ON w.seq = s.workflow_seq"
		 " WHERE w.id IN ('%s', 'ext') AND s.status = 'running'",
		 hs_str(lease, "id"));
	assert_int_equal(hs_db_count(c->node[0], body), 2);
	/* a cancel answered 200 was recorded for the owner to carry out; one answered 503 was
	 * not recorded at all */
	long long asked = hs_db_count(c->node[0], "SELECT count(*) FROM workflows WHERE id ="
						  " 'slow' AND (cancel_requested OR status ="
						  " 'cancelled')");
	if (cancelled == 200)
		assert_int_equal(asked, 1);
	else
		assert_true(cancelled == 503 && asked == 0);
	json_decref(lease);
	json_decref(task);
}

/* A node above its share hands partitions over whatever leases they hold: a partition moves
 * with its held leases, which keep their holder and token on the new owner and renew
 * there. (Before, a partition with a held lease was never handed over, and no resource of
 * it was granted meanwhile.) */
static void test_hand_over_moves_held_leases(void **state)
{
	SKIP_UNLESS_PG();
	cluster *c = *state;
	assert_int_equal(cl_open(c, 1, LEASE_MS, NULL), 0);
	assert_true(cl_wait_balanced(c, 0, 1, WAIT_MS));
	static char names[CL_PARTS][64];
	static char ids[CL_PARTS][128];
	json_int_t tokens[CL_PARTS];
	unsigned long long avoid = 0;
	for (int i = 0; i < CL_PARTS; i++) {
		char path[200];
		cl_pick_resource(c, 0, "held", &avoid, names[i], sizeof names[i]);
		snprintf(path, sizeof path, "/resources/%.63s/leases", names[i]);
		json_t *l;
		assert_int_equal(
		    call(c->node[0], "POST", path, "{\"holder\": \"h\", \"ttl_ms\": 120000}", &l),
		    201);
		snprintf(ids[i], sizeof ids[i], "%s", hs_str(l, "id"));
		tokens[i] = hs_int(l, "fencing_token");
		json_decref(l);
	}
	/* a second node joins: node0 must hand half of its partitions over */
	char lease[16];
	snprintf(lease, sizeof lease, "%d", LEASE_MS);
	const char *args[] = {"--node-id", "node1", "--lease-ms", lease, NULL};
	snprintf(c->id[1], sizeof c->id[1], "node1");
	c->node[1] = hs_open_node(c->node[0], args);
	assert_non_null(c->node[1]);
	c->n = 2;
	assert_true(cl_wait_balanced(c, 0, 3, WAIT_MS));
	int moved = 0;
	for (int i = 0; i < CL_PARTS; i++) {
		int who = cl_part_owner(c, cl_part_of(names[i]));
		assert_true(who == 0 || who == 1);
		moved += who == 1;
		char path[200];
		snprintf(path, sizeof path, "/leases/%.127s/renew", ids[i]);
		json_t *l;
		assert_int_equal(call_again(c->node[who], "POST", path, NULL, &l), 200);
		assert_string_equal(hs_str(l, "state"), "held");
		assert_int_equal(hs_int(l, "fencing_token"), tokens[i]);
		json_decref(l);
	}
	assert_true(moved > 0);
}

/* A resource named "<prefix>-<k>" in partition p (the first k that fits). */
static void name_in_part(int p, const char *prefix, char *out, size_t size)
{
	for (int k = 0; k < 100000; k++) {
		snprintf(out, size, "%s-%d", prefix, k);
		if (cl_part_of(out) == p)
			return;
	}
	fail_msg("no name in partition %d", p);
}

/* A holder that renews its lease every second, through node0 and, once set, node1 in
 * turn, as `baton lock` does (asking again on 503); it counts the renewals and keeps the
 * first answer that was not 200. */
typedef struct renewer {
	const hs_server *node0;
	_Atomic(const hs_server *) node1;
	const char *path;
	atomic_bool stop;
	atomic_int renewed;
	atomic_long refused; /* the first status other than 200, 0 while none */
} renewer;

static void *renewer_main(void *arg)
{
	renewer *r = arg;
	for (int i = 0; !atomic_load(&r->stop) && !atomic_load(&r->refused); i++) {
		const hs_server *via = atomic_load(&r->node1);
		long st = call_again(i % 2 && via ? via : r->node0, "POST", r->path, NULL, NULL);
		if (st == 200)
			atomic_fetch_add(&r->renewed, 1);
		else
			atomic_store(&r->refused, st);
		hs_pause_ms(1000);
	}
	return NULL;
}

/* A hand-over never stops a holder's renewals: while a partition waits to be handed over
 * (a step of it runs on a step thread here: an HTTP call that the test answers when it is
 * done), the leases held in it renew through every node, and a holder that renews in time
 * keeps its lease. Before, a partition marked as leaving answered every renewal 503 until
 * its step ended, and the lease expired. */
static void test_hand_over_keeps_renewals(void **state)
{
	SKIP_UNLESS_PG();
	cluster *c = *state;
	int port, filler, lis = hanging_listener(&port, &filler);
	close(filler); /* connects go through at once, once its connection left the queue */
	int queued = accept(lis, NULL, NULL);
	assert_true(queued >= 0);
	close(queued);
	char allow[64], url[80];
	snprintf(allow, sizeof allow, "http://127.0.0.1:%d/", port);
	snprintf(url, sizeof url, "http://127.0.0.1:%d/op", port);
	const char *const extra[] = {"--allow-call", allow, NULL};
	assert_int_equal(cl_open(c, 1, LEASE_MS, extra), 0);
	assert_true(cl_wait_balanced(c, 0, 1, WAIT_MS));
	/* Partition p holds a running step and the lease: two workflows. Every other one
	 * holds three leases, so that p is among the first handed over. */
	char name[64], path[200], body[256];
	int p = cl_part_of("keep-busy");
	for (int q = 0; q < CL_PARTS; q++)
		for (int k = 0; q != p && k < 3; k++) {
			char prefix[32];
			snprintf(prefix, sizeof prefix, "fill%d", k);
			name_in_part(q, prefix, name, sizeof name);
			snprintf(path, sizeof path, "/resources/%s/leases", name);
			assert_int_equal(call(c->node[0], "POST", path,
					      "{\"holder\": \"f\", \"ttl_ms\": 120000}", NULL),
					 201);
		}
	snprintf(body, sizeof body,
		 "{\"id\": \"keep-busy\", \"resource\": \"keep-busy\", \"workers\": [\"w\"],"
		 " \"call\": {\"url\": \"%s\", \"timeout_ms\": %d}}",
		 url, 2 * WAIT_MS);
	assert_int_equal(call(c->node[0], "POST", "/workflows", body, NULL), 201);
	struct pollfd pl = {.fd = lis, .events = POLLIN};
	assert_int_equal(poll(&pl, 1, WAIT_MS), 1);
	int busy = accept(lis, NULL, NULL); /* the step's call, answered once the test is done */
	assert_true(busy >= 0);
	name_in_part(p, "keep-lease", name, sizeof name);
	snprintf(path, sizeof path, "/resources/%s/leases", name);
	json_t *l;
	snprintf(body, sizeof body, "{\"holder\": \"h\", \"ttl_ms\": %d}", TTL_MS);
	assert_int_equal(call(c->node[0], "POST", path, body, &l), 201);
	char renew[200];
	snprintf(renew, sizeof renew, "/leases/%s/renew", hs_str(l, "id"));
	json_int_t token = hs_int(l, "fencing_token");
	json_decref(l);
	renewer r = {.node0 = c->node[0], .path = renew};
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, renewer_main, &r), 0);

	char lease[16];
	snprintf(lease, sizeof lease, "%d", LEASE_MS);
	const char *args[] = {"--node-id", "node1", "--lease-ms", lease, NULL};
	snprintf(c->id[1], sizeof c->id[1], "node1");
	c->node[1] = hs_open_node(c->node[0], args);
	c->n = c->node[1] ? 2 : 1;
	atomic_store(&r.node1, c->node[1]);
	/* node1 takes its share but p: node0 keeps p while its step runs. The holder renews
	 * meanwhile, through either node, for more than two ttls. */
	int64_t deadline = hs_mono_ms() + WAIT_MS;
	for (int on1 = 0; c->node[1] && on1 < CL_PARTS / 2 - 1 && hs_mono_ms() < deadline;
	     hs_pause_ms(POLL_MS)) {
		on1 = 0;
		for (int q = 0; q < CL_PARTS; q++)
			on1 += cl_part_owner(c, q) == 1;
	}
	int leaving = cl_part_owner(c, p) == 0;
	for (int from = atomic_load(&r.renewed);
	     leaving && atomic_load(&r.renewed) < from + 2 * TTL_MS / 1000 &&
	     !atomic_load(&r.refused);)
		hs_pause_ms(POLL_MS);
	leaving = leaving && cl_part_owner(c, p) == 0; /* the step still runs */
	/* Once the step ends, the partition moves with the lease, renewed all along. */
	static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
				 "Content-Length: 2\r\nConnection: close\r\n\r\n{}";
	char head[4096];
	size_t got = 0;
	for (int64_t end = hs_mono_ms() + WAIT_MS; hs_mono_ms() < end && got < sizeof head - 1;) {
		struct pollfd q = {.fd = busy, .events = POLLIN};
		ssize_t n =
		    poll(&q, 1, 200) == 1 ? read(busy, head + got, sizeof head - 1 - got) : 0;
		got += n > 0 ? (size_t)n : 0;
		head[got] = 0;
		if (n < 0 || strstr(head, "\r\n\r\n"))
			break;
	}
	ssize_t wrote = write(busy, ok, sizeof ok - 1);
	shutdown(busy, SHUT_WR);
	for (int64_t end = hs_mono_ms() + WAIT_MS; hs_mono_ms() < end;) { /* until batond closes */
		struct pollfd q = {.fd = busy, .events = POLLIN};
		if (poll(&q, 1, 200) == 1 && read(busy, head, sizeof head) <= 0)
			break;
	}
	close(busy);
	close(lis);
	json_t *wf = leaving && wrote > 0
			 ? hs_wait_workflow(c->node[0], "keep-busy", "completed", WAIT_MS)
			 : NULL;
	json_decref(wf);
	for (deadline = hs_mono_ms() + WAIT_MS;
	     wf && cl_part_owner(c, p) != 1 && hs_mono_ms() < deadline;)
		hs_pause_ms(POLL_MS);
	int moved = cl_part_owner(c, p) == 1;
	atomic_store(&r.stop, true);
	pthread_join(t, NULL);
	assert_non_null(c->node[1]);
	assert_true(leaving);
	assert_non_null(wf);
	assert_true(moved);
	assert_int_equal(atomic_load(&r.refused), 0);
	assert_int_equal(call_again(c->node[1], "POST", renew, NULL, &l), 200);
	assert_int_equal(hs_int(l, "fencing_token"), token);
	json_decref(l);
}

/* A node healthy again serves again, whether it has work of its own to commit or not. A
 * node cut off from PostgreSQL fails a commit (here a grant nobody is then told of, so
 * nothing of it is left to commit); once healed, it passes requests on and grants again.
 * Before, its "commits are failing" state was cleared only by a commit of its own, and
 * with nothing to commit it answered 503 "storage is failing" to everything for good. */
static void test_healed_node_serves_again(void **state)
{
	SKIP_UNLESS_PG();
	cluster *c = *state;
	char res[64], path[200];
	two_proxied(c, "heal", res, path);
	/* a first grant: node 0 has its ids for new leases, and asks the database nothing
	 * before the commit of the next */
	json_t *l = NULL;
	assert_int_equal(call(c->node[0], "POST", path, "{\"holder\": \"before\"}", NULL), 201);
	cl_cut(c, 0);
	long st = 0;
	for (int64_t end = hs_mono_ms() + WAIT_MS; st != 503 && hs_mono_ms() < end;)
		st = call(c->node[0], "POST", path, "{\"holder\": \"cut\", \"wait_ms\": 1000}",
			  NULL);
	assert_int_equal(st, 503);
	cl_heal(c, 0);
	assert_true(cl_wait_balanced(c, 1, 3, WAIT_MS));
	/* a resource nobody used yet, driven by each node in turn, asked through node 0 */
	unsigned long long avoid = 0;
	for (int owner = 1; owner >= 0; owner--) {
		char fresh[64];
		cl_pick_resource(c, owner, "healed", &avoid, fresh, sizeof fresh);
		snprintf(path, sizeof path, "/resources/%s/leases", fresh);
		assert_int_equal(call_again(c->node[0], "POST", path, "{\"holder\": \"h\"}", &l),
				 201);
		json_decref(l);
	}
}

/* A second batond started with a running node's --node-id takes its partitions only once
 * the first one can no longer promise anything from memory: the first one's proof (its
 * node lease as last renewed) has run out by then. Before, the second took the partitions
 * at once, and the first still answered renewals 200 until its next renewal told it
 * otherwise, while the second counted the lease's ttl from its own claim. The first one is
 * cut off from the database (so that no renewal or hint tells it soon), its clients still
 * reach it; the second one reaches the database directly. */
static void test_same_node_id_waits_for_the_first(void **state)
{
	SKIP_UNLESS_PG();
	cluster *c = *state;
	assert_int_equal(cl_open_proxied(c, 1, LEASE_MS, NULL), 0);
	assert_true(cl_wait_balanced(c, 0, 1, WAIT_MS));
	json_t *l;
	assert_int_equal(call(c->node[0], "POST", "/resources/twice/leases",
			      "{\"holder\": \"h\", \"ttl_ms\": 60000}", &l),
			 201);
	char renew[200];
	snprintf(renew, sizeof renew, "/leases/%s/renew", hs_str(l, "id"));
	json_decref(l);
	cl_cut(c, 0);
	char lease[16];
	snprintf(lease, sizeof lease, "%d", LEASE_MS);
	const char *args[] = {"--node-id", "node0", "--lease-ms", lease, NULL};
	snprintf(c->id[1], sizeof c->id[1], "node0");
	c->node[1] = hs_new(c->node[0], args);
	assert_non_null(c->node[1]);
	c->n = 2;
	assert_int_equal(hs_route_db(c->node[1], hs_pg_port()), 0);
	assert_int_equal(hs_start(c->node[1]), 0);
	/* the second drives the resource now: the first promises nothing more */
	json_t *said = NULL;
	long first = call(c->node[0], "POST", renew, NULL, &said);
	const char *why = json_string_value(json_object_get(said, "detail"));
	print_message("the first batond answered a renewal %ld once the second had started (%s)\n",
		      first, why ? why : "no detail");
	json_decref(said);
	assert_int_not_equal(first, 200);
	assert_int_equal(call_again(c->node[1], "POST", renew, NULL, NULL), 200);
}

static bool one_waiter_on(void *arg)
{
	void **a = arg;
	char path[200];
	snprintf(path, sizeof path, "/resources/%s", (const char *)a[1]);
	json_t *res = hs_get_json(a[0], path, 200);
	bool yes = json_array_size(json_object_get(res, "waiters")) == 1;
	json_decref(res);
	return yes;
}

static bool owner_is_1(void *arg)
{
	void **a = arg;
	return cl_part_owner(a[0], cl_part_of(a[1])) == 1;
}

/* A failover keeps FIFO exactly: a workflow that waited on the dead owner is granted before
 * one submitted to another node after the owner died (stored, not yet adopted by anyone). */
static void test_failover_keeps_fifo(void **state)
{
	SKIP_UNLESS_PG();
	cluster *c = *state;
	char res[64], path[200], body[300];
	two_nodes(c, "fifo", res);
	snprintf(path, sizeof path, "/resources/%s/leases", res);
	json_t *lease;
	assert_int_equal(
	    call(c->node[0], "POST", path, "{\"holder\": \"h\", \"ttl_ms\": 60000}", &lease), 201);
	snprintf(body, sizeof body, "{\"id\": \"w1\", \"resource\": \"%s\", \"workers\": [\"a\"]}",
		 res);
	assert_int_equal(call(c->node[0], "POST", "/workflows", body, NULL), 201);
	void *args[2] = {c->node[0], res};
	assert_true(hs_wait_until(one_waiter_on, args, WAIT_MS));
	hs_kill(c->node[0]);
	snprintf(body, sizeof body, "{\"id\": \"w2\", \"resource\": \"%s\", \"workers\": [\"b\"]}",
		 res);
	assert_int_equal(call(c->node[1], "POST", "/workflows", body, NULL), 201);
	void *own[2] = {c, res};
	assert_true(hs_wait_until(owner_is_1, own, WAIT_MS));
	snprintf(path, sizeof path, "/leases/%s", hs_str(lease, "id"));
	long released = 0;
	for (int64_t end = hs_mono_ms() + WAIT_MS; hs_mono_ms() < end && released != 204;) {
		released = call(c->node[1], "DELETE", path, NULL, NULL);
		if (released != 204)
			hs_pause_ms(200); /* node1 loads the partition it claimed */
	}
	assert_int_equal(released, 204);
	json_t *w1 = hs_wait_workflow(c->node[1], "w1", "completed", WAIT_MS);
	json_t *w2 = hs_wait_workflow(c->node[1], "w2", "completed", WAIT_MS);
	assert_true(hs_int(hs_step_at(w1, 0), "fencing_token") <
		    hs_int(hs_step_at(w2, 0), "fencing_token"));
	json_decref(w1);
	json_decref(w2);
	json_decref(lease);
}

static bool logged_share(void *arg)
{
	return hs_log_says(arg, "drives 64 of 64 partitions", NULL);
}

/* A node that starts alone says once that it drives all 64 partitions, not a line for each
 * batch of partitions it claimed. */
static void test_start_logs_one_summary(void **state)
{
	SKIP_UNLESS_PG();
	cluster *c = *state;
	assert_int_equal(cl_open(c, 1, LEASE_MS, NULL), 0);
	assert_true(cl_wait_balanced(c, 0, 1, WAIT_MS));
	assert_true(hs_wait_until(logged_share, c->node[0], WAIT_MS));
	char *log = hs_log_text(c->node[0]);
	int drives = 0;
	for (const char *p = log; (p = strstr(p, "drives ")); p++)
		drives++;
	free(log);
	assert_int_equal(drives, 1);
}

/* With the default settings (batond's --lease-ms, baton lock's --ttl), a `baton lock` command
 * naming every node keeps running through the kill -9 of the node that drives its resource:
 * it renews through the node that takes the resource over before its own deadline. */
static void test_lock_survives_owner_kill(void **state)
{
	SKIP_UNLESS_PG();
	cluster *c = *state;
	assert_int_equal(cl_open(c, 3, 0, NULL), 0);
	assert_true(cl_wait_balanced(c, 0, 7, WAIT_MS));
	unsigned long long avoid = 0;
	char res[64], urls[128], path[200];
	cl_pick_resource(c, 0, "survive", &avoid, res, sizeof res);
	snprintf(urls, sizeof urls, "http://127.0.0.1:%d,http://127.0.0.1:%d,http://127.0.0.1:%d",
		 hs_port(c->node[0]), hs_port(c->node[1]), hs_port(c->node[2]));
	pid_t pid = fork();
	if (pid == 0) {
		const char *bin = getenv("BATON_CLIENT");
		execl(bin, bin, "--server", urls, "lock", res, "--", "sleep", "25", (char *)NULL);
		_exit(127);
	}
	assert_true(pid > 0);
	/* held, then its owner dies */
	snprintf(path, sizeof path, "/resources/%s", res);
	int held = 0;
	for (int64_t end = hs_mono_ms() + WAIT_MS; hs_mono_ms() < end && !held;) {
		json_t *r = NULL;
		held = call(c->node[0], "GET", path, NULL, &r) == 200 &&
		       json_is_object(json_object_get(r, "holder"));
		json_decref(r);
		if (!held)
			hs_pause_ms(100);
	}
	hs_pause_ms(3000); /* a renewal or two first */
	hs_kill(c->node[0]);
	int status = wait_child(pid, 120000);
	assert_true(held);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0); /* 76 would say the lease was lost */
}

/* One request with one more header line; as call(). */
static long call_with(const hs_server *s, const char *header, const char *method, const char *path,
		      const char *body, json_t **out)
{
	hs_request req = {.method = method,
			  .path = path,
			  .content_type = body ? "application/json" : NULL,
			  .body = body,
			  .body_len = body ? strlen(body) : 0,
			  .header = header};
	hs_response r;
	long status = hs_send(s, &req, &r) == 0 ? r.status : 0;
	if (out)
		*out = status ? json_incref(r.json) : NULL;
	hs_response_fini(&r);
	return status;
}

/* The same lease, read through either node: its state, holder, token and expiry. */
static void assert_same_lease(cluster *c, const char *id, const char *state)
{
	char path[200];
	snprintf(path, sizeof path, "/leases/%s", id);
	json_t *a, *b;
	assert_int_equal(call(c->node[0], "GET", path, NULL, &a), 200);
	assert_int_equal(call(c->node[1], "GET", path, NULL, &b), 200);
	assert_string_equal(hs_str(a, "state"), state);
	assert_string_equal(hs_str(b, "state"), state);
	assert_int_equal(hs_int(a, "fencing_token"), hs_int(b, "fencing_token"));
	assert_true(json_equal(json_object_get(a, "expires_at"), json_object_get(b, "expires_at")));
	json_decref(a);
	json_decref(b);
}

static bool waiting_on(void *arg)
{
	void **a = arg;
	char path[200];
	snprintf(path, sizeof path, "/resources/%s", (const char *)a[1]);
	json_t *res = hs_get_json(a[0], path, 200);
	bool yes = json_array_size(json_object_get(res, "waiters")) == (size_t)(intptr_t)a[2];
	json_decref(res);
	return yes;
}

typedef struct acquirer {
	const hs_server *via;
	char path[200];
	long status;
	json_t *lease;
} acquirer;

static void *acquire_main(void *arg)
{
	acquirer *q = arg;
	q->status =
	    call(q->via, "POST", q->path,
		 "{\"holder\": \"second\", \"wait_ms\": 60000, \"ttl_ms\": 60000}", &q->lease);
	return NULL;
}

/* Every node serves every lease request with the answer of the node that drives the
 * resource: node1 passes them on to node0. Acquire (201, then 409 naming the holder), get
 * (the same state, token and expiry as node0 tells), renew, a waiting acquire granted when
 * the holder releases, and release. Before, node1 answered 503 ("ask that node"). */
static void test_every_node_serves_leases(void **state)
{
	SKIP_UNLESS_PG();
	cluster *c = *state;
	char res[64], path[200];
	two_nodes(c, "fwd", res);
	snprintf(path, sizeof path, "/resources/%s/leases", res);
	json_t *lease, *p;
	assert_int_equal(
	    call(c->node[1], "POST", path, "{\"holder\": \"first\", \"ttl_ms\": 60000}", &lease),
	    201);
	assert_string_equal(hs_str(lease, "holder"), "first");
	assert_int_equal(hs_int(lease, "fencing_token"), 1);
	assert_int_equal(call(c->node[1], "POST", path, "{\"holder\": \"other\"}", &p), 409);
	assert_string_equal(hs_str(p, "holder"), "first");
	json_decref(p);
	assert_same_lease(c, hs_str(lease, "id"), "held");

	char renew[200], one[200];
	snprintf(one, sizeof one, "/leases/%s", hs_str(lease, "id"));
	snprintf(renew, sizeof renew, "/leases/%s/renew", hs_str(lease, "id"));
	assert_int_equal(call(c->node[1], "POST", renew, "{\"ttl_ms\": 30000}", &p), 200);
	assert_int_equal(hs_int(p, "ttl_ms"), 30000);
	json_decref(p);
	assert_same_lease(c, hs_str(lease, "id"), "held");

	acquirer q = {.via = c->node[1]};
	snprintf(q.path, sizeof q.path, "%s", path);
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, acquire_main, &q), 0);
	void *args[3] = {c->node[0], res, (void *)(intptr_t)1};
	bool queued = hs_wait_until(waiting_on, args, WAIT_MS);
	long released = call(c->node[1], "DELETE", one, NULL, NULL);
	pthread_join(t, NULL);
	assert_true(queued);
	assert_int_equal(released, 204);
	assert_int_equal(q.status, 201);
	assert_string_equal(hs_str(q.lease, "holder"), "second");
	assert_int_equal(hs_int(q.lease, "fencing_token"), 2);
	assert_same_lease(c, hs_str(lease, "id"), "released");
	assert_same_lease(c, hs_str(q.lease, "id"), "held");
	/* node1 counts what it passed on: at least the 8 requests above sent to it */
	json_t *m = prom_scrape(c->node[1]);
	assert_true(prom_metric(m, "baton_requests_passed_on_total", "") >= 8);
	assert_true(prom_metric(m, "baton_requests_passed_on_failed_total", "") == 0);
	json_decref(m);
	json_decref(q.lease);
	json_decref(lease);
}

/* A lease granted through node1, which passes it on to node0, is renewed and released
 * through node1 while node1 is cut from the database: node1 learnt the lease's resource from
 * node0's answer, so it passes the renewal and the release on with no read of the store.
 * Before, node1 read the lease from the store to find its resource, and answered 503 while
 * it could not. */
static void test_passed_on_lease_needs_no_read(void **state)
{
	SKIP_UNLESS_PG();
	cluster *c = *state;
	char res[64], path[200], renew[200], one[200];
	two_proxied(c, "noted", res, path);
	json_t *lease, *p;
	assert_int_equal(
	    call_again(c->node[1], "POST", path, "{\"holder\": \"h\", \"ttl_ms\": 60000}", &lease),
	    201);
	snprintf(one, sizeof one, "/leases/%s", hs_str(lease, "id"));
	snprintf(renew, sizeof renew, "/leases/%s/renew", hs_str(lease, "id"));
	cl_cut(c, 1);
	assert_int_equal(call(c->node[1], "POST", renew, "{\"ttl_ms\": 30000}", &p), 200);
	assert_int_equal(hs_int(p, "ttl_ms"), 30000);
	assert_int_equal(hs_int(p, "fencing_token"), hs_int(lease, "fencing_token"));
	json_decref(p);
	assert_int_equal(call(c->node[1], "DELETE", one, NULL, NULL), 204);
	assert_int_equal(call(c->node[0], "GET", one, NULL, &p), 200);
	assert_string_equal(hs_str(p, "state"), "released");
	json_decref(p);
	json_decref(lease);
}

/* Every node serves every task request: a claim naming the resource, heartbeats and the
 * completion, all through node1, are node0's answers, and the workflow completes with the
 * worker's result. Before, the claim answered 503 and the rest could not be reached. */
static void test_every_node_serves_tasks(void **state)
{
	SKIP_UNLESS_PG();
	cluster *c = *state;
	char res[64], body[300], path[300];
	two_nodes(c, "claim", res);
	snprintf(body, sizeof body, "{\"resource\": \"%s\", \"wait_ms\": 0}", res);
	assert_int_equal(call(c->node[1], "POST", "/tasks/claim", body, NULL), 204);
	snprintf(body, sizeof body,
		 "{\"id\": \"fw\", \"resource\": \"%s\", \"workers\": [{\"name\": \"x\","
		 " \"external\": true}]}",
		 res);
	assert_int_equal(call(c->node[0], "POST", "/workflows", body, NULL), 201);
	snprintf(body, sizeof body, "{\"resource\": \"%s\", \"wait_ms\": 30000}", res);
	json_t *task, *p;
	assert_int_equal(call(c->node[1], "POST", "/tasks/claim", body, &task), 200);
	snprintf(path, sizeof path, "/tasks/%s/heartbeat", hs_str(task, "id"));
	assert_int_equal(call(c->node[1], "POST", path, NULL, &p), 200);
	json_decref(p);
	snprintf(path, sizeof path, "/tasks/%s/complete", hs_str(task, "id"));
	assert_int_equal(call(c->node[1], "POST", path, "{\"result\": {\"done\": 1}}", &p), 200);
	json_decref(p);
	json_t *wf = hs_wait_workflow(c->node[0], "fw", "completed", WAIT_MS);
	assert_int_equal(hs_int(json_object_get(hs_step_at(wf, 0), "result"), "done"), 1);
	json_decref(wf);
	json_decref(task);
}

/* GET /nodes lists both nodes, each with the URL it listens at. */
static bool urls_listed(void *arg)
{
	cluster *c = arg;
	json_t *nodes = hs_get_json(c->node[1], "/nodes", 200);
	json_t *n;
	size_t i;
	int right = 0;
	json_array_foreach(json_object_get(nodes, "nodes"), i, n)
	{
		char url[64];
		int k = cl_index(c, hs_str(n, "id"));
		snprintf(url, sizeof url, "http://127.0.0.1:%d", k >= 0 ? hs_port(c->node[k]) : 0);
		right += k >= 0 && strcmp(hs_str(n, "url"), url) == 0;
	}
	json_decref(nodes);
	return right == 2;
}

/* A request is passed on once at most: one that node1 received from another node, for a
 * resource node0 drives, answers 503 naming node0 (whose URL it gives), never a loop. */
static void test_passed_on_once(void **state)
{
	SKIP_UNLESS_PG();
	cluster *c = *state;
	char res[64], path[200], url[64];
	two_nodes(c, "hop", res);
	snprintf(path, sizeof path, "/resources/%s/leases", res);
	json_t *p;
	assert_int_equal(call_with(c->node[1], "Baton-Forwarded: node9", "POST", path, NULL, &p),
			 503);
	json_t *by = json_object_get(p, "driven_by");
	assert_string_equal(hs_str(by, "node"), "node0");
	snprintf(url, sizeof url, "http://127.0.0.1:%d", hs_port(c->node[0]));
	assert_string_equal(hs_str(by, "url"), url);
	json_decref(p);
	/* and GET /nodes says where each node is reached (a node listening on a port of the
	 * system's choice writes its URL with its next lease renewal) */
	assert_true(hs_wait_until(urls_listed, c, WAIT_MS));
}

/* GET /workflows lists newest first in a cluster too, through either node and across
 * pages: workflows submitted in turn to resources that two nodes drive (each node takes
 * its seqs from blocks of its own; before, the list was sorted by seq and showed one
 * node's block, then the other's). */
static void test_list_newest_first_across_nodes(void **state)
{
	SKIP_UNLESS_PG();
	cluster *c = *state;
	two_nodes(c, NULL, NULL);
	unsigned long long avoid = 0;
	char res[2][64], body[300], ids[8][16];
	cl_pick_resource(c, 0, "lista", &avoid, res[0], sizeof res[0]);
	cl_pick_resource(c, 1, "listb", &avoid, res[1], sizeof res[1]);
	for (int i = 0; i < 8; i++) {
		snprintf(ids[i], sizeof ids[i], "order-%d", i);
		snprintf(body, sizeof body,
			 "{\"id\": \"%s\", \"resource\": \"%s\", \"workers\": [\"w\"]}", ids[i],
			 res[i % 2]);
		assert_int_equal(call(c->node[i % 2], "POST", "/workflows", body, NULL), 201);
		/* the next one is accepted at a later millisecond */
		for (int64_t t = hs_now_ms(); hs_now_ms() <= t + 1;)
			;
	}
	for (int via = 0; via < 2; via++) {
		int seen = 0;
		char path[200] = "/workflows?limit=3";
		for (int page = 0; page < 4 && path[0]; page++) {
			json_t *l;
			assert_int_equal(call(c->node[via], "GET", path, NULL, &l), 200);
			json_t *w;
			size_t i;
			json_array_foreach(json_object_get(l, "workflows"), i, w)
			{
				assert_true(seen < 8);
				assert_string_equal(hs_str(w, "id"), ids[7 - seen]);
				seen++;
			}
			const char *next = json_string_value(json_object_get(l, "next_cursor"));
			if (next)
				snprintf(path, sizeof path, "/workflows?limit=3&cursor=%s", next);
			else
				path[0] = 0;
			json_decref(l);
		}
		assert_int_equal(seen, 8);
	}
}

/* A `baton worker` that names no resource and every node gets a task that the node named
 * last drives: a claim that found nothing goes to the next node. Before, it long-polled
 * the first node alone and exited 75 ("no task within --wait"). */
static void test_worker_without_resource_asks_every_node(void **state)
{
	SKIP_UNLESS_PG();
	cluster *c = *state;
	two_nodes(c, NULL, NULL);
	unsigned long long avoid = 0;
	char res[64], urls[128], body[300];
	cl_pick_resource(c, 1, "anywhere", &avoid, res, sizeof res);
	snprintf(body, sizeof body,
		 "{\"id\": \"far\", \"resource\": \"%s\", \"workers\": [{\"name\": \"x\","
		 " \"external\": true}]}",
		 res);
	assert_int_equal(call(c->node[0], "POST", "/workflows", body, NULL), 201);
	snprintf(urls, sizeof urls, "http://127.0.0.1:%d,http://127.0.0.1:%d", hs_port(c->node[0]),
		 hs_port(c->node[1]));
	pid_t pid = fork();
	if (pid == 0) {
		const char *bin = getenv("BATON_CLIENT");
		execl(bin, bin, "--server", urls, "worker", "--worker", "x", "--once", "--wait",
		      "90s", "--", "sh", "-c", "cat >/dev/null; echo 1", (char *)NULL);
		_exit(127);
	}
	assert_true(pid > 0);
	int status = wait_child(pid, 120000);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	json_decref(hs_wait_workflow(c->node[0], "far", "completed", WAIT_MS));
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_cut_node_promises_nothing_it_cannot_keep, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_refused_changes_are_not_answered_done, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_hand_over_moves_held_leases, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_hand_over_keeps_renewals, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_healed_node_serves_again, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_same_node_id_waits_for_the_first, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_late_connect_sends_nothing, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_renewal_after_lapse_promises_nothing, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_dispatch_after_lost_lease_sends_nothing, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_failover_keeps_fifo, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_start_logs_one_summary, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_lock_survives_owner_kill, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_every_node_serves_leases, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_passed_on_lease_needs_no_read, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_every_node_serves_tasks, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_passed_on_once, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_list_newest_first_across_nodes, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_worker_without_resource_asks_every_node, setup,
					    teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
