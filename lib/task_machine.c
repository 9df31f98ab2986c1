/*
 * task_machine.c - an external step's attempt, as pure transitions.
 *
 * Design. Once its step is granted the resource, an attempt of an external worker (task.c)
 * is ready for a claim; a claim makes it claimed; its worker's heartbeats keep it, and its
 * outcome, a missed heartbeat, a give-back or a cancel moves it on. Its id names the
 * attempt, so a call about an attempt that is no longer the claimed one finds it over.
 * task_next says, for each state and event, the state after, what the engine does and how
 * the caller is answered, under the same rules as lease_machine.c: a promise from memory
 * only with proof (eng_promise), a change once durable, and an attempt that another node
 * drives passed on to it. tests/unit/test_holds.c checks the rules; task.c carries them out.
 *
 * Retries and give-backs follow lease_machine.c's one rule. A claim may carry a request_id;
 * the same claim retried (its answer lost) is its next attempt and is answered the same
 * task once durable (task.c), not a second one. The give-back of a claim whose answer could
 * not be delivered or whose commit failed (TASK_UNCLAIM) names the claim attempt it undoes,
 * and does nothing once a later attempt arrived (task_facts.superseded). The same holds for
 * a give-back that a node which passed the claim on sends to the owner (its caller waits):
 * it is answered once the task is offered again, 409 when a later attempt keeps the claim
 * or the task is not claimed, and passed on when another node drives the task.
 */
#include "internal.h"

static int has_caller(int event, const task_facts *f)
{
	return event == TASK_HEARTBEAT || event == TASK_COMPLETE || event == TASK_FAIL ||
	       (event == TASK_UNCLAIM && f->caller);
}

static hold_move move(int to, int what, int answer)
{
	return (hold_move){.to = to, .act = what, .answer = answer};
}

static hold_move refuse(int state, int code, const char *why)
{
	return (hold_move){.to = state, .answer = HOLD_REFUSE, .code = code, .why = why};
}

static hold_move claimed(int event, const task_facts *f)
{
	switch (event) {
	case TASK_HEARTBEAT:
		return (hold_move){
		    .to = TASK_CLAIMED, .act = TASK_EXTEND, .answer = HOLD_PROMISE, .proof = 1};
	case TASK_COMPLETE:
	case TASK_FAIL: /* through the workflow's retry policy, as a step thread's outcome */
		return move(TASK_OVER, TASK_END, HOLD_COMMITTED);
	case TASK_UNCLAIM:	   /* its claimer could not be told, or the claim was not durable */
		if (f->superseded) /* unless a retry of the claim came since: it keeps it */
			return f->caller ? refuse(TASK_CLAIMED, BATON_ECONFLICT,
						  "a later attempt of this claim's request arrived:"
						  " the claim is not given back")
					 : move(TASK_CLAIMED, TASK_KEEP, HOLD_SILENT);
		return move(TASK_READY, TASK_OFFER, f->caller ? HOLD_COMMITTED : HOLD_SILENT);
	case TASK_TIMER:
		if (f->expired)
			return move(TASK_OVER, TASK_END_EXPIRED, HOLD_SILENT);
		break;
	}
	return move(TASK_CLAIMED, TASK_KEEP, HOLD_SILENT);
}

hold_move task_next(int state, int event, const task_facts *f)
{
	/* only the node that drives it can tell or end it */
	if (has_caller(event, f) && !f->here && f->elsewhere)
		return move(state, TASK_KEEP, HOLD_PASS_ON);
	if (has_caller(event, f) && f->unread) /* baton may well have issued it: ask again */
		return refuse(state, BATON_EBUSY,
			      "the task's workflow could not be read from the database; try again"
			      " shortly");
	if (has_caller(event, f) && state == TASK_UNKNOWN)
		return refuse(state, BATON_ENOTFOUND, "no such task");
	if (state == TASK_CLAIMED && f->here)
		return claimed(event, f);
	if (state == TASK_READY && f->here && event == TASK_UNCLAIM && f->caller)
		return refuse(state, BATON_ECONFLICT,
			      "the task is not claimed: there is no claim to give back");
	if (has_caller(event, f)) /* not the claimed attempt: given back, expired, or ended */
		return refuse(state, BATON_EGONE,
			      "this attempt is over (it expired, was superseded or its "
			      "workflow ended): its work must not be used");
	if (state == TASK_READY && f->here && event == TASK_CLAIM)
		return move(TASK_CLAIMED, TASK_ASSIGN, HOLD_GRANT);
	if (state == TASK_READY && f->here && event == TASK_CANCEL)
		return move(TASK_OVER, TASK_END_CANCELLED, HOLD_SILENT);
	return move(state, TASK_KEEP, HOLD_SILENT);
}
