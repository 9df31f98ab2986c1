/*
 * sse.c - Server-Sent Events: GET /workflows/{id}/events and /resources/{name}/events
 * with Accept: text/event-stream (or ?follow=true).
 *
 * Design. A stream never holds a libmicrohttpd thread while it waits. Its response is
 * a content-reader callback: when it has nothing to send it suspends its connection
 * (MHD_suspend_connection, as libmicrohttpd documents for content readers) and returns
 * 0. The engine calls srv_streams_notify after every commit with the workflows and
 * resources that got events; the hub resumes the matching streams, whose reader then
 * fetches the new events from the database (a read connection, WAL: no writer waits).
 * A flag set under the hub's lock closes the race between "nothing new" and "suspend".
 * Every 15 s the hub wakes all streams to send a comment line, which keeps proxies from
 * closing them and lets a vanished client be noticed. Each event goes out as
 * "id: <seq>", "event: <type>", "data: <json>", so a client reconnecting with
 * Last-Event-ID resumes exactly after the last event it saw. A workflow's stream ends
 * after the workflow's final event.
 *
 * Memory. A stream's buffer holds what one fetch formatted and is not sent yet. A fetch
 * stops adding events once the buffer holds SOFT_BUFFER bytes (the rest come with the
 * next fetch). When the buffer cannot take a whole event (its allocation failed, or it
 * would pass --stream-buffer), the event is taken out again, the events before it are
 * sent, and the stream ends with an "error" event that has no id: the client reconnects
 * with Last-Event-ID set to the last event it received and gets the rest, each event
 * exactly once. No event is ever skipped.
 */
#include "server.h"

#include <limits.h>

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KEEPALIVE_MS 15000
#define FETCH	     1000 /* events read per step of a stream */
#define SOFT_BUFFER  (1024 * 1024)

/* Sent, from static memory, when the buffer could not take an event. */
static const char error_event[] =
    "event: error\ndata: {\"detail\":\"the server could not buffer the next event; reconnect"
    " with Last-Event-ID to resume after the last event received\"}\n\n";

typedef struct stream {
	srv *s;
	struct MHD_Connection *conn;
	int is_resource;
	char key[256]; /* workflow id or resource name */
	int64_t last_seq;
	char *buf; /* formatted, not yet sent */
	size_t len, off;
	int events;   /* events in buf */
	size_t max;   /* --stream-buffer */
	int finished; /* the final event is in buf */
	int failed;   /* an event did not fit: error_event follows buf, then the end */
	size_t error_off;
	/* under hub.mu */
	int suspended, dirty, keepalive;
	struct stream *prev, *next;
} stream;

static struct hub {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	stream *head;
	int closing;
	int count;
	pthread_t ticker;
	int ticker_started;
} hub = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0, 0, 0, 0};

static void wake_locked(stream *st)
{
	if (st->suspended) {
		st->suspended = 0;
		MHD_resume_connection(st->conn);
	} else {
		st->dirty = 1;
	}
}

void srv_streams_notify(void *ud, const baton_change *changes, size_t n)
{
	(void)ud;
	pthread_mutex_lock(&hub.mu);
	for (stream *st = hub.head; st; st = st->next) {
		for (size_t i = 0; i < n; i++) {
			const char *k =
			    st->is_resource ? changes[i].resource : changes[i].workflow_id;
			if (strcmp(k, st->key) == 0) {
				wake_locked(st);
				break;
			}
		}
	}
	pthread_mutex_unlock(&hub.mu);
}

/* Streams look at the store this often, as well as when this node commits (0: only then).
 * Another node of a cluster commits what this one streams: its commits wake nobody here. */
static int poll_ms;

static void *ticker_main(void *arg)
{
	(void)arg;
	int period = poll_ms ? poll_ms : KEEPALIVE_MS, ticks = 0;
	pthread_mutex_lock(&hub.mu);
	while (!hub.closing) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += period / 1000;
		ts.tv_nsec += (long)(period % 1000) * 1000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		if (pthread_cond_timedwait(&hub.cv, &hub.mu, &ts) != ETIMEDOUT)
			continue;
		int keepalive = ++ticks * period >= KEEPALIVE_MS;
		if (keepalive)
			ticks = 0;
		for (stream *st = hub.head; st; st = st->next) {
			st->keepalive |= keepalive;
			wake_locked(st);
		}
	}
	pthread_mutex_unlock(&hub.mu);
	return NULL;
}

int srv_streams_start(int poll_every_ms)
{
	poll_ms = poll_every_ms;
	/* The ticker's waits run on CLOCK_MONOTONIC: a step of the wall clock neither stalls
	 * the keep-alives nor bunches them. */
	pthread_condattr_t a;
	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_destroy(&hub.cv);
	pthread_cond_init(&hub.cv, &a);
	pthread_condattr_destroy(&a);
	if (pthread_create(&hub.ticker, NULL, ticker_main, NULL) != 0)
		return -1;
	hub.ticker_started = 1;
	return 0;
}

/* Ends every stream (they are resumed and see `closing`), so the daemon can stop. */
void srv_streams_close(void)
{
	pthread_mutex_lock(&hub.mu);
	hub.closing = 1;
	for (stream *st = hub.head; st; st = st->next)
		wake_locked(st);
	pthread_cond_broadcast(&hub.cv);
	pthread_mutex_unlock(&hub.mu);
	if (hub.ticker_started)
		pthread_join(hub.ticker, NULL);
	hub.ticker_started = 0;
}

int srv_streams_count(void)
{
	pthread_mutex_lock(&hub.mu);
	int n = hub.count;
	pthread_mutex_unlock(&hub.mu);
	return n;
}

/* 0, or -1 when the buffer cannot take n more bytes (out of memory). */
static int append(stream *st, const char *text, size_t n)
{
	char *b = realloc(st->buf, st->len + n + 1);
	if (!b)
		return -1;
	st->buf = b;
	memcpy(st->buf + st->len, text, n);
	st->len += n;
	st->buf[st->len] = 0;
	return 0;
}

/*
 * Formats one event into the buffer, whole or not at all: -1 when it is out of memory, or
 * when the buffer already holds an event and this one would take it past --stream-buffer
 * (the first event always gets its chance, so that a stream always moves on).
 */
static int append_event(stream *st, int64_t seq, const char *type, const json_t *ev)
{
	size_t dlen, before = st->len;
	char *data = baton_json_text(ev, 0, &dlen);
	char head[160];
	int n = snprintf(head, sizeof head, "id: %lld\nevent: %s\ndata: ", (long long)seq, type);
	int over = st->events && st->len + (size_t)n + dlen + 3 > st->max;
	int rc = data && !over && n > 0 && (size_t)n < sizeof head &&
			 !append(st, head, (size_t)n) && !append(st, data, dlen) &&
			 !append(st, "\n\n", 2)
		     ? 0
		     : -1;
	free(data);
	if (rc) {
		st->len = before;
		if (st->buf)
			st->buf[before] = 0;
	} else {
		st->events++;
	}
	return rc;
}

static int is_final(const char *type)
{
	return strcmp(type, "workflow_completed") == 0 || strcmp(type, "workflow_failed") == 0 ||
	       strcmp(type, "workflow_cancelled") == 0;
}

/* Reads events after last_seq into the buffer; returns -1 on a read error. */
static int fetch(stream *st)
{
	json_t *out = NULL;
	baton_error err = {0};
	int rc = st->is_resource
		     ? baton_engine_resource_events(st->s->engine, st->key, st->last_seq, FETCH,
						    &out, &err)
		     : baton_engine_events(st->s->engine, st->key, st->last_seq, FETCH, &out, &err);
	if (rc)
		return -1;
	size_t i;
	json_t *ev;
	json_t *events = json_object_get(out, "events");
	const char *status = json_string_value(json_object_get(out, "status"));
	if (!st->is_resource && json_array_size(events) == 0 && status &&
	    (strcmp(status, "completed") == 0 || strcmp(status, "failed") == 0 ||
	     strcmp(status, "cancelled") == 0))
		st->finished = 1; /* resumed after the final event: nothing more will come */
	json_array_foreach(events, i, ev)
	{
		if (st->len >= SOFT_BUFFER)
			break; /* the rest come with the next fetch */
		const char *type = json_string_value(json_object_get(ev, "type"));
		int64_t seq = json_integer_value(json_object_get(ev, "seq"));
		if (append_event(st, seq, type ? type : "", ev)) {
			st->failed = 1;
			break;
		}
		st->last_seq = seq;
		if (!st->is_resource && is_final(type ? type : ""))
			st->finished = 1;
	}
	json_decref(out);
	return 0;
}

static ssize_t reader(void *cls, uint64_t pos, char *buf, size_t max)
{
	stream *st = cls;
	(void)pos;
	for (;;) {
		if (st->off < st->len) {
			size_t n = st->len - st->off;
			if (n > max)
				n = max;
			memcpy(buf, st->buf + st->off, n);
			st->off += n;
			if (st->off == st->len)
				st->off = st->len = 0, st->events = 0;
			return (ssize_t)n;
		}
		if (st->failed) {
			size_t n = sizeof error_event - 1 - st->error_off;
			if (n == 0)
				return MHD_CONTENT_READER_END_OF_STREAM;
			n = n > max ? max : n;
			memcpy(buf, error_event + st->error_off, n);
			st->error_off += n;
			return (ssize_t)n;
		}
		if (st->finished)
			return MHD_CONTENT_READER_END_OF_STREAM;
		pthread_mutex_lock(&hub.mu);
		int closing = hub.closing, keepalive = st->keepalive;
		st->dirty = 0;
		st->keepalive = 0;
		pthread_mutex_unlock(&hub.mu);
		if (closing)
			return MHD_CONTENT_READER_END_OF_STREAM;
		if (fetch(st) != 0)
			return MHD_CONTENT_READER_END_WITH_ERROR;
		if (st->len || st->finished || st->failed)
			continue;
		if (keepalive) {
			if (append(st, ": keepalive\n\n", 13))
				st->failed = 1;
			continue;
		}
		pthread_mutex_lock(&hub.mu);
		if (st->dirty || st->keepalive || hub.closing) {
			pthread_mutex_unlock(&hub.mu);
			continue;
		}
		st->suspended = 1;
		MHD_suspend_connection(st->conn);
		pthread_mutex_unlock(&hub.mu);
		return 0;
	}
}

static void stream_free(void *cls)
{
	stream *st = cls;
	pthread_mutex_lock(&hub.mu);
	if (st->prev)
		st->prev->next = st->next;
	else
		hub.head = st->next;
	if (st->next)
		st->next->prev = st->prev;
	hub.count--;
	pthread_mutex_unlock(&hub.mu);
	free(st->buf);
	free(st);
}

int srv_wants_stream(const request *r)
{
	const char *follow = query_arg(r, "follow");
	const char *accept =
	    MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT);
	return (follow && strcmp(follow, "true") == 0) ||
	       (accept && strcasestr(accept, "text/event-stream"));
}

/* Starts a stream after `after` (or Last-Event-ID); the key was checked to exist. */
int srv_stream_start(srv *s, const request *r, int is_resource, const char *key, int64_t after,
		     response *out)
{
	const char *last = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Last-Event-ID");
	long long v;
	if (last) {
		if (srv_parse_int(last, 0, LLONG_MAX, &v))
			return reply_problem(out, 400, "Last-Event-ID: must be an event id (seq)");
		after = v;
	}
	if (strcmp(r->method, "HEAD") == 0) {
		/* The head of the stream without the stream: nothing to suspend for. */
		out->status = 200;
		out->content_type = "text/event-stream";
		return 200;
	}
	stream *st = calloc(1, sizeof *st);
	if (!st)
		return reply_problem(out, 500, "out of memory");
	st->s = s;
	st->conn = r->conn;
	st->is_resource = is_resource;
	snprintf(st->key, sizeof st->key, "%s", key);
	st->last_seq = after;
	st->max = (size_t)s->cfg->stream_buffer;
	if (append(st, "retry: 1000\n\n", 13))
		st->failed = 1;
	pthread_mutex_lock(&hub.mu);
	st->next = hub.head;
	if (hub.head)
		hub.head->prev = st;
	hub.head = st;
	hub.count++;
	pthread_mutex_unlock(&hub.mu);
	out->stream =
	    MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, reader, st, stream_free);
	if (!out->stream) {
		stream_free(st);
		return reply_problem(out, 500, "out of memory");
	}
	out->status = 200;
	out->content_type = "text/event-stream";
	return 200;
}
