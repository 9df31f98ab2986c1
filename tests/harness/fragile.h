/*
 * fragile.h - a fragile shared resource for the HTTP-call tests: an in-process HTTP
 * server (libmicrohttpd, one thread per connection, so overlapping requests really
 * overlap) on 127.0.0.1, port 0, that batond calls while a step holds the resource.
 *
 * It is the oracle of the tests, so it checks what a real fragile resource needs:
 *  - one request at a time: a request that arrives while another is in flight is an
 *    overlap; it is recorded and answered 500;
 *  - fencing: a Baton-Fencing-Token lower than the highest seen so far is stale and is
 *    answered 409 (a missing or malformed token or Idempotency-Key is answered 400);
 *  - idempotency: an operation is applied when its request is answered 2xx (or dropped,
 *    see below); a later request with the Idempotency-Key of an applied operation is a
 *    duplicate, answered 200 at once without applying anything again.
 * A request that passes those checks takes the next scripted action, if any (the script
 * is a FIFO queue), else the default action (200 at once unless fragile_set_default).
 * An action answers `status` (with Retry-After and Location when given, and its own body
 * and Content-Type when given) after `delay_ms`,
 * or drops the answer: the operation is applied and the connection is then held for
 * `delay_ms` and closed without an answer (a lost answer). A request is in flight from
 * the arrival of its headers until its answer is queued, or until its connection is
 * closed; a client that goes away while its request is delayed or held ends the wait
 * (the request is then "client gone", and a delayed answer is not applied).
 *
 * Every request is recorded. All functions are thread-safe; every wait is bounded (a
 * delay or hold also ends when the server is closed). Times are CLOCK_MONOTONIC ms.
 */
#ifndef BATON_TEST_FRAGILE_H
#define BATON_TEST_FRAGILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct fragile fragile;

typedef enum fragile_outcome {
	FRAGILE_IN_FLIGHT,   /* not finished yet */
	FRAGILE_ANSWERED,    /* answered with its action's status */
	FRAGILE_OVERLAP,     /* arrived while another request was in flight: 500 */
	FRAGILE_STALE,	     /* fencing token below the highest seen: 409 */
	FRAGILE_BAD,	     /* no usable Idempotency-Key or fencing token, or too big: 400/413 */
	FRAGILE_DUPLICATE,   /* key already applied: 200, nothing applied again */
	FRAGILE_DROPPED,     /* applied, then closed without an answer */
	FRAGILE_CLIENT_GONE, /* the client left while its answer was delayed: not applied */
} fragile_outcome;

typedef struct fragile_action {
	int status;		 /* HTTP status to answer; ignored when drop */
	const char *retry_after; /* Retry-After value, or NULL */
	const char *location;	 /* Location value, or NULL */
	int delay_ms;		 /* wait before answering (drop: how long to hold) */
	bool drop;		 /* apply, hold delay_ms, close without answering */
	/* The answer's body and Content-Type: when body is NULL, the resource's own JSON
	 * report (application/json); else these body_len bytes (any bytes, NULs included)
	 * with content_type, or no Content-Type header when it is NULL. */
	const char *body;
	size_t body_len;
	const char *content_type;
	/* Hold the request (in flight, counted as held) until the test opens its gate with
	 * fragile_open_gate, before delay_ms: a step that cannot end before the test saw what
	 * it wanted to see, whatever the machine's speed. */
	bool gated;
} fragile_action;

/* One request as the resource saw it. Strings are NULL when the header was absent. */
typedef struct fragile_record {
	size_t seq; /* arrival order, from 0 */
	char *method, *path;
	char *idempotency_key, *fencing_token, *workflow, *worker, *attempt, *authorization;
	char *headers; /* every request header, one "Name: value\n" line each */
	char *body;    /* NUL-terminated, "" when empty */
	size_t body_len;
	long long token; /* Baton-Fencing-Token as a number, -1 when missing or malformed */
	int64_t arrived_ms, finished_ms; /* finished_ms is 0 while in flight */
	int status;			 /* status answered, 0 when none */
	bool applied;			 /* this request applied its operation */
	fragile_outcome outcome;
} fragile_record;

typedef struct fragile_stats {
	size_t requests;      /* arrived so far */
	size_t in_flight;     /* now */
	size_t max_in_flight; /* ever */
	size_t overlaps, stale, bad, duplicates, dropped, client_gone;
	size_t applied;	     /* distinct Idempotency-Keys applied (the deduplicated set) */
	size_t held;	     /* requests now waiting in a delay or a drop hold */
	long long max_token; /* highest fencing token seen, -1 before any */
} fragile_stats;

/* Starts the server on 127.0.0.1 with an ephemeral port. NULL (after printing why) on failure. */
fragile *fragile_open(void);

/* Stops the server (ending every delay and hold), frees everything. Accepts NULL. */
void fragile_close(fragile *f);

/* The bound port (MHD_DAEMON_INFO_BIND_PORT). */
int fragile_port(const fragile *f);

/* "http://127.0.0.1:PORT" followed by `path` ("/op"); the caller frees it. */
char *fragile_url(const fragile *f, const char *path);

/* Appends `a` to the script (strings copied). */
void fragile_push(fragile *f, fragile_action a);

/* The action of requests once the script is empty (strings copied). */
void fragile_set_default(fragile *f, fragile_action a);

/* Opens one gate: the oldest gated request still held (or the next to come) goes on. */
void fragile_open_gate(fragile *f);

void fragile_get_stats(fragile *f, fragile_stats *out);

/*
 * A copy of every record so far, in arrival order; *n receives the count. The caller
 * releases it with fragile_records_free. NULL (and *n 0) when there is none.
 */
fragile_record *fragile_records(fragile *f, size_t *n);
void fragile_records_free(fragile_record *r, size_t n);

/* Whether the distinct key `key` has been applied. */
bool fragile_applied(fragile *f, const char *key);

/*
 * Wait until at least `n` requests arrived / finished (answered, dropped, or abandoned) /
 * are held in a delay or drop hold / distinct keys are applied. True when reached,
 * false after timeout_ms.
 */
bool fragile_wait_arrived(fragile *f, size_t n, int timeout_ms);
bool fragile_wait_finished(fragile *f, size_t n, int timeout_ms);
bool fragile_wait_held(fragile *f, size_t n, int timeout_ms);
bool fragile_wait_applied(fragile *f, size_t n, int timeout_ms);

/* The name of an outcome ("answered", "overlap", ...), for failure messages. */
const char *fragile_outcome_name(fragile_outcome o);

#endif
