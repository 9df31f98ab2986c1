/*
 * test_chaos.c - allocation failures while decoding and validating a request (jansson's
 * test_chaos.c approach): jansson's allocator fails the Nth allocation, for every N
 * until a run needs no failure at all. Decoding must then fail cleanly (NULL or an error
 * code), never crash or leak.
 */
#include "unit.h"

static int fail_at, count;

static void *chaos_malloc(size_t n)
{
	if (++count == fail_at)
		return NULL;
	return malloc(n);
}

/* Decoding under allocation failure: the body is refused or, when an allocation failed
 * inside validation, reported as out of memory, never as something else. */

static void test_every_allocation_failure_is_survived(void **state)
{
	(void)state;
	static const char *const allow[] = {"http://h/", NULL};
	static const char body[] =
	    "{\"id\":\"pay-1\",\"resource\":\"payment-gateway\","
	    "\"call\":{\"url\":\"http://h/a\",\"headers\":{\"Authorization\":\"Bearer x\"}},"
	    "\"retry\":{\"max_attempts\":3},\"workers\":[\"worker-A\","
	    "{\"name\":\"worker-B\",\"call\":{\"url\":\"http://h/b\",\"body\":{\"n\":[1,2]}}}]}";
	int ok_runs = 0, failed_runs = 0;
	for (fail_at = 1; fail_at < 5000; fail_at++) {
		count = 0;
		json_alloc_track(chaos_malloc);
		json_t *req = NULL;
		baton_error err = {0};
		int drc = baton_decode_json(body, sizeof body - 1, &req, &err);
		if (drc != BATON_OK && drc != BATON_EINTERNAL)
			fail_msg("allocation %d failed and the body was called %s: %s", fail_at,
				 baton_code_name(drc), err.msg);
		wf_row *wf = calloc(1, sizeof *wf);
		int rc = req ? codec_parse_request(req, wf, allow, &err) : BATON_EINTERNAL;
		if (req && rc != BATON_OK && rc != BATON_EINTERNAL)
			fail_msg("allocation %d failed and the request was called invalid: %s",
				 fail_at, err.msg);
		json_t *shown = rc == BATON_OK ? codec_workflow(wf) : NULL;
		json_decref(shown);
		wf_row_free(wf);
		json_decref(req);
		json_alloc_track(NULL);
		if (rc == BATON_OK && count < fail_at) {
			ok_runs++;
			break; /* this run needed fewer allocations than the one set to fail */
		}
		failed_runs++;
		assert_true(rc != BATON_OK || count >= fail_at);
	}
	assert_int_equal(ok_runs, 1);
	assert_true(failed_runs > 20);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_every_allocation_failure_is_survived),
	};
	return cmocka_run_group_tests_name("chaos", tests, NULL, NULL);
}
