/*
 * wait.c - requests that wait for the engine without holding an HTTP thread.
 *
 * Design. A handler whose answer depends on the engine (POST /workflows waits for its
 * commit; lease and task endpoints will wait for a grant) calls srv_wait_begin with the
 * state its answer needs (`data`, malloc'd, owned by the request from then on) and a
 * `finish` function, hands its work to the engine with the request as the callback's
 * context, and returns srv_wait_suspend(...): the connection is suspended (libmicrohttpd's
 * MHD_suspend_connection) and the thread goes back to other connections. The engine's
 * callback fills `data` and calls srv_wait_done, which resumes the connection; the final
 * callback of http.c then sees srv_wait_answered and calls srv_wait_finish, which runs
 * `finish` on that HTTP thread to build the answer. An answer that comes before the
 * handler could suspend is finished at once.
 *
 * srv.wait_mu orders the engine's callback against the suspension (a connection is only
 * resumed once it was suspended), and counts the requests with the engine: srv_stop
 * drains them (srv_waits_drain) before it stops the daemon, since a suspended connection
 * must be resumed first, and new ones are refused with 503 from then on.
 */
#include "server.h"

#include <stdlib.h>

/* A request is off the engine's hands (under wait_mu): srv_waits_drain may go on. */
static void done_locked(srv *s, request *r)
{
	r->wait.state = WAIT_NONE;
	if (--s->waiting == 0)
		pthread_cond_broadcast(&s->wait_cv);
}

int srv_wait_begin(srv *s, request *r, void *data, wait_finish_fn finish, response *out)
{
	pthread_mutex_lock(&s->wait_mu);
	int closing = s->closing;
	s->waiting += !closing;
	int alone = s->waiting == 1;
	pthread_mutex_unlock(&s->wait_mu);
	if (closing) {
		free(data);
		reply_problem(out, 503, "the server is shutting down");
		out->retry_after = 1;
		return -1;
	}
	r->wait = (srv_wait){.srv = s, .state = WAIT_ENGINE, .data = data, .finish = finish};
	/* Alone with the engine, this thread may run the round itself (srv_wait_cancel or
	 * srv_wait_suspend helps). With others waiting on it, the engine thread runs it with
	 * theirs: one commit for all, and no HTTP thread kept from its other connections. */
	if (alone)
		baton_engine_hold(s->engine);
	return 0;
}

void srv_wait_on_discard(request *r, wait_discard_fn discard)
{
	r->wait.discard = discard;
}

void srv_wait_cancel(srv *s, request *r)
{
	baton_engine_help(s->engine);
	pthread_mutex_lock(&s->wait_mu);
	done_locked(s, r);
	pthread_mutex_unlock(&s->wait_mu);
	free(r->wait.data);
	r->wait.data = NULL;
}

int srv_wait_suspend(srv *s, request *r, response *out)
{
	baton_engine_help(s->engine);
	pthread_mutex_lock(&s->wait_mu);
	int waiting = r->wait.state == WAIT_ENGINE;
	if (waiting) {
		r->wait.suspended = 1;
		r->wait.route = out->route;
		MHD_suspend_connection(r->conn);
	}
	pthread_mutex_unlock(&s->wait_mu);
	if (waiting) {
		out->pending = 1;
		return 0;
	}
	return srv_wait_finish(s, r, out); /* answered before it could wait */
}

void srv_wait_done(request *r)
{
	srv *s = r->wait.srv;
	pthread_mutex_lock(&s->wait_mu);
	r->wait.state = WAIT_ANSWERED;
	int suspended = r->wait.suspended;
	pthread_mutex_unlock(&s->wait_mu);
	/* Outside the lock: until resumed, the connection (and r) stays as it is. */
	if (suspended)
		MHD_resume_connection(r->conn);
}

int srv_wait_answered(srv *s, request *r)
{
	pthread_mutex_lock(&s->wait_mu);
	int answered = r->wait.state == WAIT_ANSWERED;
	pthread_mutex_unlock(&s->wait_mu);
	return answered;
}

int srv_wait_finish(srv *s, request *r, response *out)
{
	pthread_mutex_lock(&s->wait_mu);
	done_locked(s, r);
	pthread_mutex_unlock(&s->wait_mu);
	if (r->wait.route)
		out->route = r->wait.route;
	int status = r->wait.finish(s, r, r->wait.data, out);
	free(r->wait.data);
	r->wait.data = NULL;
	return status;
}

void srv_wait_abandoned(srv *s, request *r)
{
	pthread_mutex_lock(&s->wait_mu);
	int answered = r->wait.state == WAIT_ANSWERED;
	if (r->wait.state) /* answered, but the connection closed before it was sent */
		done_locked(s, r);
	pthread_mutex_unlock(&s->wait_mu);
	/* What the engine handed over with its answer (a lease, a task) is given back. */
	if (answered && r->wait.data && r->wait.discard)
		r->wait.discard(s, r->wait.data);
	free(r->wait.data);
	r->wait.data = NULL;
}

void srv_waits_drain(srv *s)
{
	pthread_mutex_lock(&s->wait_mu);
	s->closing = 1;
	while (s->waiting > 0)
		pthread_cond_wait(&s->wait_cv, &s->wait_mu);
	pthread_mutex_unlock(&s->wait_mu);
}
