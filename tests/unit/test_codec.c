/*
 * test_codec.c - validation of workflow requests, table-driven: every rule of the API
 * has a case that must be rejected with a message naming the field, and defaults are
 * filled in as documented.
 */
#include "unit.h"

static const struct {
	const char *json;
	const char *needle; /* expected in the error message */
} invalid[] = {
    {"[]", "JSON object"},
    {"{}", "resource: is required"},
    {"{\"resource\":\"gw\"}", "workers: is required"},
    {"{\"resource\":\"gw\",\"workers\":[]}", "1 to 10000"},
    {"{\"resource\":\"gw\",\"workers\":\"a\"}", "workers: must be an array"},
    {"{\"resource\":\"gw\",\"workers\":[\"a\",\"a\"]}", "duplicate worker name"},
    {"{\"resource\":\"gw\",\"workers\":[1]}", "workers[0]: must be a name or an object"},
    {"{\"resource\":\"gw\",\"workers\":[\"\"]}", "workers[0].name"},
    {"{\"resource\":\"gw\",\"workers\":[\"a\\u0001b\"]}", "printable"},
    {"{\"resource\":\"gw\",\"workers\":[\"a\\u0085b\"]}", "printable"},
    {"{\"resource\":\"gw\",\"workers\":[{}]}", "workers[0].name: is required"},
    {"{\"resource\":\"gw\",\"workers\":[{\"name\":3}]}", "must be a string"},
    {"{\"resource\":\"gw\",\"workers\":[{\"name\":\"a\",\"x\":1}]}", "unknown field \"x\""},
    {"{\"resource\":\"gw\",\"workers\":[{\"name\":\"a\",\"work_ms\":-1}]}", "work_ms"},
    {"{\"resource\":\"gw\",\"workers\":[{\"name\":\"a\",\"work_ms\":1.5}]}", "integer"},
    {"{\"resource\":\"gw\",\"workers\":[{\"name\":\"a\",\"work_ms\":3600001}]}", "work_ms"},
    {"{\"resource\":\"gw\",\"workers\":[{\"name\":\"a\",\"fail_attempts\":\"1\"}]}",
     "fail_attempts"},
    {"{\"resource\":\"gw\",\"workers\":[\"a\"],\"extra\":true}", "unknown field \"extra\""},
    {"{\"resource\":\"g w\",\"workers\":[\"a\"]}", "resource: must be"},
    {"{\"resource\":\"../etc\",\"workers\":[\"a\"]}", "resource: must be"},
    {"{\"resource\":7,\"workers\":[\"a\"]}", "resource: must be a string"},
    {"{\"id\":\"x'; DROP TABLE workflows;--\",\"resource\":\"gw\",\"workers\":[\"a\"]}",
     "id: must be"},
    {"{\"id\":\"\",\"resource\":\"gw\",\"workers\":[\"a\"]}", "id: must be"},
    {"{\"resource\":\"gw\",\"workers\":[\"a\"],\"retry\":1}", "retry: must be an object"},
    {"{\"resource\":\"gw\",\"workers\":[\"a\"],\"retry\":{\"max_attempts\":0}}",
     "retry.max_attempts"},
    {"{\"resource\":\"gw\",\"workers\":[\"a\"],\"retry\":{\"backoff\":0.5}}", "retry.backoff"},
    {"{\"resource\":\"gw\",\"workers\":[\"a\"],\"retry\":{\"first_retry_ms\":-1}}",
     "retry.first_retry_ms: must be between 0 and 86400000"},
    {"{\"resource\":\"gw\",\"workers\":[\"a\"],\"retry\":{\"first_retry_ms\":0.5}}",
     "retry.first_retry_ms: must be an integer"},
    {"{\"resource\":\"gw\",\"workers\":[\"a\"],\"retry\":{\"initial_delay_ms\":86400001}}",
     "retry.initial_delay_ms: must be between 0 and 86400000"},
    {"{\"resource\":\"gw\",\"workers\":[\"a\"],\"retry\":{\"initial_delay_ms\":\"1\"}}",
     "retry.initial_delay_ms: must be an integer"},
    {"{\"resource\":\"gw\",\"workers\":[\"a\"],\"retry\":{\"first_retry_ms\":1,"
     "\"initial_delay_ms\":1}}",
     "retry: give first_retry_ms or initial_delay_ms, not both"},
    {"{\"resource\":\"gw\",\"workers\":[\"a\"],\"retry\":{\"jitter\":1}}", "unknown field"},
    {"{\"resource\":\"gw\",\"workers\":[\"a\"],\"on_failure\":\"ignore\"}", "on_failure"},
};

static void test_invalid_requests_are_rejected_with_the_field_named(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof invalid / sizeof invalid[0]; i++) {
		wf_row *wf = calloc(1, sizeof *wf);
		json_t *req = js(invalid[i].json);
		baton_error err = {0};
		int rc = codec_parse_request(req, wf, NULL, &err);
		if (rc != BATON_EINVAL || !strstr(err.msg, invalid[i].needle))
			fail_msg("case %zu (%s): rc %d, message \"%s\", wanted \"%s\"", i,
				 invalid[i].json, rc, err.msg, invalid[i].needle);
		json_decref(req);
		wf_row_free(wf);
	}
}

static void test_name_limits(void **state)
{
	(void)state;
	char name[200];
	memset(name, 'a', sizeof name);
	name[128] = 0;
	assert_true(valid_name(name));
	name[128] = 'a';
	name[129] = 0;
	assert_false(valid_name(name));
	assert_true(valid_name("payment-gateway:eu.1_a"));
	assert_false(valid_name("a/b"));
	assert_false(valid_name(""));
}

static void test_too_many_workers(void **state)
{
	(void)state;
	json_t *ws = json_array();
	for (int i = 0; i <= MAX_WORKERS; i++) {
		char n[16];
		snprintf(n, sizeof n, "w%d", i);
		json_array_append_new(ws, json_string(n));
	}
	json_t *req = json_pack("{s:s, s:o}", "resource", "gw", "workers", ws);
	wf_row *wf = calloc(1, sizeof *wf);
	baton_error err = {0};
	assert_int_equal(codec_parse_request(req, wf, NULL, &err), BATON_EINVAL);
	wf_row_free(wf);
	json_array_remove(json_object_get(req, "workers"), 0);
	wf = calloc(1, sizeof *wf);
	assert_int_equal(codec_parse_request(req, wf, NULL, &err), BATON_OK);
	assert_int_equal(wf->steps_total, MAX_WORKERS);
	wf_row_free(wf);
	json_decref(req);
}

static void test_defaults_and_normalized_definition(void **state)
{
	(void)state;
	wf_row *a = wf_from("{\"resource\":\"gw\",\"workers\":[\"worker-A\"]}");
	assert_int_equal(a->retry.max_attempts, 10);
	assert_int_equal(a->retry.first_retry_ms, 2000);
	assert_int_equal(a->retry.max_delay_ms, 30000);
	assert_true(a->retry.backoff == 2.0);
	assert_int_equal(a->on_failure, ON_FAILURE_FAIL);
	json_int_t work = json_integer_value(json_object_get(a->steps[0].params, "work_ms"));
	assert_true(work >= 100 && work <= 199);
	assert_int_equal(work, 100 + fnv1a("worker-A") % 100); /* deterministic */
	/* The same workflow spelled out in full has the same definition. */
	char full[256];
	snprintf(full, sizeof full,
		 "{\"resource\":\"gw\",\"on_failure\":\"fail\",\"retry\":{\"max_attempts\":10},"
		 "\"workers\":[{\"name\":\"worker-A\",\"work_ms\":%lld,\"fail_attempts\":0}]}",
		 (long long)work);
	wf_row *b = wf_from(full);
	assert_string_equal(a->definition, b->definition);
	wf_row *c = wf_from("{\"resource\":\"gw\",\"workers\":[{\"name\":\"worker-A\","
			    "\"fail_attempts\":1}]}");
	assert_string_not_equal(a->definition, c->definition);
	wf_row_free(a);
	wf_row_free(b);
	wf_row_free(c);
}

/* The default retry policy as the batond before first_retry_ms stored it. */
#define OLD_DEFAULT_RETRY                                                                          \
	"\"retry\":{\"backoff\":2.0,\"initial_delay_ms\":1000,\"max_attempts\":10,"                \
	"\"max_delay_ms\":30000}"

/*
 * Texts stored before first_retry_ms, which said initial_delay_ms (first retry after
 * initial_delay_ms * backoff): a row's policy reads as the same policy, and a definition
 * is the same as the one of the same request now; a changed one is not.
 */
static void test_initial_delay_ms_in_stored_texts(void **state)
{
	(void)state;
	retry_policy p;
	assert_int_equal(codec_parse_retry("{\"max_attempts\":3,\"initial_delay_ms\":300,"
					   "\"backoff\":1.5,\"max_delay_ms\":30000}",
					   &p),
			 BATON_OK);
	assert_int_equal(p.max_attempts, 3);
	assert_int_equal(p.first_retry_ms, 450);
	assert_true(p.backoff == 1.5);
	char *text = codec_retry_text(&p);
	assert_string_equal(text, "{\"max_attempts\":3,\"first_retry_ms\":450,\"backoff\":1.5,"
				  "\"max_delay_ms\":30000}");
	free(text);

	static const char stored[] =
	    "{\"on_failure\":\"fail\",\"resource\":\"ledger\"," OLD_DEFAULT_RETRY
	    ",\"workers\":[{\"fail_attempts\":0,\"name\":\"a\",\"work_ms\":0}]}";
	wf_row *same = wf_from("{\"resource\":\"ledger\",\"workers\":[{\"name\":\"a\","
			       "\"work_ms\":0}]}");
	wf_row *other = wf_from("{\"resource\":\"ledger\",\"workers\":[{\"name\":\"a\","
				"\"work_ms\":0}],\"retry\":{\"first_retry_ms\":1000}}");
	assert_string_not_equal(stored, same->definition);
	assert_true(codec_same_definition(stored, same->definition));
	assert_true(codec_same_definition(same->definition, same->definition));
	assert_false(codec_same_definition(stored, other->definition));
	assert_false(codec_same_definition("not json", same->definition));
	/* a lease's definition has no retry policy */
	assert_false(codec_same_definition("{\"lease\":{\"holder\":\"h\",\"ttl_ms\":1000},"
					   "\"resource\":\"ledger\"}",
					   same->definition));
	wf_row_free(same);
	wf_row_free(other);
}

static void test_call_urls_stay_under_allowed_prefixes(void **state)
{
	(void)state;
	static const char *const allow[] = {"http://127.0.0.1:9000/api/", "http://pay.example",
					    NULL};
	static const struct {
		const char *url;
		int ok;
	} cases[] = {
	    {"http://127.0.0.1:9000/api/charge", 1},
	    {"http://127.0.0.1:9000/api/", 1},
	    {"http://127.0.0.1:9000/apix", 0},
	    {"http://127.0.0.1:9000/api/../admin", 0},
	    {"http://127.0.0.1:9000/api/%2e%2E/admin", 0},
	    {"http://127.0.0.1:9000/api/./x", 0},
	    {"http://127.0.0.1:9000/api/a..b", 1},
	    {"http://pay.example/charge", 1},
	    {"http://pay.example", 1},
	    {"http://pay.example.evil.org/", 0},
	    {"http://pay.example:81/", 0},
	    {"ftp://pay.example/", 0},
	    {"http://127.0.0.1:9000/api/a b", 0},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		json_t *req = json_pack("{s:s, s:[{s:s, s:{s:s}}]}", "resource", "gw", "workers",
					"name", "a", "call", "url", cases[i].url);
		wf_row *wf = calloc(1, sizeof *wf);
		baton_error err = {0};
		int rc = codec_parse_request(req, wf, allow, &err);
		if ((rc == BATON_OK) != cases[i].ok)
			fail_msg("%s: rc %d (%s), wanted %s", cases[i].url, rc, err.msg,
				 cases[i].ok ? "accepted" : "refused");
		json_decref(req);
		wf_row_free(wf);
	}
}

static void test_call_headers_and_defaults(void **state)
{
	(void)state;
	static const char *const allow[] = {"http://h/", NULL};
	wf_row *wf = calloc(1, sizeof *wf);
	baton_error err = {0};
	json_t *req =
	    js("{\"resource\":\"gw\",\"call\":{\"url\":\"http://h/x\","
	       "\"headers\":{\"A\":\"1\",\"B\":\"2\"}},\"workers\":[\"w1\","
	       "{\"name\":\"w2\",\"call\":{\"method\":\"PUT\",\"headers\":{\"B\":\"3\"}}}]}");
	assert_int_equal(codec_parse_request(req, wf, allow, &err), BATON_OK);
	json_t *c1 = json_object_get(wf->steps[0].params, "call");
	json_t *c2 = json_object_get(wf->steps[1].params, "call");
	assert_string_equal(json_string_value(json_object_get(c1, "method")), "POST");
	assert_int_equal(json_integer_value(json_object_get(c1, "timeout_ms")), 10000);
	assert_string_equal(json_string_value(json_object_get(c2, "method")), "PUT");
	assert_string_equal(json_string_value(json_object_get(c2, "url")), "http://h/x");
	json_t *h2 = json_object_get(c2, "headers");
	assert_string_equal(json_string_value(json_object_get(h2, "A")), "1");
	assert_string_equal(json_string_value(json_object_get(h2, "B")), "3");
	/* Header values never leave through the API. */
	json_t *shown = codec_step(&wf->steps[1], 0);
	char *text = json_dumps(shown, 0);
	assert_null(strstr(text, "\"3\""));
	free(text);
	json_decref(shown);
	json_decref(req);
	wf_row_free(wf);
	static const char *const bad[] = {
	    "{\"resource\":\"gw\",\"workers\":[{\"name\":\"a\",\"call\":{\"url\":\"http://h/\","
	    "\"headers\":{\"Idempotency-Key\":\"x\"}}}]}",
	    "{\"resource\":\"gw\",\"workers\":[{\"name\":\"a\",\"call\":{\"url\":\"http://h/\","
	    "\"headers\":{\"Baton-Fencing-Token\":\"9\"}}}]}",
	    "{\"resource\":\"gw\",\"workers\":[{\"name\":\"a\",\"call\":{\"url\":\"http://h/\","
	    "\"headers\":{\"X\":\"a\\r\\nB: c\"}}}]}",
	    "{\"resource\":\"gw\",\"workers\":[{\"name\":\"a\",\"call\":{\"url\":\"http://h/\","
	    "\"method\":\"TRACE\"}}]}",
	    "{\"resource\":\"gw\",\"workers\":[{\"name\":\"a\",\"work_ms\":5,"
	    "\"call\":{\"url\":\"http://h/\"}}]}",
	    "{\"resource\":\"gw\",\"call\":{\"method\":\"GET\"},\"workers\":[\"a\"]}",
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		wf = calloc(1, sizeof *wf);
		req = js(bad[i]);
		if (codec_parse_request(req, wf, allow, &err) != BATON_EINVAL)
			fail_msg("accepted: %s", bad[i]);
		json_decref(req);
		wf_row_free(wf);
	}
	/* No prefixes at all: the message says how to allow calls. */
	wf = calloc(1, sizeof *wf);
	req = js("{\"resource\":\"gw\",\"workers\":[{\"name\":\"a\",\"call\":{\"url\":\"http://h/"
		 "\"}}]}");
	assert_int_equal(codec_parse_request(req, wf, NULL, &err), BATON_EINVAL);
	assert_non_null(strstr(err.msg, "--allow-call"));
	json_decref(req);
	wf_row_free(wf);
}

/* Event rows are written by codec_text_members: the same text as jansson's compact dump. */
static void test_event_text_matches_jansson(void **state)
{
	(void)state;
	static const char *const objects[] = {
	    "{}",
	    "{\"step\":0,\"worker\":\"worker-A\",\"attempt\":1}",
	    "{\"n\":-9223372036854775807,\"z\":0,\"t\":true,\"f\":false,\"x\":null}",
	    "{\"min\":-9223372036854775808,\"max\":9223372036854775807,\"ten\":10,\"m1\":-1}",
	    "{\"deep\":{\"a\":{\"b\":[[],[{}],[1,[2,{\"c\":null}]]]},\"e\":\"\\n\"},\"f\":[true,"
	    "false]}",
	    "{\"error\":\"quote \\\" backslash \\\\ slash / tab \\t nl \\n cr \\r bs \\b ff \\f\"}",
	    "{\"ctl\":\"\\u0001\\u001f\\u007f\",\"utf8\":\"\\u00e9\\u4e2d\\ud83d\\ude00\"}",
	    "{\"result\":{\"a\":[1,2.5,\"x\"],\"b\":{}},\"list\":[],\"real\":0.25}",
	    "{\"k\\\"ey\":1,\"\\u0002\":2}",
	};
	for (size_t i = 0; i < sizeof objects / sizeof *objects; i++) {
		json_t *o = json_loads(objects[i], 0, NULL);
		assert_non_null(o);
		textbuf b = {0};
		textbuf_put(&b, "{", 1);
		codec_text_members(&b, o);
		textbuf_put(&b, "}", 1);
		/* "{" + ",k:v,k:v" + "}": drop the first comma to compare */
		char *ours = calloc(1, b.len + 1);
		assert_non_null(ours);
		ours[0] = '{';
		size_t at = 1;
		for (size_t k = b.len > 2 ? 2 : 1; k < b.len; k++)
			ours[at++] = b.v[k];
		char *theirs = json_dumps(o, JSON_COMPACT);
		assert_string_equal(ours, theirs);
		free(theirs);
		free(ours);
		/* codec_text writes any value, as stored in step and workflow rows */
		json_t *values = json_pack("[O, o, s, i, n, b, f]", o,
					   json_object_get(o, "result")
					       ? json_incref(json_object_get(o, "result"))
					       : json_array(),
					   "x\"y", -42, 1, 0.5);
		assert_non_null(values);
		for (size_t k = 0; k < json_array_size(values); k++) {
			json_t *v = json_array_get(values, k);
			b.len = 0;
			codec_text(&b, v);
			theirs = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
			assert_int_equal(b.len, strlen(theirs));
			assert_memory_equal(b.v, theirs, b.len);
			free(theirs);
		}
		json_decref(values);
		free(b.v);
		json_decref(o);
	}
}

/* Stored definitions are written by codec_text_sorted: jansson's sorted compact dump. */
static void test_sorted_text_matches_jansson(void **state)
{
	(void)state;
	static const char *const values[] = {
	    "{}",
	    "[]",
	    "{\"b\":1,\"a\":{\"z\":[{\"y\":1,\"x\":2}],\"\":null},\"ab\":true,\"B\":\"v\"}",
	    "{\"\u00e9\":1,\"e\":2,\"\u4e2d\":3,\"E\":4,\"_\":5,\"~\":6,\"a b\":0.5}",
	    "{\"q\":1,\"p\":2,\"o\":3,\"n\":4,\"m\":5,\"l\":6,\"k\":7,\"j\":8,\"i\":9,"
	    "\"h\":10,\"g\":11,\"f\":12,\"e\":13,\"d\":14,\"c\":15,\"b\":16,\"a\":17,"
	    "\"aa\":{\"s\":[3,{\"r\":1,\"q\":2}]}}",
	};
	for (size_t i = 0; i < sizeof values / sizeof *values; i++) {
		json_t *v = json_loads(values[i], JSON_DECODE_ANY, NULL);
		assert_non_null(v);
		char *ours = codec_text_sorted(v);
		char *theirs = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
		assert_string_equal(ours, theirs);
		free(ours);
		free(theirs);
		json_decref(v);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_invalid_requests_are_rejected_with_the_field_named),
	    cmocka_unit_test(test_name_limits),
	    cmocka_unit_test(test_too_many_workers),
	    cmocka_unit_test(test_defaults_and_normalized_definition),
	    cmocka_unit_test(test_initial_delay_ms_in_stored_texts),
	    cmocka_unit_test(test_call_urls_stay_under_allowed_prefixes),
	    cmocka_unit_test(test_call_headers_and_defaults),
	    cmocka_unit_test(test_event_text_matches_jansson),
	    cmocka_unit_test(test_sorted_text_matches_jansson),
	};
	return cmocka_run_group_tests_name("codec", tests, NULL, NULL);
}
