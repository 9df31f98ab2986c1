/*
 * test_lock.c - one resource's FIFO lock: order of grants, one holder at a time,
 * strictly increasing fencing tokens, removal of a cancelled waiter, hold/wait totals.
 */
#include "unit.h"

static wf_row *waiter(int64_t requested_at)
{
	wf_row *wf = wf_from("{\"resource\":\"gw\",\"workers\":[\"a\"]}");
	wf->steps[0].requested_at = requested_at;
	return wf;
}

static void test_grants_in_fifo_order_one_at_a_time(void **state)
{
	(void)state;
	res_lock *l = lock_new("gw");
	wf_row *w[3] = {waiter(0), waiter(1), waiter(2)};
	for (int i = 0; i < 3; i++)
		lock_enqueue(l, w[i]);
	int64_t waited, last_token = 0;
	for (int i = 0; i < 3; i++) {
		wf_row *g = lock_grant_next(l, 100 + i * 10, &waited);
		assert_ptr_equal(g, w[i]);
		assert_true(l->row.last_token > last_token);
		last_token = l->row.last_token;
		/* Held: nobody else gets it. */
		assert_null(lock_grant_next(l, 100 + i * 10, &waited));
		lock_release(l, 105 + i * 10);
	}
	assert_null(lock_grant_next(l, 200, &waited));
	assert_int_equal(l->row.grants, 3);
	assert_int_equal(l->row.total_hold_ms, 15);
	assert_int_equal(l->row.max_wait_ms, 118);
	for (int i = 0; i < 3; i++)
		wf_row_free(w[i]);
	lock_free(l);
}

static void test_removed_waiter_is_skipped(void **state)
{
	(void)state;
	res_lock *l = lock_new("gw");
	wf_row *a = waiter(0), *b = waiter(0), *c = waiter(0);
	lock_enqueue(l, a);
	lock_enqueue(l, b);
	lock_enqueue(l, c);
	assert_true(lock_remove(l, b));
	assert_false(lock_remove(l, b));
	assert_true(lock_remove(l, c)); /* the tail */
	assert_int_equal(l->queue_len, 1);
	lock_enqueue(l, c);
	int64_t waited;
	assert_ptr_equal(lock_grant_next(l, 1, &waited), a);
	lock_release(l, 2);
	assert_ptr_equal(lock_grant_next(l, 3, &waited), c);
	wf_row_free(a);
	wf_row_free(b);
	wf_row_free(c);
	lock_free(l);
}

static void test_tokens_continue_from_persisted_high_water_mark(void **state)
{
	(void)state;
	res_lock *l = lock_new("gw");
	l->row.last_token = 41; /* as loaded after a restart */
	wf_row *a = waiter(0);
	lock_enqueue(l, a);
	int64_t waited;
	lock_grant_next(l, 0, &waited);
	assert_int_equal(l->row.last_token, 42);
	wf_row_free(a);
	lock_free(l);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_grants_in_fifo_order_one_at_a_time),
	    cmocka_unit_test(test_removed_waiter_is_skipped),
	    cmocka_unit_test(test_tokens_continue_from_persisted_high_water_mark),
	};
	return cmocka_run_group_tests_name("lock", tests, NULL, NULL);
}
