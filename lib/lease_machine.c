/*
 * lease_machine.c - a lease's life, as pure transitions.
 *
 * Design. A lease (lease.c) waits in its resource's queue, is held, and ends released,
 * expired or abandoned. Every call of its holder, each of its deadlines, its grant and
 * the server's stop is an event. lease_next takes the state, the event and the facts
 * the engine read (does a caller wait for the grant, which deadline came, does this node
 * keep the lease), and says the state after, what the engine does, and how the event's
 * caller is answered. It touches no thread, clock or database, so tests/unit/test_holds.c
 * checks every rule on its own; lease.c carries the moves out and decides nothing.
 *
 * The answer is what keeps one holder: a promise ("you hold it", from memory) is made only
 * once eng_promise proves that this node still drives the resource, and only of a hold
 * that is committed already (a renewal: its holder was told of its grant after the
 * commit); a change is answered once it is durable, under the commit's ownership check; a
 * read promises nothing. A lease that another node drives is that node's to change and to
 * tell: every call about it is passed on (503 naming that node), except a read when
 * nobody can be asked.
 *
 * Retries and give-backs are one rule. Every arrival of a request for the lease (its first
 * acquire, each retry of its request_id) is an attempt, numbered by lease.c. A give-back
 * (LEASE_UNDELIVERED: a grant whose answer could not be delivered or whose commit failed,
 * here or at the node that passed the request on) names the attempt it undoes, and a
 * waiter's leaving (LEASE_LEFT) names its caller; either does nothing once a later attempt
 * has arrived, answered or not (lease_facts.superseded). A retry of a held lease is
 * answered once its round is durable (HOLD_HELD), so it is never told "you hold it" of a
 * grant that the same round's failed commit gives back; its own give-back then names it.
 * And a renewal or release that arrived after the expiry (lease_facts.late, from its
 * stamp) answers 410, whether or not the expiry's timer ran before it in the round.
 */
#include "internal.h"

#include <string.h>

/* The events a client may ask for (a give-back too: another node passes it on). */
static int has_caller(int event)
{
	return event == LEASE_ACQUIRE || event == LEASE_RENEW || event == LEASE_RELEASE ||
	       event == LEASE_GET || event == LEASE_UNDELIVERED;
}

static hold_move refuse(int state, int code, const char *why)
{
	return (hold_move){.to = state, .answer = HOLD_REFUSE, .code = code, .why = why};
}

static hold_move act(int to, int what, int answer)
{
	return (hold_move){.to = to, .act = what, .answer = answer};
}

static hold_move leave(const char *why, int answer)
{
	return (hold_move){.to = LEASE_ABANDONED, .act = LEASE_LEAVE, .answer = answer, .why = why};
}

/* It ended: the store has the last word, and nothing moves it again. */
static hold_move ended(int state, int event)
{
	if (!has_caller(event))
		return act(state, LEASE_KEEP, HOLD_SILENT);
	if (state == LEASE_EXPIRED && (event == LEASE_RENEW || event == LEASE_RELEASE))
		return refuse(
		    state, BATON_EGONE,
		    "the lease expired: whatever was done under it since was unprotected");
	if (event == LEASE_RENEW)
		return refuse(state, BATON_ECONFLICT,
			      state == LEASE_RELEASED ? "the lease has ended (released)"
						      : "the lease has ended (abandoned)");
	return act(state, LEASE_KEEP, HOLD_READ); /* a retried acquire, a release again, a get */
}

static hold_move waiting(int event, const lease_facts *f)
{
	switch (event) {
	case LEASE_ACQUIRE: /* the first caller's answer was lost, or a restart cut it off */
		return act(LEASE_WAITING, LEASE_REATTACH, HOLD_WAIT);
	case LEASE_RENEW:
		return refuse(LEASE_WAITING, BATON_ECONFLICT, "the lease is not held yet");
	case LEASE_UNDELIVERED:
		return refuse(LEASE_WAITING, BATON_ECONFLICT,
			      "the lease is not held yet: there is no grant to give back");
	case LEASE_RELEASE:
		return leave("released while it waited", HOLD_COMMITTED);
	case LEASE_GET:
		return act(LEASE_WAITING, LEASE_KEEP, HOLD_READ);
	case LEASE_LEFT: /* unless a retry took the place of the caller who left */
		if (!f->superseded)
			return leave("the client went away", HOLD_SILENT);
		break;
	case LEASE_GRANTED:
		return f->caller ? act(LEASE_HELD, LEASE_START, HOLD_GRANT)
				 : act(LEASE_HELD, LEASE_START_UNSEEN, HOLD_SILENT);
	case LEASE_TIMER:
		if (f->wait_over)
			return leave("not granted within wait_ms", HOLD_SILENT);
		break;
	case LEASE_STOP:
		if (f->caller)
			return leave("the server is shutting down", HOLD_SILENT);
		break; /* it keeps its place for its caller, who may come back after a restart */
	}
	return act(LEASE_WAITING, LEASE_KEEP, HOLD_SILENT);
}

static hold_move held(int event, const lease_facts *f)
{
	hold_move m = act(LEASE_HELD, LEASE_KEEP, HOLD_SILENT);
	switch (event) {
	case LEASE_ACQUIRE:
		/* its caller counts the ttl from this request: so does the lease. Answered once
		 * the round is durable: the grant may be in it still, and its commit may fail */
		return act(LEASE_HELD, LEASE_ADOPT, HOLD_HELD);
	case LEASE_RENEW: /* a new ttl is answered once durable, as a restart counts it */
		if (f->late)
			break;
		m = f->new_ttl ? act(LEASE_HELD, LEASE_NEW_TTL, HOLD_COMMITTED)
			       : act(LEASE_HELD, LEASE_EXTEND, HOLD_PROMISE);
		m.proof = 1;
		break;
	case LEASE_RELEASE:
		if (f->late)
			break;
		return act(LEASE_RELEASED, LEASE_END_RELEASED, HOLD_COMMITTED);
	case LEASE_GET:
		return act(LEASE_HELD, LEASE_KEEP, HOLD_READ);
	case LEASE_UNDELIVERED: /* nobody knows they hold it, unless a retry came since */
		if (f->superseded)
			return refuse(LEASE_HELD, BATON_ECONFLICT,
				      "a later attempt of this lease's request arrived: the lease"
				      " is not given back");
		return act(LEASE_RELEASED, LEASE_END_RELEASED, HOLD_COMMITTED);
	case LEASE_UNCONFIRMED: /* its caller may come back once the round is known */
		return act(LEASE_HELD, LEASE_GRACE, HOLD_SILENT);
	case LEASE_TIMER:
		if (f->expired)
			return act(LEASE_EXPIRED, LEASE_END_EXPIRED, HOLD_SILENT);
		if (f->grace_over) /* granted to nobody, and nobody came back for it */
			return act(LEASE_RELEASED, LEASE_END_RELEASED, HOLD_SILENT);
		break;
	}
	if ((event == LEASE_RENEW || event == LEASE_RELEASE) && f->late) {
		/* it came after the expiry, which the round's timer may not have run yet */
		m = refuse(LEASE_EXPIRED, BATON_EGONE,
			   "the lease expired: whatever was done under it since was unprotected");
		m.act = LEASE_END_EXPIRED;
		return m;
	}
	if (m.answer == HOLD_PROMISE)
		m.proof = 1;
	return m;
}

hold_move lease_next(int state, int event, const lease_facts *f)
{
	if (state == LEASE_RELEASED || state == LEASE_EXPIRED || state == LEASE_ABANDONED)
		return ended(state, event);
	if (!f->here) { /* another node drives it, or is taking it over */
		if (!has_caller(event))
			return act(state, LEASE_KEEP, HOLD_SILENT);
		if (event == LEASE_GET && !f->elsewhere) /* nobody else to ask: read here */
			return act(state, LEASE_KEEP, HOLD_READ);
		return act(state, LEASE_KEEP, HOLD_PASS_ON);
	}
	return state == LEASE_WAITING ? waiting(event, f) : held(event, f);
}

const char *lease_state_name(int state)
{
	static const char *const names[] = {"waiting", "held", "released", "expired", "abandoned"};
	return state >= 0 && state <= LEASE_ABANDONED ? names[state] : "abandoned";
}

int lease_state_of(const char *name)
{
	for (int s = LEASE_WAITING; s <= LEASE_ABANDONED; s++)
		if (name && strcmp(name, lease_state_name(s)) == 0)
			return s;
	return LEASE_ABANDONED;
}
