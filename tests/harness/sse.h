/*
 * sse.h - an event-stream (Server-Sent Events) client for the HTTP tests, and the plain
 * requests with extra header lines that the stream and access-control tests send.
 *
 * Streams are read through one libcurl multi handle that the test drives from its own
 * thread (sse_pump_until), so every received event carries the time it arrived: "mono"
 * (CLOCK_MONOTONIC ms, the clock of sse.done_mono) and "wall" (hs_now_ms). The parser
 * follows the WHATWG event-stream format and is strict about what baton promises: every
 * event block has exactly the fields id, event and data; data is a JSON object whose
 * "seq" is the id and whose "type" is the event name; ids increase. Lines starting with
 * ':' are comments; "retry: N" needs digits. The first violation is kept in sse.error.
 * The one block without an id is "event: error" with data {"detail": ...}, which batond
 * sends last when it cannot go on (counted in sse.error_events, not in sse.events).
 *
 * Like the checks of harness.h, the functions that assert (sse_open, sse_await_event,
 * sse_assert_*, sse_call) fail the running cmocka test, so they belong to the test's own
 * thread; so does a multi handle and every stream on it.
 */
#ifndef BATON_TEST_SSE_H
#define BATON_TEST_SSE_H

#include <curl/curl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../../common/sse_lines.h"
#include "harness.h"

#define SSE_ACCEPT "Accept: text/event-stream"

/* ---- plain requests with extra header lines ----------------------------------------- */

/* An answer with the headers hs_response does not keep. */
typedef struct sse_reply {
	hs_response r; /* status, content_type, body, json: usable with hs_assert_problem */
	char *www_authenticate;
} sse_reply;

/*
 * One request with extra header lines (NULL-terminated list, may be NULL), read whole,
 * not as a stream; a POST sends `body` as application/json. Fills x, which the caller
 * releases with sse_reply_fini; x->r.status is 0 when no answer came.
 */
void sse_call(const hs_server *s, const char *method, const char *path, const char *const *headers,
	      const char *body, sse_reply *x);
void sse_reply_fini(sse_reply *x);

/* ---- event streams ------------------------------------------------------------------ */

/* One SSE response read through a multi handle. Read the fields; do not change them. */
typedef struct sse {
	CURL *easy;
	struct curl_slist *headers;
	long status;
	char *content_type;
	sse_lines lines;	 /* the bytes, split into fields (common/sse_lines.c) */
	char *id, *event, *data; /* fields of the event block being read */
	json_t *events;		 /* [{"data": event, "mono": ms, "wall": ms}] in arrival order */
	long long last_id;
	int error_events; /* "event: error" blocks received (the stream's end) */
	char error[400];
	bool done; /* the transfer ended */
	CURLcode result;
	int64_t done_mono;
} sse;

/*
 * Starts reading `path` as an event stream on `m`, on a fresh connection; `headers` is
 * NULL-terminated or NULL. Returns the stream, owned by the caller (sse_close).
 */
sse *sse_open(CURLM *m, const hs_server *s, const char *path, const char *const *headers);

/* Disconnects (if still open) and frees the stream. Accepts NULL. */
void sse_close(CURLM *m, sse *st);

/* How many events arrived so far. */
size_t sse_count(const sse *st);
/* The data of event `i` (borrowed). */
json_t *sse_data(const sse *st, size_t i);
/* When event `i` arrived, in hs_now_ms time. */
int64_t sse_wall(const sse *st, size_t i);
/* Index of the first event of `type` (and `step` unless -1, `wf` unless NULL), or -1. */
long sse_find(const sse *st, const char *type, int step, const char *wf);
/* How many events of `type` arrived. */
size_t sse_count_type(const sse *st, const char *type);

/* Runs the transfers of `m` for up to `ms` and records which ended. */
void sse_pump(CURLM *m, int ms);
/* Pumps until cond(arg) holds (true) or `timeout_ms` passed (false). */
bool sse_pump_until(CURLM *m, hs_pred cond, void *arg, int timeout_ms);

/* Conditions for sse_pump_until. */
bool sse_is_done(void *arg); /* arg: an sse; its transfer ended */

typedef struct sse_want {
	sse *st;
	const char *type;
	int step;
	const char *wf;
	size_t count; /* at least this many events of `type` (when > 0) */
} sse_want;
bool sse_has_event(void *arg); /* arg: an sse_want; as sse_find, or count of `type` */

typedef struct sse_set {
	sse **v;
	size_t n;
} sse_set;
bool sse_all_done(void *arg);	 /* arg: an sse_set; every transfer ended */
bool sse_all_flowing(void *arg); /* arg: an sse_set; every stream 200 with an event */

/*
 * Waits for `type` (of `step` in workflow `wf`, -1/NULL for any) on `st` and returns its
 * index; fails the test after `timeout_ms`.
 */
long sse_await_event(CURLM *m, sse *st, const char *type, int step, const char *wf, int timeout_ms);

/* Asserts that the stream answered 200 text/event-stream and broke no format rule. */
void sse_assert_ok(const sse *st, const char *what);

/* Asserts that the stream's events are exactly `want[from..]` (JSON equal, same order). */
void sse_assert_is(const sse *st, const json_t *want, size_t from, const char *what);

#endif
