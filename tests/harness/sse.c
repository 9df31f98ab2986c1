/*
 * sse.c - the event-stream client of the HTTP tests and their plain requests with extra
 * header lines (see sse.h).
 */
#include "sse.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <setjmp.h>
#include <cmocka.h>

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- plain requests with extra header lines ---------------------------------------- */

void sse_reply_fini(sse_reply *x)
{
	hs_response_fini(&x->r);
	free(x->www_authenticate);
	x->www_authenticate = NULL;
}

static size_t on_reply_header(char *line, size_t size, size_t n, void *ud)
{
	sse_reply *x = ud;
	size_t len = size * n;
	char *v;
	if ((v = hs_header_value(line, len, "Content-Type"))) {
		free(x->r.content_type);
		x->r.content_type = v;
	}
	if ((v = hs_header_value(line, len, "WWW-Authenticate"))) {
		free(x->www_authenticate);
		x->www_authenticate = v;
	}
	return len;
}

/*
 * One request with extra header lines (NULL-terminated list, may be NULL); a POST sends
 * `body` as application/json. Fills x; x->r.status is 0 when no answer came.
 */
void sse_call(const hs_server *s, const char *method, const char *path, const char *const *headers,
	      const char *body, sse_reply *x)
{
	memset(x, 0, sizeof *x);
	CURL *c = curl_easy_init();
	assert_non_null(c);
	char url[1024];
	snprintf(url, sizeof url, "http://127.0.0.1:%d%s", hs_port(s), path);
	struct curl_slist *h = curl_slist_append(NULL, "Expect:");
	for (size_t i = 0; headers && headers[i]; i++)
		h = curl_slist_append(h, headers[i]);
	if (body)
		h = curl_slist_append(h, "Content-Type: application/json");
	curl_req req = {.method = method,
			.url = url,
			.body = body,
			.body_len = body ? strlen(body) : 0,
			.headers = h,
			.timeout_ms = HS_REQUEST_TIMEOUT_MS};
	curl_body b = {0};
	curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_reply_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, x);
	CURLcode rc;
	long status = curl_req_perform(c, &req, &b, &rc);
	x->r.status = status > 0 ? status : 0;
	x->r.body = b.data;
	x->r.body_len = b.len;
	if (rc != CURLE_OK)
		snprintf(x->r.error, sizeof x->r.error, "%s", curl_easy_strerror(rc));
	curl_slist_free_all(h);
	curl_easy_cleanup(c);
	if (x->r.body)
		x->r.json = json_loadb(x->r.body, x->r.body_len, 0, NULL);
}

/* ---- event streams ------------------------------------------------------------------ */

static void sse_fail(sse *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sse_fail(sse *st, const char *fmt, ...)
{
	if (st->error[0])
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(st->error, sizeof st->error, fmt, ap);
	va_end(ap);
}

static bool all_digits(const char *p)
{
	if (!*p)
		return false;
	for (; *p; p++)
		if (*p < '0' || *p > '9')
			return false;
	return true;
}

static void sse_dispatch(sse *st)
{
	if (!st->id && st->event && strcmp(st->event, "error") == 0 && st->data) {
		/* The end of a stream that could not go on: no id, so Last-Event-ID stays. */
		json_t *data = json_loads(st->data, 0, NULL);
		const char *detail = json_string_value(json_object_get(data, "detail"));
		if (!detail)
			sse_fail(st, "an error event without a detail: %.200s", st->data);
		st->error_events++;
		json_decref(data);
		goto out;
	}
	if (!st->id || !st->event || !st->data) {
		if (st->id || st->event || st->data)
			sse_fail(st, "an event block lacks id, event or data (id %s, event %s)",
				 st->id ? st->id : "-", st->event ? st->event : "-");
		goto out;
	}
	json_t *data = json_loads(st->data, 0, NULL);
	if (!json_is_object(data)) {
		sse_fail(st, "data is not a JSON object: %.200s", st->data);
		json_decref(data);
		goto out;
	}
	json_t *seq = json_object_get(data, "seq");
	const char *type = json_string_value(json_object_get(data, "type"));
	long long id = all_digits(st->id) ? strtoll(st->id, NULL, 10) : -1;
	if (id < 0 || !json_is_integer(seq) || json_integer_value(seq) != id)
		sse_fail(st, "id: %s but data.seq is %lld", st->id,
			 (long long)json_integer_value(seq));
	else if (!type || strcmp(type, st->event) != 0)
		sse_fail(st, "event: %s but data.type is %s", st->event, type ? type : "-");
	else if (id <= st->last_id)
		sse_fail(st, "id %lld after id %lld: not increasing", id, st->last_id);
	st->last_id = id;
	json_array_append_new(st->events,
			      json_pack("{s:o, s:I, s:I}", "data", data, "mono",
					(json_int_t)mono_ms(), "wall", (json_int_t)hs_now_ms()));
out:
	free(st->id);
	free(st->event);
	free(st->data);
	st->id = st->event = st->data = NULL;
}

static void set_field(sse *st, char **slot, const char *name, const char *value)
{
	if (*slot)
		sse_fail(st, "field %s twice in one event block", name);
	free(*slot);
	*slot = strdup(value);
}

/* One field of the block being read, or its end (name NULL): common/sse_lines.c. */
static int sse_field(void *ud, const char *name, const char *value, size_t vlen)
{
	sse *st = ud;
	(void)vlen;
	if (!name)
		sse_dispatch(st);
	else if (strcmp(name, "id") == 0)
		set_field(st, &st->id, "id", value);
	else if (strcmp(name, "event") == 0)
		set_field(st, &st->event, "event", value);
	else if (strcmp(name, "data") == 0)
		set_field(st, &st->data, "data", value);
	else if (strcmp(name, "retry") == 0) {
		if (!all_digits(value))
			sse_fail(st, "retry: %s is not a number of ms", value);
	} else
		sse_fail(st, "unknown field \"%s\"", name);
	return 0;
}

static size_t sse_write(char *p, size_t size, size_t n, void *ud)
{
	sse *st = ud;
	size_t len = size * n;
	return sse_lines_feed(&st->lines, p, len) == 0 ? len : 0;
}

static size_t sse_header(char *line, size_t size, size_t n, void *ud)
{
	sse *st = ud;
	size_t len = size * n;
	if (len > 9 && strncmp(line, "HTTP/", 5) == 0) {
		const char *sp = memchr(line, ' ', len);
		if (sp)
			st->status = strtol(sp + 1, NULL, 10);
	}
	char *v = hs_header_value(line, len, "Content-Type");
	if (v) {
		free(st->content_type);
		st->content_type = v;
	}
	return len;
}

/* Starts reading `path` as an event stream; `headers` is NULL-terminated or NULL. */
sse *sse_open(CURLM *m, const hs_server *s, const char *path, const char *const *headers)
{
	sse *st = calloc(1, sizeof *st);
	assert_non_null(st);
	st->events = json_array();
	sse_lines_init(&st->lines, 64 << 20, sse_field, st);
	st->easy = curl_easy_init();
	assert_non_null(st->easy);
	char url[1024];
	snprintf(url, sizeof url, "http://127.0.0.1:%d%s", hs_port(s), path);
	for (size_t i = 0; headers && headers[i]; i++)
		st->headers = curl_slist_append(st->headers, headers[i]);
	curl_easy_setopt(st->easy, CURLOPT_URL, url);
	curl_easy_setopt(st->easy, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(st->easy, CURLOPT_NOPROXY, "*");
	curl_easy_setopt(st->easy, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
	curl_easy_setopt(st->easy, CURLOPT_HTTPHEADER, st->headers);
	curl_easy_setopt(st->easy, CURLOPT_WRITEFUNCTION, sse_write);
	curl_easy_setopt(st->easy, CURLOPT_WRITEDATA, st);
	curl_easy_setopt(st->easy, CURLOPT_HEADERFUNCTION, sse_header);
	curl_easy_setopt(st->easy, CURLOPT_HEADERDATA, st);
	curl_easy_setopt(st->easy, CURLOPT_PRIVATE, (void *)st);
	/* A fresh connection per stream, so that 200 streams are 200 connections. */
	curl_easy_setopt(st->easy, CURLOPT_FRESH_CONNECT, 1L);
	curl_easy_setopt(st->easy, CURLOPT_FORBID_REUSE, 1L);
	assert_int_equal(curl_multi_add_handle(m, st->easy), CURLM_OK);
	return st;
}

/* Disconnects (if still open) and frees the stream. Accepts NULL. */
void sse_close(CURLM *m, sse *st)
{
	if (!st)
		return;
	curl_multi_remove_handle(m, st->easy);
	curl_easy_cleanup(st->easy);
	curl_slist_free_all(st->headers);
	free(st->content_type);
	sse_lines_fini(&st->lines);
	free(st->id);
	free(st->event);
	free(st->data);
	json_decref(st->events);
	free(st);
}

size_t sse_count(const sse *st)
{
	return json_array_size(st->events);
}

json_t *sse_data(const sse *st, size_t i)
{
	return json_object_get(json_array_get(st->events, i), "data");
}

int64_t sse_wall(const sse *st, size_t i)
{
	return json_integer_value(json_object_get(json_array_get(st->events, i), "wall"));
}

/* Member `key` of event `d` as a string, "" when absent. */
static const char *member(const json_t *d, const char *key)
{
	const char *v = json_string_value(json_object_get(d, key));
	return v ? v : "";
}

/* Index of the first event of `type` (and `step` unless -1, `wf` unless NULL), or -1. */
long sse_find(const sse *st, const char *type, int step, const char *wf)
{
	for (size_t i = 0; i < sse_count(st); i++) {
		json_t *d = sse_data(st, i);
		if (strcmp(member(d, "type"), type) != 0)
			continue;
		if (step >= 0 && json_integer_value(json_object_get(d, "step")) != step)
			continue;
		if (wf && strcmp(member(d, "workflow_id"), wf) != 0)
			continue;
		return (long)i;
	}
	return -1;
}

size_t sse_count_type(const sse *st, const char *type)
{
	size_t n = 0;
	for (size_t i = 0; i < sse_count(st); i++)
		n += strcmp(member(sse_data(st, i), "type"), type) == 0;
	return n;
}

/* Runs the transfers for up to `ms` and records which ended. */
void sse_pump(CURLM *m, int ms)
{
	int running, left;
	curl_multi_perform(m, &running);
	curl_multi_poll(m, NULL, 0, ms, NULL);
	curl_multi_perform(m, &running);
	CURLMsg *msg;
	while ((msg = curl_multi_info_read(m, &left))) {
		if (msg->msg != CURLMSG_DONE)
			continue;
		sse *st = NULL;
		curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&st);
		st->done = true;
		st->result = msg->data.result;
		st->done_mono = mono_ms();
	}
}

/* Pumps until cond(arg) holds (true) or `timeout_ms` passed (false). */
bool sse_pump_until(CURLM *m, hs_pred cond, void *arg, int timeout_ms)
{
	int64_t deadline = mono_ms() + timeout_ms;
	for (;;) {
		if (cond(arg))
			return true;
		if (mono_ms() >= deadline)
			return false;
		sse_pump(m, 20);
	}
}

bool sse_is_done(void *arg)
{
	return ((sse *)arg)->done;
}

bool sse_has_event(void *arg)
{
	sse_want *w = arg;
	if (w->count)
		return sse_count_type(w->st, w->type) >= w->count;
	return sse_find(w->st, w->type, w->step, w->wf) >= 0;
}

bool sse_all_done(void *arg)
{
	sse_set *set = arg;
	for (size_t i = 0; i < set->n; i++)
		if (!set->v[i]->done)
			return false;
	return true;
}

/* Every stream answered 200 and delivered at least one event. */
bool sse_all_flowing(void *arg)
{
	sse_set *set = arg;
	for (size_t i = 0; i < set->n; i++)
		if (set->v[i]->status != 200 || sse_count(set->v[i]) == 0)
			return false;
	return true;
}

/* Waits for `type` (of `step` in workflow `wf`, -1/NULL for any) on `st`, or fails. */
long sse_await_event(CURLM *m, sse *st, const char *type, int step, const char *wf, int timeout_ms)
{
	sse_want w = {st, type, step, wf, 0};
	if (!sse_pump_until(m, sse_has_event, &w, timeout_ms))
		fail_msg(
		    "no %s event (step %d) on the stream within %d ms; %zu events, status %ld, "
		    "done %d, error \"%s\"",
		    type, step, timeout_ms, sse_count(st), st->status, st->done, st->error);
	return sse_find(st, type, step, wf);
}

/* A stream answered 200 text/event-stream and broke no format rule. */
void sse_assert_ok(const sse *st, const char *what)
{
	if (st->status != 200)
		fail_msg("%s: status %ld, expected 200", what, st->status);
	if (!st->content_type || strncmp(st->content_type, "text/event-stream", 17) != 0)
		fail_msg("%s: Content-Type %s, expected text/event-stream", what,
			 st->content_type ? st->content_type : "(none)");
	if (st->error[0])
		fail_msg("%s: malformed event stream: %s", what, st->error);
}

/* The stream's events are exactly `want[from..]` (JSON equal, same order). */
void sse_assert_is(const sse *st, const json_t *want, size_t from, const char *what)
{
	size_t n = json_array_size(want) - from;
	for (size_t i = 0; i < sse_count(st) && i < n; i++)
		if (!json_equal(sse_data(st, i), json_array_get(want, from + i))) {
			char *got = json_dumps(sse_data(st, i), JSON_COMPACT);
			char *exp = json_dumps(json_array_get(want, from + i), JSON_COMPACT);
			fail_msg("%s: event %zu is %.400s, expected %.400s", what, i, got, exp);
		}
	if (sse_count(st) != n)
		fail_msg("%s: %zu events, expected %zu", what, sse_count(st), n);
}
