/*
 * test_faults.c - batond when its disk fails, and when clients are slow.
 *
 * Disk faults go through the store's test seam: with BATON_TEST_FAULT_FILE set, every
 * write of the database fails while that file exists (an I/O error, or a full disk when
 * it says "full"). While it fails: new work is refused with 503 and not stored, running
 * workflows pause instead of failing, /readyz says not ready. Once writes work again,
 * everything acknowledged completes, nothing ran twice, and PRAGMA integrity_check is ok.
 * The seam is SQLite's: on PostgreSQL these two tests skip, and the same round is played
 * by stopping the PostgreSQL server itself (scripts/pg.sh) under batond.
 * Slow clients: connections that send a byte a second hold no thread, and others are
 * served promptly meanwhile.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "../harness/faulty.h"
#include "../harness/harness.h"

#define WAIT_MS 60000

static void set_fault(const hs_faulty *f, const char *kind)
{
	FILE *fp = fopen(f->file, "w");
	assert_non_null(fp);
	fputs(kind, fp);
	fclose(fp);
}

static long post(const hs_server *s, const char *body)
{
	hs_response r;
	hs_post(s, "/workflows", body, &r);
	long status = r.status;
	if (status == 503 && !strstr(r.body ? r.body : "", "unavailable"))
		fail_msg("503 without a problem body: %s", r.body ? r.body : "");
	hs_response_fini(&r);
	return status;
}

static long get_status(const hs_server *s, const char *path)
{
	hs_response r;
	hs_get(s, path, &r);
	long status = r.status;
	hs_response_fini(&r);
	return status;
}

typedef struct until_ready {
	const hs_server *s;
	long want;
} until_ready;

static bool readyz_is(void *arg)
{
	until_ready *u = arg;
	return get_status(u->s, "/readyz") == u->want;
}

/* The steps of id that are not completed, with their status: none may have failed. */
static void assert_none_failed(const hs_server *s, const char *id)
{
	json_t *wf = hs_get_workflow(s, id);
	assert_string_not_equal(hs_str(wf, "status"), "failed");
	size_t i;
	json_t *st;
	json_array_foreach(json_object_get(wf, "steps"), i, st)
	{
		assert_string_not_equal(hs_str(st, "status"), "failed");
	}
	json_decref(wf);
}

/* Stops batond (it holds its database while it runs) and checks the file. */
static void integrity_ok(hs_server *s)
{
	assert_int_equal(hs_stop(s), 0);
	sqlite3 *db;
	assert_int_equal(sqlite3_open_v2(hs_db_path(s), &db, SQLITE_OPEN_READONLY, NULL),
			 SQLITE_OK);
	sqlite3_stmt *st;
	assert_int_equal(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &st, NULL),
			 SQLITE_OK);
	assert_int_equal(sqlite3_step(st), SQLITE_ROW);
	assert_string_equal((const char *)sqlite3_column_text(st, 0), "ok");
	sqlite3_finalize(st);
	sqlite3_close(db);
}

/* w1's 5 s are far longer than the few requests between seeing it run and setting the
 * fault, so its checkpoint falls in the fault however slow the machine. */
#define FMT                                                                                        \
	"{\"id\":\"%s\",\"resource\":\"%s\",\"workers\":[{\"name\":\"w1\",\"work_ms\":5000},"      \
	"{\"name\":\"w2\",\"work_ms\":50},{\"name\":\"w3\",\"work_ms\":50}]}"

/* A storage outage: outage(arg, true) begins it, outage(arg, false) ends it. */
typedef void (*outage_fn)(void *arg, bool broken);

typedef struct disk_fault {
	hs_faulty *f;
	const char *kind;
} disk_fault;

static void disk_outage(void *arg, bool broken)
{
	disk_fault *d = arg;
	if (broken)
		set_fault(d->f, d->kind);
	else
		unlink(d->f->file);
}

static void postgres_outage(void *arg, bool broken)
{
	(void)arg;
	assert_int_equal(broken ? hs_pg_stop() : hs_pg_start(), 0);
}

/* One storage outage in the middle of two running workflows. reads_work: the store is a
 * file that can still be read (a disk that fails writes); a database server that is down
 * answers no read either, and reads answer 503. */
static void outage_round(hs_server *s, outage_fn outage, void *arg, const char *prefix,
			 bool reads_work)
{
	char a[64], b[64], c[64], body[512];
	snprintf(a, sizeof a, "%s-a", prefix);
	snprintf(b, sizeof b, "%s-b", prefix);
	snprintf(c, sizeof c, "%s-refused", prefix);
	snprintf(body, sizeof body, FMT, a, "disk-1");
	assert_int_equal(post(s, body), 201);
	snprintf(body, sizeof body, FMT, b, "disk-2");
	assert_int_equal(post(s, body), 201);
	json_decref(hs_wait_step(s, a, 0, "running", WAIT_MS));
	json_t *list = hs_get_json(s, "/workflows?limit=1000", 200);
	long long before = (long long)json_array_size(json_object_get(list, "workflows"));
	json_decref(list);

	outage(arg, true);
	/* The running steps end during the fault: their checkpoints cannot be written. */
	until_ready not_ready = {s, 503};
	assert_true(hs_wait_until(readyz_is, &not_ready, WAIT_MS));
	snprintf(body, sizeof body, FMT, c, "disk-3");
	assert_int_equal(post(s, body), 503);
	assert_int_equal(get_status(s, "/healthz"), 200);
	if (reads_work) {
		assert_none_failed(s, a);
		assert_none_failed(s, b);
	}
	assert_int_equal(get_status(s, "/workflows/x-never"), reads_work ? 404 : 503);

	outage(arg, false);
	until_ready ready = {s, 200};
	assert_true(hs_wait_until(readyz_is, &ready, WAIT_MS));
	json_t *wa = hs_wait_workflow(s, a, "completed", WAIT_MS);
	json_t *wb = hs_wait_workflow(s, b, "completed", WAIT_MS);
	/* The refused submission was not stored, and nothing ran twice. */
	char path[128];
	snprintf(path, sizeof path, "/workflows/%s", c);
	assert_int_equal(get_status(s, path), 404);
	assert_int_equal(hs_db_count(s, "SELECT count(*) FROM workflows"), before);
	for (size_t i = 0; i < 3; i++) {
		assert_int_equal(
		    hs_int(json_array_get(json_object_get(wa, "steps"), i), "attempts"), 1);
		assert_int_equal(
		    hs_int(json_array_get(json_object_get(wb, "steps"), i), "attempts"), 1);
	}
	json_decref(wa);
	json_decref(wb);
	/* New work is taken again. */
	snprintf(body, sizeof body, FMT, c, "disk-3");
	assert_int_equal(post(s, body), 201);
	json_decref(hs_wait_workflow(s, c, "completed", WAIT_MS));
}

typedef struct waiting_lease {
	const hs_server *s;
	const char *body;
	long status;
	pthread_t t;
} waiting_lease;

static void *waiting_lease_main(void *arg)
{
	waiting_lease *w = arg;
	hs_response r;
	w->status = hs_post(w->s, "/resources/db/leases", w->body, &r) == 0 ? r.status : 0;
	hs_response_fini(&r);
	return NULL;
}

static bool one_waiter(void *arg)
{
	json_t *res = hs_get_json(arg, "/resources/db", 200);
	bool yes = json_array_size(json_object_get(res, "waiters")) == 1;
	json_decref(res);
	return yes;
}

/* A grant whose commit fails is undone: its caller was told 503, so the resource is not held
 * for nobody once storage recovers; the next waiter gets it. And a claim likewise. */
static void test_grant_that_cannot_commit_is_undone(void **state)
{
	if (hs_store_is_pg())
		skip(); /* the faults come from SQLite's VFS */
	hs_faulty *f = *state;
	hs_server *s = f->s;
	hs_response r;
	assert_int_equal(
	    hs_post(s, "/resources/db/leases", "{\"holder\": \"a\", \"ttl_ms\": 60000}", &r), 0);
	assert_int_equal(r.status, 201);
	char path[128];
	snprintf(path, sizeof path, "/leases/%s", hs_str(r.json, "id"));
	hs_response_fini(&r);
	waiting_lease b = {s, "{\"holder\": \"b\", \"ttl_ms\": 60000, \"wait_ms\": 60000}", 0, 0};
	assert_int_equal(pthread_create(&b.t, NULL, waiting_lease_main, &b), 0);
	bool queued = hs_wait_until(one_waiter, s, WAIT_MS);

	set_fault(f, "io");
	hs_request del = {.method = "DELETE", .path = path};
	assert_int_equal(hs_send(s, &del, &r), 0);
	long released = r.status;
	hs_response_fini(&r);
	pthread_join(b.t, NULL);
	unlink(f->file);
	until_ready ready = {s, 200};
	assert_true(queued);
	assert_int_equal(released, 503);
	assert_int_equal(b.status, 503); /* granted in the round that could not commit */
	assert_true(hs_wait_until(readyz_is, &ready, WAIT_MS));
	/* b was never told it holds the lease: c gets the resource, not b's 60 s of nobody */
	assert_int_equal(
	    hs_post(s, "/resources/db/leases", "{\"holder\": \"c\", \"wait_ms\": 10000}", &r), 0);
	assert_int_equal(r.status, 201);
	hs_response_fini(&r);
}

static void test_io_error_pauses_and_recovers(void **state)
{
	if (hs_store_is_pg())
		skip(); /* the faults come from SQLite's VFS; integrity_check is SQLite's */
	hs_faulty *f = *state;
	disk_fault io = {f, "io"};
	outage_round(f->s, disk_outage, &io, "io", true);
	integrity_ok(f->s);
}

static void test_full_disk_pauses_and_recovers(void **state)
{
	if (hs_store_is_pg())
		skip(); /* the faults come from SQLite's VFS; integrity_check is SQLite's */
	hs_faulty *f = *state;
	disk_fault full = {f, "full"};
	outage_round(f->s, disk_outage, &full, "full", true);
	/* And the whole story survives a restart: what was acknowledged is there. */
	hs_kill(f->s);
	assert_int_equal(hs_start(f->s), 0);
	json_decref(hs_wait_workflow(f->s, "full-a", "completed", WAIT_MS));
	json_decref(hs_wait_workflow(f->s, "full-refused", "completed", WAIT_MS));
	integrity_ok(f->s);
}

/*
 * The PostgreSQL server stops under two running workflows and starts again (pg.sh, same
 * port and data): batond behaves as when its disk fails, and recovers the same way.
 */
static void test_postgres_down_pauses_and_recovers(void **state)
{
	if (!hs_store_is_pg())
		skip(); /* only PostgreSQL is a server that can go away under batond */
	hs_server *s = *state;
	outage_round(s, postgres_outage, NULL, "pg", false);
	/* And a restart of the database alone, with no request in between. */
	assert_int_equal(hs_pg_restart(), 0);
	until_ready ready = {s, 200};
	assert_true(hs_wait_until(readyz_is, &ready, WAIT_MS));
	assert_int_equal(post(s, "{\"id\":\"after\",\"resource\":\"disk-1\",\"workers\":[\"w\"]}"),
			 201);
	json_decref(hs_wait_workflow(s, "after", "completed", WAIT_MS));
}

/* ---- slow clients ---- */

static int slow_connection(int port, const char *start)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
		close(fd);
		return -1;
	}
	send(fd, start, strlen(start), MSG_NOSIGNAL);
	return fd;
}

/*
 * More slow clients than batond has HTTP threads (8), each trickling a request a byte at
 * a time: other requests are still answered while every slow request is still open,
 * because a connection holds no thread while it waits for bytes (with a thread each,
 * nothing else would be answered until they finished).
 */
static void test_slow_clients_hold_no_thread(void **state)
{
	hs_server *s = *state;
	enum { SLOW = 24 };
	int fds[SLOW];
	for (int i = 0; i < SLOW; i++) {
		fds[i] = slow_connection(
		    hs_port(s), i % 2 ? "GET /healthz HTTP/1.1\r\nHo"
				      : "POST /workflows HTTP/1.1\r\nContent-Length: 200\r\n\r\n{");
		assert_true(fds[i] >= 0);
	}
	for (int round = 0; round < 5; round++) {
		for (int i = 0; i < SLOW; i++)
			send(fds[i], "x", 1, MSG_NOSIGNAL); /* a byte, then a pause */
		for (int k = 0; k < 10; k++) {
			char body[160];
			snprintf(body, sizeof body,
				 "{\"id\":\"quick-%d-%d\",\"resource\":\"q\",\"workers\":["
				 "{\"name\":\"w\",\"work_ms\":0}]}",
				 round, k);
			assert_int_equal(post(s, body), 201);
			assert_int_equal(get_status(s, "/healthz"), 200);
		}
		usleep(200 * 1000); /* the slow clients' pace, not a wait for the server */
	}
	/* Every slow request is still unfinished and its connection open: the answers above
	 * came while they held their connections, so those held no thread (how fast the
	 * answers came is the machine's business). */
	for (int i = 0; i < SLOW; i++) {
		char byte;
		ssize_t n = recv(fds[i], &byte, 1, MSG_PEEK | MSG_DONTWAIT);
		if (n >= 0)
			fail_msg("slow connection %d was answered or closed (recv %zd)", i, n);
		close(fds[i]);
	}
	json_decref(hs_wait_workflow(s, "quick-4-9", "completed", WAIT_MS));
}

/* A server on PostgreSQL; on SQLite none, and the test skips. */
static int pg_setup(void **state)
{
	*state = NULL;
	return hs_store_is_pg() ? hs_setup(state) : 0;
}

static int setup_small(void **state)
{
	static const char *const args[] = {"--max-connections", "16", NULL};
	hs_server *s = hs_open(args);
	*state = s;
	return s ? 0 : -1;
}

/* Reads the status line and whether a Retry-After header came, from a raw request. */
static long raw_request(int port, const char *req, int *retry_after)
{
	int fd = slow_connection(port, req);
	if (fd < 0)
		return 0;
	struct timeval tv = {.tv_sec = 15};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	char buf[2048] = "";
	size_t n = 0;
	ssize_t got;
	while (n < sizeof buf - 1 && (got = recv(fd, buf + n, sizeof buf - 1 - n, 0)) > 0)
		n += (size_t)got;
	buf[n] = 0;
	close(fd);
	long status = 0;
	if (sscanf(buf, "HTTP/1.%*d %ld", &status) != 1)
		status = 0;
	*retry_after = strcasestr(buf, "\r\nRetry-After: ") != NULL;
	return status;
}

/*
 * Past 90% of --max-connections, requests get 503 with Retry-After at once (health checks
 * excepted), and the server serves normally again when connections go away.
 */
static void test_overload_answers_503_with_retry_after(void **state)
{
	hs_server *s = *state;
	enum { HELD = 14 };
	int fds[HELD];
	for (int i = 0; i < HELD; i++) {
		fds[i] = slow_connection(hs_port(s), "GET /healthz HTTP/1.1\r\n");
		assert_true(fds[i] >= 0);
	}
	/* The 15th connection is past 90% of 16. Connections count once batond accepted
	 * them, so poll until it says so. */
	int retry_after = 0;
	long status = 0;
	for (int i = 0; i < 200 && status != 503; i++) {
		status = raw_request(
		    hs_port(s), "GET /workflows HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
		    &retry_after);
		if (status != 503)
			usleep(20 * 1000);
	}
	assert_int_equal(status, 503);
	assert_true(retry_after);
	status =
	    raw_request(hs_port(s), "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
			&retry_after);
	assert_int_equal(status, 200);
	for (int i = 0; i < HELD; i++)
		close(fds[i]);
	/* Wait until batond has seen the closes: status still holds /healthz's 200. */
	status = 0;
	for (int i = 0; i < 500 && status != 200; i++) {
		usleep(20 * 1000);
		status = raw_request(
		    hs_port(s), "GET /workflows HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
		    &retry_after);
	}
	status = raw_request(hs_port(s),
			     "GET /workflows HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
			     &retry_after);
	assert_int_equal(status, 200);
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_grant_that_cannot_commit_is_undone,
					    hs_faulty_setup, hs_faulty_teardown),
	    cmocka_unit_test_setup_teardown(test_io_error_pauses_and_recovers, hs_faulty_setup,
					    hs_faulty_teardown),
	    cmocka_unit_test_setup_teardown(test_full_disk_pauses_and_recovers, hs_faulty_setup,
					    hs_faulty_teardown),
	    cmocka_unit_test_setup_teardown(test_postgres_down_pauses_and_recovers, pg_setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_slow_clients_hold_no_thread, hs_setup,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_overload_answers_503_with_retry_after, setup_small,
					    hs_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
