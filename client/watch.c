/*
 * watch.c: `baton watch ID`, one workflow followed live over Server-Sent Events.
 *
 * Design. GET /workflows/{id}/events with "Accept: text/event-stream" sends the history,
 * then each new event as it is committed, and ends after the workflow's final event
 * (server/sse.c). The easy handle runs inside a multi handle that this file drives, so
 * control comes back every TICK_MS even while the stream is silent: that is when the
 * progress bar's retry countdown ticks and a stalled connection is noticed. The write
 * callback feeds the bytes to the incremental SSE parser of sse.c, which accepts frames
 * split anywhere by the network; each complete frame is one event, printed at once.
 *
 * Nothing is printed twice and nothing is missed: the client remembers the seq of the
 * last event it printed, reconnects after a dropped connection with Last-Event-ID set to
 * it (the server resumes right after it), and skips any event it has already passed.
 * Reconnects are bounded (MAX_RECONNECTS in a row without a new event, exponential
 * backoff); a server that does not answer the very first request is reported at once.
 *
 * On a terminal (and without --json) the last line is a progress bar, erased before each
 * event line and drawn again after it with "\r" and ESC[K; elsewhere the output is
 * plain lines with no escape codes. Text from the server is printed with its control
 * characters replaced, so an event cannot move the cursor or recolour the terminal.
 *
 * Exit status: 0 the workflow completed; 1 it failed or was cancelled, or the server
 * refused the request (404 ...); 2 usage; 3 the server could not be reached, or was
 * lost and did not come back; 4 it completed, but some of its steps failed
 * (on_failure: continue).
 */
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include "../common/rfc3339.h"
#include "client.h"

enum {
	TICK_MS = 200,		    /* longest time without control: countdown, stalls, ^C */
	CONNECT_TIMEOUT_MS = 5000,  /* per connection attempt */
	STALL_MS = 45000,	    /* three missed keepalives (the server sends one per 15 s) */
	MAX_RECONNECTS = 10,	    /* in a row, without a new event in between */
	RECONNECT_FIRST_MS = 500,   /* then doubled at each attempt ... */
	RECONNECT_MAX_MS = 5000,    /* ... up to this: about 38 s in all */
	MAX_FRAME_BYTES = 64 << 20, /* one event: a 10000-step result is a few MiB */
	MAX_ERROR_BYTES = 64 << 10, /* the body of an error answer, kept for its message */
	BAR_CELLS = 20,
	TYPE_COLUMN = 18, /* strlen("workflow_completed") */
	WORKER_COLUMN = 10,
};

/* Raised by SIGINT while watching: the loop leaves the terminal tidy, then dies of it. */
static volatile sig_atomic_t interrupted;

/* ---- text of lines and of the bar ------------------------------------------------------ */

static void __attribute__((format(printf, 2, 3))) sbuf_printf(struct sbuf *b, const char *fmt, ...)
{
	char small[256], *big = NULL;
	va_list ap;

	va_start(ap, fmt);
	int n = vsnprintf(small, sizeof(small), fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n >= sizeof(small)) {
		va_start(ap, fmt);
		if (vasprintf(&big, fmt, ap) < 0)
			big = NULL;
		va_end(ap);
		if (!big)
			return; /* out of memory: the line is shorter, nothing worse */
	}
	sbuf_add(b, big ? big : small, (size_t)n, MAX_FRAME_BYTES);
	free(big);
}

/* Appends s with control characters (C0, DEL, C1) replaced by '?'. */
static void sbuf_text(struct sbuf *b, const char *s)
{
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		char c = (char)*p;
		if (*p < 0x20 || *p == 0x7f) {
			c = '?';
		} else if (*p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) {
			c = '?'; /* U+0080..U+009F, among them CSI */
			p++;
		}
		sbuf_add(b, &c, 1, MAX_FRAME_BYTES);
	}
}

/* Appends "  " and s (sanitised), padded with spaces to width terminal columns. */
static void sbuf_column(struct sbuf *b, const char *s, int width)
{
	sbuf_add(b, "  ", 2, MAX_FRAME_BYTES);
	size_t from = b->len;
	sbuf_text(b, s);
	for (size_t n = display_width(b->p + from, b->len - from); n < (size_t)width; n++)
		sbuf_add(b, " ", 1, MAX_FRAME_BYTES);
}

/* ---- state ----------------------------------------------------------------------------- */

/* What the events so far say about the workflow: the progress bar's contents. */
struct progress {
	char *resource;
	json_int_t total, completed, failed; /* steps; failed = failed for good */
	char *holder;			     /* worker holding the resource, or NULL */
	json_int_t token;		     /* its fencing token */
	char *waiting;			     /* worker queued for the resource, or NULL */
	char *retry_worker;		     /* worker waiting to retry, or NULL */
	json_int_t retry_attempt;	     /* the attempt it waits for */
	long long retry_at;		     /* when, in ms since the epoch */
	int started, cancel_requested;
	const char *end; /* "completed", "failed", "cancelled"; NULL while running */
};

enum { BODY_UNKNOWN, BODY_SSE, BODY_OTHER }; /* what the current answer carries */

struct watch {
	char *path; /* "/workflows/ID/events" */
	char *url;
	http *http;	/* its servers: a lost stream resumes on the next one */
	size_t untried; /* servers not tried yet while none was reached */
	int json, tty;
	CURLM *multi;
	CURL *easy;
	struct curl_slist *headers;
	char errbuf[CURL_ERROR_SIZE];

	/* the current connection */
	struct sse sse;
	int body;
	struct sbuf error_body; /* the body of a non-SSE answer */
	long long last_byte_ms;
	int new_events; /* printed since this connection began */
	int fatal;	/* an exit status that ends the watch (out of memory ...) */

	/* the whole watch */
	json_int_t last_seq; /* of the last event printed, -1 before the first */
	int reached;	     /* some request got an HTTP answer */
	int outcome;	     /* exit status once the final event is printed, -1 before */
	struct progress pg;
	long long reconnect_at; /* monotonic ms of the next attempt, 0 when connected */
	int reconnect_attempt;
	char drawn[512]; /* the bar as last drawn ("" when not on screen) */
	int drawn_cols;
};

static void set_str(char **slot, const char *s)
{
	free(*slot);
	*slot = s ? strdup(s) : NULL; /* out of memory: the bar shows less, nothing worse */
}

static long long realtime_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- progress -------------------------------------------------------------------------- */

/* "completed", "failed" or "cancelled" for an event that ends the workflow, else NULL. */
static const char *final_word(const char *type)
{
	static const char *const words[] = {"completed", "failed", "cancelled"};

	for (size_t i = 0; i < 3 && strncmp(type, "workflow_", 9) == 0; i++) {
		if (strcmp(type + 9, words[i]) == 0)
			return words[i];
	}
	return NULL;
}

/* Exit status for an event that ends the workflow, -1 for any other event. A workflow
 * that completed with failed steps (on_failure: continue) has a status of its own. */
static int final_outcome(const char *type, const json_t *ev, const struct progress *pg)
{
	const char *word = final_word(type);
	const json_t *failed = json_object_get(json_object_get(ev, "result"), "failed");

	if (!word)
		return -1;
	if (strcmp(word, "completed") != 0)
		return EXIT_FAILED;
	return json_array_size(failed) > 0 || pg->failed > 0 ? EXIT_PARTIAL : EXIT_OK;
}

static void progress_fini(struct progress *pg)
{
	free(pg->resource);
	free(pg->holder);
	free(pg->waiting);
	free(pg->retry_worker);
	memset(pg, 0, sizeof(*pg));
}

static void progress_step_failed(struct progress *pg, const json_t *ev)
{
	const json_t *retry_in = json_object_get(ev, "retry_in_ms");

	if (!json_is_integer(retry_in)) {
		pg->failed++; /* no retry: the step failed for good */
		return;
	}
	int64_t at;
	if (rfc3339_parse_ms(jstr(ev, "next_attempt_at", NULL), &at))
		at = -1;
	set_str(&pg->retry_worker, jstr(ev, "worker", "?"));
	pg->retry_attempt = jint(ev, "attempt", 0) + 1;
	pg->retry_at = at >= 0 ? at : realtime_ms() + json_integer_value(retry_in);
}

/* Updates pg with one event (events arrive in seq order, each once). */
static void progress_apply(struct progress *pg, const json_t *ev, const char *type)
{
	const char *worker = jstr(ev, "worker", "?");

	if (!strcmp(type, "workflow_submitted")) {
		set_str(&pg->resource, jstr(ev, "resource", NULL));
		pg->total = jint(ev, "steps_total", 0);
	} else if (!strcmp(type, "workflow_started")) {
		pg->started = 1;
	} else if (!strcmp(type, "lock_requested")) {
		set_str(&pg->waiting, worker);
		set_str(&pg->retry_worker, NULL);
	} else if (!strcmp(type, "lock_acquired")) {
		pg->started = 1;
		set_str(&pg->holder, worker);
		pg->token = jint(ev, "fencing_token", 0);
		set_str(&pg->waiting, NULL);
		set_str(&pg->retry_worker, NULL);
	} else if (!strcmp(type, "lock_released") || !strcmp(type, "step_interrupted")) {
		set_str(&pg->holder, NULL);
	} else if (!strcmp(type, "step_completed")) {
		pg->completed++;
	} else if (!strcmp(type, "step_failed")) {
		progress_step_failed(pg, ev);
	} else if (!strcmp(type, "cancel_requested")) {
		pg->cancel_requested = 1;
	} else if (final_word(type)) {
		pg->end = final_word(type);
		set_str(&pg->holder, NULL);
		set_str(&pg->waiting, NULL);
		set_str(&pg->retry_worker, NULL);
	}
}

/* Whole seconds left until ms (since the epoch), rounded up: 3, 2, 1, 0. */
static long long secs_until(long long at_ms)
{
	long long left = at_ms - realtime_ms();

	return left <= 0 ? 0 : (left + 999) / 1000;
}

/* What is happening now, for the bar: "worker-B holds payment-gateway (token 2)" ... */
static void progress_activity(const struct watch *w, struct sbuf *b)
{
	const struct progress *pg = &w->pg;
	const char *res = pg->resource ? pg->resource : "the resource";

	if (pg->end) {
		sbuf_text(b, pg->end);
		return;
	}
	if (w->reconnect_at) {
		long long left = w->reconnect_at - monotonic_ms();
		sbuf_printf(b, "connection lost, reconnecting in %llds (%d/%d)",
			    left <= 0 ? 0 : (left + 999) / 1000, w->reconnect_attempt,
			    MAX_RECONNECTS);
	} else if (pg->holder) {
		sbuf_text(b, pg->holder);
		sbuf_add(b, " holds ", 7, MAX_FRAME_BYTES);
		sbuf_text(b, res);
		sbuf_printf(b, " (token %" JSON_INTEGER_FORMAT ")", pg->token);
	} else if (pg->retry_worker) {
		sbuf_text(b, pg->retry_worker);
		sbuf_printf(b, " retry %" JSON_INTEGER_FORMAT " in %llds", pg->retry_attempt,
			    secs_until(pg->retry_at));
	} else if (pg->waiting) {
		sbuf_text(b, pg->waiting);
		sbuf_add(b, " waiting for ", 13, MAX_FRAME_BYTES);
		sbuf_text(b, res);
	} else if (w->last_seq < 0) {
		sbuf_text(b, "connecting");
	} else if (!pg->started) {
		sbuf_text(b, "pending");
	}
	if (pg->cancel_requested)
		sbuf_text(b, ", cancel requested");
}

/* "[########------------] 2/5 steps  worker-C retry 2 in 3s" */
static void progress_bar(const struct watch *w, struct sbuf *b)
{
	const struct progress *pg = &w->pg;
	json_int_t done = pg->completed + pg->failed;
	int filled = pg->total > 0 ? (int)(done * BAR_CELLS / pg->total) : 0;

	sbuf_add(b, "[", 1, MAX_FRAME_BYTES);
	for (int i = 0; i < BAR_CELLS; i++)
		sbuf_add(b, i < filled ? "#" : "-", 1, MAX_FRAME_BYTES);
	if (pg->total > 0)
		sbuf_printf(b, "] %" JSON_INTEGER_FORMAT "/%" JSON_INTEGER_FORMAT " steps", done,
			    pg->total);
	else
		sbuf_printf(b, "] %" JSON_INTEGER_FORMAT " steps", done);
	if (pg->failed > 0)
		sbuf_printf(b, ", %" JSON_INTEGER_FORMAT " failed", pg->failed);
	sbuf_add(b, "  ", 2, MAX_FRAME_BYTES);
	progress_activity(w, b);
}

/* ---- the terminal ---------------------------------------------------------------------- */

static int term_cols(void)
{
	struct winsize ws;

	if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1)
		return ws.ws_col;
	return 80;
}

/* Erases the bar, so that a line can be printed where it was. */
static void bar_erase(struct watch *w)
{
	if (w->drawn[0]) {
		fputs("\r\033[K", stdout);
		w->drawn[0] = '\0';
	}
}

/* Draws the bar when its text or the terminal's width changed since it was last drawn. */
static void bar_draw(struct watch *w)
{
	struct sbuf b = {0};

	if (!w->tty)
		return;
	int cols = term_cols();
	progress_bar(w, &b);
	if (!b.p)
		return;
	/* Shorter than the terminal: a line that wraps could not be redrawn in place. */
	size_t keep = 0, chars = 0, max = (size_t)cols - 1;
	if (max > sizeof(w->drawn) - 1)
		max = sizeof(w->drawn) - 1;
	while (keep < b.len && keep < sizeof(w->drawn) - 1) {
		int lead = ((unsigned char)b.p[keep] & 0xc0) != 0x80;
		if (lead && chars == max)
			break;
		chars += lead;
		keep++;
	}
	while (keep > 0 && b.p[keep - 1] == ' ')
		keep--; /* no activity: no trailing blanks */
	b.p[keep] = '\0';
	if (strcmp(b.p, w->drawn) != 0 || cols != w->drawn_cols) {
		fputs("\r\033[K", stdout);
		fputs(b.p, stdout);
		fflush(stdout);
		memcpy(w->drawn, b.p, keep + 1);
		w->drawn_cols = cols;
	}
	sbuf_fini(&b);
}

/* Prints a notice on stderr, the bar out of its way. */
static void __attribute__((format(printf, 2, 3))) notice(struct watch *w, const char *fmt, ...)
{
	va_list ap;

	bar_erase(w);
	fflush(stdout);
	fputs("baton: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	bar_draw(w);
}

/* ---- one event, one line --------------------------------------------------------------- */

/* The time of day of an RFC 3339 time ("05:40:00.123"), else the text as it is. */
static void line_time(struct sbuf *b, const char *ts)
{
	const char *t = strchr(ts, 'T');

	if (t && strlen(t) == 14 && t[13] == 'Z')
		sbuf_add(b, t + 1, 12, MAX_FRAME_BYTES);
	else
		sbuf_text(b, *ts ? ts : "-");
}

static void line_details(struct sbuf *b, const json_t *ev, const char *type)
{
	if (!strcmp(type, "workflow_submitted")) {
		sbuf_add(b, "  ", 2, MAX_FRAME_BYTES);
		sbuf_text(b, jstr(ev, "resource", "?"));
		sbuf_printf(b, ", %" JSON_INTEGER_FORMAT " steps", jint(ev, "steps_total", 0));
	} else if (!strcmp(type, "lock_acquired")) {
		sbuf_printf(b,
			    "  token %" JSON_INTEGER_FORMAT "  waited %" JSON_INTEGER_FORMAT "ms",
			    jint(ev, "fencing_token", 0), jint(ev, "waited_ms", 0));
	} else if (!strcmp(type, "lock_released")) {
		sbuf_printf(b, "  token %" JSON_INTEGER_FORMAT "  held %" JSON_INTEGER_FORMAT "ms",
			    jint(ev, "fencing_token", 0), jint(ev, "hold_ms", 0));
	} else if (!strcmp(type, "step_completed")) {
		sbuf_printf(b, "  %" JSON_INTEGER_FORMAT "ms", jint(ev, "duration_ms", 0));
	} else if (!strcmp(type, "step_failed")) {
		const json_t *retry = json_object_get(ev, "retry_in_ms");
		char secs[32];
		sbuf_printf(b, "  %" JSON_INTEGER_FORMAT "ms  error: ", jint(ev, "duration_ms", 0));
		sbuf_text(b, jstr(ev, "error", "?"));
		format_secs(secs, sizeof(secs), json_integer_value(retry));
		if (json_is_integer(retry))
			sbuf_printf(b, "; retry in %ss", secs);
		else
			sbuf_text(b, "; no retries left");
	} else if (!strcmp(type, "step_interrupted")) {
		const char *node = jstr(ev, "node", NULL), *was = jstr(ev, "previous_node", NULL);
		if (node && was)
			sbuf_printf(b,
				    "  taken over by node %s after node %s stopped renewing its"
				    " lease; it runs again",
				    node, was);
		else if (node)
			sbuf_printf(b, "  node %s restarted during this attempt; it runs again",
				    node);
		else
			sbuf_text(b, "  batond restarted during this attempt; it runs again");
	} else if (!strcmp(type, "workflow_completed")) {
		const json_t *result = json_object_get(ev, "result");
		size_t failed = json_array_size(json_object_get(result, "failed"));
		sbuf_printf(
		    b, "  %" JSON_INTEGER_FORMAT " steps processed in %" JSON_INTEGER_FORMAT "ms",
		    jint(result, "workersProcessed", 0), jint(result, "totalMs", 0));
		if (failed)
			sbuf_printf(b, ", %zu failed", failed);
	} else if (!strcmp(type, "workflow_failed")) {
		sbuf_text(b, "  error: ");
		sbuf_text(b, jstr(ev, "error", "?"));
	}
}

void format_event_line(struct sbuf *b, const json_t *ev, const char *type)
{
	const char *worker = jstr(ev, "worker", NULL);

	line_time(b, jstr(ev, "ts", ""));
	sbuf_column(b, type, TYPE_COLUMN);
	if (worker) {
		sbuf_column(b, worker, WORKER_COLUMN);
		sbuf_printf(b, "  attempt %" JSON_INTEGER_FORMAT, jint(ev, "attempt", 0));
	}
	line_details(b, ev, type);
	while (b->len > 0 && b->p[b->len - 1] == ' ')
		b->p[--b->len] = '\0'; /* the padding of a last column */
}

static void print_event_line(struct watch *w, const json_t *ev, const char *type)
{
	struct sbuf b = {0};

	format_event_line(&b, ev, type);
	bar_erase(w);
	if (b.p)
		puts(b.p);
	sbuf_fini(&b);
}

static void print_event_json(struct watch *w, const json_t *ev)
{
	char *line = json_dumps(ev, JSON_COMPACT);

	if (!line) {
		w->fatal = EXIT_FAILED;
		fprintf(stderr, "baton: out of memory\n");
		return;
	}
	puts(line);
	free(line);
}

/* Handles one complete SSE frame: an event to print, unless it was printed already. */
static void on_frame(void *userdata, const char *idtext, const char *event, const char *data,
		     size_t len)
{
	struct watch *w = userdata;
	json_error_t err;
	char *end;
	json_int_t id = idtext[0] ? strtoll(idtext, &end, 10) : -1;

	if (w->outcome >= 0)
		return; /* nothing follows the final event */
	if (!idtext[0] && strcmp(event, "error") == 0)
		return; /* the server ends the stream; the reconnection resumes after last_seq */
	json_t *ev = json_loadb(data, len, 0, &err);
	if (!json_is_object(ev)) {
		struct sbuf b = {0};
		char head[61];
		snprintf(head, sizeof(head), "%s", data);
		sbuf_text(&b, head); /* stderr may be the terminal too */
		notice(w, "watch: skipped an event that is not a JSON object (%s): %s", err.text,
		       b.p ? b.p : "");
		sbuf_fini(&b);
		json_decref(ev);
		return;
	}
	json_int_t seq = jint(ev, "seq", id);
	const char *type = jstr(ev, "type", event[0] ? event : "?");
	if (seq >= 0 && seq <= w->last_seq) {
		json_decref(ev); /* already printed: never twice */
		return;
	}
	progress_apply(&w->pg, ev, type);
	if (w->json)
		print_event_json(w, ev);
	else
		print_event_line(w, ev, type);
	/* The bar is drawn again by pump once the bytes at hand are parsed: a burst of
	 * events (the history) redraws it once, not once per line. */
	if (seq >= 0)
		w->last_seq = seq;
	w->new_events++;
	w->outcome = final_outcome(type, ev, &w->pg);
	json_decref(ev);
}

/* ---- the connection -------------------------------------------------------------------- */

/* Decides, at the first byte of an answer, whether it is the event stream. */
static int body_kind(struct watch *w)
{
	long status = 0;
	const char *ctype = NULL;

	curl_easy_getinfo(w->easy, CURLINFO_RESPONSE_CODE, &status);
	curl_easy_getinfo(w->easy, CURLINFO_CONTENT_TYPE, &ctype);
	if (status == 200 && ctype && !strncasecmp(ctype, "text/event-stream", 17))
		return BODY_SSE;
	return BODY_OTHER;
}

static size_t on_bytes(char *p, size_t size, size_t nmemb, void *userdata)
{
	struct watch *w = userdata;
	size_t n = size * nmemb;

	w->last_byte_ms = monotonic_ms();
	if (w->body == BODY_UNKNOWN)
		w->body = body_kind(w);
	if (w->body == BODY_OTHER) {
		sbuf_add(&w->error_body, p, n, MAX_ERROR_BYTES); /* past the cap: keep the start */
		return n;
	}
	if (sse_feed(&w->sse, p, n) < 0) {
		w->fatal = EXIT_FAILED;
		notice(w, "watch: an event larger than %d MiB, or out of memory",
		       MAX_FRAME_BYTES >> 20);
		return 0; /* aborts the transfer */
	}
	return w->fatal ? 0 : n;
}

/* Sets the Last-Event-ID of the next request: the server resumes after that event. */
static int set_headers(struct watch *w)
{
	char last[64];
	struct curl_slist *h = curl_slist_append(NULL, "Accept: text/event-stream");

	if (h && w->last_seq >= 0) {
		snprintf(last, sizeof(last), "Last-Event-ID: %" JSON_INTEGER_FORMAT, w->last_seq);
		struct curl_slist *more = curl_slist_append(h, last);
		if (!more)
			curl_slist_free_all(h);
		h = more;
	}
	if (!h)
		return -1;
	curl_slist_free_all(w->headers);
	w->headers = h;
	curl_easy_setopt(w->easy, CURLOPT_HTTPHEADER, h);
	return 0;
}

/* "baton: GET /workflows/x/events: HTTP 404 Not Found: workflow "x" not found" */
static void print_refusal(struct watch *w, long status)
{
	json_t *doc =
	    json_loadb(w->error_body.p ? w->error_body.p : "", w->error_body.len, 0, NULL);
	struct sbuf b = {0};

	if (w->json && status != 200) {
		print_problem("GET", w->path, status, doc);
		json_decref(doc);
		return;
	}
	sbuf_printf(&b, "GET %s: HTTP %ld", w->path, status);
	if (jstr(doc, "title", NULL)) {
		sbuf_add(&b, " ", 1, MAX_FRAME_BYTES);
		sbuf_text(&b, jstr(doc, "title", ""));
	}
	if (jstr(doc, "detail", NULL)) {
		sbuf_add(&b, ": ", 2, MAX_FRAME_BYTES);
		sbuf_text(&b, jstr(doc, "detail", ""));
	}
	if (status == 200)
		sbuf_text(&b, ", not an event stream");
	notice(w, "%s", b.p ? b.p : "refused");
	sbuf_fini(&b);
	json_decref(doc);
}

/* How one connection ended. */
enum { CONN_FINAL, CONN_DROPPED, CONN_FATAL };

/* Runs the transfer until it ends, the final event arrives, it stalls or ^C. */
static CURLcode pump(struct watch *w, int *stalled)
{
	CURLcode cc = CURLE_OK;

	for (;;) {
		int running = 0, left = 0;
		CURLMsg *m;
		if (curl_multi_perform(w->multi, &running) != CURLM_OK)
			return CURLE_OUT_OF_MEMORY;
		while ((m = curl_multi_info_read(w->multi, &left)) != NULL) {
			if (m->msg == CURLMSG_DONE)
				return m->data.result;
		}
		if (w->outcome >= 0 || w->fatal || interrupted)
			return cc;
		if (monotonic_ms() - w->last_byte_ms > STALL_MS) {
			*stalled = 1;
			return CURLE_OPERATION_TIMEDOUT;
		}
		bar_draw(w); /* the countdown ticks */
		curl_multi_poll(w->multi, NULL, 0, TICK_MS, NULL);
	}
}

/* One connection: prints the events it brings. *why says why it dropped. */
static int connect_once(struct watch *w, int *rc, char *why, size_t whylen)
{
	long status = 0;
	int stalled = 0;

	sse_reset(&w->sse);
	w->error_body.len = 0;
	w->body = BODY_UNKNOWN;
	w->new_events = 0;
	w->errbuf[0] = '\0';
	w->last_byte_ms = monotonic_ms();
	if (set_headers(w) < 0 || curl_multi_add_handle(w->multi, w->easy) != CURLM_OK) {
		fprintf(stderr, "baton: out of memory\n");
		*rc = EXIT_FAILED;
		return CONN_FATAL;
	}
	CURLcode cc = pump(w, &stalled);
	curl_easy_getinfo(w->easy, CURLINFO_RESPONSE_CODE, &status);
	curl_multi_remove_handle(w->multi, w->easy);
	if (w->outcome >= 0)
		return CONN_FINAL;
	*rc = w->fatal ? w->fatal : EXIT_FAILED;
	if (w->fatal || interrupted)
		return CONN_FATAL;
	if (cc == CURLE_URL_MALFORMAT || cc == CURLE_UNSUPPORTED_PROTOCOL) {
		notice(w, "bad server URL \"%s\": %s", w->url, w->errbuf);
		*rc = EXIT_USAGE;
		return CONN_FATAL;
	}
	if (status > 0)
		w->reached = 1;
	if (w->body == BODY_UNKNOWN && status > 0)
		w->body = body_kind(w);
	if (stalled)
		snprintf(why, whylen, "no data for %d s", STALL_MS / 1000);
	else if (status == 0 || w->body == BODY_SSE)
		snprintf(why, whylen, "%s",
			 cc != CURLE_OK ? (w->errbuf[0] ? w->errbuf : curl_easy_strerror(cc))
					: "the server ended the stream early");
	else if (status >= 500)
		snprintf(why, whylen, "HTTP %ld", status);
	else {
		print_refusal(w, status); /* 404 and the like: asking again will not help */
		return CONN_FATAL;
	}
	return CONN_DROPPED;
}

/* Waits ms before reconnecting, the bar counting down. 0, or -1 on ^C. */
static int pause_before_retry(struct watch *w, long ms, int attempt)
{
	w->reconnect_at = monotonic_ms() + ms;
	w->reconnect_attempt = attempt;
	while (!interrupted && monotonic_ms() < w->reconnect_at) {
		bar_draw(w);
		long long left = w->reconnect_at - monotonic_ms();
		sleep_ms(left < TICK_MS ? (left > 0 ? (long)left : 0) : TICK_MS);
	}
	w->reconnect_at = 0;
	return interrupted ? -1 : 0;
}

/* Points the stream at the next server (with several): 0, or -1 out of memory. */
static int next_server(struct watch *w)
{
	char *url;
	if (http_server_count(w->http) < 2)
		return 0;
	if (asprintf(&url, "%s%s", http_next_server(w->http), w->path) < 0)
		return -1;
	free(w->url);
	w->url = url;
	curl_easy_setopt(w->easy, CURLOPT_URL, w->url);
	return 0;
}

/* Follows the stream until the final event, reconnecting after drops (on the next
 * server, when there are several). Exit status. */
static int follow(struct watch *w)
{
	int failures = 0;

	for (;;) {
		char why[CURL_ERROR_SIZE + 64];
		int rc = EXIT_OK;
		long long began = monotonic_ms();
		int r = connect_once(w, &rc, why, sizeof(why));
		if (r == CONN_FINAL)
			return w->outcome;
		if (r == CONN_FATAL)
			return rc;
		if (!w->reached && --w->untried > 0) {
			notice(w, "server unreachable at %s: %s", w->url, why);
			if (next_server(w) < 0)
				return EXIT_FAILED;
			continue;
		}
		if (!w->reached && w->json) {
			print_error("Server unreachable", "server unreachable at %s: %s", w->url,
				    why);
			return EXIT_UNREACHABLE;
		}
		if (!w->reached) {
			notice(w, "server unreachable at %s: %s", w->url, why);
			return EXIT_UNREACHABLE;
		}
		if (next_server(w) < 0)
			return EXIT_FAILED;
		if (w->new_events > 0 || monotonic_ms() - began > STALL_MS)
			failures = 0; /* that connection worked: a fresh budget */
		if (++failures > MAX_RECONNECTS && w->json) {
			print_error("Server unreachable",
				    "watch: gave up after %d attempts to reconnect (%s)",
				    MAX_RECONNECTS, why);
			return EXIT_UNREACHABLE;
		}
		if (failures > MAX_RECONNECTS) {
			notice(w, "watch: gave up after %d attempts to reconnect (%s)",
			       MAX_RECONNECTS, why);
			return EXIT_UNREACHABLE;
		}
		char secs[32];
		long delay = RECONNECT_FIRST_MS;
		for (int i = 1; i < failures && delay < RECONNECT_MAX_MS; i++)
			delay *= 2;
		if (delay > RECONNECT_MAX_MS)
			delay = RECONNECT_MAX_MS;
		format_secs(secs, sizeof(secs), delay);
		notice(w, "watch: connection lost (%s); reconnecting in %s s (attempt %d of %d)",
		       why, secs, failures, MAX_RECONNECTS);
		if (pause_before_retry(w, delay, failures) < 0)
			return EXIT_FAILED;
	}
}

/* ---- the command ----------------------------------------------------------------------- */

static void on_sigint(int sig)
{
	(void)sig;
	interrupted = 1;
}

static int watch_init(struct watch *w, struct cli *cli, const char *id)
{
	char *esc = http_escape(id);

	w->json = cli->json;
	w->http = cli->http;
	w->untried = http_server_count(cli->http);
	w->tty = !cli->json && isatty(STDOUT_FILENO);
	w->last_seq = -1;
	w->outcome = -1;
	if (asprintf(&w->path, "/workflows/%s/events", esc) < 0)
		w->path = NULL;
	free(esc);
	if (w->path && asprintf(&w->url, "%s%s", http_base(cli->http), w->path) < 0)
		w->url = NULL;
	sse_init(&w->sse, MAX_FRAME_BYTES, on_frame, w);
	w->multi = curl_multi_init();
	w->easy = curl_easy_init();
	if (!w->path || !w->url || !w->multi || !w->easy) {
		fprintf(stderr, "baton: out of memory\n");
		return -1;
	}
	curl_easy_setopt(w->easy, CURLOPT_URL, w->url);
	http_auth(w->easy);
	curl_easy_setopt(w->easy, CURLOPT_ERRORBUFFER, w->errbuf);
	curl_easy_setopt(w->easy, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(w->easy, CURLOPT_CONNECTTIMEOUT_MS, (long)CONNECT_TIMEOUT_MS);
	curl_easy_setopt(w->easy, CURLOPT_USERAGENT, "baton/" BATON_CLIENT_VERSION);
	curl_easy_setopt(w->easy, CURLOPT_WRITEFUNCTION, on_bytes);
	curl_easy_setopt(w->easy, CURLOPT_WRITEDATA, w);
	return 0;
}

static void watch_fini(struct watch *w)
{
	if (w->easy)
		curl_easy_cleanup(w->easy);
	if (w->multi)
		curl_multi_cleanup(w->multi);
	curl_slist_free_all(w->headers);
	sse_fini(&w->sse);
	sbuf_fini(&w->error_body);
	progress_fini(&w->pg);
	free(w->url);
	free(w->path);
}

int cmd_watch(struct cli *cli, int argc, char **argv)
{
	struct watch w = {0};
	struct sigaction sa = {0}, old;
	const char *id;
	int rc = parse_workflow_id(argc, argv, &id);

	if (rc >= 0)
		return rc;
	if (watch_init(&w, cli, id) < 0) {
		watch_fini(&w);
		return EXIT_FAILED;
	}
	sa.sa_handler = on_sigint;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, &old);
	rc = follow(&w);
	if (w.outcome >= 0)
		bar_draw(&w); /* its final state stays on screen */
	if (w.drawn[0])
		fputs(w.outcome >= 0 ? "\n" : "\r\033[K", stdout);
	fflush(stdout);
	watch_fini(&w);
	sigaction(SIGINT, &old, NULL);
	if (interrupted)
		raise(SIGINT); /* dies of it, as the shell expects of ^C */
	return rc;
}
