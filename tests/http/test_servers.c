/*
 * test_servers.c - `baton --server URL,URL,...` (and BATON_SERVER): the failover of the
 * client between servers, with the real batond and the real baton. Two batond on SQLite
 * have a database each, so these tests check the mechanics, not a shared ownership: a
 * first server that refuses connections, or one that answers 503 to everything (a stub,
 * tests/harness/stub.h), and the command still works through the live one; baton lock's
 * acquire reaches the next server with the same request_id; baton lock renews through
 * the next server while the first is frozen (SIGSTOP), within its own deadline.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../harness/client.h"
#include "../harness/stub.h"

#define WAIT_MS 60000

static char dir[64];
static stub *fake;

static int setup(void **state)
{
	snprintf(dir, sizeof dir, "/tmp/baton-servers-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	return hs_setup(state);
}

static int teardown(void **state)
{
	client_free_all();
	hs_signal(*state, SIGCONT); /* a test that failed while batond was stopped */
	stub_close(fake);
	fake = NULL;
	unsetenv("BATON_SERVER");
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	if (system(cmd) != 0)
		return -1;
	return hs_close(*state);
}

static char *path_in(const char *name)
{
	static char p[4][128];
	static int k;
	k = (k + 1) % 4;
	snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
	return p[k];
}

static bool file_exists(void *path)
{
	return access(path, F_OK) == 0;
}

/* "FIRST,http://127.0.0.1:PORT-of-s" in a static buffer. */
static const char *list_of(const char *first, const hs_server *s)
{
	static char list[256];
	snprintf(list, sizeof list, "%s,%s", first, client_url_of(s));
	return list;
}

static const char *closed_url(void)
{
	static char url[64];
	snprintf(url, sizeof url, "http://127.0.0.1:%d", client_closed_port());
	return url;
}

/* Starts the stub with its routes; returns its URL (static buffer). */
static const char *start_stub(const stub_rule *rules, size_t n)
{
	static char url[64];
	fake = stub_open();
	assert_non_null(fake);
	for (size_t i = 0; i < n; i++)
		stub_route(fake, rules[i]);
	char *u = stub_url(fake);
	snprintf(url, sizeof url, "%s", u);
	free(u);
	return url;
}

/* The first server refuses connections: --server, BATON_SERVER, and baton lock. */
static void test_refused_then_live(void **state)
{
	hs_server *s = *state;
	char list[256], closed[64];
	snprintf(closed, sizeof closed, "%s", closed_url());
	snprintf(list, sizeof list, "%s", list_of(closed, s));
	const char *const res[] = {"--server", list, "resources", NULL};
	client_proc *p = client_expect_exit(0, NULL, res);
	/* the failover says why: refused */
	char want[256];
	snprintf(want, sizeof want, "baton: %s refused the connection; trying %s\n", closed,
		 client_url_of(s));
	if (!strstr(p->e.p, want))
		fail_msg("stderr lacks \"%s\":\n%s", want, p->e.p);
	client_free(p);
	const char *const lock[] = {"--server", list, "lock", "db", "--", "true", NULL};
	client_free(client_expect_exit(0, NULL, lock));
	json_t *r = hs_get_json(s, "/resources/db", 200);
	assert_int_equal(hs_int(r, "last_fencing_token"), 1);
	json_decref(r);
	/* BATON_SERVER takes the same list, and wins over BATON_URL */
	assert_int_equal(setenv("BATON_SERVER", list, 1), 0);
	const char *const health[] = {"health", NULL};
	client_free(client_expect_exit(0, closed_url(), health));
}

/* The first server answers 503 to everything: the request goes on to the next, and
 * baton lock's acquire carries the same request_id to both. */
static void test_503_then_live(void **state)
{
	hs_server *s = *state;
	const stub_rule busy[] = {
	    {"GET", NULL, 503,
	     "{\"title\": \"Service unavailable\", \"status\": 503, \"detail\": \"node n7 "
	     "drives this resource and could not be asked (timeout); try again\", \"driven_by\": "
	     "{\"node\": \"n7\", \"url\": \"http://127.0.0.1:9\"}}",
	     0},
	    {NULL, NULL, 503, "{\"title\": \"Service Unavailable\"}", 0}};
	char list[256];
	snprintf(list, sizeof list, "%s", list_of(start_stub(busy, 2), s));
	const char *const res[] = {"--server", list, "resources", NULL};
	client_proc *p = client_expect_exit(0, NULL, res);
	/* the failover says why: 503, naming the node that drives the resource */
	if (!strstr(p->e.p, "answered 503 (n7 at http://127.0.0.1:9 drives it); trying"))
		fail_msg("stderr lacks the 503 and its owner:\n%s", p->e.p);
	client_free(p);
	assert_int_equal(stub_count(fake, "GET", "/resources"), 1);
	char script[256];
	snprintf(script, sizeof script, "echo $BATON_LEASE_ID > %s", path_in("id"));
	const char *const lock[] = {"--server", list, "lock", "db", "--", "sh", "-c", script, NULL};
	client_free(client_expect_exit(0, NULL, lock));
	char *body = stub_body(fake, "POST", "/resources/db/leases");
	assert_non_null(body);
	json_t *sent = json_loads(body, 0, NULL);
	free(body);
	assert_non_null(sent);
	char path[256];
	snprintf(path, sizeof path, "/leases/lease-%s", hs_str(sent, "request_id"));
	json_decref(sent);
	json_t *lease = hs_get_json(s, path, 200); /* the live server's lease: the same id */
	assert_string_equal(hs_str(lease, "state"), "released");
	json_decref(lease);
}

/*
 * batond (the first server) is frozen while baton lock holds its lease: the renewals go
 * to the next server (a stub that accepts them) within baton lock's own deadline, so the
 * command is not stopped, even after three times the ttl without batond.
 */
static void test_lock_renews_through_the_next_server(void **state)
{
	hs_server *s = *state;
	const stub_rule rules[] = {{"POST", "/leases/", 200, "{\"state\": \"held\"}", 0},
				   {"DELETE", "/leases/", 204, NULL, 0}};
	char list[256];
	snprintf(list, sizeof list, "%s,%s", client_url_of(s), start_stub(rules, 2));
	char script[512];
	snprintf(script, sizeof script,
		 "touch %s; while [ ! -e %s ]; do sleep 0.05; done; echo done", path_in("ran"),
		 path_in("go"));
	const char *const args[] = {"--server", list, "lock", "db",   "--ttl", "2s",
				    "--",	"sh", "-c",   script, NULL};
	client_proc *p = client_spawn(args, NULL, false);
	int64_t deadline = hs_mono_ms() + WAIT_MS;
	while (!file_exists(path_in("ran"))) {
		if (!client_running(p) || hs_mono_ms() > deadline)
			fail_msg("the command never ran\nstderr:\n%s", p->e.p);
		client_pump(p, HS_POLL_MS);
	}
	assert_int_equal(hs_signal(s, SIGSTOP), 0);
	/* about 6 s: each renewal comes every ttl/3 once batond has timed out */
	deadline = hs_mono_ms() + WAIT_MS;
	while (stub_count(fake, "POST", "/leases/") < 9 && client_running(p)) {
		client_pump(p, HS_POLL_MS);
		assert_true(hs_mono_ms() < deadline);
	}
	if (!client_running(p))
		fail_msg("baton lock ended while batond was frozen\nstderr:\n%s", p->e.p);
	FILE *go = fopen(path_in("go"), "w");
	assert_non_null(go);
	fclose(go);
	int code = client_finish(p);
	assert_int_equal(hs_signal(s, SIGCONT), 0);
	if (code != 0)
		fail_msg("exit %d\nstderr:\n%s", code, p->e.p);
	assert_non_null(strstr(p->o.p, "done"));
	/* the failover says why: the frozen server timed out */
	char want[128];
	snprintf(want, sizeof want, "baton: %s did not answer within ", client_url_of(s));
	if (!strstr(p->e.p, want))
		fail_msg("stderr lacks \"%s...\":\n%s", want, p->e.p);
	client_free(p);
}

/* watch: the first server refuses connections, the stream comes from the next. */
static void test_watch_moves_on(void **state)
{
	hs_server *s = *state;
	json_decref(hs_create_workflow(
	    s, json_pack("{s:s, s:s, s:[s]}", "id", "w1", "resource", "db", "workers", "a")));
	json_decref(hs_wait_workflow(s, "w1", "completed", WAIT_MS));
	char list[256];
	snprintf(list, sizeof list, "%s", list_of(closed_url(), s));
	const char *const args[] = {"--server", list, "watch", "w1", NULL};
	client_free(client_expect_exit(0, NULL, args));
}

/* The lines of text (a final newline not counted). */
static int lines_of(const char *text)
{
	int n = 0;
	for (const char *c = text; *c; c++)
		n += *c == '\n' || (c[1] == '\0');
	return n;
}

/*
 * No server of the list answers baton lock (both refuse): it gives up after
 * --connect-timeout (default 5 s), not --wait, with exit 3 and one line naming each server
 * and why; nothing runs. The old baton lock retried for the whole --wait (60 s), a line
 * per try.
 */
static void test_lock_gives_up_when_no_server_answers(void **state)
{
	(void)state;
	char a[64], b[64], list[160], touch[160];
	snprintf(a, sizeof a, "%s", closed_url());
	snprintf(b, sizeof b, "%s", closed_url());
	snprintf(list, sizeof list, "%s,%s", a, b);
	snprintf(touch, sizeof touch, "touch %s", path_in("ran"));
	const char *const args[] = {"--server", list, "lock", "db", "--", "sh", "-c", touch, NULL};
	client_proc *p = client_expect_exit(3, NULL, args);
	if (lines_of(p->e.p) != 1 || !strstr(p->e.p, a) || !strstr(p->e.p, b) ||
	    !strstr(p->e.p, "within 5 s") || !strstr(p->e.p, "refused the connection"))
		fail_msg("not one line naming both servers and why:\n%s", p->e.p);
	client_free(p);
	assert_false(file_exists(path_in("ran")));
	const char *const short_one[] = {"--server", a,	   "lock", "db", "--connect-timeout",
					 "500ms",    "--", "sh",   "-c", touch,
					 NULL};
	p = client_expect_exit(3, NULL, short_one);
	if (lines_of(p->e.p) != 1 || !strstr(p->e.p, "within 0.5 s"))
		fail_msg("not one line, after 0.5 s:\n%s", p->e.p);
	client_free(p);
	const char *const bad[] = {"--server", a,    "lock", "db", "--connect-timeout",
				   "soon",     "--", "true", NULL};
	client_free(client_expect_exit(2, NULL, bad));
	assert_false(file_exists(path_in("ran")));
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_refused_then_live, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_503_then_live, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_lock_renews_through_the_next_server, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_watch_moves_on, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_lock_gives_up_when_no_server_answers, setup,
					    teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
