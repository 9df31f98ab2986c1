/*
 * test_call_policy.c - what an HTTP step may call and what it may carry, over HTTP
 * against the real batond: only URLs under the operator's --allow-call prefixes are
 * accepted, on a path boundary, and not by climbing out with dot segments; baton's own
 * headers cannot be overridden; header values never leave batond except towards the
 * resource; redirects are not followed; without a usable libcurl, a batond that allows
 * calls refuses to start and says why. Nothing refused is stored or called.
 *
 * Each test gets its own fragile resource (tests/harness/fragile.h) and its own batond
 * (tests/harness/calls.h).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../harness/calls.h"

#define WAIT_MS 30000
#define SECRET	"Bearer s3cret"
#define SECRET2 "k3y-zz9-secret"

/* ---- what may be called ---------------------------------------------------------- */

/* POSTs `body` (stolen) and asserts a 400 problem whose detail calls_contains `needle`. */
static void assert_refused(const hs_server *s, json_t *body, const char *needle, const char *what)
{
	char *text = json_dumps(body, JSON_COMPACT);
	json_decref(body);
	hs_response r;
	hs_post(s, "/workflows", text, &r);
	hs_assert_problem(&r, 400, "invalid-request", what);
	const char *detail = hs_str(r.json, "detail");
	if (needle && !strstr(detail, needle))
		fail_msg("%s: detail \"%s\" does not mention \"%s\"", what, detail, needle);
	hs_response_fini(&r);
	free(text);
}

/* A one-worker workflow whose worker calls `url`. */
static json_t *one_call(const char *url)
{
	return json_pack("{s:s, s:[{s:s, s:{s:s}}]}", "resource", "gateway", "workers", "name",
			 "w0", "call", "url", url);
}

/*
 * Only URLs under an --allow-call prefix, on a path boundary, are accepted at POST;
 * nothing refused is stored or called; a batond without --allow-call refuses every
 * call and says how to allow it.
 */
static void test_allowed_prefixes(void **state)
{
	calls_ctx *c = *state;
	int port = fragile_port(c->res);
	char *base = fragile_url(c->res, "");
	const char *const refused_paths[] = {"/apix", "/ap",	"/",	  "/API/x",
					     "/v2",   "/v2x/y", "/other", "/x/api"};
	for (size_t i = 0; i < sizeof refused_paths / sizeof *refused_paths; i++) {
		char url[256], what[300];
		snprintf(url, sizeof url, "%s%s", base, refused_paths[i]);
		snprintf(what, sizeof what, "POST with call.url %s", url);
		assert_refused(c->s, one_call(url), "--allow-call", what);
	}
	char other[256], host[256], tls[256], ftp[256];
	snprintf(other, sizeof other, "http://127.0.0.1:%d/api/x", port == 65535 ? 1 : port + 1);
	snprintf(host, sizeof host, "http://localhost:%d/api/x", port);
	snprintf(tls, sizeof tls, "https://127.0.0.1:%d/api/x", port);
	snprintf(ftp, sizeof ftp, "ftp://127.0.0.1:%d/api/x", port);
	assert_refused(c->s, one_call(other), "--allow-call", "another port");
	assert_refused(c->s, one_call(host), "--allow-call", "another host name");
	assert_refused(c->s, one_call(tls), "--allow-call", "another scheme");
	assert_refused(c->s, one_call(ftp), "http://", "a scheme other than http(s)");

	/* The merged call is checked: the worker's url wins over the workflow's. */
	char *api = fragile_url(c->res, "/api/ok"), *outside = fragile_url(c->res, "/admin");
	json_t *body = one_call(outside);
	json_object_set_new(body, "call", json_pack("{s:s}", "url", api));
	assert_refused(c->s, body, "workers[0].call.url", "worker url outside, default inside");
	body = json_pack("{s:s, s:[s], s:{s:s}}", "resource", "gateway", "workers", "w0", "call",
			 "url", outside);
	assert_refused(c->s, body, "--allow-call", "default url outside");

	/* Accepted, and called where they say. */
	const char *const ok_paths[] = {"/api", "/api/x", "/api?q=1", "/v2/y"};
	const char *const seen_paths[] = {"/api", "/api/x", "/api", "/v2/y"};
	for (size_t i = 0; i < 4; i++) {
		char url[256], id[32];
		snprintf(url, sizeof url, "%s%s", base, ok_paths[i]);
		snprintf(id, sizeof id, "ok-%zu", i);
		json_t *b = one_call(url);
		json_object_set_new(b, "id", json_string(id));
		calls_create(c->s, b);
		json_decref(hs_wait_workflow(c->s, id, "completed", WAIT_MS));
	}
	body = one_call(api);
	json_object_set_new(body, "id", json_string("ok-merged"));
	json_object_set_new(body, "call", json_pack("{s:s}", "url", outside));
	calls_create(c->s, body); /* the worker's allowed url wins over the default */
	json_decref(hs_wait_workflow(c->s, "ok-merged", "completed", WAIT_MS));
	assert_int_equal(hs_db_count(c->s, "SELECT count(*) FROM workflows"), 5);
	fragile_record *r = calls_records_exactly(c->res, 5);
	for (size_t i = 0; i < 4; i++)
		assert_string_equal(r[i].path, seen_paths[i]);
	assert_string_equal(r[4].path, "/api/ok");
	fragile_records_free(r, 5);

	/* No --allow-call: every call is refused, with the way to allow it. */
	assert_refused(c->bare, one_call(api), "--allow-call", "batond without --allow-call");
	body = json_pack("{s:s, s:[s], s:{s:s}}", "resource", "gateway", "workers", "w0", "call",
			 "url", api);
	assert_refused(c->bare, body, "--allow-call", "default call, batond without --allow-call");
	assert_int_equal(hs_db_count(c->bare, "SELECT count(*) FROM workflows"), 0);
	free(api);
	free(outside);
	free(base);
	fragile_stats st;
	fragile_get_stats(c->res, &st);
	assert_int_equal(st.requests, 5);
}

/*
 * A path that climbs out of an allowed prefix with dot segments ("/api/../admin") is
 * under it as text, but would reach /admin once normalized (libcurl removes dot
 * segments unless told not to; many servers decode %2e): refused at POST, never called.
 */
static void test_dot_segments_refused(void **state)
{
	calls_ctx *c = *state;
	const char *const climbs[] = {"/api/../admin",	   "/api/./../admin", "/v2/../admin",
				      "/api/%2e%2e/admin", "/api/%2E./admin", "/api/.%2e"};
	for (size_t i = 0; i < sizeof climbs / sizeof *climbs; i++) {
		char *url = fragile_url(c->res, climbs[i]);
		char what[300];
		snprintf(what, sizeof what, "POST with call.url %s", url);
		assert_refused(c->s, one_call(url), NULL, what);
		free(url);
	}
	assert_int_equal(hs_db_count(c->s, "SELECT count(*) FROM workflows"), 0);
	fragile_stats st;
	fragile_get_stats(c->res, &st);
	assert_int_equal(st.requests, 0);
}

/* Headers that baton sets, or that frame the message, are refused in call.headers. */
static void test_reserved_headers_refused(void **state)
{
	calls_ctx *c = *state;
	const char *const reserved[] = {"Idempotency-Key",
					"idempotency-key",
					"Baton-Fencing-Token",
					"BATON-FENCING-TOKEN",
					"Baton-Workflow",
					"Baton-Worker",
					"Baton-Attempt",
					"Host",
					"Content-Length",
					"Transfer-Encoding",
					"Expect",
					"Connection"};
	for (size_t i = 0; i < sizeof reserved / sizeof *reserved; i++) {
		char what[128];
		json_t *worker_level = one_call(c->url);
		json_t *call = json_object_get(
		    json_array_get(json_object_get(worker_level, "workers"), 0), "call");
		json_object_set_new(call, "headers", json_pack("{s:s}", reserved[i], "1"));
		snprintf(what, sizeof what, "worker call.headers.%s", reserved[i]);
		assert_refused(c->s, worker_level, reserved[i], what);

		json_t *wf_level =
		    json_pack("{s:s, s:[s], s:{s:s, s:{s:s}}}", "resource", "gateway", "workers",
			      "w0", "call", "url", c->url, "headers", reserved[i], "1");
		snprintf(what, sizeof what, "workflow call.headers.%s", reserved[i]);
		assert_refused(c->s, wf_level, reserved[i], what);
	}
	assert_int_equal(hs_db_count(c->s, "SELECT count(*) FROM workflows"), 0);
	fragile_stats st;
	fragile_get_stats(c->res, &st);
	assert_int_equal(st.requests, 0);
}

/* ---- secrets and redirects --------------------------------------------------------- */

static void assert_no_secret(const char *text, const char *where)
{
	if (calls_contains(text, "s3cret") || calls_contains(text, SECRET2))
		fail_msg("a header value leaked into %s: %.2000s", where, text);
}

/*
 * Header values reach the resource (workflow-level headers merged under the worker's,
 * the worker's winning) but are never echoed: not in the POST answer, GET of the
 * workflow or of the list, the events, nor batond's log at debug level.
 */
static void test_header_values_not_echoed(void **state)
{
	calls_ctx *c = *state;
	fragile_push(c->res, (fragile_action){.status = 503}); /* a failure event and log line */
	json_t *body = calls_workflow("sec", c->url, 2, calls_quick_retry(100));
	json_object_set_new(json_object_get(body, "call"), "headers",
			    json_pack("{s:s, s:s}", "Authorization", SECRET, "X-Tenant", "acme"));
	json_t *w0call =
	    json_object_get(json_array_get(json_object_get(body, "workers"), 0), "call");
	json_object_set_new(w0call, "headers",
			    json_pack("{s:s, s:s}", "X-Tenant", "beta", "X-Api-Key", SECRET2));
	char *text = json_dumps(body, JSON_COMPACT);
	json_decref(body);
	hs_response created;
	hs_post(c->s, "/workflows", text, &created);
	free(text);
	assert_int_equal(created.status, 201);
	assert_no_secret(created.body, "the POST answer");
	hs_response_fini(&created);
	json_t *wf = hs_wait_workflow(c->s, "sec", "completed", WAIT_MS);

	fragile_record *r = calls_records_exactly(c->res, 3);
	for (size_t i = 0; i < 3; i++) {
		assert_string_equal(r[i].authorization, SECRET);
		bool w0 = strcmp(r[i].worker, "w0") == 0;
		char *tenant = calls_record_header(&r[i], "X-Tenant"),
		     *key = calls_record_header(&r[i], "X-Api-Key");
		assert_string_equal(tenant, w0 ? "beta" : "acme");
		if (w0)
			assert_string_equal(key, SECRET2);
		else
			assert_null(key);
		free(tenant);
		free(key);
	}
	fragile_records_free(r, 3);

	json_t *h0 = json_object_get(json_object_get(hs_step_at(wf, 0), "call"), "headers");
	json_t *h1 = json_object_get(json_object_get(hs_step_at(wf, 1), "call"), "headers");
	assert_string_equal(hs_str(h0, "Authorization"), "<redacted>");
	assert_string_equal(hs_str(h0, "X-Api-Key"), "<redacted>");
	assert_string_equal(hs_str(h1, "X-Tenant"), "<redacted>");
	assert_null(json_object_get(h1, "X-Api-Key"));
	json_decref(wf);

	hs_response got;
	hs_get(c->s, "/workflows/sec", &got);
	assert_int_equal(got.status, 200);
	assert_no_secret(got.body, "GET /workflows/sec");
	hs_response_fini(&got);
	hs_get(c->s, "/workflows", &got);
	assert_no_secret(got.body, "GET /workflows");
	hs_response_fini(&got);
	hs_get(c->s, "/workflows/sec/events", &got);
	assert_int_equal(got.status, 200);
	assert_true(calls_contains(got.body, "step_failed"));
	assert_no_secret(got.body, "the events");
	hs_response_fini(&got);
	char *log = hs_log_text(c->s);
	assert_true(calls_contains(log, "wf=sec"));
	assert_no_secret(log, "batond's log");
	free(log);
	calls_assert_sound(c->res);
}

/* A 302 is not followed: the step fails at once and its Location is never requested. */
static void test_redirect_not_followed(void **state)
{
	calls_ctx *c = *state;
	char *elsewhere = fragile_url(c->res, "/elsewhere");
	fragile_push(c->res, (fragile_action){.status = 302, .location = elsewhere});
	calls_create(c->s, calls_workflow("redir", c->url, 1, calls_quick_retry(100)));
	json_t *wf = hs_wait_workflow(c->s, "redir", "failed", WAIT_MS);
	fragile_record *r = calls_records_exactly(c->res, 1);
	assert_string_equal(r[0].path, "/op");
	assert_int_equal(r[0].status, 302);
	fragile_records_free(r, 1);
	json_t *st = hs_step_at(wf, 0);
	assert_int_equal(hs_int(st, "attempts"), 1);
	assert_true(calls_contains(hs_str(st, "error"), "redirect"));
	json_t *events = hs_get_events(c->s, "redir");
	json_t *failed = hs_event_find(events, "step_failed", 0, 1);
	calls_assert_event(failed, "step_failed", "POST", c->url, 302);
	assert_true(json_is_null(json_object_get(failed, "retry_in_ms")));
	json_decref(events);
	json_decref(wf);
	free(elsewhere);
	calls_assert_sound(c->res);
}

/*
 * batond loads libcurl only when calls are allowed. With a libcurl.so.4 that is not a
 * library first on LD_LIBRARY_PATH (so the dynamic loader finds it before the real
 * one), a batond with --allow-call exits 1 at start and its log says that HTTP steps
 * need libcurl; it never listens.
 */
static void test_allow_call_needs_libcurl(void **state)
{
	(void)state;
	char dir[] = "/tmp/baton-nocurl-XXXXXX", lib[64], db[64];
	assert_non_null(mkdtemp(dir));
	snprintf(lib, sizeof lib, "%s/libcurl.so.4", dir);
	snprintf(db, sizeof db, "%s/baton.db", dir);
	FILE *f = fopen(lib, "w");
	assert_non_null(f);
	fputs("not a shared library\n", f);
	fclose(f);

	const char *const args[] = {"--listen",	    "127.0.0.1:0",	   "--db", db,
				    "--allow-call", "http://127.0.0.1:9/", NULL};
	char text[8192];
	int status = hs_run_batond(args, "LD_LIBRARY_PATH", dir, WAIT_MS, text, sizeof text);
	if (status == -1)
		fail_msg("batond with --allow-call and no usable libcurl did not exit");
	unlink(lib);
	char path[96];
	static const char *const suffix[] = {"", "-wal", "-shm"};
	for (int i = 0; i < 3; i++) {
		snprintf(path, sizeof path, "%s%s", db, suffix[i]);
		unlink(path);
	}
	rmdir(dir);
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 1)
		fail_msg("batond ended with wait status %d, expected exit 1; log:\n%s", status,
			 text);
	if (!strstr(text, "need libcurl") || strstr(text, "listening on"))
		fail_msg("batond's log does not say that HTTP steps need libcurl:\n%s", text);
}

/*
 * batond checks, at start, that libcurl takes every option baton relies on. With a
 * libcurl.so.4 that refuses CURLOPT_PROTOCOLS_STR as libcurl before 7.85.0 does (built
 * from tests/http/oldcurl.c into build/.../tests/oldcurl/ by the Makefile), a batond with
 * --allow-call exits 1 at start, says which option and which version, and never listens.
 */
static void test_allow_call_refuses_old_libcurl(void **state)
{
	(void)state;
	char exe[4096], dir[4096 + 16], db[64] = "/tmp/baton-oldcurl-XXXXXX";
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	assert_true(n > 0);
	exe[n] = 0;
	*strrchr(exe, '/') = 0; /* .../tests/http */
	*strrchr(exe, '/') = 0; /* .../tests */
	snprintf(dir, sizeof dir, "%s/oldcurl", exe);
	char lib[sizeof dir + 16];
	snprintf(lib, sizeof lib, "%s/libcurl.so.4", dir);
	if (access(lib, R_OK) != 0)
		fail_msg("%s is missing: build it with make", lib);
	assert_non_null(mkdtemp(db));
	char path[96];
	snprintf(path, sizeof path, "%s/baton.db", db);
	const char *const args[] = {"--listen",	    "127.0.0.1:0",	   "--db", path,
				    "--allow-call", "http://127.0.0.1:9/", NULL};
	char text[8192];
	int status = hs_run_batond(args, "LD_LIBRARY_PATH", dir, WAIT_MS, text, sizeof text);
	bool left_db = access(path, F_OK) == 0;
	unlink(path);
	rmdir(db);
	if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 1)
		fail_msg("batond with too old a libcurl: wait status %d, expected exit 1; log:\n%s",
			 status, text);
	if (!strstr(text, "libcurl/7.84.0 is too old") || !strstr(text, "CURLOPT_PROTOCOLS_STR") ||
	    strstr(text, "listening on"))
		fail_msg("batond's log does not say that libcurl is too old:\n%s", text);
	assert_false(left_db);
}

/*
 * A prefix must name at least a host: "http://" alone (which would allow every http URL),
 * an empty host, user info, a bad port or a query in the authority are refused at start,
 * by flag and by BATON_ALLOW_CALL, with exit 2 and a message that names the prefix.
 * (Prefixes that name a host are accepted: every other test here starts with one.)
 */
static void test_allow_call_prefix_needs_host(void **state)
{
	(void)state;
	static const char *const bad[] = {
	    "http://",		 "https://",	  "http:///api",	"http://:8080/",
	    "http://user@host/", "http://host:/", "http://host:99999/", "http://[::1/",
	    "http://[]/",	 "http://host?x",
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		for (int by_env = 0; by_env < 2; by_env++) {
			const char *const flag[] = {
			    "--listen",	    "127.0.0.1:0", "--db", "/nonexistent/baton.db",
			    "--allow-call", bad[i],	   NULL};
			const char *const env[] = {"--listen", "127.0.0.1:0", "--db",
						   "/nonexistent/baton.db", NULL};
			char text[4096];
			int status =
			    hs_run_batond(by_env ? env : flag, by_env ? "BATON_ALLOW_CALL" : NULL,
					  bad[i], WAIT_MS, text, sizeof text);
			if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 2)
				fail_msg(
				    "--allow-call \"%s\" (%s): wait status %d, expected exit 2;"
				    " log:\n%s",
				    bad[i], by_env ? "environment" : "flag", status, text);
			char want[128];
			snprintf(want, sizeof want,
				 "names a host, http[s]://HOST[:PORT][/PATH], not \"%s\"", bad[i]);
			if (!strstr(text, want))
				fail_msg("--allow-call \"%s\": the log does not say why:\n%s",
					 bad[i], text);
		}
	}
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_allowed_prefixes, calls_setup_prefixes,
					    calls_teardown),
	    cmocka_unit_test_setup_teardown(test_dot_segments_refused, calls_setup_prefixes,
					    calls_teardown),
	    cmocka_unit_test_setup_teardown(test_reserved_headers_refused, calls_setup,
					    calls_teardown),
	    cmocka_unit_test_setup_teardown(test_header_values_not_echoed, calls_setup_debug,
					    calls_teardown),
	    cmocka_unit_test_setup_teardown(test_redirect_not_followed, calls_setup,
					    calls_teardown),
	    cmocka_unit_test(test_allow_call_needs_libcurl),
	    cmocka_unit_test(test_allow_call_refuses_old_libcurl),
	    cmocka_unit_test(test_allow_call_prefix_needs_host),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
