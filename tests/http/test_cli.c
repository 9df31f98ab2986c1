/*
 * test_cli.c - the output of the command-line client `baton` for scripts and people, run
 * as a real process against a real batond (or the stub of stub.h, for what a lone batond
 * on SQLite never answers): errors as JSON with --json (test_json_errors_on_stderr), answers on one
 * line (test_json_answers_are_one_line), the columns of `list` with lease ids
 * (test_list_columns_fit_lease_ids), the mode of a backup (test_backup_is_0600), a
 * resource's permits (test_limit_shows_and_sets, test_lock_exclusive_runs_alone).
 *
 * The client binary comes from $BATON_CLIENT (harness/client.h).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../harness/client.h"
#include "../harness/stub.h"

static int teardown(void **state)
{
	client_free_all();
	return hs_close(*state);
}

/* The only line of text, parsed as a JSON object, or fails the test. */
static json_t *one_json_line(const char *text)
{
	json_error_t err;
	size_t len = strlen(text);
	if (len == 0 || text[len - 1] != '\n' || strchr(text, '\n') != text + len - 1)
		fail_msg("not one line:\n%s", text);
	json_t *doc = json_loads(text, 0, &err);
	if (!json_is_object(doc))
		fail_msg("not a JSON object (%s):\n%s", err.text, text);
	return doc;
}

/* ---- errors with --json ------------------------------------------------------------- */

/* With --json, an error is one line of JSON on stderr: the server's problem document, or
 * the client's own for a server it could not reach; the exit statuses stay. */
static void test_json_errors_on_stderr(void **state)
{
	hs_server *s = *state;
	const char *url = client_url_of(s);
	char closed[64];
	client_proc *p;
	json_t *doc;

	p = client_expect_exit(1, url, (const char *const[]){"--json", "get", "nope", NULL});
	assert_string_equal(p->o.p, "");
	doc = one_json_line(p->e.p);
	assert_int_equal(hs_int(doc, "status"), 404);
	assert_non_null(strstr(hs_str(doc, "type"), "not-found"));
	assert_non_null(strstr(hs_str(doc, "detail"), "nope"));
	json_decref(doc);
	client_free(p);

	p = client_expect_exit(1, url, (const char *const[]){"--json", "watch", "nope", NULL});
	doc = one_json_line(p->e.p);
	assert_int_equal(hs_int(doc, "status"), 404);
	json_decref(doc);
	client_free(p);

	p = client_expect_exit(1, url,
			       (const char *const[]){"list", "--status", "bogus", "--json", NULL});
	doc = one_json_line(p->e.p);
	assert_int_equal(hs_int(doc, "status"), 400);
	json_decref(doc);
	client_free(p);

	snprintf(closed, sizeof closed, "http://127.0.0.1:%d", client_closed_port());
	const char *const cmds[][3] = {{"get", "x", NULL}, {"watch", "x", NULL}, {"health", NULL}};
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
		const char *const args[] = {"--json", cmds[i][0], cmds[i][1], NULL};
		p = client_expect_exit(3, closed, args);
		doc = one_json_line(p->e.p);
		assert_string_equal(hs_str(doc, "type"), "about:blank");
		assert_non_null(strstr(hs_str(doc, "title"), "unreachable"));
		assert_non_null(strstr(hs_str(doc, "detail"), closed));
		json_decref(doc);
		client_free(p);
	}

	/* Without --json: text, as before. */
	p = client_expect_exit(1, url, (const char *const[]){"get", "nope", NULL});
	assert_non_null(strstr(p->e.p, "baton: GET /workflows/nope: HTTP 404"));
	client_free(p);
}

/* ---- one line of JSON ---------------------------------------------------------------- */

/* Every --json answer is one line of JSON, health's as the others. */
static void test_json_answers_are_one_line(void **state)
{
	hs_server *s = *state;
	const char *url = client_url_of(s);
	client_proc *p;

	p = client_expect_exit(0, url, (const char *const[]){"--json", "health", NULL});
	assert_string_equal(p->o.p, "{\"status\": \"ok\"}\n");
	client_free(p);

	json_decref(hs_create_workflow(s, json_pack("{s:s, s:s, s:[s, s]}", "id", "w", "resource",
						    "gw", "workers", "a", "b")));
	json_decref(hs_wait_workflow(s, "w", "completed", 60000));
	const char *const cmds[][3] = {{"get", "w", NULL},
				       {"list", NULL, NULL},
				       {"events", "w", NULL},
				       {"resources", NULL, NULL},
				       {"resources", "gw", NULL}};
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
		const char *const args[] = {"--json", cmds[i][0], cmds[i][1], NULL};
		p = client_expect_exit(0, url, args);
		json_decref(one_json_line(p->o.p));
		client_free(p);
	}
}

/* ---- columns -------------------------------------------------------------------------- */

/* Asserts that every line of a table has `word`'s column where the header has it:
 * the word itself, or any text after two spaces. */
static void assert_column(const char *table, const char *word)
{
	const char *head = strstr(table, word);
	assert_non_null(head);
	size_t at = (size_t)(head - table);
	for (const char *line = strchr(table, '\n') + 1; *line;) {
		const char *eol = strchr(line, '\n');
		size_t len = eol ? (size_t)(eol - line) : strlen(line);
		if (len <= at || line[at - 1] != ' ' || line[at - 2] != ' ' || line[at] == ' ')
			fail_msg("column %s not at %zu in:\n%s", word, at, table);
		line += len + (eol ? 1 : 0);
	}
}

/* `baton list` keeps its columns with lease ids ("lease-" and 32 hex digits). */
static void test_list_columns_fit_lease_ids(void **state)
{
	hs_server *s = *state;
	hs_response r;
	assert_int_equal(
	    hs_post(s, "/resources/gw/leases", "{\"holder\": \"me\", \"ttl_ms\": 60000}", &r), 0);
	assert_int_equal(r.status, 201);
	assert_int_equal(strlen(hs_str(r.json, "id")), 38);
	hs_response_fini(&r);
	json_decref(hs_create_workflow(
	    s, json_pack("{s:s, s:s, s:[s]}", "id", "w", "resource", "gw", "workers", "a")));

	client_proc *p =
	    client_expect_exit(0, client_url_of(s), (const char *const[]){"list", NULL});
	assert_non_null(strstr(p->o.p, "lease-"));
	assert_column(p->o.p, "STATUS");
	assert_column(p->o.p, "RESOURCE");
	client_free(p);
}

/* ---- events and watch ----------------------------------------------------------------- */

/* `baton events ID` prints the lines `baton watch ID` prints (through a pipe): one layout,
 * for a workflow with a retried step. */
static void test_events_lines_are_watch_lines(void **state)
{
	hs_server *s = *state;
	const char *url = client_url_of(s);
	json_t *body = json_pack("{s:s, s:s, s:[s, {s:s, s:i}], s:{s:i}}", "id", "w", "resource",
				 "gw", "workers", "worker-A", "name", "worker-B", "fail_attempts",
				 1, "retry", "first_retry_ms", 20);
	json_decref(hs_create_workflow(s, body));
	json_decref(hs_wait_workflow(s, "w", "completed", 60000));

	client_proc *w = client_expect_exit(0, url, (const char *const[]){"watch", "w", NULL});
	client_proc *e = client_expect_exit(0, url, (const char *const[]){"events", "w", NULL});
	assert_non_null(strstr(w->o.p, "step_failed"));
	assert_non_null(strstr(w->o.p, "workflow_completed"));
	assert_string_equal(e->o.p, w->o.p);
	client_free(w);
	client_free(e);
}

/* ---- the node that drives a resource ------------------------------------------------- */

static const char WORKFLOW_ON_NODES[] =
    "{\"id\": \"w\", \"resource\": \"gw\", \"status\": \"running\", \"steps_total\": 3,"
    " \"steps_completed\": 1, \"steps\": ["
    "{\"index\": 0, \"worker\": \"worker-A\", \"status\": \"completed\", \"attempts\": 1,"
    " \"node\": \"node-a\"},"
    "{\"index\": 1, \"worker\": \"worker-B\", \"status\": \"running\", \"attempts\": 2,"
    " \"node\": \"node-b\"},"
    "{\"index\": 2, \"worker\": \"worker-C\", \"status\": \"pending\", \"attempts\": 0,"
    " \"node\": null}]}";
static const char RESOURCE_ON_NODE[] =
    "{\"name\": \"gw\", \"last_fencing_token\": 2, \"last_event_seq\": 9, \"holder\": null,"
    " \"waiters\": [], \"totals\": {}, \"node\": \"node-b\"}";

/* get shows the node of each step's latest attempt, and `resources NAME` the node that
 * drives the resource, where the server gives them (a cluster: the stub stands for one);
 * a lone batond on SQLite gives null, and neither is shown. */
static void test_get_and_resources_show_the_node(void **state)
{
	hs_server *s = *state;
	stub *st = stub_open();
	assert_non_null(st);
	stub_route(st, (stub_rule){"GET", "/workflows/w", 200, WORKFLOW_ON_NODES, 0});
	stub_route(st, (stub_rule){"GET", "/resources/gw", 200, RESOURCE_ON_NODE, 0});
	stub_route(st, (stub_rule){"GET", "/resources", 200,
				   "{\"resources\": [{\"name\": \"gw\", \"holder\": null,"
				   " \"queue_length\": 0, \"node\": \"node-b\"}],"
				   " \"next_cursor\": null}",
				   0});
	char *url = stub_url(st);
	client_proc *p;

	p = client_expect_exit(0, url, (const char *const[]){"get", "w", NULL});
	assert_non_null(strstr(p->o.p, "NODE"));
	assert_column(strstr(p->o.p, "  #"), "NODE");
	assert_non_null(strstr(strstr(p->o.p, "worker-A"), "node-a"));
	assert_non_null(strstr(strstr(p->o.p, "worker-B"), "node-b"));
	client_free(p);
	p = client_expect_exit(0, url, (const char *const[]){"resources", "gw", NULL});
	assert_non_null(strstr(p->o.p, "node      node-b\n"));
	client_free(p);
	p = client_expect_exit(0, url, (const char *const[]){"resources", NULL});
	assert_column(p->o.p, "NODE");
	assert_non_null(strstr(p->o.p, "node-b"));
	client_free(p);
	free(url);
	stub_close(st);

	json_decref(hs_create_workflow(
	    s, json_pack("{s:s, s:s, s:[s]}", "id", "w", "resource", "gw", "workers", "a")));
	json_decref(hs_wait_workflow(s, "w", "completed", 60000));
	/* A real batond: on SQLite (no cluster) it names no node, and nothing is shown; on
	 * PostgreSQL a batond is a cluster node, and its node is shown. */
	const char *lone = client_url_of(s);
	bool pg = hs_store_is_pg();
	p = client_expect_exit(0, lone, (const char *const[]){"get", "w", NULL});
	assert_true((strstr(p->o.p, "NODE") != NULL) == pg);
	client_free(p);
	p = client_expect_exit(0, lone, (const char *const[]){"resources", "gw", NULL});
	assert_true((strstr(p->o.p, "node ") != NULL) == pg);
	client_free(p);
}

/* ---- permits ------------------------------------------------------------------------ */

/* The limit `baton limit NAME` prints, asserting exit 0 and one line. */
static long long limit_of(const char *url, const char *name)
{
	client_proc *p = client_expect_exit(0, url, (const char *const[]){"limit", name, NULL});
	long long n = -1;
	char end = 0;
	if (sscanf(p->o.p, "%lld%c", &n, &end) != 2 || end != '\n' || strchr(p->o.p, '\n')[1])
		fail_msg("not one number on one line:\n%s", p->o.p);
	client_free(p);
	return n;
}

/* `baton limit NAME N` sets the limit and prints it, `baton limit NAME` prints it, --json
 * prints the resource; a limit the server refuses (400) is exit 1 and changes nothing; N
 * that is not a number is a usage error, and nothing is sent. */
static void test_limit_shows_and_sets(void **state)
{
	hs_server *s = *state;
	const char *url = client_url_of(s);
	client_proc *p;

	p = client_expect_exit(0, url, (const char *const[]){"limit", "gw", "3", NULL});
	assert_string_equal(p->o.p, "3\n");
	client_free(p);
	assert_int_equal(limit_of(url, "gw"), 3);
	json_t *res = hs_get_json(s, "/resources/gw", 200);
	assert_int_equal(hs_int(res, "limit"), 3);
	json_decref(res);

	p = client_expect_exit(0, url, (const char *const[]){"--json", "limit", "gw", NULL});
	json_t *doc = one_json_line(p->o.p);
	assert_string_equal(hs_str(doc, "name"), "gw");
	assert_int_equal(hs_int(doc, "limit"), 3);
	assert_int_equal(hs_int(doc, "permits_in_use"), 0);
	json_decref(doc);
	client_free(p);

	const char *const refused[] = {"0", "10001"};
	for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
		p = client_expect_exit(1, url,
				       (const char *const[]){"limit", "gw", refused[i], NULL});
		assert_string_equal(p->o.p, "");
		assert_non_null(strstr(p->e.p, "HTTP 400"));
		client_free(p);
	}
	const char *const bad[][4] = {{"limit", "gw", "2x", NULL},
				      {"limit", "gw", "", NULL},
				      {"limit", NULL, NULL, NULL},
				      {"limit", "gw", "3", "4"}};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		const char *const args[] = {bad[i][0], bad[i][1], bad[i][2], bad[i][3], NULL};
		client_free(client_expect_exit(2, url, args));
	}
	assert_int_equal(limit_of(url, "gw"), 3);

	p = client_expect_exit(0, url, (const char *const[]){"limit", "gw", "1", NULL});
	assert_string_equal(p->o.p, "1\n");
	client_free(p);
	assert_int_equal(limit_of(url, "gw"), 1);

	/* a resource never used has the default limit, 1 (the server answers 404) */
	assert_int_equal(limit_of(url, "never-used"), 1);
	p = client_expect_exit(0, url, (const char *const[]){"--json", "limit", "fresh", NULL});
	doc = one_json_line(p->o.p);
	assert_string_equal(hs_str(doc, "name"), "fresh");
	assert_int_equal(hs_int(doc, "limit"), 1);
	assert_int_equal(hs_int(doc, "permits_in_use"), 0);
	json_decref(doc);
	client_free(p);
}

/* POSTs a lease request for `holder` on gw (wait_ms 0: granted only at once) and asserts
 * the status; returns the answer (new reference). */
static json_t *lease_on_gw(hs_server *s, const char *holder, long status)
{
	char body[160];
	hs_response r;
	snprintf(body, sizeof body, "{\"holder\": \"%s\", \"ttl_ms\": 60000}", holder);
	assert_int_equal(hs_post(s, "/resources/gw/leases", body, &r), 0);
	if (r.status != status)
		fail_msg("lease for %s: HTTP %ld, not %ld: %s", holder, r.status, status,
			 r.body ? r.body : "");
	json_t *out = json_incref(r.json);
	hs_response_fini(&r);
	return out;
}

static void release_lease(hs_server *s, const json_t *lease)
{
	char path[256];
	hs_response r;
	snprintf(path, sizeof path, "/leases/%s", hs_str(lease, "id"));
	assert_int_equal(hs_send(s, &(hs_request){.method = "DELETE", .path = path}, &r), 0);
	assert_int_equal(r.status, 204);
	hs_response_fini(&r);
}

/* Whether gw's queue holds one waiter, an exclusive one. */
static bool exclusive_waits(void *arg)
{
	hs_response r;
	bool yes = false;
	if (hs_get(arg, "/resources/gw", &r) == 0 && r.status == 200) {
		const json_t *w = json_object_get(r.json, "waiters");
		yes = json_array_size(w) == 1 &&
		      json_is_true(json_object_get(json_array_get(w, 0), "exclusive"));
	}
	hs_response_fini(&r);
	return yes;
}

/* Runs `baton resources [NAME]` and returns its output (free it). */
static char *resources_text(const char *url, const char *name)
{
	client_proc *p = client_expect_exit(0, url, (const char *const[]){"resources", name, NULL});
	char *text = strdup(p->o.p);
	client_free(p);
	assert_non_null(text);
	return text;
}

/* On a resource of 3 permits, `baton lock` gives its command slot 0 in BATON_SLOT;
 * `baton lock --exclusive` waits while plain leases hold, is not overtaken by a later
 * request, runs alone (all 3 permits in use, nobody else granted) with BATON_SLOT set and
 * empty, and the resource is free again after it. `baton resources` shows the permits
 * and every holder. */
static void test_lock_exclusive_runs_alone(void **state)
{
	hs_server *s = *state;
	const char *url = client_url_of(s);
	client_free(client_expect_exit(0, url, (const char *const[]){"limit", "gw", "3", NULL}));

	client_proc *p = client_expect_exit(
	    0, url,
	    (const char *const[]){"lock", "gw", "--", "sh", "-c",
				  "echo \"slot=[${BATON_SLOT-unset}] token=$BATON_FENCING_TOKEN\"",
				  NULL});
	assert_string_equal(p->o.p, "slot=[0] token=1\n");
	client_free(p);

	json_t *a = lease_on_gw(s, "holder-a", 201), *b = lease_on_gw(s, "holder-b", 201);
	assert_int_equal(hs_int(a, "slot"), 0);
	assert_int_equal(hs_int(b, "slot"), 1);
	char *text = resources_text(url, "gw");
	assert_non_null(strstr(text, "\nlimit     3 permits, 2 in use\n"));
	assert_non_null(strstr(text, "\nholders   2\n  slot 0     holder-a (workflow lease-"));
	assert_non_null(strstr(text, ")\n  slot 1     holder-b (workflow lease-"));
	free(text);
	text = resources_text(url, NULL);
	assert_column(text, "PERMITS");
	assert_non_null(strstr(text, " 2/3 "));
	assert_non_null(strstr(text, "holder-a (workflow lease-"));
	assert_non_null(strstr(text, ") and 1 more\n"));
	free(text);

	char dir[] = "/tmp/baton-cli-XXXXXX", go[64], script[256];
	assert_non_null(mkdtemp(dir));
	snprintf(go, sizeof go, "%s/go", dir);
	snprintf(script, sizeof script,
		 "echo \"slot=[${BATON_SLOT-unset}]\"; while [ ! -e %s ]; do sleep 0.05; done;"
		 " echo done",
		 go);
	p = client_spawn((const char *const[]){"lock", "--exclusive", "gw", "--wait", "60s",
					       "--holder", "alone", "--", "sh", "-c", script, NULL},
			 url, false);
	assert_true(hs_wait_until(exclusive_waits, s, 30000));
	/* Permits are free, but the exclusive request is first in the queue: no barging. */
	json_decref(lease_on_gw(s, "late", 409));
	text = resources_text(url, "gw");
	assert_non_null(strstr(text, "alone (workflow lease-"));
	assert_non_null(strstr(text, ", exclusive\n"));
	free(text);
	release_lease(s, a);
	assert_true(exclusive_waits(s));
	client_pump(p, 0);
	assert_null(strstr(p->o.p, "slot="));
	release_lease(s, b);

	client_read_until(p, "slot=[]\n");
	json_t *res = hs_get_json(s, "/resources/gw", 200);
	const json_t *holders = json_object_get(res, "holders");
	assert_int_equal(hs_int(res, "permits_in_use"), 3);
	assert_int_equal(json_array_size(holders), 1);
	assert_true(json_is_true(json_object_get(json_array_get(holders, 0), "exclusive")));
	assert_true(json_is_null(json_object_get(json_array_get(holders, 0), "slot")));
	json_decref(res);
	json_decref(lease_on_gw(s, "during", 409));
	text = resources_text(url, "gw");
	assert_non_null(strstr(text, "\nlimit     3 permits, 3 in use\n"));
	assert_non_null(strstr(text, "\nholders   1\n  exclusive  alone (workflow lease-"));
	free(text);
	text = resources_text(url, NULL);
	assert_non_null(strstr(text, " 3/3 "));
	assert_non_null(strstr(text, "alone (workflow lease-"));
	assert_null(strstr(text, " more"));
	free(text);

	FILE *f = fopen(go, "w");
	assert_non_null(f);
	fclose(f);
	assert_int_equal(client_finish(p), 0);
	assert_non_null(strstr(p->o.p, "slot=[]\ndone\n"));
	client_free(p);
	unlink(go);
	rmdir(dir);

	json_t *after = lease_on_gw(s, "after", 201);
	assert_int_equal(hs_int(after, "slot"), 0);
	release_lease(s, after);
	json_decref(after);
	json_decref(a);
	json_decref(b);
}

/* ---- backup --------------------------------------------------------------------------- */

static mode_t mode_of(const char *path)
{
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	return st.st_mode & 07777;
}

/* `baton backup FILE` writes FILE 0600 under umask 022, even over a FILE.part left 0644:
 * the database holds the calls' headers (Authorization). */
static void test_backup_is_0600(void **state)
{
	if (hs_store_is_pg())
		skip(); /* PostgreSQL is backed up with its own tools: batond answers 501 */
	hs_server *s = *state;
	char dir[] = "/tmp/baton-cli-XXXXXX", file[64], part[80];
	assert_non_null(mkdtemp(dir));
	snprintf(file, sizeof file, "%s/copy.db", dir);
	snprintf(part, sizeof part, "%s.part", file);
	FILE *f = fopen(part, "w");
	assert_non_null(f);
	fputs("left over", f);
	fclose(f);
	assert_int_equal(chmod(part, 0644), 0);

	mode_t old = umask(022);
	client_proc *p =
	    client_expect_exit(0, client_url_of(s), (const char *const[]){"backup", file, NULL});
	umask(old);
	client_free(p);
	assert_int_equal(mode_of(file), 0600);
	assert_int_equal(access(part, F_OK), -1);
	unlink(file);
	rmdir(dir);
}

/* ---- make demo ---------------------------------------------------------------------- */

/* scripts/demo.sh of the tree this file was compiled in. */
static void demo_script(char *out, size_t size)
{
	static const char self[] = "tests/http/test_cli.c";
	size_t len = strlen(__FILE__), tail = sizeof self - 1;
	size_t root = len >= tail && strcmp(__FILE__ + len - tail, self) == 0 ? len - tail : 0;
	snprintf(out, size, "%.*sscripts/demo.sh", (int)root, __FILE__);
}

static pid_t demo_pid;

static bool demo_ended(void *arg)
{
	int *status = arg;
	return waitpid(demo_pid, status, WNOHANG) == demo_pid;
}

/* `make demo` runs against the batond that BATON_SERVER names (README's name for it), as
 * it does for BATON_URL: here a stub, which answers the health check and refuses the
 * workflow, so the demo ends at once. The old script read BATON_URL only and ran against
 * a batond of its own. */
static void test_demo_honours_baton_server(void **state)
{
	(void)state;
	stub *fake = stub_open();
	assert_non_null(fake);
	stub_route(fake, (stub_rule){"GET", "/healthz", 200, "{\"status\": \"ok\"}", 0});
	char script[512], *url = stub_url(fake);
	demo_script(script, sizeof script);
	const char *batond = getenv("BATOND"), *baton = getenv("BATON_CLIENT");
	assert_non_null(batond);
	assert_non_null(baton);
	demo_pid = fork();
	assert_true(demo_pid >= 0);
	if (demo_pid == 0) {
		int null = open("/dev/null", O_WRONLY);
		dup2(null, 1);
		dup2(null, 2);
		unsetenv("BATON_URL");
		setenv("BATON_SERVER", url, 1);
		execlp("sh", "sh", script, batond, baton, (char *)NULL);
		_exit(127);
	}
	free(url);
	int status = 0;
	bool ended = hs_wait_until(demo_ended, &status, 60000);
	if (!ended) {
		kill(demo_pid, SIGKILL);
		waitpid(demo_pid, NULL, 0);
	}
	size_t asked = stub_count(fake, "POST", "/workflows");
	stub_close(fake);
	assert_true(ended);
	if (asked == 0)
		fail_msg("the demo did not run against BATON_SERVER");
	assert_int_not_equal(WEXITSTATUS(status), 0); /* the stub refused the workflow */
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_json_errors_on_stderr, hs_setup, teardown),
	    cmocka_unit_test_setup_teardown(test_json_answers_are_one_line, hs_setup, teardown),
	    cmocka_unit_test_setup_teardown(test_list_columns_fit_lease_ids, hs_setup, teardown),
	    cmocka_unit_test_setup_teardown(test_backup_is_0600, hs_setup, teardown),
	    cmocka_unit_test_setup_teardown(test_get_and_resources_show_the_node, hs_setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_events_lines_are_watch_lines, hs_setup, teardown),
	    cmocka_unit_test_setup_teardown(test_limit_shows_and_sets, hs_setup, teardown),
	    cmocka_unit_test_setup_teardown(test_lock_exclusive_runs_alone, hs_setup, teardown),
	    cmocka_unit_test(test_demo_honours_baton_server),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
