/*
 * test_wait.c - a request's wait for the engine (server/wait.c): what happens to the
 * engine's answer when the connection closes before the answer was built. What the
 * answer holds (a lease granted, a task claimed, their JSON) is handed to the handler's
 * discard function exactly then, and never when the answer was built or never came.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "../../server/server.h"

#include <stdlib.h>
#include <string.h>

static int finished, discarded;

static int finish(srv *s, request *r, void *data, response *out)
{
	(void)s;
	(void)r;
	assert_int_equal(*(int *)data, 42);
	finished++;
	out->status = 200;
	return 200;
}

static void discard(srv *s, void *data)
{
	(void)s;
	assert_int_equal(*(int *)data, 42);
	discarded++;
}

static int setup(void **state)
{
	srv *s = calloc(1, sizeof *s);
	pthread_mutex_init(&s->wait_mu, NULL);
	pthread_cond_init(&s->wait_cv, NULL);
	finished = discarded = 0;
	*state = s;
	return 0;
}

static int teardown(void **state)
{
	srv *s = *state;
	pthread_cond_destroy(&s->wait_cv);
	pthread_mutex_destroy(&s->wait_mu);
	free(s);
	return 0;
}

/* A request waiting with data, its discard function set (the connection never
 * suspended: the engine's answer comes first, and no libmicrohttpd call is made). */
static void begin(srv *s, request *r)
{
	int *data = malloc(sizeof *data);
	assert_non_null(data);
	*data = 42;
	response out = {0};
	assert_int_equal(srv_wait_begin(s, r, data, finish, &out), 0);
	srv_wait_on_discard(r, discard);
	assert_int_equal(s->waiting, 1);
}

static void test_answer_dropped_unsent_is_discarded(void **state)
{
	srv *s = *state;
	request r = {0};
	begin(s, &r);
	srv_wait_done(&r);
	assert_true(srv_wait_answered(s, &r));
	srv_wait_abandoned(s, &r); /* the connection closed before the answer was built */
	assert_int_equal(discarded, 1);
	assert_int_equal(finished, 0);
	assert_null(r.wait.data);
	assert_int_equal(s->waiting, 0);
}

static void test_answer_built_is_not_discarded(void **state)
{
	srv *s = *state;
	request r = {0};
	begin(s, &r);
	srv_wait_done(&r);
	response out = {0};
	assert_int_equal(srv_wait_finish(s, &r, &out), 200);
	srv_wait_abandoned(s, &r); /* every request ends through it */
	assert_int_equal(finished, 1);
	assert_int_equal(discarded, 0);
	assert_int_equal(s->waiting, 0);
}

static void test_wait_cancelled_is_not_discarded(void **state)
{
	srv *s = *state;
	request r = {0};
	begin(s, &r);
	srv_wait_cancel(s, &r); /* the handler gave up before the engine had it */
	srv_wait_abandoned(s, &r);
	assert_int_equal(discarded, 0);
	assert_int_equal(finished, 0);
	assert_int_equal(s->waiting, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_answer_dropped_unsent_is_discarded, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_answer_built_is_not_discarded, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_wait_cancelled_is_not_discarded, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
