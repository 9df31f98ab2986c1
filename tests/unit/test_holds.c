/*
 * test_holds.c - the rules of a lease and of a claimed task (lease_machine.c,
 * task_machine.c), without threads, clocks or a database: for each state and event, the
 * state after, what the engine does and how the caller is answered; and the rules that
 * keep one holder, checked over every state, event and fact.
 */
#include "unit.h"

#include <time.h>

static const lease_facts here = {.here = 1};

static void expect(hold_move m, int to, int act, int answer)
{
	assert_int_equal(m.to, to);
	assert_int_equal(m.act, act);
	assert_int_equal(m.answer, answer);
}

static void test_lease_waiting(void **state)
{
	(void)state;
	lease_facts caller = {.here = 1, .caller = 1};
	expect(lease_next(LEASE_WAITING, LEASE_GRANTED, &caller), LEASE_HELD, LEASE_START,
	       HOLD_GRANT);
	/* granted after a restart, before its caller came back: kept a grace, nobody told */
	expect(lease_next(LEASE_WAITING, LEASE_GRANTED, &here), LEASE_HELD, LEASE_START_UNSEEN,
	       HOLD_SILENT);
	expect(lease_next(LEASE_WAITING, LEASE_ACQUIRE, &caller), LEASE_WAITING, LEASE_REATTACH,
	       HOLD_WAIT);
	hold_move m = lease_next(LEASE_WAITING, LEASE_RENEW, &caller);
	expect(m, LEASE_WAITING, LEASE_KEEP, HOLD_REFUSE);
	assert_int_equal(m.code, BATON_ECONFLICT);
	m = lease_next(LEASE_WAITING, LEASE_RELEASE, &caller);
	expect(m, LEASE_ABANDONED, LEASE_LEAVE, HOLD_COMMITTED);
	assert_string_equal(m.why, "released while it waited");
	expect(lease_next(LEASE_WAITING, LEASE_LEFT, &caller), LEASE_ABANDONED, LEASE_LEAVE,
	       HOLD_SILENT);
	/* the caller who left was replaced by a retry of its request_id: it keeps waiting */
	lease_facts retried = {.here = 1, .caller = 1, .superseded = 1};
	expect(lease_next(LEASE_WAITING, LEASE_LEFT, &retried), LEASE_WAITING, LEASE_KEEP,
	       HOLD_SILENT);
	/* a give-back of a waiter changes nothing: there was no grant */
	m = lease_next(LEASE_WAITING, LEASE_UNDELIVERED, &caller);
	expect(m, LEASE_WAITING, LEASE_KEEP, HOLD_REFUSE);
	assert_int_equal(m.code, BATON_ECONFLICT);
	lease_facts due = {.here = 1, .caller = 1, .wait_over = 1, .expired = 1};
	m = lease_next(LEASE_WAITING, LEASE_TIMER, &due);
	expect(m, LEASE_ABANDONED, LEASE_LEAVE, HOLD_SILENT);
	assert_string_equal(m.why, "not granted within wait_ms");
	expect(lease_next(LEASE_WAITING, LEASE_TIMER, &caller), LEASE_WAITING, LEASE_KEEP,
	       HOLD_SILENT);
	/* the server stops: its caller is told; one without a caller keeps its place */
	expect(lease_next(LEASE_WAITING, LEASE_STOP, &caller), LEASE_ABANDONED, LEASE_LEAVE,
	       HOLD_SILENT);
	expect(lease_next(LEASE_WAITING, LEASE_STOP, &here), LEASE_WAITING, LEASE_KEEP,
	       HOLD_SILENT);
}

static void test_lease_held(void **state)
{
	(void)state;
	hold_move m = lease_next(LEASE_HELD, LEASE_RENEW, &here);
	expect(m, LEASE_HELD, LEASE_EXTEND, HOLD_PROMISE);
	assert_true(m.proof);
	lease_facts ttl = {.here = 1, .new_ttl = 1};
	m = lease_next(LEASE_HELD, LEASE_RENEW, &ttl);
	expect(m, LEASE_HELD, LEASE_NEW_TTL, HOLD_COMMITTED); /* told once the ttl is durable */
	assert_true(m.proof);
	/* a retry is told it holds the lease once the round (its grant, its attempt) is
	 * durable, never from memory */
	expect(lease_next(LEASE_HELD, LEASE_ACQUIRE, &here), LEASE_HELD, LEASE_ADOPT, HOLD_HELD);
	expect(lease_next(LEASE_HELD, LEASE_RELEASE, &here), LEASE_RELEASED, LEASE_END_RELEASED,
	       HOLD_COMMITTED);
	expect(lease_next(LEASE_HELD, LEASE_UNDELIVERED, &here), LEASE_RELEASED, LEASE_END_RELEASED,
	       HOLD_COMMITTED);
	/* the give-back of an attempt after which a retry arrived does nothing */
	lease_facts retried = {.here = 1, .superseded = 1};
	m = lease_next(LEASE_HELD, LEASE_UNDELIVERED, &retried);
	expect(m, LEASE_HELD, LEASE_KEEP, HOLD_REFUSE);
	assert_int_equal(m.code, BATON_ECONFLICT);
	/* a renewal or release that arrived after the expiry: 410, and the lease expires in
	 * this round, whether or not its timer ran yet */
	lease_facts late = {.here = 1, .late = 1};
	for (int ev = LEASE_RENEW; ev <= LEASE_RELEASE; ev++) {
		m = lease_next(LEASE_HELD, ev, &late);
		expect(m, LEASE_EXPIRED, LEASE_END_EXPIRED, HOLD_REFUSE);
		assert_int_equal(m.code, BATON_EGONE);
	}
	expect(lease_next(LEASE_HELD, LEASE_LEFT, &here), LEASE_HELD, LEASE_KEEP, HOLD_SILENT);
	/* its caller told 503 while its grant may still commit: kept a grace for a retry */
	expect(lease_next(LEASE_HELD, LEASE_UNCONFIRMED, &here), LEASE_HELD, LEASE_GRACE,
	       HOLD_SILENT);
	expect(lease_next(LEASE_WAITING, LEASE_UNCONFIRMED, &here), LEASE_WAITING, LEASE_KEEP,
	       HOLD_SILENT);
	expect(lease_next(LEASE_HELD, LEASE_STOP, &here), LEASE_HELD, LEASE_KEEP, HOLD_SILENT);
	expect(lease_next(LEASE_HELD, LEASE_GET, &here), LEASE_HELD, LEASE_KEEP, HOLD_READ);
	/* expiry wins over the grace when both came */
	lease_facts both = {.here = 1, .expired = 1, .grace_over = 1};
	expect(lease_next(LEASE_HELD, LEASE_TIMER, &both), LEASE_EXPIRED, LEASE_END_EXPIRED,
	       HOLD_SILENT);
	lease_facts grace = {.here = 1, .grace_over = 1, .wait_over = 1};
	expect(lease_next(LEASE_HELD, LEASE_TIMER, &grace), LEASE_RELEASED, LEASE_END_RELEASED,
	       HOLD_SILENT);
	lease_facts early = {.here = 1, .wait_over = 1};
	expect(lease_next(LEASE_HELD, LEASE_TIMER, &early), LEASE_HELD, LEASE_KEEP, HOLD_SILENT);
}

static void test_lease_ended(void **state)
{
	(void)state;
	lease_facts stored = {0};
	hold_move m = lease_next(LEASE_EXPIRED, LEASE_RENEW, &stored);
	expect(m, LEASE_EXPIRED, LEASE_KEEP, HOLD_REFUSE);
	assert_int_equal(m.code, BATON_EGONE);
	m = lease_next(LEASE_EXPIRED, LEASE_RELEASE, &stored);
	assert_int_equal(m.code, BATON_EGONE);
	m = lease_next(LEASE_RELEASED, LEASE_RENEW, &stored);
	assert_int_equal(m.code, BATON_ECONFLICT);
	assert_string_equal(m.why, "the lease has ended (released)");
	m = lease_next(LEASE_ABANDONED, LEASE_RENEW, &stored);
	assert_string_equal(m.why, "the lease has ended (abandoned)");
	expect(lease_next(LEASE_RELEASED, LEASE_RELEASE, &stored), LEASE_RELEASED, LEASE_KEEP,
	       HOLD_READ);
	expect(lease_next(LEASE_ABANDONED, LEASE_ACQUIRE, &stored), LEASE_ABANDONED, LEASE_KEEP,
	       HOLD_READ);
	expect(lease_next(LEASE_EXPIRED, LEASE_GET, &here), LEASE_EXPIRED, LEASE_KEEP, HOLD_READ);
}

static void test_lease_driven_elsewhere(void **state)
{
	(void)state;
	lease_facts there = {.elsewhere = 1};
	lease_facts nobody = {0};
	for (int s = LEASE_WAITING; s <= LEASE_HELD; s++) {
		for (int ev = LEASE_ACQUIRE; ev <= LEASE_RELEASE; ev++) {
			expect(lease_next(s, ev, &there), s, LEASE_KEEP, HOLD_PASS_ON);
			expect(lease_next(s, ev, &nobody), s, LEASE_KEEP, HOLD_PASS_ON);
		}
		expect(lease_next(s, LEASE_GET, &there), s, LEASE_KEEP, HOLD_PASS_ON);
		/* nobody else can be asked: read here, which promises nothing */
		expect(lease_next(s, LEASE_GET, &nobody), s, LEASE_KEEP, HOLD_READ);
		expect(lease_next(s, LEASE_TIMER, &there), s, LEASE_KEEP, HOLD_SILENT);
	}
}

/* Over every state, event and combination of facts: the rules that keep one holder. */
static void test_lease_rules_hold_everywhere(void **state)
{
	(void)state;
	for (int s = LEASE_WAITING; s <= LEASE_ABANDONED; s++)
		for (int ev = LEASE_ACQUIRE; ev <= LEASE_UNCONFIRMED; ev++)
			for (int bits = 0; bits < 512; bits++) {
				lease_facts f = {bits & 1,	bits >> 1 & 1, bits >> 2 & 1,
						 bits >> 3 & 1, bits >> 4 & 1, bits >> 5 & 1,
						 bits >> 6 & 1, bits >> 7 & 1, bits >> 8 & 1};
				hold_move m = lease_next(s, ev, &f);
				int ended = s >= LEASE_RELEASED;
				/* a promise from memory is made only with proof */
				if (m.answer == HOLD_PROMISE)
					assert_true(m.proof);
				/* only the queue's grant makes a holder, and it is told once
				 * durable */
				if (m.to == LEASE_HELD && s != LEASE_HELD)
					assert_int_equal(ev, LEASE_GRANTED);
				if (m.answer == HOLD_GRANT)
					assert_int_equal(m.act, LEASE_START);
				/* an ended lease never moves again, and only a node that keeps the
				 * lease changes it */
				if (ended || !f.here)
					expect(m, s, LEASE_KEEP, m.answer);
				/* a caller is always answered or kept waiting; besides the grant,
				 * which answers the acquisition's caller, nothing else answers */
				int caller = ev <= LEASE_GET || ev == LEASE_UNDELIVERED;
				if (caller)
					assert_true(m.answer != HOLD_SILENT);
				else if (ev != LEASE_GRANTED)
					assert_int_equal(m.answer, HOLD_SILENT);
				if (m.answer == HOLD_REFUSE)
					assert_true(m.code != BATON_OK && m.why);
				if (m.act == LEASE_LEAVE)
					assert_true(m.why && m.to == LEASE_ABANDONED);
				/* an undo names what it undoes: once a later attempt arrived,
				 * the give-back or leaving of an earlier one does nothing */
				if (f.superseded && (ev == LEASE_UNDELIVERED || ev == LEASE_LEFT))
					expect(m, s, LEASE_KEEP, m.answer);
				/* "you hold it" to a retry only once durable */
				if (ev == LEASE_ACQUIRE)
					assert_true(m.answer != HOLD_PROMISE &&
						    m.answer != HOLD_GRANT);
				if (m.answer == HOLD_HELD)
					assert_true(s == LEASE_HELD && m.act == LEASE_ADOPT);
				/* a renewal that came after the expiry never extends the lease */
				if (f.late && ev == LEASE_RENEW && s == LEASE_HELD && f.here)
					assert_int_equal(m.act, LEASE_END_EXPIRED);
			}
	assert_string_equal(lease_state_name(LEASE_HELD), "held");
	for (int s = LEASE_WAITING; s <= LEASE_ABANDONED; s++)
		assert_int_equal(lease_state_of(lease_state_name(s)), s);
}

static void test_task_claimed(void **state)
{
	(void)state;
	task_facts f = {.here = 1};
	expect(task_next(TASK_READY, TASK_CLAIM, &f), TASK_CLAIMED, TASK_ASSIGN, HOLD_GRANT);
	hold_move m = task_next(TASK_CLAIMED, TASK_HEARTBEAT, &f);
	expect(m, TASK_CLAIMED, TASK_EXTEND, HOLD_PROMISE);
	assert_true(m.proof);
	expect(task_next(TASK_CLAIMED, TASK_COMPLETE, &f), TASK_OVER, TASK_END, HOLD_COMMITTED);
	expect(task_next(TASK_CLAIMED, TASK_FAIL, &f), TASK_OVER, TASK_END, HOLD_COMMITTED);
	expect(task_next(TASK_CLAIMED, TASK_UNCLAIM, &f), TASK_READY, TASK_OFFER, HOLD_SILENT);
	expect(task_next(TASK_CLAIMED, TASK_TIMER, &f), TASK_CLAIMED, TASK_KEEP, HOLD_SILENT);
	task_facts due = {.here = 1, .expired = 1};
	expect(task_next(TASK_CLAIMED, TASK_TIMER, &due), TASK_OVER, TASK_END_EXPIRED, HOLD_SILENT);
	/* a claimed attempt finishes on its own; only an unclaimed one ends with the cancel */
	expect(task_next(TASK_CLAIMED, TASK_CANCEL, &f), TASK_CLAIMED, TASK_KEEP, HOLD_SILENT);
	expect(task_next(TASK_READY, TASK_CANCEL, &f), TASK_OVER, TASK_END_CANCELLED, HOLD_SILENT);
}

static void test_task_not_claimed_here(void **state)
{
	(void)state;
	task_facts f = {.here = 1}, stored = {0}, there = {.elsewhere = 1}, unread = {.unread = 1};
	for (int ev = TASK_HEARTBEAT; ev <= TASK_FAIL; ev++) {
		hold_move m = task_next(TASK_READY, ev, &f); /* given back: the old claimer */
		expect(m, TASK_READY, TASK_KEEP, HOLD_REFUSE);
		assert_int_equal(m.code, BATON_EGONE);
		m = task_next(TASK_OVER, ev, &stored);
		assert_int_equal(m.code, BATON_EGONE);
		m = task_next(TASK_UNKNOWN, ev, &stored);
		assert_int_equal(m.code, BATON_ENOTFOUND);
		m = task_next(TASK_UNKNOWN, ev, &unread); /* the store could not tell: ask again */
		expect(m, TASK_UNKNOWN, TASK_KEEP, HOLD_REFUSE);
		assert_int_equal(m.code, BATON_EBUSY);
		expect(task_next(TASK_OVER, ev, &there), TASK_OVER, TASK_KEEP, HOLD_PASS_ON);
		/* a claimed attempt this node no longer keeps is not its to answer */
		expect(task_next(TASK_CLAIMED, ev, &there), TASK_CLAIMED, TASK_KEEP, HOLD_PASS_ON);
	}
	expect(task_next(TASK_OVER, TASK_UNCLAIM, &stored), TASK_OVER, TASK_KEEP, HOLD_SILENT);
	task_facts retried = {.here = 1, .superseded = 1};
	expect(task_next(TASK_CLAIMED, TASK_UNCLAIM, &retried), TASK_CLAIMED, TASK_KEEP,
	       HOLD_SILENT);
	expect(task_next(TASK_OVER, TASK_TIMER, &f), TASK_OVER, TASK_KEEP, HOLD_SILENT);
}

/* A give-back passed on by another node waits for its answer: once the task is offered
 * again (durable), 409 when a later attempt keeps the claim or nothing is claimed, 410 for
 * an attempt that is over, and passed on to the node that drives the task. */
static void test_task_give_back_with_a_caller(void **state)
{
	(void)state;
	task_facts f = {.here = 1, .caller = 1};
	expect(task_next(TASK_CLAIMED, TASK_UNCLAIM, &f), TASK_READY, TASK_OFFER, HOLD_COMMITTED);
	task_facts retried = {.here = 1, .superseded = 1, .caller = 1};
	hold_move m = task_next(TASK_CLAIMED, TASK_UNCLAIM, &retried);
	expect(m, TASK_CLAIMED, TASK_KEEP, HOLD_REFUSE);
	assert_int_equal(m.code, BATON_ECONFLICT);
	m = task_next(TASK_READY, TASK_UNCLAIM, &f);
	expect(m, TASK_READY, TASK_KEEP, HOLD_REFUSE);
	assert_int_equal(m.code, BATON_ECONFLICT);
	m = task_next(TASK_OVER, TASK_UNCLAIM, &f);
	assert_int_equal(m.code, BATON_EGONE);
	task_facts stored = {.caller = 1}, there = {.elsewhere = 1, .caller = 1};
	m = task_next(TASK_UNKNOWN, TASK_UNCLAIM, &stored);
	assert_int_equal(m.code, BATON_ENOTFOUND);
	expect(task_next(TASK_OVER, TASK_UNCLAIM, &there), TASK_OVER, TASK_KEEP, HOLD_PASS_ON);
}

static void test_task_rules_hold_everywhere(void **state)
{
	(void)state;
	for (int s = TASK_READY; s <= TASK_UNKNOWN; s++)
		for (int ev = TASK_HEARTBEAT; ev <= TASK_CANCEL; ev++)
			for (int bits = 0; bits < 32; bits++) {
				task_facts f = {.here = bits & 1,
						.elsewhere = bits >> 1 & 1,
						.expired = bits >> 2 & 1,
						.superseded = bits >> 3 & 1,
						.caller = bits >> 4 & 1};
				hold_move m = task_next(s, ev, &f);
				/* the give-back of a claim attempt after which a retry of its
				 * request_id arrived does nothing */
				if (f.superseded && ev == TASK_UNCLAIM)
					assert_int_equal(m.act, TASK_KEEP);
				if (m.answer == HOLD_PROMISE)
					assert_true(m.proof);
				if (m.to == TASK_CLAIMED && s != TASK_CLAIMED)
					assert_int_equal(ev, TASK_CLAIM);
				if (m.act != TASK_KEEP)
					assert_true(f.here);
				int caller = ev <= TASK_FAIL || (ev == TASK_UNCLAIM && f.caller);
				assert_true(caller ? m.answer != HOLD_SILENT
						   : m.answer == HOLD_SILENT ||
							 m.answer == HOLD_GRANT);
				/* a worker's outcome is recorded only for the claimed attempt */
				if (m.act == TASK_END)
					assert_int_equal(s, TASK_CLAIMED);
			}
}

/* The proof that a node still drives its partitions (its node lease, counted from the
 * renewal's send) runs on a clock that keeps counting while the machine is suspended:
 * CLOCK_MONOTONIC stops then, and a node resumed after a suspend longer than its lease
 * would still count a lease that ran out, and promise from memory. */
static void test_proof_clock_counts_suspended_time(void **state)
{
	(void)state;
	assert_int_equal(PROOF_CLOCK, CLOCK_BOOTTIME);
	struct timespec before, after;
	clock_gettime(CLOCK_BOOTTIME, &before);
	int64_t proof = proof_ms();
	clock_gettime(CLOCK_BOOTTIME, &after);
	assert_true(proof >= (int64_t)before.tv_sec * 1000 + before.tv_nsec / 1000000);
	assert_true(proof <= (int64_t)after.tv_sec * 1000 + after.tv_nsec / 1000000);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_lease_waiting),
	    cmocka_unit_test(test_lease_held),
	    cmocka_unit_test(test_lease_ended),
	    cmocka_unit_test(test_lease_driven_elsewhere),
	    cmocka_unit_test(test_lease_rules_hold_everywhere),
	    cmocka_unit_test(test_task_claimed),
	    cmocka_unit_test(test_task_not_claimed_here),
	    cmocka_unit_test(test_task_give_back_with_a_caller),
	    cmocka_unit_test(test_task_rules_hold_everywhere),
	    cmocka_unit_test(test_proof_clock_counts_suspended_time),
	};
	return cmocka_run_group_tests_name("holds", tests, NULL, NULL);
}
