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
	assert_int_equal(a->retry.initial_delay_ms, 1000);
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_invalid_requests_are_rejected_with_the_field_named),
		cmocka_unit_test(test_name_limits),
		cmocka_unit_test(test_too_many_workers),
		cmocka_unit_test(test_defaults_and_normalized_definition),
	};
	return cmocka_run_group_tests_name("codec", tests, NULL, NULL);
}
