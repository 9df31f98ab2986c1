/*
 * test_answers.c - whatever a resource sends back to an HTTP step is stored and served
 * (issue 17), over HTTP against the real batond and the fragile test resource: an empty
 * body, JSON with and without a JSON Content-Type, text, bytes that are not UTF-8, NULs,
 * control characters, binary, a body cut at the 1 MiB bound in the middle of a two- and
 * of a three-byte character, no Content-Type and a Content-Type that is not ASCII. Each
 * answer must come back in the one documented shape (openapi.yaml, StepResult.response:
 * the JSON value, a UTF-8 string, or base64 with "encoding": "base64"; status and
 * content_type beside it), the same in the workflow, its result, its events and its
 * event stream, with the resource's events, the lists and the client's output intact, and all of it
 * again after batond is killed with SIGKILL and restarted, and after a clean restart.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../harness/calls.h"
#include "../harness/client.h"
#include "../harness/sse.h"

#define WAIT_MS	 30000
#define MAX_BODY (1024 * 1024) /* batond's bound on a stored answer */

typedef enum kind { AS_JSON, AS_TEXT, AS_BASE64 } kind;

/* One answer the resource sends, and how it must be shown. */
typedef struct answer_case {
	const char *name;
	char *body; /* malloc'd */
	size_t len;
	const char *content_type;      /* sent; NULL: no header */
	const char *want_content_type; /* shown; NULL: null */
	kind as;
	size_t text_len; /* AS_TEXT: the bytes shown (a cut drops an incomplete character) */
	bool truncated;
} answer_case;

static char *memdup(const char *p, size_t n)
{
	char *d = malloc(n + 1);
	memcpy(d, p, n);
	d[n] = 0;
	return d;
}

/* `lead` then `ch` repeated past the 1 MiB bound, so the cut falls inside a character. */
static char *cut_text(const char *lead, const char *ch, size_t *len)
{
	size_t ll = strlen(lead), cl = strlen(ch), n = ll;
	char *b = malloc(MAX_BODY + 64);
	memcpy(b, lead, ll);
	while (n < MAX_BODY + 32) {
		memcpy(b + n, ch, cl);
		n += cl;
	}
	*len = n;
	return b;
}

#define N_CASES 13

static void make_cases(answer_case *c)
{
	static const char bin[] = {0x00, 0x01, (char)0xff, (char)0xfe, 'P', 'K', 0x03, 0x04};
	static const char latin1[] = "caf\xe9 cr\xe8me"; /* ISO-8859-1, not UTF-8 */
	static const char nul_text[] = "before\0after";
	size_t n;
	int i = 0;
	c[i++] = (answer_case){"empty", memdup("", 0), 0, NULL, NULL, AS_TEXT, 0, false};
	c[i++] = (answer_case){"json",
			       memdup("{\"ok\":true,\"n\":[1,2]}", 21),
			       21,
			       "application/json",
			       "application/json",
			       AS_JSON,
			       0,
			       false};
	c[i++] = (answer_case){"json as text/plain",
			       memdup("[1,\"\xc3\xa9\"]", 8),
			       8,
			       "text/plain",
			       "text/plain",
			       AS_JSON,
			       0,
			       false};
	static const char utf8[] = "h\xc3\xa9llo\n\tw\xe2\x82\xac\r\n";
	c[i++] = (answer_case){"utf-8 text",
			       memdup(utf8, strlen(utf8)),
			       strlen(utf8),
			       "text/plain; charset=utf-8",
			       "text/plain; charset=utf-8",
			       AS_TEXT,
			       strlen(utf8),
			       false};
	c[i++] = (answer_case){"latin-1",
			       memdup(latin1, sizeof latin1 - 1),
			       sizeof latin1 - 1,
			       "text/plain; charset=iso-8859-1",
			       "text/plain; charset=iso-8859-1",
			       AS_BASE64,
			       0,
			       false};
	c[i++] = (answer_case){"NUL in text",
			       memdup(nul_text, sizeof nul_text - 1),
			       sizeof nul_text - 1,
			       "text/plain",
			       "text/plain",
			       AS_BASE64,
			       0,
			       false};
	c[i++] = (answer_case){"JSON with \\u0000",
			       memdup("\"a\\u0000b\"", 10),
			       10,
			       "application/json",
			       "application/json",
			       AS_TEXT,
			       10,
			       false};
	c[i++] = (answer_case){
	    "escape codes", memdup("\x1b[31mred\x1b[0m", 12), 12, NULL, NULL, AS_BASE64, 0, false};
	c[i++] = (answer_case){"binary",
			       memdup(bin, sizeof bin),
			       sizeof bin,
			       "application/octet-stream",
			       "application/octet-stream",
			       AS_BASE64,
			       0,
			       false};
	c[i++] = (answer_case){"odd Content-Type", memdup("ok", 2), 2, "text/\xff\x01x",
			       "text/??x",	   AS_TEXT,	    2, false};
	char *two = cut_text("a", "\xc3\xa9", &n); /* the bound falls after a lead byte */
	c[i++] = (answer_case){"cut in a 2-byte character",
			       two,
			       n,
			       "text/plain",
			       "text/plain",
			       AS_TEXT,
			       MAX_BODY - 1,
			       true};
	char *three = cut_text("ab", "\xe2\x82\xac", &n); /* 2 + 3k: the bound cuts 2 of 3 */
	c[i++] = (answer_case){
	    "cut in a 3-byte character", three, n, NULL, NULL, AS_TEXT, MAX_BODY - 2, true};
	char *big = cut_text("", "\xff", &n);
	c[i++] = (answer_case){"cut binary", big, n, NULL, NULL, AS_BASE64, 0, true};
	assert_int_equal(i, N_CASES);
}

static void free_cases(answer_case *c)
{
	for (int i = 0; i < N_CASES; i++)
		free(c[i].body);
}

static int b64_value(char ch)
{
	const char *abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	const char *p = ch ? strchr(abc, ch) : NULL;
	return p ? (int)(p - abc) : -1;
}

/* Decodes padded base64; NULL when it is not. */
static char *b64_decode(const char *s, size_t *out_len)
{
	size_t n = strlen(s);
	if (n % 4)
		return NULL;
	char *out = malloc(n / 4 * 3 + 1);
	size_t o = 0;
	for (size_t i = 0; i < n; i += 4) {
		int v[4];
		for (int k = 0; k < 4; k++)
			v[k] = s[i + k] == '=' && i + 4 == n && k >= 2 ? 0 : b64_value(s[i + k]);
		if (v[0] < 0 || v[1] < 0 || v[2] < 0 || v[3] < 0) {
			free(out);
			return NULL;
		}
		unsigned w = (unsigned)v[0] << 18 | (unsigned)v[1] << 12 | (unsigned)v[2] << 6 |
			     (unsigned)v[3];
		out[o++] = (char)(w >> 16);
		if (s[i + 2] != '=')
			out[o++] = (char)(w >> 8 & 0xff);
		if (s[i + 3] != '=')
			out[o++] = (char)(w & 0xff);
	}
	*out_len = o;
	return out;
}

/* Fails unless resp is the documented shape of case c. */
static void assert_response(const answer_case *c, const json_t *resp, const char *where)
{
	if (!json_is_object(resp))
		fail_msg("%s, %s: no response object", where, c->name);
	assert_int_equal(hs_int(resp, "status"), 200);
	const json_t *ct = json_object_get(resp, "content_type");
	if (c->want_content_type
		? !json_is_string(ct) || strcmp(json_string_value(ct), c->want_content_type) != 0
		: !json_is_null(ct))
		fail_msg("%s, %s: content_type is not %s", where, c->name,
			 c->want_content_type ? c->want_content_type : "null");
	if (json_is_true(json_object_get(resp, "truncated")) != c->truncated)
		fail_msg("%s, %s: truncated should be %s", where, c->name,
			 c->truncated ? "true" : "absent");
	const json_t *body = json_object_get(resp, "body");
	const json_t *enc = json_object_get(resp, "encoding");
	if ((c->as == AS_BASE64) != (enc != NULL))
		fail_msg("%s, %s: encoding should be %s", where, c->name,
			 c->as == AS_BASE64 ? "base64" : "absent");
	if (c->as == AS_JSON) {
		json_t *want = json_loadb(c->body, c->len, JSON_DECODE_ANY, NULL);
		assert_non_null(want);
		if (!json_equal(want, body))
			fail_msg("%s, %s: the body is not the JSON sent", where, c->name);
		json_decref(want);
	} else if (c->as == AS_TEXT) {
		if (!json_is_string(body) || json_string_length(body) != c->text_len ||
		    memcmp(json_string_value(body), c->body, c->text_len) != 0)
			fail_msg("%s, %s: the body is not the text sent (%zu bytes)", where,
				 c->name, c->text_len);
	} else {
		assert_string_equal(json_string_value(enc), "base64");
		size_t n = 0;
		char *bytes = json_is_string(body) ? b64_decode(json_string_value(body), &n) : NULL;
		size_t want = c->truncated ? MAX_BODY : c->len;
		if (!bytes || n != want || memcmp(bytes, c->body, n) != 0)
			fail_msg("%s, %s: the base64 body is not the %zu bytes sent", where,
				 c->name, want);
		free(bytes);
	}
}

static const json_t *response_of(const json_t *result)
{
	return json_object_get(result, "response");
}

/* Every event of step i's completion in `events` carries case c's answer. */
static void assert_events(const answer_case *c, const json_t *events, int i, const char *where)
{
	const json_t *ev = hs_event_find(events, "step_completed", i, 1);
	if (!ev)
		fail_msg("%s: no step_completed for step %d", where, i);
	assert_response(c, response_of(json_object_get(ev, "result")), where);
}

/* The workflow, its result, its events, the resource's events, the list, the stream and
 * the client all show every answer as documented. */
static void assert_served(calls_ctx *ctx, const answer_case *c)
{
	json_t *wf = hs_get_workflow(ctx->s, "answers");
	assert_string_equal(hs_str(wf, "status"), "completed");
	const json_t *processed = json_object_get(json_object_get(wf, "result"), "processed");
	assert_int_equal(json_array_size(processed), N_CASES);
	for (int i = 0; i < N_CASES; i++) {
		assert_response(&c[i], response_of(json_object_get(hs_step_at(wf, i), "result")),
				"GET /workflows/answers");
		assert_response(&c[i], response_of(json_array_get(processed, i)),
				"the workflow's result");
	}
	json_decref(wf);

	json_t *events = hs_get_events(ctx->s, "answers");
	for (int i = 0; i < N_CASES; i++)
		assert_events(&c[i], events, i, "GET /workflows/answers/events");
	json_decref(events);

	/* The resource's history has no results, but it shares the rows: every step's lock
	 * events are served. */
	json_t *res = hs_get_json(ctx->s, "/resources/gateway/events?limit=1000", 200);
	assert_int_equal(hs_event_count(json_object_get(res, "events"), "lock_released", -1, -1),
			 N_CASES);
	json_decref(res);

	json_t *list = hs_get_json(ctx->s, "/workflows?resource=gateway", 200);
	assert_int_equal(json_array_size(json_object_get(list, "workflows")), 1);
	json_decref(list);
	json_decref(hs_get_json(ctx->s, "/resources/gateway", 200));
	json_decref(hs_get_json(ctx->s, "/resources", 200));

	CURLM *m = curl_multi_init();
	sse *st = sse_open(m, ctx->s, "/workflows/answers/events?follow=true", NULL);
	assert_true(sse_pump_until(m, sse_is_done, st, WAIT_MS));
	if (st->error[0] || st->status != 200)
		fail_msg("the event stream: status %ld, %s", st->status, st->error);
	json_t *streamed = json_array();
	for (size_t i = 0; i < sse_count(st); i++)
		json_array_append(streamed, sse_data(st, i));
	for (int i = 0; i < N_CASES; i++)
		assert_events(&c[i], streamed, i, "the event stream");
	json_decref(streamed);
	sse_close(m, st);
	curl_multi_cleanup(m);

	static const char *const get[] = {"get", "answers", NULL};
	static const char *const evs[] = {"events", "answers", NULL};
	static const char *const json_evs[] = {"--json", "events", "answers", NULL};
	const char *const *runs[] = {get, evs, json_evs};
	for (size_t r = 0; r < 3; r++)
		client_free(client_expect_exit(0, client_url_of(ctx->s), runs[r]));
}

/*
 * One workflow of N_CASES steps, each answered with one case; everything that shows an
 * answer shows it as documented, before and after a SIGKILL and a clean restart.
 */
static void test_every_answer_is_stored_and_served(void **state)
{
	calls_ctx *ctx = *state;
	answer_case c[N_CASES];
	make_cases(c);
	for (int i = 0; i < N_CASES; i++)
		fragile_push(ctx->res, (fragile_action){.status = 200,
							.body = c[i].body,
							.body_len = c[i].len,
							.content_type = c[i].content_type});
	calls_create(ctx->s, calls_workflow("answers", ctx->url, N_CASES, NULL));
	json_decref(hs_wait_workflow(ctx->s, "answers", "completed", WAIT_MS));
	assert_served(ctx, c);

	hs_kill(ctx->s);
	assert_int_equal(hs_start(ctx->s), 0);
	assert_served(ctx, c);

	assert_int_equal(hs_stop(ctx->s), 0);
	assert_int_equal(hs_start(ctx->s), 0);
	assert_served(ctx, c);
	calls_assert_sound(ctx->res);
	free_cases(c);
}

/*
 * Killed while the step that got a binary answer waits to commit is not observable from
 * outside; what is: a workflow still running when batond is killed (its first step
 * answered with binary bytes, its second held by the resource) resumes after the restart
 * and shows the first answer as base64, then completes with the second.
 */
static void test_binary_answer_survives_kill_mid_workflow(void **state)
{
	calls_ctx *ctx = *state;
	static const char bin[] = {(char)0x80, 0x00, (char)0xc3, 0x28};
	fragile_push(ctx->res, (fragile_action){.status = 200,
						.body = bin,
						.body_len = sizeof bin,
						.content_type = "application/octet-stream"});
	fragile_push(ctx->res, (fragile_action){.status = 200, .delay_ms = 60000});
	calls_create(ctx->s, calls_workflow("midway", ctx->url, 2, calls_quick_retry(100)));
	assert_true(fragile_wait_held(ctx->res, 1, WAIT_MS));
	hs_kill(ctx->s);
	assert_true(fragile_wait_finished(ctx->res, 2, WAIT_MS));
	assert_int_equal(hs_start(ctx->s), 0);
	json_t *wf = hs_wait_workflow(ctx->s, "midway", "completed", WAIT_MS);
	const json_t *resp = response_of(json_object_get(hs_step_at(wf, 0), "result"));
	assert_string_equal(hs_str(resp, "encoding"), "base64");
	assert_string_equal(hs_str(resp, "body"), "gADDKA==");
	assert_string_equal(hs_str(resp, "content_type"), "application/octet-stream");
	json_decref(wf);
	json_t *events = hs_get_events(ctx->s, "midway");
	assert_non_null(hs_event_find(events, "step_interrupted", 1, -1));
	json_decref(events);
	calls_assert_sound(ctx->res);
}

/*
 * An error message quotes the URL up to 160 bytes; a URL of two-byte characters cut
 * there in the middle of one must not make the error, the events or the workflow
 * unreadable: the incomplete character is dropped.
 */
static void test_error_cut_inside_character(void **state)
{
	calls_ctx *ctx = *state;
	char url[512];
	size_t n = (size_t)snprintf(url, sizeof url, "%s/", ctx->url);
	if ((160 - n) % 2 == 0) /* make byte 160 of the URL the second of a character */
		url[n++] = 'x';
	while (n < 300) {
		memcpy(url + n, "\xc3\xa9", 2);
		n += 2;
	}
	url[n] = 0;
	fragile_push(ctx->res, (fragile_action){.status = 404});
	json_t *body = calls_workflow("cut-error", ctx->url, 1, NULL);
	json_object_set_new(json_object_get(body, "call"), "url", json_string(url));
	calls_create(ctx->s, body);
	json_t *wf = hs_wait_workflow(ctx->s, "cut-error", "failed", WAIT_MS);
	const char *error = hs_str(hs_step_at(wf, 0), "error");
	if (strncmp(error, "HTTP 404 from ", 14) != 0 || strlen(error) != 14 + 159)
		fail_msg("the step's error is \"%s\"", error);
	json_t *events = hs_get_events(ctx->s, "cut-error");
	const json_t *failed = hs_event_find(events, "step_failed", 0, 1);
	assert_non_null(failed);
	assert_string_equal(hs_str(failed, "error"), error);
	json_decref(events);
	json_decref(wf); /* error is wf's */
	hs_kill(ctx->s);
	assert_int_equal(hs_start(ctx->s), 0);
	json_decref(hs_get_events(ctx->s, "cut-error"));
	json_decref(hs_wait_workflow(ctx->s, "cut-error", "failed", WAIT_MS));
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_every_answer_is_stored_and_served, calls_setup,
					    calls_teardown),
	    cmocka_unit_test_setup_teardown(test_binary_answer_survives_kill_mid_workflow,
					    calls_setup, calls_teardown),
	    cmocka_unit_test_setup_teardown(test_error_cut_inside_character, calls_setup,
					    calls_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
