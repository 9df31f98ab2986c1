/*
 * test_clock.c - a step of batond's wall clock (an NTP step, a VM resumed) changes no lease,
 * wait or retry timer: they run on the monotonic clock.
 *
 * batond runs with libfaketime (Debian's faketime package) preloaded, reading its offset
 * from a file that the test rewrites (atomically, with rename) while batond runs:
 * CLOCK_REALTIME jumps by the offset, CLOCK_MONOTONIC does not (DONT_FAKE_MONOTONIC), as
 * in a real step. The preload goes to batond alone: the test sets the variables in its own
 * environment only around starting the server.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../harness/harness.h"

#define WAIT_MS 60000

typedef struct stepped {
	hs_server *s;
	char file[PATH_MAX];
} stepped;

/* Writes the clock's offset ("+3600", "-3600" seconds) for batond to read at its next look. */
static void set_offset(const stepped *t, const char *offset)
{
	char tmp[PATH_MAX + 8];
	snprintf(tmp, sizeof tmp, "%s.tmp", t->file);
	FILE *f = fopen(tmp, "w");
	assert_non_null(f);
	fprintf(f, "%s\n", offset);
	assert_int_equal(fclose(f), 0);
	assert_int_equal(rename(tmp, t->file), 0);
}

static int setup(void **state)
{
#if defined(__SANITIZE_THREAD__)
	*state = NULL;
	return 0; /* the tests skip: see hs_faketime_lib */
#endif
	if (!hs_faketime_lib()) {
		fprintf(stderr, "libfaketime is not installed (Debian package faketime)\n");
		return -1;
	}
	stepped *t = calloc(1, sizeof *t);
	const char *tmp = getenv("TMPDIR");
	snprintf(t->file, sizeof t->file, "%s/baton-clock-%d-%p", tmp && *tmp ? tmp : "/tmp",
		 (int)getpid(), (void *)t);
	FILE *f = fopen(t->file, "w");
	if (!f || fputs("+0\n", f) < 0 || fclose(f) != 0) {
		fprintf(stderr, "cannot write %s\n", t->file);
		free(t);
		return -1;
	}
	hs_faketime_env(1);
	setenv("FAKETIME_TIMESTAMP_FILE", t->file, 1);
	t->s = hs_open(NULL);
	unsetenv("FAKETIME_TIMESTAMP_FILE");
	hs_faketime_env(0);
	if (!t->s) {
		unlink(t->file);
		free(t);
		return -1;
	}
	*state = t;
	return 0;
}

static int teardown(void **state)
{
	stepped *t = *state;
	if (!t)
		return 0;
	int rc = hs_close(t->s);
	unlink(t->file);
	free(t);
	return rc;
}

static json_t *post(const hs_server *s, const char *path, const char *body, long want)
{
	hs_response r;
	if (hs_post(s, path, body, &r) != 0)
		fail_msg("POST %s: %s", path, r.error);
	if (r.status != want)
		fail_msg("POST %s answered %ld, not %ld: %s", path, r.status, want,
			 r.body ? r.body : "");
	json_t *j = json_incref(r.json);
	hs_response_fini(&r);
	return j;
}

static json_t *get_lease(const hs_server *s, const char *id)
{
	char path[200];
	snprintf(path, sizeof path, "/leases/%s", id);
	return hs_get_json(s, path, 200);
}

/* +1 h: a lease granted just before still has its whole ttl, and still renews. */
static void test_step_forward_keeps_a_lease(void **state)
{
	stepped *t = *state;
	if (!t)
		skip(); /* a ThreadSanitizer build: see hs_faketime_lib */
	json_t *a =
	    post(t->s, "/resources/db/leases", "{\"holder\": \"a\", \"ttl_ms\": 20000}", 201);
	set_offset(t, "+3600");
	json_t *got = get_lease(t->s, hs_str(a, "id"));
	assert_string_equal(hs_str(got, "state"), "held");
	json_decref(got);
	json_t *b = post(t->s, "/resources/db/leases", "{\"holder\": \"b\", \"wait_ms\": 0}", 409);
	assert_string_equal(hs_str(b, "holder"), "a");
	json_decref(b);
	char path[200];
	snprintf(path, sizeof path, "/leases/%s/renew", hs_str(a, "id"));
	json_decref(post(t->s, path, NULL, 200));
	json_decref(a);
}

typedef struct waiting {
	const hs_server *s;
	const char *body;
	long status;
	json_t *lease;
	pthread_t t;
} waiting;

static void *wait_thread(void *arg)
{
	waiting *w = arg;
	hs_response r;
	hs_post(w->s, "/resources/db/leases", w->body, &r);
	w->status = r.status;
	w->lease = json_incref(r.json);
	hs_response_fini(&r);
	return NULL;
}

static bool one_waits(void *arg)
{
	json_t *res = hs_get_json(arg, "/resources/db", 200);
	bool yes = json_array_size(json_object_get(res, "waiters")) == 1;
	json_decref(res);
	return yes;
}

/* +1 h while a waiter waits: it keeps its whole wait_ms, and is granted at the release. */
static void test_step_forward_keeps_a_wait(void **state)
{
	stepped *t = *state;
	if (!t)
		skip(); /* a ThreadSanitizer build: see hs_faketime_lib */
	json_t *a =
	    post(t->s, "/resources/db/leases", "{\"holder\": \"a\", \"ttl_ms\": 60000}", 201);
	waiting b = {.s = t->s, .body = "{\"holder\": \"b\", \"wait_ms\": 20000}"};
	assert_int_equal(pthread_create(&b.t, NULL, wait_thread, &b), 0);
	bool queued = hs_wait_until(one_waits, t->s, WAIT_MS);
	if (queued)
		set_offset(t, "+3600");
	/* any message wakes the engine to look at its timers with the stepped clock */
	json_t *got = get_lease(t->s, hs_str(a, "id"));
	char path[200];
	snprintf(path, sizeof path, "/leases/%s", hs_str(a, "id"));
	hs_response r;
	hs_request del = {.method = "DELETE", .path = path};
	assert_int_equal(hs_send(t->s, &del, &r), 0);
	long released = r.status;
	hs_response_fini(&r);
	pthread_join(b.t, NULL);
	assert_true(queued);
	assert_string_equal(hs_str(got, "state"), "held");
	assert_int_equal(released, 204);
	assert_int_equal(b.status, 201);
	assert_true(hs_int(b.lease, "fencing_token") > hs_int(a, "fencing_token"));
	json_decref(got);
	json_decref(b.lease);
	json_decref(a);
}

/* -1 h: a lease nobody renews still expires after its ttl, and its waiter is granted. */
static void test_step_back_still_expires(void **state)
{
	stepped *t = *state;
	if (!t)
		skip(); /* a ThreadSanitizer build: see hs_faketime_lib */
	json_t *a =
	    post(t->s, "/resources/db/leases", "{\"holder\": \"a\", \"ttl_ms\": 2000}", 201);
	set_offset(t, "-3600");
	json_t *b =
	    post(t->s, "/resources/db/leases", "{\"holder\": \"b\", \"wait_ms\": 10000}", 201);
	assert_true(hs_int(b, "fencing_token") > hs_int(a, "fencing_token"));
	json_decref(a);
	json_decref(b);
}

/* A workflow whose one step fails once, once it waits for its retry; its id (malloc'd). */
static char *failed_once(const stepped *t)
{
	json_t *created =
	    hs_create_workflow(t->s, json_pack("{s:s, s:[{s:s, s:i}]}", "resource", "gateway",
					       "workers", "name", "worker-C", "fail_attempts", 1));
	char *id = strdup(hs_str(created, "id"));
	json_decref(created);
	json_decref(hs_wait_step(t->s, id, 0, "retrying", WAIT_MS));
	return id;
}

/* -1 h while a failed step waits for its retry: it is retried after its backoff, not 1 h. */
static void test_step_back_keeps_retry_schedule(void **state)
{
	stepped *t = *state;
	if (!t)
		skip(); /* a ThreadSanitizer build: see hs_faketime_lib */
	char *id = failed_once(t);
	set_offset(t, "-3600");
	json_t *wf = hs_wait_workflow(t->s, id, "completed", WAIT_MS);
	assert_int_equal(hs_int(hs_step_at(wf, 0), "attempts"), 2);
	json_decref(wf);
	free(id);
}

/* -1 h while batond is down, a failed step waiting for its retry: the retry comes after its
 * backoff counted from the restart at the latest, not an hour late (the wait is stored as
 * a time of the clock that was stepped). */
static void test_step_back_while_down_keeps_retry_schedule(void **state)
{
	stepped *t = *state;
	if (!t)
		skip(); /* a ThreadSanitizer build: see hs_faketime_lib */
	char *id = failed_once(t);
	hs_kill(t->s);
	set_offset(t, "-3600");
	hs_faketime_env(1);
	setenv("FAKETIME_TIMESTAMP_FILE", t->file, 1);
	int started = hs_start(t->s);
	unsetenv("FAKETIME_TIMESTAMP_FILE");
	hs_faketime_env(0);
	assert_int_equal(started, 0);
	json_t *wf = hs_wait_workflow(t->s, id, "completed", WAIT_MS);
	assert_int_equal(hs_int(hs_step_at(wf, 0), "attempts"), 2);
	json_decref(wf);
	free(id);
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_step_forward_keeps_a_lease, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_step_forward_keeps_a_wait, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_step_back_still_expires, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_step_back_keeps_retry_schedule, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_step_back_while_down_keeps_retry_schedule, setup,
					    teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
