/*
 * test_postgres.c - what only the PostgreSQL store has, against the real batond and the
 * throwaway PostgreSQL server of the test run (BATON_TEST_PG): the database restarted
 * under load (test_faults has it stopped for a while), a change the database refuses for
 * good, a server that refuses connections at start, the schema made from an empty
 * database by two batonds starting at once, a database of schema 1 migrated, a schema
 * too new refused, a database owned by a role without superuser rights, and passwords
 * never shown.
 * On SQLite every test here skips.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <libpq-fe.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../harness/harness.h"

#define WAIT_MS 90000

/* ---- SQL on the test server, as its superuser ---- */

/* The base URL with its database replaced by `db` ("postgresql://u@h:p/db"). */
static void url_for(const char *db, char *out, size_t n)
{
	const char *base = getenv("BATON_TEST_PG");
	const char *slash = strchr(strstr(base, "://") + 3, '/');
	int keep = slash ? (int)(slash - base) : (int)strlen(base);
	snprintf(out, n, "%.*s/%s", keep, base, db);
}

/* Runs sql on database db (NULL: the base URL's); returns the first value or "" (static). */
static const char *sql_on(const char *db, const char *sql)
{
	static char value[256];
	char url[512];
	if (db)
		url_for(db, url, sizeof url);
	else
		snprintf(url, sizeof url, "%s", getenv("BATON_TEST_PG"));
	PGconn *c = PQconnectdb(url);
	assert_int_equal(PQstatus(c), CONNECTION_OK);
	PGresult *r = PQexec(c, sql);
	ExecStatusType st = PQresultStatus(r);
	if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
		fail_msg("%s: %s", sql, PQerrorMessage(c));
	snprintf(value, sizeof value, "%s",
		 st == PGRES_TUPLES_OK && PQntuples(r) > 0 ? PQgetvalue(r, 0, 0) : "");
	PQclear(r);
	PQfinish(c);
	return value;
}

/* A new empty database with a name of its own; its name in out. */
static void fresh_database(char *out, size_t n, const char *owner)
{
	static int count;
	char sql[256];
	snprintf(out, n, "baton_pgt%d_%d", (int)getpid(), ++count);
	snprintf(sql, sizeof sql, "CREATE DATABASE %s%s%s", out, owner ? " OWNER " : "",
		 owner ? owner : "");
	sql_on(NULL, sql);
}

static void drop_database(const char *name)
{
	char sql[256];
	snprintf(sql, sizeof sql, "DROP DATABASE IF EXISTS %s WITH (FORCE)", name);
	sql_on(NULL, sql);
}

/* Every test starts with it: on SQLite the test is skipped. */
#define PG_ONLY()                                                                                  \
	do {                                                                                       \
		if (!hs_store_is_pg())                                                             \
			skip();                                                                    \
	} while (0)

/* ---- load ---- */

static json_t *submit(hs_server *s, const char *resource, int steps)
{
	json_t *workers = json_array();
	for (int i = 0; i < steps; i++) {
		char name[16];
		snprintf(name, sizeof name, "w%d", i);
		json_array_append_new(workers,
				      json_pack("{s:s, s:i}", "name", name, "work_ms", 30));
	}
	return hs_create_workflow(
	    s, json_pack("{s:s, s:o}", "resource", resource, "workers", workers));
}

/* Every step completed once, and each resource's grants carry strictly rising tokens. */
static void assert_ran_once(hs_server *s, json_t **wfs, int n)
{
	for (int i = 0; i < n; i++) {
		const char *id = hs_str(wfs[i], "id");
		json_decref(hs_wait_workflow(s, id, "completed", WAIT_MS));
		json_t *events = hs_get_events(s, id);
		json_int_t total = hs_int(wfs[i], "steps_total");
		for (json_int_t k = 0; k < total; k++)
			assert_int_equal(hs_event_count(events, "step_completed", (int)k, -1), 1);
		json_decref(events);
	}
	const char *names[] = {"pga", "pgb", "pgc"};
	for (size_t r = 0; r < 3; r++) {
		char path[128];
		snprintf(path, sizeof path, "/resources/%s/events?limit=10000", names[r]);
		json_t *h = hs_get_json(s, path, 200);
		json_int_t last = 0;
		size_t i;
		json_t *ev;
		json_array_foreach(json_object_get(h, "events"), i, ev)
		{
			if (strcmp(hs_str(ev, "type"), "lock_acquired") != 0)
				continue;
			json_int_t token = hs_int(ev, "fencing_token");
			if (token <= last)
				fail_msg("%s: token %lld after %lld", names[r], (long long)token,
					 (long long)last);
			last = token;
		}
		json_decref(h);
	}
}

static int count_of(const char *text, const char *what)
{
	int n = 0;
	for (const char *p = text; (p = strstr(p, what)); p += strlen(what))
		n++;
	return n;
}

static bool some_steps_done(void *arg)
{
	hs_server *s = arg;
	json_t *m = hs_get_json(s, "/workflows?status=completed&limit=1", 200);
	bool done = json_array_size(json_object_get(m, "workflows")) > 0;
	json_decref(m);
	return done;
}

static bool connection_back(void *arg)
{
	char *log = hs_log_text(arg);
	bool yes = log && strstr(log, "database connection is back");
	free(log);
	return yes;
}

/* PostgreSQL restarted while workflows run: batond stays up, reconnects, everything
 * acknowledged completes, no step runs twice, tokens keep rising. */
static void test_pg_restart_under_load(void **state)
{
	PG_ONLY();
	hs_server *s = *state;
	enum { N = 12 };
	json_t *wfs[N];
	const char *res[] = {"pga", "pgb", "pgc"};
	for (int i = 0; i < N; i++)
		wfs[i] = submit(s, res[i % 3], 4);
	assert_true(hs_wait_until(some_steps_done, s, WAIT_MS));
	assert_int_equal(hs_pg_restart(), 0);
	assert_true(hs_alive(s));
	assert_ran_once(s, wfs, N);
	for (int i = 0; i < N; i++)
		json_decref(wfs[i]);
	assert_int_equal(hs_db_count(s, "SELECT count(*) FROM workflows"), N);
	/* One line when the connection is lost and one when it is back, not one per try. The
	 * connection that saw the loss may be back only after the last workflow completed. */
	assert_true(hs_wait_until(connection_back, s, WAIT_MS));
	char *log = hs_log_text(s);
	assert_int_equal(count_of(log, "lost the database connection"), 1);
	assert_int_equal(count_of(log, "database connection is back"), 1);
	free(log);
}

/* ---- changes the database refuses ---- */

/*
 * A change the database refuses for good (here: CHECK constraints an operator added)
 * fails only the workflow it belongs to, with the database's reason; a new submission
 * refused that way is answered 400; everything else goes on.
 */
static void test_pg_refused_change_fails_one_workflow(void **state)
{
	PG_ONLY();
	hs_server *s = *state;
	const char *db = strrchr(hs_db_url(s), '/') + 1;
	sql_on(db, "ALTER TABLE steps ADD CONSTRAINT no_poison"
		   " CHECK (result IS NULL OR result NOT LIKE '%poison%')");
	sql_on(db,
	       "ALTER TABLE workflows ADD CONSTRAINT no_refused CHECK (id NOT LIKE 'refused%')");
	hs_response r;
	hs_post(s, "/workflows", "{\"id\":\"refused-1\",\"resource\":\"pga\",\"workers\":[\"a\"]}",
		&r);
	hs_assert_problem(&r, 400, "invalid-request", "a submission the database refuses");
	assert_non_null(strstr(r.body, "no_refused"));
	hs_response_fini(&r);
	json_t *bad =
	    hs_create_workflow(s, json_pack("{s:s, s:s, s:[s, s, s]}", "id", "bad", "resource",
					    "pga", "workers", "ok-1", "poison-2", "ok-3"));
	json_t *good = submit(s, "pga", 3);
	json_t *wf = hs_wait_workflow(s, "bad", "failed", WAIT_MS);
	assert_non_null(strstr(hs_str(wf, "error"), "no_poison"));
	assert_string_equal(hs_str(hs_step_at(wf, 0), "status"), "completed");
	json_decref(wf);
	json_decref(hs_wait_workflow(s, hs_str(good, "id"), "completed", WAIT_MS));
	json_decref(bad);
	json_decref(good);
	assert_int_equal(hs_db_count(s, "SELECT count(*) FROM workflows WHERE id = 'refused-1'"),
			 0);
	/* The engine goes on: a later workflow on the same resource completes too. */
	json_t *after = submit(s, "pga", 1);
	json_decref(hs_wait_workflow(s, hs_str(after, "id"), "completed", WAIT_MS));
	json_decref(after);
	hs_get(s, "/readyz", &r);
	assert_int_equal(r.status, 200);
	hs_response_fini(&r);
}

/* ---- start-up ---- */

/* A server that refuses connections: batond exits 1 at once and says so, without the
 * password of the URL. */
static void test_pg_refused_at_start(void **state)
{
	PG_ONLY();
	(void)state;
	char out[4096];
	const char *args[] = {"--listen", "127.0.0.1:0", "--db",
			      "postgresql://baton:sekrit@127.0.0.1:1/baton", NULL};
	int st = hs_run_batond(args, NULL, NULL, 30000, out, sizeof out);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
	assert_non_null(strstr(out, "cannot connect"));
	assert_null(strstr(out, "sekrit"));
	assert_non_null(strstr(out, "baton:***@127.0.0.1:1"));
}

/* Passwords never appear in logs, errors, /metrics or --help. */
static void test_pg_password_never_shown(void **state)
{
	PG_ONLY();
	hs_server *s = *state;
	char url[512];
	const char *plain = hs_db_url(s);
	const char *at = strstr(plain, "@");
	assert_non_null(at);
	/* postgresql://USER@... becomes postgresql://USER:sekrit@... (trust ignores it). */
	snprintf(url, sizeof url, "%.*s:sekrit%s", (int)(at - plain), plain, at);
	const char *args[] = {"--db", url, NULL};
	assert_int_equal(hs_stop(s), 0);
	assert_int_equal(hs_set_args(s, args), 0);
	assert_int_equal(hs_start(s), 0);
	json_t *wf = submit(s, "pga", 1);
	json_decref(hs_wait_workflow(s, hs_str(wf, "id"), "completed", WAIT_MS));
	json_decref(wf);
	hs_response r;
	hs_get(s, "/metrics", &r);
	assert_int_equal(r.status, 200);
	assert_null(strstr(r.body, "sekrit"));
	hs_response_fini(&r);
	assert_int_equal(hs_pg_stop(), 0);
	hs_post(s, "/workflows", "{\"resource\":\"pgb\",\"workers\":[\"x\"]}", &r);
	assert_true(r.body == NULL || strstr(r.body, "sekrit") == NULL);
	hs_response_fini(&r);
	hs_get(s, "/workflows?limit=1", &r);
	assert_true(r.body == NULL || strstr(r.body, "sekrit") == NULL);
	hs_response_fini(&r);
	assert_int_equal(hs_pg_start(), 0);
	char *log = hs_log_text(s);
	assert_null(strstr(log, "sekrit"));
	assert_non_null(strstr(log, ":***@"));
	free(log);
	char out[8192];
	const char *help[] = {"--help", NULL};
	hs_run_batond(help, "BATON_DB", url, 30000, out, sizeof out);
	assert_null(strstr(out, "sekrit"));
}

/* Starts batond on url with its output in log (an open file); returns its pid. */
static pid_t spawn_batond(const char *url, const char *node_id, int log)
{
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(log, 1);
		dup2(log, 2);
		execl(getenv("BATOND"), "batond", "--listen", "127.0.0.1:0", "--db", url,
		      "--node-id", node_id, (char *)NULL);
		_exit(127);
	}
	return pid;
}

static int reap(pid_t pid, int timeout_ms, int *status)
{
	int64_t end = hs_mono_ms() + timeout_ms;
	while (hs_mono_ms() < end) {
		if (waitpid(pid, status, WNOHANG) == pid)
			return 0;
		hs_pause_ms(20);
	}
	return -1;
}

/* Whether the log file at path holds text. */
static int log_has(const char *path, const char *text)
{
	char buf[8192];
	FILE *f = fopen(path, "r");
	size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
	buf[n] = 0;
	if (f)
		fclose(f);
	return strstr(buf, text) != NULL;
}

/* Two batonds starting at once on an empty database: the schema is made once (under the
 * migration lock), and both serve, as the two nodes of one cluster. */
static void test_pg_two_start_on_empty_database(void **state)
{
	PG_ONLY();
	(void)state;
	char db[64], url[512], logs[2][64];
	fresh_database(db, sizeof db, NULL);
	url_for(db, url, sizeof url);
	pid_t pid[2];
	int fd[2];
	for (int i = 0; i < 2; i++) {
		snprintf(logs[i], sizeof logs[i], "/tmp/baton-pgt-%d-%d.log", (int)getpid(), i);
		fd[i] = open(logs[i], O_CREAT | O_TRUNC | O_WRONLY, 0600);
		assert_true(fd[i] >= 0);
	}
	for (int i = 0; i < 2; i++)
		pid[i] = spawn_batond(url, i ? "two-b" : "two-a", fd[i]);
	int status = 0, exited = -1, listening = 0;
	int64_t end = hs_mono_ms() + WAIT_MS;
	while (exited < 0 && listening < 2 && hs_mono_ms() < end) {
		listening = 0;
		for (int i = 0; i < 2 && exited < 0; i++) {
			if (waitpid(pid[i], &status, WNOHANG) == pid[i])
				exited = i;
			listening += log_has(logs[i], "listening on");
		}
		hs_pause_ms(20);
	}
	long long nodes = exited < 0 ? atoll(sql_on(db, "SELECT count(*) FROM nodes")) : -1;
	int clean = 1;
	for (int i = 0; i < 2; i++)
		if (exited != i) {
			kill(pid[i], SIGTERM);
			clean &= reap(pid[i], 30000, &status) == 0 && WIFEXITED(status) &&
				 WEXITSTATUS(status) == 0;
		}
	for (int i = 0; i < 2; i++) {
		close(fd[i]);
		unlink(logs[i]);
	}
	assert_int_equal(exited, -1);
	assert_int_equal(listening, 2);
	assert_int_equal(nodes, 2);
	assert_true(clean);
	assert_string_equal(sql_on(db, "SELECT count(*) FROM baton_meta WHERE key = 'schema'"),
			    "1");
	assert_string_equal(sql_on(db, "SELECT value FROM baton_meta WHERE key = 'schema'"), "7");
	drop_database(db);
}

/* The fixture next to this file (tests/http/fixtures/NAME), read whole; malloc'd. */
static char *fixture(const char *name)
{
	static const char self[] = "tests/http/test_postgres.c";
	size_t len = strlen(__FILE__), tail = sizeof self - 1;
	size_t root = len >= tail && strcmp(__FILE__ + len - tail, self) == 0 ? len - tail : 0;
	char path[1024];
	snprintf(path, sizeof path, "%.*stests/http/fixtures/%s", (int)root, __FILE__, name);
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	assert_int_equal(fseek(f, 0, SEEK_END), 0);
	long n = ftell(f);
	rewind(f);
	char *text = malloc((size_t)n + 1);
	assert_non_null(text);
	assert_int_equal(fread(text, 1, (size_t)n, f), (size_t)n);
	text[n] = 0;
	fclose(f);
	return text;
}

/*
 * A database of an older schema (tests/http/fixtures/pg-schema-vN.sql), left by the batond
 * of that schema killed while a step ran, opened by this batond: migrated to schema 4 in
 * place, the finished workflow left as it was, the interrupted step run again as attempt
 * 2 with a token above the one it had (token), the waiter after it, every step once.
 * Workflow ids start with prefix ("v1-").
 */
static void migrates_from(const char *file, const char *version, const char *prefix, int token)
{
	char db[64], url[512], id[32];
	fresh_database(db, sizeof db, NULL);
	char *sql = fixture(file);
	sql_on(db, sql);
	free(sql);
	assert_string_equal(sql_on(db, "SELECT value FROM baton_meta WHERE key = 'schema'"),
			    version);
	url_for(db, url, sizeof url);
	const char *args[] = {"--db", url, NULL};
	hs_server *s = hs_open(args);
	assert_non_null(s);
	assert_string_equal(sql_on(db, "SELECT value FROM baton_meta WHERE key = 'schema'"), "7");
	/* schema 7: the database's generation, 0 on a database that never failed over */
	assert_string_equal(sql_on(db, "SELECT baton_generation()"), "0");
	/* schema 6: a resource's limit, 1 (a mutex) for those that existed */
	assert_string_equal(sql_on(db, "SELECT count(*) FROM resources WHERE permits <> 1"), "0");
	assert_string_equal(sql_on(db, "SELECT count(*) FROM information_schema.columns WHERE"
				       " table_name = 'resources' AND column_name = 'holders'"),
			    "1");
	/* schema 5: each node's URL, which the others pass requests on to */
	assert_string_equal(sql_on(db, "SELECT count(*) FROM information_schema.columns WHERE"
				       " table_name = 'nodes' AND column_name = 'url'"),
			    "1");
	assert_string_equal(
	    sql_on(db, "SELECT count(*) FROM pg_proc WHERE proname = 'baton_check_epoch'"), "0");
	assert_string_equal(
	    sql_on(db, "SELECT count(*) FROM pg_proc WHERE proname = 'baton_refuse'"), "1");
	snprintf(id, sizeof id, "%sdone", prefix);
	json_t *done = hs_get_workflow(s, id);
	assert_string_equal(hs_str(done, "status"), "completed");
	json_decref(done);
	snprintf(id, sizeof id, "%srunning", prefix);
	json_t *ran = hs_wait_workflow(s, id, "completed", WAIT_MS);
	json_t *slow = hs_step_at(ran, 1);
	assert_int_equal(hs_int(slow, "attempts"), 2);
	assert_true(hs_int(slow, "fencing_token") > token);
	assert_int_equal(hs_int(hs_step_at(ran, 0), "attempts"), 1);
	assert_int_equal(hs_int(hs_step_at(ran, 2), "attempts"), 1);
	json_t *events = hs_get_events(s, id);
	assert_int_equal(hs_event_count(events, "step_interrupted", 1, 1), 1);
	for (int k = 0; k < 3; k++)
		assert_int_equal(hs_event_count(events, "step_completed", k, -1), 1);
	json_decref(events);
	json_decref(ran);
	snprintf(id, sizeof id, "%swaiting", prefix);
	json_decref(hs_wait_workflow(s, id, "completed", WAIT_MS));
	assert_int_equal(hs_close(s), 0);
	drop_database(db);
}

/* Schema 1: the first released one, before the cluster. */
static void test_pg_schema_1_migrates(void **state)
{
	PG_ONLY();
	(void)state;
	migrates_from("pg-schema-v1.sql", "1", "v1-", 4);
}

/* Schema 3, the previous one: a cluster's tables, its node dead (its lease long past). */
static void test_pg_schema_3_migrates(void **state)
{
	PG_ONLY();
	(void)state;
	migrates_from("pg-schema-v3.sql", "3", "v3-", 5);
}

/* A database whose schema is newer than this batond's is refused, untouched. */
static void test_pg_newer_schema_refused(void **state)
{
	PG_ONLY();
	hs_server *s = *state;
	assert_int_equal(hs_stop(s), 0);
	const char *url = hs_db_url(s);
	const char *db = strrchr(url, '/') + 1;
	char was[32];
	snprintf(was, sizeof was, "%s",
		 sql_on(db, "SELECT value FROM baton_meta WHERE key = 'schema'"));
	sql_on(db, "UPDATE baton_meta SET value = 99 WHERE key = 'schema'");
	char out[4096];
	const char *args[] = {"--listen", "127.0.0.1:0", "--db", url, NULL};
	int st = hs_run_batond(args, NULL, NULL, 30000, out, sizeof out);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
	assert_non_null(strstr(out, "schema version 99"));
	assert_string_equal(sql_on(db, "SELECT value FROM baton_meta WHERE key = 'schema'"), "99");
	char restore[96];
	snprintf(restore, sizeof restore, "UPDATE baton_meta SET value = %s WHERE key = 'schema'",
		 was);
	sql_on(db, restore);
	assert_int_equal(hs_start(s), 0);
}

/* The operator's two statements (README): a role and a database it owns; batond needs no
 * other right. */
static void test_pg_runs_without_superuser(void **state)
{
	PG_ONLY();
	(void)state;
	char role[64], db[64], url[512], sql[256];
	snprintf(role, sizeof role, "baton_role_%d", (int)getpid());
	snprintf(sql, sizeof sql, "CREATE ROLE %s LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE", role);
	sql_on(NULL, sql);
	fresh_database(db, sizeof db, role);
	url_for(db, url, sizeof url);
	/* The same URL with the role as its user. */
	char as_role[600];
	const char *host = strchr(url, '@');
	snprintf(as_role, sizeof as_role, "postgresql://%s%s", role, host);
	const char *args[] = {"--db", as_role, NULL};
	hs_server *s = hs_open(args);
	assert_non_null(s);
	json_t *wf = submit(s, "pga", 2);
	json_decref(hs_wait_workflow(s, hs_str(wf, "id"), "completed", WAIT_MS));
	json_decref(wf);
	assert_int_equal(hs_close(s), 0);
	assert_string_equal(
	    sql_on(db, "SELECT tableowner FROM pg_tables WHERE tablename = 'workflows'"), role);
	drop_database(db);
	snprintf(sql, sizeof sql, "DROP ROLE %s", role);
	sql_on(NULL, sql);
}

static int setup(void **state)
{
	*state = NULL;
	return hs_store_is_pg() ? hs_setup(state) : 0;
}

static int teardown(void **state)
{
	return *state ? hs_teardown(state) : 0;
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_pg_restart_under_load, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_pg_refused_change_fails_one_workflow, setup,
					    teardown),
	    cmocka_unit_test(test_pg_refused_at_start),
	    cmocka_unit_test_setup_teardown(test_pg_password_never_shown, setup, teardown),
	    cmocka_unit_test(test_pg_two_start_on_empty_database),
	    cmocka_unit_test_setup_teardown(test_pg_newer_schema_refused, setup, teardown),
	    cmocka_unit_test(test_pg_schema_1_migrates),
	    cmocka_unit_test(test_pg_schema_3_migrates),
	    cmocka_unit_test(test_pg_runs_without_superuser),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
