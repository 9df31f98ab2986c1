/*
 * test_bad_input.c - batond refuses bad requests with the documented status and an
 * application/problem+json body, stays up, and stores nothing.
 *
 * Data-driven, as jansson's test/suites/invalid: each table below is a list of requests
 * that must all be refused the same way. After every single case the harness checks
 * that the process still lives, /healthz answers, and the workflows table (read straight
 * from the database, hs_db_count) and GET /workflows still hold only the baseline workflow.
 * The last test is the mirror image: values exactly at the documented limits are
 * accepted, so that a server refusing everything cannot pass this file.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "../harness/harness.h"

#define WAIT_MS	  30000
#define MIB	  (1024 * 1024)
#define COUNT_SQL "SELECT count(*) FROM workflows"

/* A valid body with `extra` members appended at the top level. */
#define WF(extra) "{\"resource\":\"r\",\"workers\":[\"a\"]" extra "}"
/* A valid body whose single worker is `w`. */
#define WK(w) "{\"resource\":\"r\",\"workers\":[" w "]}"
/* A valid body with retry object `r`. */
#define RT(r) WF(",\"retry\":" r)

#define LEN(a) (sizeof(a) / sizeof((a)[0]))

/*
 * For the tests that start with baseline(): after all their refused requests, the
 * database itself (hs_db_count: on SQLite read with batond stopped, since it holds the
 * file while it runs) still holds the one baseline workflow.
 */
static int teardown_one_row(void **state)
{
	hs_server *s = *state;
	long long n = hs_db_count(s, COUNT_SQL);
	int rc = hs_close(s);
	if (n != 1) {
		fprintf(stderr,
			"after the refused requests the workflows table holds %lld rows,"
			" expected 1\n",
			n);
		return -1;
	}
	return rc;
}

/* One valid, finished workflow: what every bad request must leave alone. */
static void baseline(hs_server *s)
{
	hs_response r;
	hs_post(s, "/workflows",
		"{\"id\":\"baseline\",\"resource\":\"bad-input\","
		"\"workers\":[{\"name\":\"w\",\"work_ms\":0}]}",
		&r);
	assert_int_equal(r.status, 201);
	hs_response_fini(&r);
	json_decref(hs_wait_workflow(s, "baseline", "completed", WAIT_MS));
}

/* After a refused request: the server lives and nothing was stored (the file itself is
 * read once the test is over: teardown_one_row). */
static void assert_unharmed(hs_server *s, const char *what)
{
	if (!hs_alive(s)) {
		hs_dump_log(s, 3000);
		fail_msg("batond died after %s", what);
	}
	json_t *health = hs_get_json(s, "/healthz", 200);
	json_decref(health);
	json_t *list = hs_get_json(s, "/workflows", 200);
	if (json_array_size(json_object_get(list, "workflows")) != 1)
		fail_msg("after %s GET /workflows lists %zu workflows, expected 1", what,
			 json_array_size(json_object_get(list, "workflows")));
	json_decref(list);
}

/* Describes a body for failure messages: its start, printable. */
static void describe(char *buf, size_t size, const char *prefix, const char *body, size_t len)
{
	size_t n = (size_t)snprintf(buf, size, "%s ", prefix);
	for (size_t i = 0; i < len && n + 5 < size && i < 160; i++) {
		unsigned char c = (unsigned char)body[i];
		n += (size_t)snprintf(buf + n, size - n, c >= 0x20 && c < 0x7f ? "%c" : "\\x%02x",
				      c);
	}
	if (len > 160 && n + 4 < size)
		snprintf(buf + n, size - n, "...");
}

/* POSTs `len` bytes of `body` as application/json; asserts `status`/`slug`, then unharmed. */
static void expect_refused(hs_server *s, const char *body, size_t len, long status,
			   const char *slug)
{
	char what[512];
	describe(what, sizeof what, "POST /workflows", body, len);
	hs_request req = {.method = "POST",
			  .path = "/workflows",
			  .content_type = "application/json",
			  .body = body,
			  .body_len = len};
	hs_response r;
	hs_send(s, &req, &r);
	hs_assert_problem(&r, status, slug, what);
	hs_response_fini(&r);
	assert_unharmed(s, what);
}

static void expect_invalid_all(hs_server *s, const char *const *bodies, size_t n)
{
	for (size_t i = 0; i < n; i++)
		expect_refused(s, bodies[i], strlen(bodies[i]), 400, "invalid-request");
}

/* The same for a jansson-built body (stolen). */
static void expect_invalid_json(hs_server *s, json_t *body)
{
	char *text = json_dumps(body, JSON_COMPACT);
	json_decref(body);
	assert_non_null(text);
	expect_refused(s, text, strlen(text), 400, "invalid-request");
	free(text);
}

static char *repeat(const char *unit, size_t times)
{
	size_t n = strlen(unit);
	char *out = malloc(n * times + 1);
	for (size_t i = 0; i < times; i++)
		memcpy(out + i * n, unit, n);
	out[n * times] = '\0';
	return out;
}

/* ---- the tables ------------------------------------------------------------------ */

static void test_malformed_json(void **state)
{
	hs_server *s = *state;
	baseline(s);
	static const char *const bodies[] = {
	    "",
	    "{",
	    "}",
	    "nul",
	    "\"unterminated",
	    "{\"resource\":\"r\",\"workers\":[\"a\"]",	 /* truncated */
	    "{\"resource\":\"r\",\"workers\":[\"a\"",	 /* truncated */
	    "{\"resource\":\"r\",\"workers\":[\"a\"],}", /* trailing comma */
	    "{\"resource\":\"r\",\"workers\":[\"a\",]}",
	    "{\"resource\":\"r\" \"workers\":[\"a\"]}", /* missing comma */
	    "{resource:\"r\",\"workers\":[\"a\"]}",	/* unquoted name */
	    "{'resource':'r','workers':['a']}",
	    WF("") " {}", /* two documents */
	    WF("") "x",
	    "{\"resource\":\"r\",\"workers\":[\"a\\x\"]}", /* bad escape */
	    "{\"resource\":\"r\",\"workers\":[\"a\"] /* comment */}",
	    "{\"resource\":\"r\",\"workers\":[\"a\"],\"on_failure\":\"fail",
	    /* valid JSON, but not a workflow object */
	    "null",
	    "true",
	    "42",
	    "\"workflow\"",
	    "[]",
	    "[" WF("") "]",
	    "{}",
	};
	expect_invalid_all(s, bodies, LEN(bodies));

	/* Nesting far deeper than any parser should recurse. */
	char *open = repeat("[", 100000);
	expect_refused(s, open, strlen(open), 400, "invalid-request");
	free(open);
}

static void test_wrong_types(void **state)
{
	hs_server *s = *state;
	baseline(s);
	static const char *const bodies[] = {
	    "{\"workers\":[\"a\"]}", /* no resource */
	    "{\"resource\":\"r\"}",  /* no workers */
	    "{\"resource\":5,\"workers\":[\"a\"]}",
	    "{\"resource\":null,\"workers\":[\"a\"]}",
	    "{\"resource\":[\"r\"],\"workers\":[\"a\"]}",
	    "{\"resource\":{},\"workers\":[\"a\"]}",
	    "{\"resource\":true,\"workers\":[\"a\"]}",
	    "{\"resource\":\"r\",\"workers\":\"a\"}",
	    "{\"resource\":\"r\",\"workers\":{}}",
	    "{\"resource\":\"r\",\"workers\":null}",
	    "{\"resource\":\"r\",\"workers\":5}",
	    WK("5"),
	    WK("null"),
	    WK("[]"),
	    WK("true"),
	    WK("1.5"),
	    WK("{\"name\":5}"),
	    WK("{\"name\":null}"),
	    WK("{\"name\":[\"a\"]}"),
	    WK("{\"work_ms\":5}"), /* no name */
	    WK("{}"),
	    WK("{\"name\":\"a\",\"work_ms\":\"100\"}"),
	    WK("{\"name\":\"a\",\"work_ms\":1.5}"),
	    WK("{\"name\":\"a\",\"work_ms\":true}"),
	    WK("{\"name\":\"a\",\"work_ms\":[]}"),
	    WK("{\"name\":\"a\",\"fail_attempts\":\"1\"}"),
	    WK("{\"name\":\"a\",\"fail_attempts\":1.5}"),
	    WK("{\"name\":\"a\",\"fail_attempts\":false}"),
	    RT("\"x\""),
	    RT("[]"),
	    RT("5"),
	    RT("true"),
	    RT("{\"max_attempts\":\"3\"}"),
	    RT("{\"max_attempts\":2.5}"),
	    RT("{\"initial_delay_ms\":\"1\"}"),
	    RT("{\"initial_delay_ms\":1.5}"),
	    RT("{\"first_retry_ms\":\"1\"}"),
	    RT("{\"first_retry_ms\":1.5}"),
	    RT("{\"first_retry_ms\":null}"),
	    RT("{\"first_retry_ms\":2000,\"initial_delay_ms\":1000}"),
	    RT("{\"initial_delay_ms\":0,\"first_retry_ms\":0}"),
	    RT("{\"backoff\":\"2\"}"),
	    RT("{\"backoff\":true}"),
	    RT("{\"backoff\":[2]}"),
	    RT("{\"max_delay_ms\":\"1\"}"),
	    RT("{\"max_delay_ms\":2.5}"),
	    WF(",\"on_failure\":5"),
	    WF(",\"on_failure\":true"),
	    WF(",\"on_failure\":\"ignore\""),
	    WF(",\"on_failure\":\"FAIL\""),
	    WF(",\"on_failure\":\"\""),
	    WF(",\"on_failure\":\"fail \""),
	    WF(",\"on_failure\":[\"fail\"]"),
	    WF(",\"id\":5"),
	    WF(",\"id\":1.0"),
	    WF(",\"id\":true"),
	    WF(",\"id\":[\"x\"]"),
	    WF(",\"id\":{}"),
	};
	expect_invalid_all(s, bodies, LEN(bodies));
}

static void test_unknown_fields(void **state)
{
	hs_server *s = *state;
	baseline(s);
	static const char *const bodies[] = {
	    WF(",\"foo\":1"),
	    WF(",\"Resource\":\"r\""),
	    WF(",\"worker\":[\"b\"]"),
	    WF(",\"status\":\"completed\""),
	    WF(",\"steps\":[]"),
	    WF(",\"created_at\":\"2026-11-30T05:40:00.123Z\""),
	    WF(",\"cancel_requested\":false"),
	    WF(",\"\":1"),
	    WK("{\"name\":\"a\",\"foo\":1}"),
	    WK("{\"name\":\"a\",\"workMs\":5}"),
	    WK("{\"name\":\"a\",\"attempts\":1}"),
	    WK("{\"name\":\"a\",\"status\":\"completed\"}"),
	    RT("{\"foo\":1}"),
	    RT("{\"max_attempts\":3,\"maxAttempts\":3}"),
	    RT("{\"jitter\":0.1}"),
	};
	expect_invalid_all(s, bodies, LEN(bodies));
}

static void test_out_of_range(void **state)
{
	hs_server *s = *state;
	baseline(s);
	static const char *const bodies[] = {
	    WK("{\"name\":\"a\",\"work_ms\":-1}"),
	    WK("{\"name\":\"a\",\"work_ms\":3600001}"),
	    WK("{\"name\":\"a\",\"work_ms\":4294967296}"),
	    WK("{\"name\":\"a\",\"work_ms\":9223372036854775807}"),
	    WK("{\"name\":\"a\",\"work_ms\":9223372036854775808}"),
	    WK("{\"name\":\"a\",\"work_ms\":-9223372036854775808}"),
	    WK("{\"name\":\"a\",\"work_ms\":1e300}"),
	    WK("{\"name\":\"a\",\"fail_attempts\":-1}"),
	    WK("{\"name\":\"a\",\"fail_attempts\":1001}"),
	    RT("{\"max_attempts\":0}"),
	    RT("{\"max_attempts\":-1}"),
	    RT("{\"max_attempts\":1001}"),
	    RT("{\"initial_delay_ms\":-1}"),
	    RT("{\"initial_delay_ms\":86400001}"),
	    RT("{\"first_retry_ms\":-1}"),
	    RT("{\"first_retry_ms\":86400001}"),
	    RT("{\"backoff\":0.99}"),
	    RT("{\"backoff\":0}"),
	    RT("{\"backoff\":-2.0}"),
	    RT("{\"backoff\":100.01}"),
	    RT("{\"backoff\":1e308}"),
	    RT("{\"backoff\":1e999}"),
	    RT("{\"max_delay_ms\":-1}"),
	    RT("{\"max_delay_ms\":86400001}"),
	};
	expect_invalid_all(s, bodies, LEN(bodies));
}

/* Ids and resource names outside 1-128 chars of [A-Za-z0-9._:-], SQL and path tricks included. */
static void test_bad_names(void **state)
{
	hs_server *s = *state;
	baseline(s);
	char *long_name = repeat("a", 129);
	const char *const names[] = {
	    "",
	    long_name,
	    "a b",
	    " a",
	    "a ",
	    "a/b",
	    "../../etc/passwd",
	    "..%2Fx",
	    "a;b",
	    "'; DROP TABLE workflows; --",
	    "x' OR '1'='1",
	    "a\"b",
	    "a\\b",
	    "a?b",
	    "a#b",
	    "a*b",
	    "a%b",
	    "a\tb",
	    "a\nb",
	    "a\x01"
	    "b",
	    "\xc3\xa9",	     /* é */
	    "\xe5\x90\x8d",  /* 名 */
	    "a\xe2\x80\x8b", /* zero-width space */
	};
	for (size_t i = 0; i < LEN(names); i++) {
		expect_invalid_json(s, json_pack("{s:s, s:s, s:[s]}", "id", names[i], "resource",
						 "r", "workers", "a"));
		expect_invalid_json(
		    s, json_pack("{s:s, s:[s]}", "resource", names[i], "workers", "a"));
	}
	free(long_name);
}

static void test_bad_workers(void **state)
{
	hs_server *s = *state;
	baseline(s);
	static const char *const bodies[] = {
	    "{\"resource\":\"r\",\"workers\":[]}",
	    "{\"resource\":\"r\",\"workers\":[\"a\",\"a\"]}",
	    "{\"resource\":\"r\",\"workers\":[\"a\",\"b\",{\"name\":\"a\"}]}",
	    "{\"resource\":\"r\",\"workers\":[{\"name\":\"a\"},{\"name\":\"a\",\"work_ms\":5}]}",
	    WK("\"\""),
	    WK("{\"name\":\"\"}"),
	    /* control characters, C0, DEL and C1 */
	    WK("\"a\\u0001b\""),
	    WK("\"a\\nb\""),
	    WK("\"a\\tb\""),
	    WK("\"a\\rb\""),
	    WK("\"a\\u001bb\""),
	    WK("\"a\\u007fb\""),
	    WK("\"a\\u0085b\""),
	    WK("\"a\\u009bb\""),
	    WK("\"a\\u0000b\""),
	    WK("{\"name\":\"\\u001b[31mred\"}"),
	    /* raw control character and invalid UTF-8 inside the JSON string */
	    WK("\"a\nb\""),
	    WK("\"a\xff"
	       "b\""),
	    WK("\"\xc0\xaf\""),		    /* overlong encoding of '/' */
	    WK("\"\xed\xa0\x80\""),	    /* encoded surrogate */
	    WK("\"a\xe2\x82\""),	    /* truncated sequence */
	    WK("\"\xf8\x88\x80\x80\x80\""), /* 5-byte form */
	    WK("\"\xf4\x90\x80\x80\""),	    /* above U+10FFFF */
	    WK("\"\\ud800\""),		    /* lone surrogates */
	    WK("\"\\udc00x\""),
	};
	expect_invalid_all(s, bodies, LEN(bodies));

	/* 129 bytes, in ASCII and in two-byte characters (65 x é = 130 bytes, 65 chars). */
	char *ascii = repeat("n", 129), *accents = repeat("\xc3\xa9", 65);
	expect_invalid_json(s, json_pack("{s:s, s:[s]}", "resource", "r", "workers", ascii));
	expect_invalid_json(
	    s, json_pack("{s:s, s:[{s:s}]}", "resource", "r", "workers", "name", accents));
	free(ascii);
	free(accents);

	/* 10001 workers. */
	json_t *workers = json_array();
	for (int i = 0; i < 10001; i++) {
		char name[32];
		snprintf(name, sizeof name, "w%05d", i);
		json_array_append_new(workers, json_string(name));
	}
	expect_invalid_json(s, json_pack("{s:s, s:o}", "resource", "r", "workers", workers));
}

/* A valid workflow body padded with spaces to exactly `size` bytes. Caller frees. */
static char *padded_body(const char *id, size_t size)
{
	char head[256];
	int n = snprintf(head, sizeof head,
			 "{\"id\":\"%s\",\"resource\":\"big\",\"workers\":[{\"name\":\"w\","
			 "\"work_ms\":0}]",
			 id);
	char *body = malloc(size + 1);
	memcpy(body, head, (size_t)n);
	memset(body + n, ' ', size - (size_t)n - 1);
	body[size - 1] = '}';
	body[size] = '\0';
	return body;
}

static void test_payload_too_large(void **state)
{
	hs_server *s = *state;
	baseline(s);
	static const size_t sizes[] = {MIB + 1, 4 * MIB};
	/* Content-Length alone, Content-Length with Expect: 100-continue, chunked. */
	static const char *const ways[] = {"", " (Expect: 100-continue)", " (chunked)"};
	for (size_t i = 0; i < LEN(sizes); i++) {
		char *body = padded_body("too-big", sizes[i]);
		for (int way = 0; way < 3; way++) {
			char what[128];
			snprintf(what, sizeof what, "POST /workflows with %zu bytes%s", sizes[i],
				 ways[way]);
			hs_request req = {.method = "POST",
					  .path = "/workflows",
					  .content_type = "application/json",
					  .body = body,
					  .body_len = sizes[i],
					  .expect_continue = way == 1,
					  .chunked = way == 2};
			hs_response r;
			hs_send(s, &req, &r);
			hs_assert_problem(&r, 413, "payload-too-large", what);
			hs_response_fini(&r);
			assert_unharmed(s, what);
		}
		free(body);
	}
}

static void test_unsupported_media_type(void **state)
{
	hs_server *s = *state;
	baseline(s);
	static const char *const types[] = {
	    NULL, /* no Content-Type at all */
	    "text/plain",
	    "text/json",
	    "application/x-www-form-urlencoded",
	    "multipart/form-data; boundary=x",
	    "application/xml",
	    "application/jsonx",
	    "application/json-patch+json",
	    "application/problem+json",
	    "json",
	};
	static const char body[] = "{\"id\":\"media\",\"resource\":\"r\",\"workers\":[\"a\"]}";
	for (size_t i = 0; i < LEN(types); i++) {
		char what[160];
		snprintf(what, sizeof what, "POST /workflows with Content-Type \"%s\"",
			 types[i] ? types[i] : "(none)");
		hs_request req = {.method = "POST",
				  .path = "/workflows",
				  .content_type = types[i],
				  .body = body,
				  .body_len = strlen(body)};
		hs_response r;
		hs_send(s, &req, &r);
		hs_assert_problem(&r, 415, "unsupported-media-type", what);
		hs_response_fini(&r);
		assert_unharmed(s, what);
	}
}

/* Bad list parameters give 400; ids in paths that cannot exist give 404 (400 accepted). */
static void test_bad_queries_and_paths(void **state)
{
	hs_server *s = *state;
	baseline(s);
	static const char *const queries[] = {
	    "/workflows?status=bogus",
	    "/workflows?status=COMPLETED",
	    "/workflows?status=completed,failed",
	    "/workflows?limit=0",
	    "/workflows?limit=1001",
	    "/workflows?limit=-1",
	    "/workflows?limit=abc",
	    "/workflows?limit=1.5",
	    "/workflows?limit=10abc",
	    "/workflows?limit=99999999999999999999",
	    "/workflows?cursor=not-a-cursor!!",
	    "/workflows?cursor=%00",
	    "/workflows?cursor=%27%3B%20DROP%20TABLE%20workflows%3B--",
	    "/resources?limit=0",
	    "/resources?limit=1001",
	    "/resources?limit=abc",
	    "/resources?cursor=w1",
	    "/resources?cursor=r",
	    "/resources?cursor=r%27%3B%20DROP%20TABLE%20resources%3B--",
	    "/workflows/baseline/events?limit=10001",
	    "/resources/bad-input/events?limit=10001",
	    "/workflows/baseline/steps?limit=0",
	    "/workflows/baseline/steps?limit=1001",
	    "/workflows/baseline/steps?after=-1",
	    "/workflows/baseline/steps?after=x",
	    "/workflows/baseline/steps?after=99999999999",
	};
	for (size_t i = 0; i < LEN(queries); i++) {
		hs_response r;
		hs_get(s, queries[i], &r);
		char what[256];
		snprintf(what, sizeof what, "GET %s", queries[i]);
		hs_assert_problem(&r, 400, "invalid-request", what);
		hs_response_fini(&r);
		assert_unharmed(s, what);
	}
	/*
	 * The contract says 404 for unknown ids; a server may also call an id that could
	 * never exist invalid (400). Either way: a problem document, and nothing else.
	 */
	static const char *const paths[] = {
	    "/workflows/..%2F..%2Fetc%2Fpasswd",
	    "/workflows/%27%3B%20DROP%20TABLE%20workflows%3B--",
	    "/workflows/baseline%27%20OR%20%271%27%3D%271",
	    "/workflows/a%20b/events",
	    "/workflows/a%20b/steps",
	    "/workflows/%00",
	    "/resources/%27%3B%20DROP%20TABLE%20workflows%3B--",
	    "/workflows/"
	    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
	};
	for (size_t i = 0; i < LEN(paths); i++) {
		hs_response r;
		hs_get(s, paths[i], &r);
		char what[512];
		snprintf(what, sizeof what, "GET %s", paths[i]);
		if (r.status == 400)
			hs_assert_problem(&r, 400, "invalid-request", what);
		else
			hs_assert_problem(&r, 404, "not-found", what);
		hs_response_fini(&r);
		assert_unharmed(s, what);
	}
	/* Cancel through a tricky id must not touch the baseline either. */
	hs_request req = {.method = "POST", .path = "/workflows/baseline%27--/cancel"};
	hs_response r;
	hs_send(s, &req, &r);
	if (r.status == 400)
		hs_assert_problem(&r, 400, "invalid-request", "cancel with a tricky id");
	else
		hs_assert_problem(&r, 404, "not-found", "cancel with a tricky id");
	hs_response_fini(&r);
	json_t *wf = hs_get_workflow(s, "baseline");
	assert_string_equal(hs_str(wf, "status"), "completed");
	json_decref(wf);
}

/* ---- the mirror image: the limits themselves are accepted ------------------------ */

/* POSTs `body` with `ctype`, asserts 201 and returns the workflow (new reference). */
static json_t *accepted(hs_server *s, const char *body, size_t len, const char *ctype)
{
	hs_request req = {.method = "POST",
			  .path = "/workflows",
			  .content_type = ctype,
			  .body = body,
			  .body_len = len};
	hs_response r;
	hs_send(s, &req, &r);
	if (r.status != 201) {
		char what[512];
		describe(what, sizeof what, "POST /workflows", body, len);
		fail_msg("%s (Content-Type %s): %ld %.400s, expected 201", what, ctype, r.status,
			 r.body ? r.body : "");
	}
	json_t *wf = json_incref(r.json);
	hs_response_fini(&r);
	return wf;
}

static json_t *accepted_json(hs_server *s, json_t *body)
{
	char *text = json_dumps(body, JSON_COMPACT);
	json_decref(body);
	json_t *wf = accepted(s, text, strlen(text), "application/json");
	free(text);
	return wf;
}

static void test_limits_are_accepted(void **state)
{
	hs_server *s = *state;
	char *id128 = repeat("Az09._:-", 16), *res128 = repeat("r", 128);
	char *name128 = repeat("\xc3\xa9", 64); /* 128 bytes */
	json_t *wf = accepted_json(s, json_pack("{s:s, s:s, s:[{s:s, s:i}, {s:s, s:i}, s]}", "id",
						id128, "resource", res128, "workers", "name",
						name128, "work_ms", 0, "name",
						"Zahlung pr\xc3\xbc"
						"fen \xe2\x9c\x93 #1",
						"work_ms", 0, "x"));
	assert_string_equal(hs_str(wf, "id"), id128);
	assert_string_equal(hs_str(wf, "resource"), res128);
	json_t *steps = json_object_get(wf, "steps");
	assert_string_equal(hs_str(json_array_get(steps, 0), "worker"), name128);
	assert_string_equal(hs_str(json_array_get(steps, 1), "worker"), "Zahlung pr\xc3\xbc"
									"fen \xe2\x9c\x93 #1");
	assert_string_equal(hs_str(json_array_get(steps, 2), "worker"), "x");
	json_decref(wf);
	json_decref(hs_wait_workflow(s, id128, "completed", WAIT_MS));

	/* Largest counts and durations; the first step fails for good so nothing long runs. */
	json_t *workers = json_array();
	json_array_append_new(workers, json_pack("{s:s, s:i, s:i}", "name", "first", "work_ms", 0,
						 "fail_attempts", 1000));
	json_array_append_new(workers, json_pack("{s:s, s:i, s:i}", "name", "longest", "work_ms",
						 3600000, "fail_attempts", 0));
	for (int i = 2; i < 10000; i++) {
		char name[32];
		snprintf(name, sizeof name, "w%05d", i);
		json_array_append_new(workers, json_string(name));
	}
	wf =
	    accepted_json(s, json_pack("{s:s, s:s, s:o, s:{s:i}}", "id", "ten-thousand", "resource",
				       "limits", "workers", workers, "retry", "max_attempts", 1));
	assert_int_equal(hs_int(wf, "steps_total"), 10000);
	json_decref(wf);
	wf = hs_wait_workflow(s, "ten-thousand", "failed", WAIT_MS);
	assert_int_equal(json_array_size(json_object_get(wf, "steps")), 10000);
	json_decref(wf);

	wf = accepted_json(s,
			   json_pack("{s:s, s:s, s:[{s:s, s:i, s:i}], s:{s:i, s:i, s:f, s:i}, "
				     "s:s}",
				     "id", "slowest-retry", "resource", "limits", "workers", "name",
				     "first", "work_ms", 0, "fail_attempts", 1000, "retry",
				     "max_attempts", 1000, "first_retry_ms", 86400000, "backoff",
				     100.0, "max_delay_ms", 86400000, "on_failure", "continue"));
	json_decref(wf);
	wf = hs_wait_step(s, "slowest-retry", 0, "retrying", WAIT_MS);
	json_t *events = hs_get_events(s, "slowest-retry");
	json_t *failed = hs_event_find(events, "step_failed", 0, 1);
	assert_non_null(failed);
	assert_int_equal(hs_int(failed, "retry_in_ms"), 86400000);
	json_decref(events);
	json_decref(wf);
	hs_response r;
	hs_post(s, "/workflows/slowest-retry/cancel", NULL, &r);
	assert_int_equal(r.status, 200);
	hs_response_fini(&r);

	/* backoff bounds, as integers and reals; zero delays. */
	static const char *const bodies[] = {
	    "{\"id\":\"b1\",\"resource\":\"limits\",\"workers\":[{\"name\":\"w\",\"work_ms\":0}],"
	    "\"retry\":{\"backoff\":1,\"first_retry_ms\":0,\"max_delay_ms\":0}}",
	    "{\"id\":\"b2\",\"resource\":\"limits\",\"workers\":[{\"name\":\"w\",\"work_ms\":0}],"
	    "\"retry\":{\"backoff\":100}}",
	    "{\"id\":\"b3\",\"resource\":\"limits\",\"workers\":[{\"name\":\"w\",\"work_ms\":0}],"
	    "\"retry\":{\"backoff\":1.0,\"max_attempts\":1}}",
	    "{\"id\":\"b4\",\"resource\":\"limits\",\"workers\":[{\"name\":\"w\",\"work_ms\":0}],"
	    "\"retry\":{\"backoff\":100.0}}",
	};
	for (size_t i = 0; i < LEN(bodies); i++)
		json_decref(accepted(s, bodies[i], strlen(bodies[i]), "application/json"));

	/* Content-Type parameters and case. */
	static const char *const ctypes[] = {"application/json; charset=utf-8",
					     "application/json;charset=UTF-8", "Application/JSON"};
	for (size_t i = 0; i < LEN(ctypes); i++) {
		char body[128];
		snprintf(body, sizeof body,
			 "{\"id\":\"ct%zu\",\"resource\":\"limits\",\"workers\":[\"w\"]}", i);
		json_decref(accepted(s, body, strlen(body), ctypes[i]));
	}

	/* A body of exactly 1 MiB is not "over 1 MiB". */
	char *big = padded_body("one-mib", MIB);
	json_decref(accepted(s, big, MIB, "application/json"));
	free(big);

	static const char *const ids[] = {"b1", "b2", "b3", "b4", "ct0", "ct1", "ct2", "one-mib"};
	for (size_t i = 0; i < LEN(ids); i++)
		json_decref(hs_wait_workflow(s, ids[i], "completed", WAIT_MS));
	free(id128);
	free(res128);
	free(name128);
}

/* Sends raw bytes on a fresh connection; returns the status of the answer, or 0. */
static long raw_status(const hs_server *s, const char *req, size_t len)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)hs_port(s))};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	struct timeval tv = {.tv_sec = 15};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	long status = 0;
	if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
		size_t sent = 0;
		while (sent < len) {
			ssize_t n = send(fd, req + sent, len - sent, MSG_NOSIGNAL);
			if (n <= 0)
				break;
			sent += (size_t)n;
		}
		char buf[64] = "";
		ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
		if (n > 12 && sscanf(buf, "HTTP/1.%*d %ld", &status) != 1)
			status = 0;
	}
	close(fd);
	return status;
}

/* Wrong methods on every route, and headers over the per-connection memory limit. */
static void test_wrong_methods_and_oversized_headers(void **state)
{
	hs_server *s = *state;
	baseline(s);
	static const struct {
		const char *path, *allow;
	} paths[] = {
	    {"/workflows", "POST, GET, HEAD"},
	    {"/workflows/baseline", "GET, HEAD, DELETE"},
	    {"/workflows/baseline/events", "GET, HEAD"},
	    {"/workflows/baseline/steps", "GET, HEAD"},
	    {"/workflows/baseline/cancel", "POST"},
	    {"/resources", "GET, HEAD"},
	    {"/resources/bad-input", "GET, HEAD, PUT"},
	    {"/resources/bad-input/events", "GET, HEAD"},
	    {"/healthz", "GET, HEAD"},
	    {"/readyz", "GET, HEAD"},
	    {"/metrics", "GET, HEAD"},
	    {"/backup", "GET, HEAD"},
	};
	static const char *const methods[] = {"GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"};
	int cases = 0;
	for (size_t i = 0; i < LEN(paths); i++) {
		for (size_t m = 0; m < LEN(methods); m++) {
			if (strstr(paths[i].allow, methods[m]))
				continue;
			char what[160];
			snprintf(what, sizeof what, "%s %s", methods[m], paths[i].path);
			hs_request req = {.method = methods[m], .path = paths[i].path};
			hs_response r;
			hs_send(s, &req, &r);
			hs_assert_problem(&r, 405, "method-not-allowed", what);
			hs_assert_allow(&r, paths[i].allow);
			hs_response_fini(&r);
			assert_unharmed(s, what);
			cases++;
		}
	}
	assert_true(cases >= 40);
	/* 70 KB of headers: answered 431 by libmicrohttpd itself, nothing else happens. */
	size_t big = 70000;
	char *req = malloc(big + 256);
	int n = snprintf(req, 256, "POST /workflows HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ");
	memset(req + n, 'x', big);
	n += (int)big;
	n += snprintf(req + n, 256, "\r\nContent-Length: 2\r\n\r\n{}");
	assert_int_equal(raw_status(s, req, (size_t)n), 431);
	free(req);
	assert_unharmed(s, "70 KB of headers");
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_malformed_json, hs_setup, teardown_one_row),
	    cmocka_unit_test_setup_teardown(test_wrong_types, hs_setup, teardown_one_row),
	    cmocka_unit_test_setup_teardown(test_unknown_fields, hs_setup, teardown_one_row),
	    cmocka_unit_test_setup_teardown(test_out_of_range, hs_setup, teardown_one_row),
	    cmocka_unit_test_setup_teardown(test_bad_names, hs_setup, teardown_one_row),
	    cmocka_unit_test_setup_teardown(test_bad_workers, hs_setup, teardown_one_row),
	    cmocka_unit_test_setup_teardown(test_payload_too_large, hs_setup, teardown_one_row),
	    cmocka_unit_test_setup_teardown(test_unsupported_media_type, hs_setup,
					    teardown_one_row),
	    cmocka_unit_test_setup_teardown(test_bad_queries_and_paths, hs_setup, teardown_one_row),
	    cmocka_unit_test_setup_teardown(test_limits_are_accepted, hs_setup, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_wrong_methods_and_oversized_headers, hs_setup,
					    teardown_one_row),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
