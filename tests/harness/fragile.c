/*
 * fragile.c - the fragile shared resource of the HTTP-call tests (see fragile.h).
 *
 * Design. libmicrohttpd runs one thread per connection, so two requests from two
 * holders would really be served at once; every check and every record change happens
 * under one mutex, and one condition variable (on CLOCK_MONOTONIC) is broadcast on every
 * change so that both the tests' waits and the delayed handlers wake promptly. The
 * overlap, fencing and duplicate checks are made when a request's headers arrive, in
 * arrival order, which is the order the resource sees. A request stops being in flight
 * just before its answer is queued (the next holder can only call once that answer has
 * left, so a correct client never trips the detector), or when its connection is closed.
 * A delayed handler polls its socket every few milliseconds (recv with MSG_PEEK) to learn
 * that the client went away: a SIGKILLed batond, or a libcurl timeout.
 */
#include "fragile.h"

#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define MAX_BODY     (1024 * 1024)
#define POLL_STEP_MS 5

struct fragile {
	struct MHD_Daemon *daemon;
	int port;
	pthread_mutex_t mu;
	pthread_cond_t cv; /* broadcast on every change */
	bool stopping;
	fragile_record **recs; /* stable pointers: handlers keep theirs */
	size_t n_recs, cap_recs;
	fragile_action *script; /* FIFO: script[head..n_script) */
	size_t head, n_script, cap_script;
	fragile_action def;
	char **keys; /* applied Idempotency-Keys, distinct */
	size_t n_keys, cap_keys;
	fragile_stats st;
	size_t gates_taken, gates_opened; /* gated requests so far, gates opened so far */
};

/* Per-request state, from the first callback to MHD_OPTION_NOTIFY_COMPLETED. */
typedef struct request {
	fragile_record *rec;
	char *body;
	size_t len;
	bool too_big;
	bool overlap, stale; /* the verdicts made at arrival */
	bool in_flight;	     /* still counted in st.in_flight */
} request;

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static char *dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

static void action_free(fragile_action *a)
{
	free((char *)a->retry_after);
	free((char *)a->location);
	free((char *)a->body);
	free((char *)a->content_type);
}

static fragile_action action_copy(fragile_action a)
{
	a.retry_after = dup_or_null(a.retry_after);
	a.location = dup_or_null(a.location);
	a.content_type = dup_or_null(a.content_type);
	if (a.body) {
		char *b = malloc(a.body_len + 1);
		memcpy(b, a.body, a.body_len);
		a.body = b;
	}
	return a;
}

const char *fragile_outcome_name(fragile_outcome o)
{
	static const char *const names[] = {"in flight", "answered",  "overlap", "stale",
					    "bad",	 "duplicate", "dropped", "client gone"};
	return (unsigned)o < sizeof names / sizeof names[0] ? names[o] : "?";
}

/* ---- records and the applied set (callers hold f->mu) ---------------------------- */

static bool is_applied(const fragile *f, const char *key)
{
	for (size_t i = 0; key && i < f->n_keys; i++)
		if (strcmp(f->keys[i], key) == 0)
			return true;
	return false;
}

static void apply(fragile *f, request *r)
{
	r->rec->applied = true;
	if (is_applied(f, r->rec->idempotency_key))
		return;
	if (f->n_keys == f->cap_keys) {
		f->cap_keys = f->cap_keys ? f->cap_keys * 2 : 64;
		f->keys = realloc(f->keys, f->cap_keys * sizeof *f->keys);
	}
	f->keys[f->n_keys++] = strdup(r->rec->idempotency_key);
	f->st.applied = f->n_keys;
}

/* Ends a request's time in flight with `outcome`; wakes every waiter. */
static void finish(fragile *f, request *r, fragile_outcome outcome, int status)
{
	fragile_record *rec = r->rec;
	rec->outcome = outcome;
	rec->status = status;
	rec->finished_ms = mono_ms();
	if (r->in_flight) {
		r->in_flight = false;
		f->st.in_flight--;
	}
	switch (outcome) {
	case FRAGILE_OVERLAP:
		f->st.overlaps++;
		break;
	case FRAGILE_STALE:
		f->st.stale++;
		break;
	case FRAGILE_BAD:
		f->st.bad++;
		break;
	case FRAGILE_DUPLICATE:
		f->st.duplicates++;
		break;
	case FRAGILE_DROPPED:
		f->st.dropped++;
		break;
	case FRAGILE_CLIENT_GONE:
		f->st.client_gone++;
		break;
	default:
		break;
	}
	pthread_cond_broadcast(&f->cv);
}

/* ---- the request's arrival --------------------------------------------------------- */

static enum MHD_Result add_header_line(void *cls, enum MHD_ValueKind kind, const char *key,
				       const char *value)
{
	char **text = cls;
	(void)kind;
	size_t old = *text ? strlen(*text) : 0;
	size_t add = strlen(key) + strlen(value ? value : "") + 3;
	char *t = realloc(*text, old + add + 1);
	if (!t)
		return MHD_NO;
	snprintf(t + old, add + 1, "%s: %s\n", key, value ? value : "");
	*text = t;
	return MHD_YES;
}

static char *header(struct MHD_Connection *c, const char *name)
{
	return dup_or_null(MHD_lookup_connection_value(c, MHD_HEADER_KIND, name));
}

static long long parse_token(const char *s)
{
	if (!s || !*s)
		return -1;
	char *end;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	return *end || errno || v < 0 ? -1 : v;
}

static fragile_record *new_record(struct MHD_Connection *c, const char *url, const char *method)
{
	fragile_record *rec = calloc(1, sizeof *rec);
	rec->method = strdup(method);
	rec->path = strdup(url);
	rec->idempotency_key = header(c, "Idempotency-Key");
	rec->fencing_token = header(c, "Baton-Fencing-Token");
	rec->workflow = header(c, "Baton-Workflow");
	rec->worker = header(c, "Baton-Worker");
	rec->attempt = header(c, "Baton-Attempt");
	rec->authorization = header(c, "Authorization");
	MHD_get_connection_values(c, MHD_HEADER_KIND, add_header_line, &rec->headers);
	if (!rec->headers)
		rec->headers = strdup("");
	rec->token = parse_token(rec->fencing_token);
	rec->arrived_ms = mono_ms();
	rec->outcome = FRAGILE_IN_FLIGHT;
	return rec;
}

/* Records the arrival, counts it in flight, judges it; returns the request state. */
static request *arrive(fragile *f, struct MHD_Connection *c, const char *url, const char *method)
{
	request *r = calloc(1, sizeof *r);
	r->rec = new_record(c, url, method);
	pthread_mutex_lock(&f->mu);
	if (f->n_recs == f->cap_recs) {
		f->cap_recs = f->cap_recs ? f->cap_recs * 2 : 64;
		f->recs = realloc(f->recs, f->cap_recs * sizeof *f->recs);
	}
	r->rec->seq = f->n_recs;
	f->recs[f->n_recs++] = r->rec;
	f->st.requests++;
	r->in_flight = true;
	if (++f->st.in_flight > f->st.max_in_flight)
		f->st.max_in_flight = f->st.in_flight;
	/* The checks made in arrival order, answered by the final call. */
	r->overlap = f->st.in_flight > 1;
	if (!r->overlap && r->rec->token >= 0) {
		r->stale = r->rec->token < f->st.max_token;
		if (!r->stale)
			f->st.max_token = r->rec->token;
	}
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
	return r;
}

/* ---- the answer --------------------------------------------------------------------- */

/* Whether the client closed its end (or the socket failed). */
static bool client_gone(struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *ci =
	    MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	if (!ci)
		return true;
	char byte;
	ssize_t n = recv(ci->connect_fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
	if (n > 0)
		return false;
	if (n == 0)
		return true;
	return !(errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
}

/*
 * Waits up to `ms`, or when `gate` is not NULL until gate number *gate is opened (f->mu
 * held), unless the server stops or the client goes away. Returns true when the client
 * went away.
 */
static bool hold(fragile *f, struct MHD_Connection *c, int ms, const size_t *gate)
{
	int64_t deadline = mono_ms() + ms;
	bool gone = false;
	f->st.held++;
	pthread_cond_broadcast(&f->cv);
	while (!f->stopping && !gone && (gate ? f->gates_opened <= *gate : mono_ms() < deadline)) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += POLL_STEP_MS * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&f->cv, &f->mu, &ts);
		gone = client_gone(c);
	}
	f->st.held--;
	return gone;
}

static fragile_action next_action(fragile *f)
{
	if (f->head < f->n_script)
		return f->script[f->head++];
	return f->def;
}

static char *answer_body(const fragile_record *rec, const char *what)
{
	json_t *j = json_pack("{s:s, s:s?, s:I, s:b}", "outcome", what, "key", rec->idempotency_key,
			      "token", (json_int_t)rec->token, "applied", rec->applied);
	char *text = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	return text;
}

/* Queues the answer (a's body when it has one, else the report); f->mu is held and is
 * released here. */
static enum MHD_Result respond(fragile *f, struct MHD_Connection *c, request *r,
			       fragile_outcome outcome, int status, const fragile_action *a)
{
	struct MHD_Response *resp;
	if (a && a->body) {
		char *copy = malloc(a->body_len + 1);
		memcpy(copy, a->body, a->body_len);
		resp = MHD_create_response_from_buffer(a->body_len, copy, MHD_RESPMEM_MUST_FREE);
		if (a->content_type)
			MHD_add_response_header(resp, "Content-Type", a->content_type);
	} else {
		char *text = answer_body(r->rec, fragile_outcome_name(outcome));
		resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
		MHD_add_response_header(resp, "Content-Type", "application/json");
	}
	if (a && a->retry_after)
		MHD_add_response_header(resp, "Retry-After", a->retry_after);
	if (a && a->location)
		MHD_add_response_header(resp, "Location", a->location);
	/* Out of flight before the answer can leave: the next holder calls only after it. */
	finish(f, r, outcome, status);
	pthread_mutex_unlock(&f->mu);
	enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, resp);
	MHD_destroy_response(resp);
	return ok;
}

/* Closes the connection without an answer; f->mu is held and is released here. */
static enum MHD_Result hang_up(fragile *f, request *r, fragile_outcome outcome)
{
	finish(f, r, outcome, 0);
	pthread_mutex_unlock(&f->mu);
	return MHD_NO;
}

static enum MHD_Result final_call(fragile *f, struct MHD_Connection *c, request *r)
{
	fragile_record *rec = r->rec;
	pthread_mutex_lock(&f->mu);
	rec->body = r->body ? r->body : strdup("");
	rec->body_len = r->len;
	r->body = NULL;
	if (r->overlap)
		return respond(f, c, r, FRAGILE_OVERLAP, 500, NULL);
	if (r->too_big)
		return respond(f, c, r, FRAGILE_BAD, 413, NULL);
	if (rec->token < 0 || !rec->idempotency_key || !*rec->idempotency_key)
		return respond(f, c, r, FRAGILE_BAD, 400, NULL);
	if (r->stale)
		return respond(f, c, r, FRAGILE_STALE, 409, NULL);
	if (is_applied(f, rec->idempotency_key))
		return respond(f, c, r, FRAGILE_DUPLICATE, 200, NULL);
	fragile_action a = next_action(f);
	if (a.drop) {
		apply(f, r);
		hold(f, c, a.delay_ms, NULL);
		return hang_up(f, r, FRAGILE_DROPPED);
	}
	size_t gate = a.gated ? f->gates_taken++ : 0;
	if (a.gated && hold(f, c, 0, &gate))
		return hang_up(f, r, FRAGILE_CLIENT_GONE);
	if (a.delay_ms > 0 && hold(f, c, a.delay_ms, NULL))
		return hang_up(f, r, FRAGILE_CLIENT_GONE);
	if (f->stopping)
		return hang_up(f, r, FRAGILE_CLIENT_GONE);
	if (a.status >= 200 && a.status < 300)
		apply(f, r);
	return respond(f, c, r, FRAGILE_ANSWERED, a.status, &a);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
				  const char *method, const char *version, const char *data,
				  size_t *data_size, void **con_cls)
{
	fragile *f = cls;
	(void)version;
	request *r = *con_cls;
	if (!r) {
		r = arrive(f, c, url, method);
		*con_cls = r;
		return MHD_YES;
	}
	if (*data_size) {
		if (!r->too_big && r->len + *data_size <= MAX_BODY) {
			r->body = realloc(r->body, r->len + *data_size + 1);
			memcpy(r->body + r->len, data, *data_size);
			r->len += *data_size;
			r->body[r->len] = 0;
		} else {
			r->too_big = true;
		}
		*data_size = 0;
		return MHD_YES;
	}
	return final_call(f, c, r);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	fragile *f = cls;
	request *r = *con_cls;
	(void)c;
	(void)toe;
	if (!r)
		return;
	pthread_mutex_lock(&f->mu);
	if (r->in_flight) /* the connection ended before the final call */
		finish(f, r, FRAGILE_CLIENT_GONE, 0);
	pthread_mutex_unlock(&f->mu);
	free(r->body);
	free(r);
	*con_cls = NULL;
}

/* ---- lifecycle ---------------------------------------------------------------------- */

fragile *fragile_open(void)
{
	fragile *f = calloc(1, sizeof *f);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&f->cv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&f->mu, NULL);
	f->def = (fragile_action){.status = 200};
	f->st.max_token = -1;
	struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	f->daemon = MHD_start_daemon(
	    MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL,
	    on_request, f, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
	    MHD_OPTION_NOTIFY_COMPLETED, on_completed, f, MHD_OPTION_END);
	const union MHD_DaemonInfo *info =
	    f->daemon ? MHD_get_daemon_info(f->daemon, MHD_DAEMON_INFO_BIND_PORT) : NULL;
	if (!info || info->port == 0) {
		fprintf(stderr, "fragile: cannot start the test resource on 127.0.0.1\n");
		fragile_close(f);
		return NULL;
	}
	f->port = info->port;
	return f;
}

void fragile_close(fragile *f)
{
	if (!f)
		return;
	pthread_mutex_lock(&f->mu);
	f->stopping = true;
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
	if (f->daemon)
		MHD_stop_daemon(f->daemon); /* joins every connection thread */
	for (size_t i = 0; i < f->n_recs; i++)
		fragile_records_free(f->recs[i], 1);
	free(f->recs);
	for (size_t i = 0; i < f->n_script; i++)
		action_free(&f->script[i]);
	free(f->script);
	action_free(&f->def);
	for (size_t i = 0; i < f->n_keys; i++)
		free(f->keys[i]);
	free(f->keys);
	pthread_cond_destroy(&f->cv);
	pthread_mutex_destroy(&f->mu);
	free(f);
}

int fragile_port(const fragile *f)
{
	return f->port;
}

char *fragile_url(const fragile *f, const char *path)
{
	char *url = NULL;
	if (asprintf(&url, "http://127.0.0.1:%d%s", f->port, path ? path : "") < 0)
		return NULL;
	return url;
}

void fragile_push(fragile *f, fragile_action a)
{
	pthread_mutex_lock(&f->mu);
	if (f->n_script == f->cap_script) {
		f->cap_script = f->cap_script ? f->cap_script * 2 : 16;
		f->script = realloc(f->script, f->cap_script * sizeof *f->script);
	}
	f->script[f->n_script++] = action_copy(a);
	pthread_mutex_unlock(&f->mu);
}

void fragile_set_default(fragile *f, fragile_action a)
{
	fragile_action copy = action_copy(a);
	pthread_mutex_lock(&f->mu);
	fragile_action old = f->def;
	f->def = copy;
	pthread_mutex_unlock(&f->mu);
	action_free(&old);
}

/* ---- what the tests read ----------------------------------------------------------- */

void fragile_open_gate(fragile *f)
{
	pthread_mutex_lock(&f->mu);
	f->gates_opened++;
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
}

void fragile_get_stats(fragile *f, fragile_stats *out)
{
	pthread_mutex_lock(&f->mu);
	*out = f->st;
	pthread_mutex_unlock(&f->mu);
}

static void copy_record(fragile_record *dst, const fragile_record *src)
{
	*dst = *src;
	dst->method = dup_or_null(src->method);
	dst->path = dup_or_null(src->path);
	dst->idempotency_key = dup_or_null(src->idempotency_key);
	dst->fencing_token = dup_or_null(src->fencing_token);
	dst->workflow = dup_or_null(src->workflow);
	dst->worker = dup_or_null(src->worker);
	dst->attempt = dup_or_null(src->attempt);
	dst->authorization = dup_or_null(src->authorization);
	dst->headers = dup_or_null(src->headers);
	if (src->body) {
		dst->body = malloc(src->body_len + 1);
		memcpy(dst->body, src->body, src->body_len + 1);
	} else {
		dst->body = strdup(""); /* still being received */
		dst->body_len = 0;
	}
}

fragile_record *fragile_records(fragile *f, size_t *n)
{
	pthread_mutex_lock(&f->mu);
	*n = f->n_recs;
	fragile_record *out = *n ? calloc(*n, sizeof *out) : NULL;
	for (size_t i = 0; i < *n; i++)
		copy_record(&out[i], f->recs[i]);
	pthread_mutex_unlock(&f->mu);
	return out;
}

void fragile_records_free(fragile_record *r, size_t n)
{
	for (size_t i = 0; r && i < n; i++) {
		free(r[i].method);
		free(r[i].path);
		free(r[i].idempotency_key);
		free(r[i].fencing_token);
		free(r[i].workflow);
		free(r[i].worker);
		free(r[i].attempt);
		free(r[i].authorization);
		free(r[i].headers);
		free(r[i].body);
	}
	free(r);
}

bool fragile_applied(fragile *f, const char *key)
{
	pthread_mutex_lock(&f->mu);
	bool yes = is_applied(f, key);
	pthread_mutex_unlock(&f->mu);
	return yes;
}

typedef size_t (*counter_fn)(const fragile *f);

static size_t count_arrived(const fragile *f)
{
	return f->st.requests;
}

static size_t count_finished(const fragile *f)
{
	size_t n = 0;
	for (size_t i = 0; i < f->n_recs; i++)
		n += f->recs[i]->finished_ms != 0;
	return n;
}

static size_t count_held(const fragile *f)
{
	return f->st.held;
}

static size_t count_applied(const fragile *f)
{
	return f->n_keys;
}

static bool wait_for(fragile *f, counter_fn count, size_t n, int timeout_ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += timeout_ms / 1000;
	ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&f->mu);
	bool ok;
	while (!(ok = count(f) >= n))
		if (pthread_cond_timedwait(&f->cv, &f->mu, &ts) == ETIMEDOUT) {
			ok = count(f) >= n;
			break;
		}
	pthread_mutex_unlock(&f->mu);
	return ok;
}

bool fragile_wait_arrived(fragile *f, size_t n, int timeout_ms)
{
	return wait_for(f, count_arrived, n, timeout_ms);
}

bool fragile_wait_finished(fragile *f, size_t n, int timeout_ms)
{
	return wait_for(f, count_finished, n, timeout_ms);
}

bool fragile_wait_held(fragile *f, size_t n, int timeout_ms)
{
	return wait_for(f, count_held, n, timeout_ms);
}

bool fragile_wait_applied(fragile *f, size_t n, int timeout_ms)
{
	return wait_for(f, count_applied, n, timeout_ms);
}
