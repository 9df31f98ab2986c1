/*
 * test_cli.c - the output of the command-line client `baton` for scripts and people, run
 * as a real process against a real batond (or the stub of stub.h, for what a lone batond
 * on SQLite never answers): errors as JSON with --json (test_json_errors_on_stderr), answers on one
 * line (test_json_answers_are_one_line), the columns of `list` with lease ids
 * (test_list_columns_fit_lease_ids), the mode of a backup (test_backup_is_0600).
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
#include <sys/stat.h>
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
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
