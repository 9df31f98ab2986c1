/*
 * test_lock.c - one resource's FIFO lock: order of grants, one holder at a time,
 * strictly increasing fencing tokens, removal of a cancelled waiter, hold/wait totals;
 * with several permits: never more holders than the limit, an exclusive holder alone,
 * no waiter granted before the head, the lowest free slot.
 */
#include "unit.h"

static wf_row *waiter(int64_t requested_at)
{
	wf_row *wf = wf_from("{\"resource\":\"gw\",\"workers\":[\"a\"]}");
	wf->steps[0].requested_at = requested_at;
	return wf;
}

static wf_row *exclusive_waiter(void)
{
	wf_row *wf =
	    wf_from("{\"resource\":\"gw\",\"workers\":[{\"name\":\"w\",\"exclusive\":true}]}");
	return wf;
}

/* Grants l to its head and checks who got it, with which slot, at a higher token. */
static void expect_grant(res_lock *l, wf_row *want, int slot, int64_t *last_token)
{
	int64_t waited;
	wf_row *g = lock_grant_next(l, 10, &waited);
	assert_ptr_equal(g, want);
	want->steps[0].token = l->row.last_token;
	assert_true(l->row.last_token > *last_token);
	*last_token = l->row.last_token;
	const lock_hold *h = lock_hold_of(l, want);
	assert_non_null(h);
	assert_int_equal(h->slot, slot);
}

static void test_permits_are_granted_up_to_the_limit(void **state)
{
	(void)state;
	res_lock *l = lock_new("gw");
	l->row.permits = 3;
	wf_row *w[5];
	for (int i = 0; i < 5; i++) {
		w[i] = waiter(0);
		lock_enqueue(l, w[i]);
	}
	int64_t token = 0, waited;
	for (int i = 0; i < 3; i++)
		expect_grant(l, w[i], i, &token);
	assert_null(lock_grant_next(l, 10, &waited)); /* full */
	assert_int_equal(lock_permits_in_use(l), 3);
	lock_release(l, w[1], 20);
	expect_grant(l, w[3], 1, &token); /* the lowest free slot, a higher token */
	assert_null(lock_grant_next(l, 20, &waited));
	assert_ptr_equal(lock_first_holder(l), w[0]);
	lock_release(l, w[0], 30);
	assert_ptr_equal(lock_first_holder(l), w[2]);
	expect_grant(l, w[4], 0, &token);
	assert_int_equal(l->row.grants, 5);
	for (int i = 0; i < 5; i++)
		wf_row_free(w[i]);
	lock_free(l);
}

/* Slots past the first 64, and the lowest free one reused whichever was freed. */
static void test_many_permits_reuse_the_lowest_free_slot(void **state)
{
	(void)state;
	enum { N = 150 };
	res_lock *l = lock_new("gw");
	l->row.permits = N;
	wf_row *w[N + 2];
	for (int i = 0; i < N + 2; i++) {
		w[i] = waiter(0);
		lock_enqueue(l, w[i]);
	}
	int64_t token = 0, waited;
	for (int i = 0; i < N; i++)
		expect_grant(l, w[i], i, &token);
	assert_null(lock_grant_next(l, 10, &waited));
	lock_release(l, w[130], 20);
	lock_release(l, w[70], 20);
	expect_grant(l, w[N], 70, &token);
	expect_grant(l, w[N + 1], 130, &token);
	assert_int_equal(lock_permits_in_use(l), N);
	for (int i = 0; i < N + 2; i++)
		wf_row_free(w[i]);
	lock_free(l);
}

static void test_exclusive_waits_alone_and_nobody_passes_it(void **state)
{
	(void)state;
	res_lock *l = lock_new("gw");
	l->row.permits = 3;
	wf_row *a = waiter(0), *x = exclusive_waiter(), *b = waiter(0);
	lock_enqueue(l, a);
	lock_enqueue(l, x);
	lock_enqueue(l, b);
	int64_t token = 0, waited;
	expect_grant(l, a, 0, &token);
	/* x waits for a; b would fit, but is behind x. */
	assert_null(lock_grant_next(l, 10, &waited));
	lock_release(l, a, 20);
	expect_grant(l, x, -1, &token);
	assert_int_equal(lock_permits_in_use(l), 3);
	assert_null(lock_grant_next(l, 20, &waited)); /* nobody beside x */
	lock_release(l, x, 30);
	expect_grant(l, b, 0, &token);
	wf_row_free(a);
	wf_row_free(x);
	wf_row_free(b);
	lock_free(l);
}

static void test_a_lower_limit_takes_nothing_back(void **state)
{
	(void)state;
	res_lock *l = lock_new("gw");
	l->row.permits = 3;
	wf_row *w[4];
	for (int i = 0; i < 4; i++) {
		w[i] = waiter(0);
		lock_enqueue(l, w[i]);
	}
	int64_t token = 0, waited;
	for (int i = 0; i < 3; i++)
		expect_grant(l, w[i], i, &token);
	l->row.permits = 1;
	lock_release(l, w[2], 20);
	assert_null(lock_grant_next(l, 20, &waited));
	lock_release(l, w[0], 20);
	assert_null(lock_grant_next(l, 20, &waited)); /* w[1] holds the one permit */
	lock_release(l, w[1], 20);
	expect_grant(l, w[3], 0, &token);
	for (int i = 0; i < 4; i++)
		wf_row_free(w[i]);
	lock_free(l);
}

static void test_ungrant_never_takes_a_token_back_from_a_later_grant(void **state)
{
	(void)state;
	res_lock *l = lock_new("gw");
	l->row.permits = 2;
	wf_row *a = waiter(0), *b = waiter(0);
	lock_enqueue(l, a);
	lock_enqueue(l, b);
	int64_t token = 0;
	expect_grant(l, a, 0, &token);
	expect_grant(l, b, 1, &token);
	lock_ungrant(l, a); /* b's token stays the highest given */
	assert_int_equal(l->row.last_token, token);
	assert_null(lock_hold_of(l, a));
	lock_ungrant(l, b); /* the newest: its token is given again */
	assert_int_equal(l->row.last_token, token - 1);
	assert_int_equal(lock_permits_in_use(l), 0);
	wf_row_free(a);
	wf_row_free(b);
	lock_free(l);
}

static void test_restored_holders_keep_their_slots_in_token_order(void **state)
{
	(void)state;
	res_lock *l = lock_new("gw");
	l->row.permits = 3;
	l->row.last_token = 9;
	wf_row *a = waiter(0), *b = waiter(0), *c = waiter(0);
	a->steps[0].token = 9;
	b->steps[0].token = 7;
	lock_restore(l, a, 0, 1);
	lock_restore(l, b, 2, 1);
	assert_ptr_equal(lock_first_holder(l), b);
	lock_enqueue(l, c);
	int64_t token = 9;
	expect_grant(l, c, 1, &token);
	wf_row_free(a);
	wf_row_free(b);
	wf_row_free(c);
	lock_free(l);
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
		lock_release(l, w[i], 105 + i * 10);
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
	lock_release(l, a, 2);
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
	    cmocka_unit_test(test_permits_are_granted_up_to_the_limit),
	    cmocka_unit_test(test_many_permits_reuse_the_lowest_free_slot),
	    cmocka_unit_test(test_exclusive_waits_alone_and_nobody_passes_it),
	    cmocka_unit_test(test_a_lower_limit_takes_nothing_back),
	    cmocka_unit_test(test_ungrant_never_takes_a_token_back_from_a_later_grant),
	    cmocka_unit_test(test_restored_holders_keep_their_slots_in_token_order),
	};
	return cmocka_run_group_tests_name("lock", tests, NULL, NULL);
}
