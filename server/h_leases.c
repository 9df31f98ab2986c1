/*
 * h_leases.c - handlers of leases: POST /resources/{name}/leases, GET and DELETE
 * /leases/{id}, POST /leases/{id}/renew.
 *
 * Every one is answered by the engine thread (lib/lease.c) and waits for it without
 * holding an HTTP thread (wait.c). An acquisition may wait up to wait_ms in the
 * resource's queue, on a suspended connection, which libmicrohttpd does not watch: a
 * client that goes away meanwhile is noticed here, by a thread that polls the sockets of
 * the waiting acquisitions (every WATCH_MS) and tells the engine, which takes the request
 * out of the queue unless it was granted first. A grant whose client is found gone when
 * its answer is built, or whose answer could not be sent, is released at once: giving
 * up is atomic, a lease is never left holding the resource for nobody.
 */
#include "server.h"

#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define WATCH_MS    100
#define MAX_WATCHED 4096

/* ---- the watch of waiting acquisitions ---- */

typedef struct watched {
	request *r;
	int fd;
	char id[48];
} watched;

static struct {
	pthread_mutex_t mu;
	watched v[MAX_WATCHED];
	int n;
	pthread_t thread;
	int started, stop;
	baton_engine *engine;
} watch = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* 1 when the peer of fd has closed or reset its side. */
int srv_peer_gone(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
	if (fd < 0 || poll(&p, 1, 0) <= 0)
		return 0;
	if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))
		return 1;
	char c;
	return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

static void *watch_main(void *arg)
{
	(void)arg;
	pthread_setname_np(pthread_self(), "baton-leasewatch");
	for (;;) {
		struct timespec ts = {0, WATCH_MS * 1000000L};
		nanosleep(&ts, NULL);
		pthread_mutex_lock(&watch.mu);
		if (watch.stop) {
			pthread_mutex_unlock(&watch.mu);
			return NULL;
		}
		for (int i = 0; i < watch.n;) {
			if (!srv_peer_gone(watch.v[i].fd)) {
				i++;
				continue;
			}
			baton_lease_left(watch.engine, watch.v[i].id, watch.v[i].r);
			watch.v[i] = watch.v[--watch.n];
		}
		pthread_mutex_unlock(&watch.mu);
	}
}

int srv_conn_fd(struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *ci =
	    MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	return ci ? ci->connect_fd : -1;
}

/* Under watch.mu. */
static void watch_add_locked(srv *s, request *r, const char *id)
{
	if (!watch.started) {
		watch.engine = s->engine;
		watch.started = pthread_create(&watch.thread, NULL, watch_main, NULL) == 0;
	}
	if (watch.n < MAX_WATCHED) {
		watch.v[watch.n] = (watched){.r = r, .fd = srv_conn_fd(r->conn)};
		snprintf(watch.v[watch.n].id, sizeof watch.v[watch.n].id, "%s", id);
		watch.n++;
	}
}

static void watch_del(request *r)
{
	pthread_mutex_lock(&watch.mu);
	for (int i = 0; i < watch.n; i++)
		if (watch.v[i].r == r) {
			watch.v[i] = watch.v[--watch.n];
			break;
		}
	pthread_mutex_unlock(&watch.mu);
}

void srv_leases_stop(srv *s)
{
	baton_lease_stop(s->engine);
	pthread_mutex_lock(&watch.mu);
	int started = watch.started;
	watch.stop = 1;
	pthread_mutex_unlock(&watch.mu);
	if (started)
		pthread_join(watch.thread, NULL);
	watch.started = 0;
	watch.stop = 0;
}

/* ---- answers ---- */

/* What the engine answered (the request's wait data). */
typedef struct lease_answer {
	int rc, created, acquire;
	json_t *lease;
	char why[512];
	int64_t wait_ms;
	int forwarded; /* passed on to the node that drives the resource: its answer in fwd */
	srv_forward fwd;
	char resource[130]; /* a new limit for it (PUT /resources/{name}): answered with it */
} lease_answer;

/* The engine thread's answer: recorded, and the connection resumed. */
static void on_lease(void *ud, int rc, int created, json_t *lease, const char *why)
{
	request *r = ud;
	lease_answer *a = r->wait.data;
	if (a->acquire)
		watch_del(r);
	if (srv_forward_refused(r, rc, lease, &a->fwd, a->wait_ms, a->acquire && a->wait_ms > 0,
				&a->forwarded)) {
		json_decref(lease); /* answered by forward.c's thread */
		return;
	}
	a->rc = rc;
	a->created = created;
	a->lease = lease;
	snprintf(a->why, sizeof a->why, "%s", why ? why : "");
	srv_wait_done(r);
}

/* The attempt that an acquisition's answer tells "you hold it" (201, or 200 to a retry): the
 * one its give-back names when the answer cannot be delivered; 0 for any other answer. */
static int64_t held_attempt(const json_t *lease)
{
	const char *state = json_string_value(json_object_get(lease, "state"));
	json_int_t attempt = json_integer_value(json_object_get(lease, "attempt"));
	return state && strcmp(state, "held") == 0 && attempt > 0 ? attempt : 0;
}

static void give_back(srv *s, const char *id, int64_t attempt)
{
	baton_error err;
	baton_lease_give_back(s->engine, id, attempt, NULL, NULL, &err);
}

/* A lease granted or waiting at the node that drives it: its renewals and release through
 * this node go there with no read of the store (baton_lease_note). Returns the attempt that
 * the answer tells "you hold it" (held_attempt), and its id in id. */
static int64_t note_relayed(srv *s, const char *text, char id[48])
{
	json_t *lease = json_loads(text, 0, NULL);
	baton_lease_note(s->engine, json_string_value(json_object_get(lease, "id")),
			 json_string_value(json_object_get(lease, "resource")));
	snprintf(id, 48, "%.47s",
		 json_string_value(json_object_get(lease, "id"))
		     ? json_string_value(json_object_get(lease, "id"))
		     : "");
	int64_t attempt = held_attempt(lease);
	json_decref(lease);
	return attempt;
}

/* The answer of the node that drives the resource, relayed. A grant for a client that has
 * gone is given back there at once, naming its attempt, as answered does here. */
static int relayed(srv *s, request *r, lease_answer *a, response *out)
{
	int status = srv_forward_reply(&a->fwd, out);
	char id[48] = "";
	int64_t attempt = 0;
	if (a->acquire && (status == 200 || status == 201) && out->text)
		attempt = note_relayed(s, out->text, id);
	if (attempt && id[0]) {
		if (srv_peer_gone(r->fd)) {
			srv_forward_give_back(s, a->fwd.url, r->authorization, id, attempt);
			srv_forward_fini(&a->fwd);
			free(out->text);
			out->text = NULL;
			out->location[0] = 0;
			return reply_problem(
			    out, 409,
			    "the client closed its side of the connection before the"
			    " grant could be answered: the lease was released");
		}
		snprintf(r->lease_granted, sizeof r->lease_granted, "%s", id);
		snprintf(r->granted_by, sizeof r->granted_by, "%s", a->fwd.url);
		r->granted_attempt = attempt;
	}
	srv_forward_fini(&a->fwd);
	return status;
}

/* The answer on an HTTP thread. */
static int answered(srv *s, request *r, void *data, response *out)
{
	lease_answer *a = data;
	if (a->forwarded)
		return relayed(s, r, a, out);
	json_t *lease = a->lease;
	a->lease = NULL;
	if (a->rc) {
		baton_error err = {.code = a->rc};
		snprintf(err.msg, sizeof err.msg, "%s", a->why);
		reply_error(out, &err);
		if (a->rc == BATON_ECONFLICT && lease && out->body) /* who holds it */
			json_object_update(out->body, lease);
		srv_driven_by(a->rc, lease, out);
		json_decref(lease);
		return out->status;
	}
	const char *id = json_string_value(json_object_get(lease, "id"));
	int64_t attempt = a->acquire && !a->rc ? held_attempt(lease) : 0;
	if (attempt && id) {
		if (srv_peer_gone(srv_conn_fd(r->conn))) {
			/* Granted to a client that closed its side: given back at once. One that
			 * only half-closed still reads this answer, which must say so. */
			give_back(s, id, attempt);
			json_decref(lease);
			return reply_problem(
			    out, 409,
			    "the client closed its side of the connection before the"
			    " grant could be answered: the lease was released");
		}
		snprintf(r->lease_granted, sizeof r->lease_granted, "%s", id);
		r->granted_attempt = attempt;
		if (a->created)
			snprintf(out->location, sizeof out->location, "/leases/%s", id);
	}
	if (a->resource[0]) { /* the limit is durable: the resource as it is now */
		json_t *res;
		baton_error err = {0};
		if (baton_engine_resource(s->engine, a->resource, &res, &err))
			return reply_error(out, &err);
		return reply_json(out, 200, res);
	}
	if (!lease)
		return reply_problem(out, 500, "no lease in the engine's answer");
	if (strcmp(r->method, "DELETE") == 0) {
		json_decref(lease);
		out->status = 204;
		return 204;
	}
	return reply_json(out, a->acquire && a->created ? 201 : 200, lease);
}

/* The answer dropped unsent (its connection closed first): a lease granted to nobody is
 * given back at once, as answered does for a client that left. */
static void dropped(srv *s, void *data)
{
	lease_answer *a = data;
	if (a->forwarded) {
		json_t *lease = a->acquire && (a->fwd.status == 200 || a->fwd.status == 201)
				    ? json_loadb(a->fwd.body, a->fwd.body_len, 0, NULL)
				    : NULL;
		const char *id = json_string_value(json_object_get(lease, "id"));
		if (id && held_attempt(lease))
			srv_forward_give_back(s, a->fwd.url, srv_forward_auth(&a->fwd), id,
					      held_attempt(lease));
		json_decref(lease);
		srv_forward_fini(&a->fwd);
		return;
	}
	const char *id = json_string_value(json_object_get(a->lease, "id"));
	int64_t attempt = !a->rc && a->acquire ? held_attempt(a->lease) : 0;
	if (attempt && id)
		give_back(s, id, attempt);
	json_decref(a->lease);
	a->lease = NULL;
}

void srv_lease_unsent(srv *s, request *r)
{
	if (r->lease_granted[0] && r->granted_by[0])
		srv_forward_give_back(s, r->granted_by, r->authorization, r->lease_granted,
				      r->granted_attempt);
	else if (r->lease_granted[0])
		give_back(s, r->lease_granted, r->granted_attempt);
}

static lease_answer *begin(srv *s, request *r, int acquire, int64_t wait_ms, response *out)
{
	lease_answer *a = calloc(1, sizeof *a);
	if (!a) {
		reply_problem(out, 500, "out of memory");
		return NULL;
	}
	a->acquire = acquire;
	a->wait_ms = wait_ms;
	if (srv_wait_begin(s, r, a, answered, out))
		return NULL;
	srv_wait_on_discard(r, dropped);
	return a;
}

int body_field_int(const json_t *body, const char *key, long long lo, long long hi, int64_t *v,
		   response *out)
{
	const json_t *j = json_object_get(body, key);
	if (!j)
		return 0;
	if (!json_is_integer(j) || json_integer_value(j) < lo || json_integer_value(j) > hi)
		return reply_problem(out, 400, "%s: a whole number from %lld to %lld", key, lo, hi);
	*v = json_integer_value(j);
	return 0;
}

int body_field_bool(const json_t *body, const char *key, int *v, response *out)
{
	const json_t *j = json_object_get(body, key);
	if (!j)
		return 0;
	if (!json_is_boolean(j))
		return reply_problem(out, 400, "%s: true or false", key);
	*v = json_is_true(j);
	return 0;
}

int body_field_str(const json_t *body, const char *key, const char **v, response *out)
{
	const json_t *j = json_object_get(body, key);
	if (!j)
		return 0;
	if (!json_is_string(j))
		return reply_problem(out, 400, "%s: a string", key);
	*v = json_string_value(j);
	return 0;
}

int body_only_fields(const json_t *body, const char *const *keys, response *out)
{
	const char *key;
	json_t *v;
	if (!json_is_object(body))
		return reply_problem(out, 400, "the body must be a JSON object");
	json_object_foreach((json_t *)body, key, v)
	{
		int known = 0;
		for (const char *const *k = keys; *k && !known; k++)
			known = strcmp(key, *k) == 0;
		if (!known)
			return reply_problem(out, 400, "unknown field \"%.64s\"", key);
	}
	return 0;
}

/* An optional body (absent or empty: {}). */
int body_optional_body(const request *r, response *out, json_t **body)
{
	if (r->body_len == 0) {
		*body = json_object();
		return 0;
	}
	return read_json_body(r, out, body);
}

int h_lease_acquire(srv *s, const request *cr, const char *const *p, response *out)
{
	static const char *const keys[] = {"holder",	 "ttl_ms",    "wait_ms",
					   "request_id", "exclusive", NULL};
	request *r = (request *)cr;
	json_t *body;
	if (body_optional_body(r, out, &body))
		return out->status;
	baton_lease_request req = {
	    .resource = p[0], .holder = "anonymous", .ttl_ms = 15000, .wait_ms = 0};
	if (body_only_fields(body, keys, out) || body_field_str(body, "holder", &req.holder, out) ||
	    body_field_str(body, "request_id", &req.request_id, out) ||
	    body_field_int(body, "ttl_ms", 1000, 86400000, &req.ttl_ms, out) ||
	    body_field_int(body, "wait_ms", 0, 300000, &req.wait_ms, out) ||
	    body_field_bool(body, "exclusive", &req.exclusive, out)) {
		json_decref(body);
		return out->status;
	}
	lease_answer *a = begin(s, r, 1, req.wait_ms, out);
	if (!a) {
		json_decref(body);
		return out->status;
	}
	char id[48];
	baton_error err = {0};
	/* Watched before the engine can answer (on_lease's watch_del waits for watch.mu). */
	pthread_mutex_lock(&watch.mu);
	int rc = baton_lease_acquire(s->engine, &req, on_lease, r, id, &err);
	if (rc == BATON_OK && req.wait_ms > 0)
		watch_add_locked(s, r, id);
	pthread_mutex_unlock(&watch.mu);
	json_decref(body);
	if (rc) {
		srv_wait_cancel(s, r);
		return reply_error(out, &err);
	}
	return srv_wait_suspend(s, r, out);
}

typedef int (*lease_call)(baton_engine *e, const char *id, int64_t ttl_ms, baton_lease_fn done,
			  void *ud, baton_error *err);

static int call_get(baton_engine *e, const char *id, int64_t ttl, baton_lease_fn done, void *ud,
		    baton_error *err)
{
	(void)ttl;
	return baton_lease_get(e, id, done, ud, err);
}

static int call_release(baton_engine *e, const char *id, int64_t ttl, baton_lease_fn done, void *ud,
			baton_error *err)
{
	(void)ttl;
	return baton_lease_release(e, id, done, ud, err);
}

static int lease_op(srv *s, request *r, const char *id, int64_t ttl_ms, lease_call call,
		    response *out)
{
	if (!begin(s, r, 0, 0, out))
		return out->status;
	baton_error err = {0};
	if (call(s->engine, id, ttl_ms, on_lease, r, &err)) {
		srv_wait_cancel(s, r);
		return reply_error(out, &err);
	}
	return srv_wait_suspend(s, r, out);
}

int h_lease_get(srv *s, const request *r, const char *const *p, response *out)
{
	return lease_op(s, (request *)r, p[0], 0, call_get, out);
}

static int call_give_back(baton_engine *e, const char *id, int64_t attempt, baton_lease_fn done,
			  void *ud, baton_error *err)
{
	return baton_lease_give_back(e, id, attempt, done, ud, err);
}

/* DELETE /leases/{id}: the holder's release; with ?attempt=N, the give-back of the grant
 * answered to that attempt (another node passes on one it could not deliver). */
int h_lease_release(srv *s, const request *r, const char *const *p, response *out)
{
	if (!query_arg(r, "attempt"))
		return lease_op(s, (request *)r, p[0], 0, call_release, out);
	long long attempt = 0;
	if (query_int(r, "attempt", 1, LLONG_MAX, &attempt, out))
		return out->status;
	return lease_op(s, (request *)r, p[0], attempt, call_give_back, out);
}

int h_lease_renew(srv *s, const request *r, const char *const *p, response *out)
{
	static const char *const keys[] = {"ttl_ms", NULL};
	json_t *body;
	int64_t ttl = 0;
	if (body_optional_body(r, out, &body))
		return out->status;
	int bad = body_only_fields(body, keys, out) ||
		  body_field_int(body, "ttl_ms", 1000, 86400000, &ttl, out);
	json_decref(body);
	if (bad)
		return out->status;
	return lease_op(s, (request *)r, p[0], ttl, baton_lease_renew, out);
}

/* PUT /resources/{name} {"limit": N}: answered with the resource once the limit is durable,
 * by the node that drives it (passed on as a lease call is). */
int h_resource_put(srv *s, const request *cr, const char *const *p, response *out)
{
	static const char *const keys[] = {"limit", NULL};
	request *r = (request *)cr;
	json_t *body;
	if (read_json_body(r, out, &body))
		return out->status;
	int64_t limit = 0;
	int bad = body_only_fields(body, keys, out) ||
		  body_field_int(body, "limit", 1, 10000, &limit, out);
	json_decref(body);
	if (bad)
		return out->status;
	if (!limit)
		return reply_problem(out, 400,
				     "limit: is required (a whole number from 1 to 10000)");
	lease_answer *a = begin(s, r, 0, 0, out);
	if (!a)
		return out->status;
	snprintf(a->resource, sizeof a->resource, "%s", p[0]);
	baton_error err = {0};
	if (baton_resource_limit(s->engine, p[0], limit, on_lease, r, &err)) {
		srv_wait_cancel(s, r);
		return reply_error(out, &err);
	}
	return srv_wait_suspend(s, r, out);
}
