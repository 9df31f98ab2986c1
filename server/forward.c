/*
 * forward.c - lease and task requests that only another node can answer, passed on to it.
 *
 * A lease or an external task belongs to the node that drives its resource's partition
 * (lib/members.c). When the engine refuses a request because another node drives the
 * resource, it names that node and its --advertise-url (eng_refuse). The request is then
 * passed on to that node as it came (method, path, body, Authorization), with
 * "Baton-Forwarded: <this node's id>", and its answer is relayed as it came back: status,
 * body, Location, Retry-After. So every node serves every lease and task request with the
 * owner's own answer, and a client needs no idea of who drives what.
 *
 * One hop at most: a node does not pass on a request that was passed to it. When the
 * ownership moved in between, it answers 503 with Retry-After, and the client asks again.
 * A node that cannot reach the owner answers 503 as well. The answer promises nothing the
 * owner did not: a holder counts its ttl from when it sent its request, before the owner
 * granted or renewed, and the owner proves its ownership as for a client of its own.
 *
 * Exchanges run on a pool of threads that grows as needed (an acquisition or a claim may
 * wait up to 300 s on one) and shrinks when idle; each thread keeps its connections to
 * the other nodes alive. At most MAX_FORWARDS at once, 503 beyond. The client's connection stays
 * suspended meanwhile (wait.c), and a client that goes away from a waiting acquisition or
 * claim is noticed (its socket polled, as h_leases.c's watch does). The exchange is then
 * not cut but half-closed (baton_http_req.drain_ms): the owner sees its client gone, as for
 * a client of its own, and takes the request out of its queue or gives back a grant it
 * had not answered yet; and the answer is still read to its end (for up to DRAIN_MS), so
 * that a grant the owner wrote before it saw the half-close, which it counts as delivered,
 * is not lost unseen. Cutting instead left such a grant held for nobody until its ttl ran
 * out; a give-back by "the latest attempt sent" could undo a retry that reached the owner
 * through another node in between, while the answer names exactly the attempt to undo.
 * A grant that comes back for a client that has gone is given back at the owner
 * (h_leases.c) with DELETE /leases/{id}?attempt=N: the give-back names the attempt whose
 * answer was lost, so the owner tells it from the holder's own release and ignores it once
 * a retry of the same request_id has arrived. A claim so is given back at the owner with
 * POST /tasks/{id}/give-back {"claim_attempt": N} (h_tasks.c), under the same rule. Only an
 * owner that answers nothing within DRAIN_MS of the half-close has its exchange cut; it
 * then sees the connection closed before it answers.
 */
#include "server.h"

#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FORWARDS 256
#define IDLE_MS	     30000 /* a thread with nothing to pass on for this long ends */
#define DRAIN_MS     5000  /* the owner's answer read after the client left */

typedef struct job {
	request *r;
	srv_forward *f;
	char url[MAX_FORWARD_URL + 400];
	char auth[sizeof((srv_forward *)0)->auth];
	char by[200];
	char *body;
	size_t body_len;
	char method[16];
	int64_t timeout_ms;
	int fd; /* the client's socket, watched while a waiting request waits; -1: not */
	struct job *next;
} job;

/* The threads that pass requests on: each keeps its libcurl handle, and so its
 * connections to the other nodes, from one request to the next. */
static struct {
	pthread_mutex_t mu;
	pthread_cond_t work, ended;
	job *head, *tail;
	int threads, idle, busy; /* busy: jobs queued or under way */
	int stop;
	unsigned long long total, failed;
} fw = {.mu = PTHREAD_MUTEX_INITIALIZER,
	.work = PTHREAD_COND_INITIALIZER,
	.ended = PTHREAD_COND_INITIALIZER};

static int stopping(void)
{
	pthread_mutex_lock(&fw.mu);
	int stop = fw.stop;
	pthread_mutex_unlock(&fw.mu);
	return stop;
}

static int aborted(void *ud)
{
	const job *j = ud;
	return stopping() || (j->fd >= 0 && srv_peer_gone(j->fd));
}

/* One exchange; then r is answered (srv_wait_done). */
static void run(job *j, void **curl)
{
	const char *headers[4];
	int h = 0;
	headers[h++] = "Content-Type: application/json";
	if (j->auth[0])
		headers[h++] = j->auth;
	headers[h++] = j->by;
	headers[h] = NULL;
	baton_http_req q = {.method = j->method,
			    .url = j->url,
			    .headers = headers,
			    .body = j->body,
			    .body_len = j->body_len,
			    .timeout_ms = j->timeout_ms,
			    .aborted = aborted,
			    .ud = j,
			    .drain_ms = j->fd >= 0 ? DRAIN_MS : 0};
	baton_http_resp p;
	srv_forward *f = j->f;
	if (baton_http_exchange(curl, &q, &p) == 0) {
		f->status = p.status;
		f->body = p.body;
		f->body_len = p.body_len;
		snprintf(f->content_type, sizeof f->content_type, "%s", p.content_type);
		snprintf(f->location, sizeof f->location, "%s", p.location);
		f->retry_after = p.retry_after;
	} else {
		f->status = 0;
		snprintf(f->why, sizeof f->why, "%s", p.why);
	}
	pthread_mutex_lock(&fw.mu);
	fw.failed += f->status == 0;
	pthread_mutex_unlock(&fw.mu);
	srv_wait_done(j->r); /* r may be gone from here on */
}

static void *forward_main(void *arg)
{
	(void)arg;
	pthread_setname_np(pthread_self(), "baton-forward");
	void *curl = NULL;
	pthread_mutex_lock(&fw.mu);
	for (;;) {
		while (!fw.head && !fw.stop) {
			struct timespec until;
			clock_gettime(CLOCK_REALTIME, &until);
			until.tv_sec += IDLE_MS / 1000;
			fw.idle++;
			int rc = pthread_cond_timedwait(&fw.work, &fw.mu, &until);
			fw.idle--;
			if (rc && !fw.head)
				break; /* idle too long */
		}
		job *j = fw.head;
		if (!j)
			break;
		fw.head = j->next;
		if (!fw.head)
			fw.tail = NULL;
		pthread_mutex_unlock(&fw.mu);
		run(j, &curl);
		free(j->body);
		free(j);
		pthread_mutex_lock(&fw.mu);
		fw.busy--;
	}
	fw.threads--;
	pthread_cond_broadcast(&fw.ended);
	pthread_mutex_unlock(&fw.mu);
	baton_http_close(curl);
	return NULL;
}

int srv_forward_start(srv *s, request *r, srv_forward *f, const char *node, const char *url,
		      int64_t timeout_ms, int waits)
{
	memset(f, 0, sizeof *f);
	snprintf(f->node, sizeof f->node, "%s", node);
	snprintf(f->url, sizeof f->url, "%s", url ? url : "");
	if (r->authorization)
		snprintf(f->auth, sizeof f->auth, "Authorization: %s", r->authorization);
	if (r->forwarded_by || !url || !url[0])
		return -1;
	job *j = calloc(1, sizeof *j);
	char *body = r->body_len ? malloc(r->body_len) : NULL;
	if (!j || (r->body_len && !body)) {
		free(j);
		free(body);
		return -1;
	}
	if (body)
		memcpy(body, r->body, r->body_len);
	j->r = r;
	j->f = f;
	j->body = body;
	j->body_len = r->body_len;
	/* The one query a lease or task call passed on has: a give-back's attempt (checked). */
	const char *attempt = query_arg(r, "attempt");
	snprintf(j->url, sizeof j->url, "%s%s%s%s", url, r->path, attempt ? "?attempt=" : "",
		 attempt ? attempt : "");
	snprintf(j->method, sizeof j->method, "%s", r->method);
	snprintf(j->auth, sizeof j->auth, "%s", f->auth);
	snprintf(j->by, sizeof j->by, "Baton-Forwarded: %s", s->cfg->node_id);
	j->timeout_ms = timeout_ms;
	j->fd = waits ? r->fd : -1;
	pthread_mutex_lock(&fw.mu);
	int room = !fw.stop && fw.busy < MAX_FORWARDS;
	if (room) {
		fw.busy++;
		fw.total++;
		if (fw.tail)
			fw.tail->next = j;
		else
			fw.head = j;
		fw.tail = j;
		if (fw.idle > 0) {
			pthread_cond_signal(&fw.work);
		} else {
			pthread_t t;
			pthread_attr_t attr;
			pthread_attr_init(&attr);
			pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
			if (pthread_create(&t, &attr, forward_main, NULL) == 0) {
				fw.threads++;
			} else if (fw.threads == 0) { /* nobody would ever take it */
				fw.head = fw.tail = NULL;
				fw.busy--;
				fw.total--;
				room = 0;
			}
			pthread_attr_destroy(&attr);
		}
	}
	pthread_mutex_unlock(&fw.mu);
	if (room)
		return 0;
	snprintf(f->why, sizeof f->why, "no room to pass it on");
	free(j->body);
	free(j);
	return -1;
}

int srv_forward_refused(request *r, int rc, const json_t *answer, srv_forward *f, int64_t wait_ms,
			int waits, int *forwarded)
{
	*forwarded = srv_forwardable(rc, answer);
	if (*forwarded &&
	    srv_forward_start(r->wait.srv, r, f, json_string_value(json_object_get(answer, "node")),
			      json_string_value(json_object_get(answer, "url")),
			      wait_ms + FORWARD_SLACK_MS, waits) == 0)
		return 1;
	*forwarded = 0;
	return 0;
}

int srv_forward_reply(const srv_forward *f, response *out)
{
	if (f->status == 0) {
		reply_problem(out, 503,
			      "node %s drives this resource and could not be asked (%s); try again",
			      f->node, f->why);
		out->retry_after = 1;
		return out->status;
	}
	out->status = (int)f->status;
	if (f->body_len) {
		out->text = malloc(f->body_len + 1);
		if (!out->text)
			return reply_problem(out, 500, "out of memory");
		memcpy(out->text, f->body, f->body_len);
		out->text[f->body_len] = 0;
		out->content_type = strncmp(f->content_type, "application/problem+json", 24) == 0
					? "application/problem+json"
					: "application/json";
	}
	snprintf(out->location, sizeof out->location, "%s", f->location);
	out->retry_after = f->retry_after;
	return out->status;
}

void srv_forward_fini(srv_forward *f)
{
	free(f->body);
	f->body = NULL;
	f->body_len = 0;
}

/* One give-back sent to the node that answered (method url, body NULL: none). 0 when given
 * back, or when the owner found nothing to give back: 404, 410 (over), 409 (a later attempt
 * arrived, and the hold is that attempt's). */
static int give_back_at(srv *s, const char *method, const char *url, const char *body,
			const char *authorization)
{
	char by[200], auth[600] = "";
	snprintf(by, sizeof by, "Baton-Forwarded: %s", s->cfg->node_id);
	if (authorization)
		snprintf(auth, sizeof auth, "Authorization: %s", authorization);
	const char *headers[4] = {by};
	int h = 1;
	if (body)
		headers[h++] = "Content-Type: application/json";
	if (auth[0])
		headers[h++] = auth;
	baton_http_req q = {.method = method,
			    .url = url,
			    .headers = headers,
			    .body = body,
			    .body_len = body ? strlen(body) : 0,
			    .timeout_ms = 5000};
	baton_http_resp p;
	int rc = baton_http_exchange(NULL, &q, &p);
	free(p.body);
	return rc == 0 && (p.status == 204 || p.status == 404 || p.status == 409 || p.status == 410)
		   ? 0
		   : -1;
}

int srv_forward_give_back(srv *s, const char *base, const char *authorization, const char *id,
			  int64_t attempt)
{
	char url[MAX_FORWARD_URL + 400];
	snprintf(url, sizeof url, "%s/leases/%s?attempt=%lld", base, id, (long long)attempt);
	return give_back_at(s, "DELETE", url, NULL, authorization);
}

int srv_forward_claim_give_back(srv *s, const char *base, const char *authorization, const char *id,
				int64_t claim_attempt)
{
	char url[MAX_FORWARD_URL + 400], body[64];
	snprintf(url, sizeof url, "%s/tasks/%s/give-back", base, id);
	snprintf(body, sizeof body, "{\"claim_attempt\": %lld}", (long long)claim_attempt);
	return give_back_at(s, "POST", url, body, authorization);
}

const char *srv_forward_auth(const srv_forward *f)
{
	static const char prefix[] = "Authorization: ";
	return strncmp(f->auth, prefix, sizeof prefix - 1) == 0 ? f->auth + sizeof prefix - 1
								: NULL;
}

int srv_forwardable(int rc, const json_t *answer)
{
	const char *url = json_string_value(json_object_get(answer, "url"));
	return rc == BATON_EBUSY && json_string_value(json_object_get(answer, "node")) && url &&
	       url[0];
}

void srv_driven_by(int rc, json_t *answer, response *out)
{
	if (srv_forwardable(rc, answer) && out->body)
		json_object_set(out->body, "driven_by", answer);
}

void srv_forwards_stop(void)
{
	pthread_mutex_lock(&fw.mu);
	fw.stop = 1; /* for good: the engine refuses new requests from now on */
	pthread_cond_broadcast(&fw.work);
	while (fw.threads > 0)
		pthread_cond_wait(&fw.ended, &fw.mu);
	pthread_mutex_unlock(&fw.mu);
}

void srv_forward_counts(unsigned long long *total, unsigned long long *failed)
{
	pthread_mutex_lock(&fw.mu);
	*total = fw.total;
	*failed = fw.failed;
	pthread_mutex_unlock(&fw.mu);
}
