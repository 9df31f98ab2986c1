/*
 * requests.c - the HTTP tests' side of the conversation with batond (see harness.h):
 * requests over libcurl, JSON helpers, the checks every test shares, and the waits
 * that poll for a condition with a deadline instead of sleeping.
 */
#include "harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <setjmp.h>
#include <cmocka.h>
#include <curl/curl.h>

/* ---- requests -------------------------------------------------------------------- */

char *hs_header_value(const char *line, size_t len, const char *name)
{
	size_t n = strlen(name);
	if (len <= n || strncasecmp(line, name, n) != 0 || line[n] != ':')
		return NULL;
	const char *v = line + n + 1, *end = line + len;
	while (v < end && (*v == ' ' || *v == '\t'))
		v++;
	while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' '))
		end--;
	return strndup(v, (size_t)(end - v));
}

/* Stores the value of header line `line` in *slot when its name is `name`. */
static void keep_header(const char *line, size_t len, const char *name, char **slot)
{
	char *v = hs_header_value(line, len, name);
	if (v) {
		free(*slot);
		*slot = v;
	}
}

static size_t on_header(char *line, size_t size, size_t nmemb, void *userdata)
{
	hs_response *r = userdata;
	size_t len = size * nmemb;
	if (len >= 5 && strncmp(line, "HTTP/", 5) == 0) {
		/* A new response (after a 100 Continue, say): forget the previous headers. */
		free(r->content_type);
		free(r->location);
		free(r->allow);
		free(r->retry_after);
		r->content_type = r->location = r->allow = r->retry_after = NULL;
	}
	keep_header(line, len, "Content-Type", &r->content_type);
	keep_header(line, len, "Location", &r->location);
	keep_header(line, len, "Allow", &r->allow);
	keep_header(line, len, "Retry-After", &r->retry_after);
	return len;
}

typedef struct upload {
	const char *data;
	size_t len, off;
} upload;

static size_t on_read(char *buf, size_t size, size_t nitems, void *userdata)
{
	upload *u = userdata;
	size_t n = size * nitems;
	if (n > 64 * 1024)
		n = 64 * 1024; /* many chunks, not one */
	if (n > u->len - u->off)
		n = u->len - u->off;
	memcpy(buf, u->data + u->off, n);
	u->off += n;
	return n;
}

int hs_send(const hs_server *s, const hs_request *req, hs_response *r)
{
	memset(r, 0, sizeof *r);
	CURL *c = curl_easy_init();
	if (!c) {
		snprintf(r->error, sizeof r->error, "curl_easy_init failed");
		return -1;
	}
	char url[2048];
	snprintf(url, sizeof url, "http://127.0.0.1:%d%s", hs_port(s), req->path);
	char ctype[256];
	struct curl_slist *headers =
	    curl_slist_append(NULL, req->expect_continue ? "Expect: 100-continue" : "Expect:");
	if (req->content_type) {
		snprintf(ctype, sizeof ctype, "Content-Type: %s", req->content_type);
		headers = curl_slist_append(headers, ctype);
	} else {
		headers = curl_slist_append(headers, "Content-Type:");
	}
	if (req->header)
		headers = curl_slist_append(headers, req->header);
	upload up = {req->body, req->body_len, 0};
	char errbuf[CURL_ERROR_SIZE] = "";
	curl_body b = {0};
	curl_req cr = {.method = req->method,
		       .url = url,
		       .body = req->body,
		       .body_len = req->body ? req->body_len : 0,
		       .timeout_ms = HS_REQUEST_TIMEOUT_MS};
	if (req->body && req->chunked) {
		headers = curl_slist_append(headers, "Transfer-Encoding: chunked");
		cr.read = on_read;
		cr.read_data = &up;
	}
	cr.headers = headers;

	curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
	curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
	CURLcode rc;
	r->status = curl_req_perform(c, &cr, &b, &rc);
	if (r->status < 0)
		r->status = 0; /* nothing was sent */
	r->body = b.data;
	r->body_len = b.len;
	curl_slist_free_all(headers);
	curl_easy_cleanup(c);

	if (r->body) {
		json_error_t jerr;
		r->json = json_loadb(r->body, r->body_len, 0, &jerr);
	}
	if (rc != CURLE_OK && r->status == 0) {
		snprintf(r->error, sizeof r->error, "%.16s %.100s: %.120s", req->method, req->path,
			 errbuf[0] ? errbuf : curl_easy_strerror(rc));
		return -1;
	}
	return r->status > 0 ? 0 : -1;
}

int hs_get(const hs_server *s, const char *path, hs_response *r)
{
	hs_request req = {.method = "GET", .path = path};
	return hs_send(s, &req, r);
}

int hs_post(const hs_server *s, const char *path, const char *body, hs_response *r)
{
	hs_request req = {.method = "POST",
			  .path = path,
			  .content_type = body ? "application/json" : NULL,
			  .body = body,
			  .body_len = body ? strlen(body) : 0};
	return hs_send(s, &req, r);
}

char *hs_url_escape(const char *text)
{
	char *escaped = curl_easy_escape(NULL, text, 0);
	char *out = strdup(escaped ? escaped : "");
	curl_free(escaped);
	return out;
}

void hs_response_fini(hs_response *r)
{
	if (!r)
		return;
	free(r->content_type);
	free(r->location);
	free(r->allow);
	free(r->retry_after);
	free(r->body);
	json_decref(r->json);
	memset(r, 0, sizeof *r);
}

/* ---- checks ---------------------------------------------------------------------- */

/* Fails the test with the response's details. */
static void fail_response(const hs_server *s, const char *what, const hs_response *r)
{
	if (s)
		hs_dump_log(s, 3000);
	fail_msg("%s: status %ld, error \"%s\", body %.1000s", what, r->status, r->error,
		 r->body ? r->body : "(none)");
}

static bool is_json_type(const char *ctype, const char *want)
{
	size_t n = strlen(want);
	return ctype && strncasecmp(ctype, want, n) == 0 && (ctype[n] == '\0' || ctype[n] == ';');
}

json_t *hs_get_json(const hs_server *s, const char *path, long status)
{
	hs_response r;
	hs_get(s, path, &r);
	if (r.status != status || !r.json) {
		char what[512];
		snprintf(what, sizeof what, "GET %s: expected %ld with JSON", path, status);
		fail_response(s, what, &r);
	}
	if (status < 400 && !is_json_type(r.content_type, "application/json"))
		fail_msg("GET %s: Content-Type %s, expected application/json", path,
			 r.content_type ? r.content_type : "(none)");
	json_t *out = json_incref(r.json);
	hs_response_fini(&r);
	return out;
}

json_t *hs_get_workflow(const hs_server *s, const char *id)
{
	char path[512];
	snprintf(path, sizeof path, "/workflows/%s", id);
	json_t *wf = hs_get_json(s, path, 200);
	assert_string_equal(hs_str(wf, "id"), id);
	return wf;
}

json_t *hs_get_events(const hs_server *s, const char *id)
{
	char path[512];
	snprintf(path, sizeof path, "/workflows/%s/events", id);
	json_t *events = json_array();
	for (;;) { /* page by page, as next_after says */
		json_t *doc = hs_get_json(s, path, 200);
		assert_string_equal(hs_str(doc, "workflow_id"), id);
		json_t *page = json_object_get(doc, "events");
		json_t *next = json_object_get(doc, "next_after");
		assert_true(json_is_array(page));
		assert_true(json_is_null(next) || json_is_integer(next));
		if (json_is_integer(next) &&
		    (json_array_size(page) == 0 ||
		     json_integer_value(next) !=
			 hs_int(json_array_get(page, json_array_size(page) - 1), "seq")))
			fail_msg("events of %s: next_after %lld is not the page's last seq", id,
				 (long long)json_integer_value(next));
		json_array_extend(events, page);
		json_int_t after = json_is_integer(next) ? json_integer_value(next) : -1;
		json_decref(doc);
		if (after < 0)
			break;
		snprintf(path, sizeof path, "/workflows/%s/events?after=%lld", id,
			 (long long)after);
	}
	json_int_t prev = 0;
	size_t i;
	json_t *ev;
	json_array_foreach(events, i, ev)
	{
		json_int_t seq = hs_int(ev, "seq");
		if (i > 0 && seq <= prev)
			fail_msg("events of %s: seq %lld after %lld, not strictly increasing", id,
				 (long long)seq, (long long)prev);
		prev = seq;
		hs_time(ev, "ts");
		hs_str(ev, "type");
		assert_string_equal(hs_str(ev, "workflow_id"), id);
	}
	return events;
}

json_t *hs_create_workflow(const hs_server *s, json_t *body)
{
	char *text = json_dumps(body, JSON_COMPACT);
	json_decref(body);
	assert_non_null(text);
	hs_response r;
	hs_post(s, "/workflows", text, &r);
	if (r.status != 201 || !json_is_object(r.json)) {
		char what[256];
		snprintf(what, sizeof what, "POST /workflows %.150s: expected 201", text);
		free(text);
		fail_response(s, what, &r);
	}
	free(text);
	if (!is_json_type(r.content_type, "application/json"))
		fail_msg("POST /workflows: Content-Type %s", r.content_type ? r.content_type : "-");
	const char *id = hs_str(r.json, "id");
	char want[512];
	snprintf(want, sizeof want, "/workflows/%s", id);
	if (!r.location || strcmp(r.location, want) != 0)
		fail_msg("POST /workflows: Location %s, expected %s",
			 r.location ? r.location : "(none)", want);
	json_t *wf = json_incref(r.json);
	hs_response_fini(&r);
	return wf;
}

const char *hs_str(const json_t *obj, const char *key)
{
	json_t *v = json_object_get(obj, key);
	if (!json_is_string(v)) {
		char *dump = json_dumps(obj, JSON_COMPACT);
		fail_msg("\"%s\" is not a string in %.1500s", key, dump ? dump : "?");
	}
	return json_string_value(v);
}

json_int_t hs_int(const json_t *obj, const char *key)
{
	json_t *v = json_object_get(obj, key);
	if (!json_is_integer(v)) {
		char *dump = json_dumps(obj, JSON_COMPACT);
		fail_msg("\"%s\" is not an integer in %.1500s", key, dump ? dump : "?");
	}
	return json_integer_value(v);
}

int64_t hs_time_or_null(const json_t *obj, const char *key)
{
	json_t *v = json_object_get(obj, key);
	if (json_is_null(v))
		return HS_NO_TIME;
	int64_t ms = 0;
	if (!json_is_string(v) || rfc3339_parse_ms(json_string_value(v), &ms) != 0) {
		char *dump = json_dumps(obj, JSON_COMPACT);
		fail_msg("\"%s\" is not an RFC 3339 UTC time with ms in %.1500s", key,
			 dump ? dump : "?");
	}
	return ms;
}

int64_t hs_time(const json_t *obj, const char *key)
{
	int64_t ms = hs_time_or_null(obj, key);
	if (ms == HS_NO_TIME) {
		char *dump = json_dumps(obj, JSON_COMPACT);
		fail_msg("\"%s\" is null in %.1500s", key, dump ? dump : "?");
	}
	return ms;
}

static bool in_set(const char *v, const char *const *set)
{
	for (; *set; set++)
		if (strcmp(v, *set) == 0)
			return true;
	return false;
}

/* Fails unless obj[key] has JSON type `type`, or is null when `nullable`. */
static void want_type(const json_t *obj, const char *key, json_type type, bool nullable)
{
	json_t *v = json_object_get(obj, key);
	bool ok = v && (json_typeof(v) == type || (nullable && json_is_null(v)) ||
			(type == JSON_REAL && json_is_integer(v)) ||
			(type == JSON_TRUE && json_is_boolean(v)));
	if (!ok) {
		char *dump = json_dumps(obj, JSON_COMPACT);
		fail_msg("member \"%s\" missing or of the wrong type in %.2000s", key,
			 dump ? dump : "?");
	}
}

static void assert_step_shape(const json_t *st, size_t index)
{
	static const char *const statuses[] = {"pending",   "waiting",	 "running",
					       "retrying",  "completed", "failed",
					       "cancelled", "skipped",	 NULL};
	if (hs_int(st, "index") != (json_int_t)index)
		fail_msg("step %zu has index %lld", index, (long long)hs_int(st, "index"));
	hs_str(st, "worker");
	if (json_object_get(st, "call")) { /* an HTTP step */
		want_type(st, "call", JSON_OBJECT, false);
	} else {
		hs_int(st, "work_ms");
		hs_int(st, "fail_attempts");
	}
	hs_int(st, "attempts");
	if (!in_set(hs_str(st, "status"), statuses))
		fail_msg("step %zu: unknown status %s", index, hs_str(st, "status"));
	want_type(st, "fencing_token", JSON_INTEGER, true);
	want_type(st, "queue_position", JSON_INTEGER, true);
	hs_time_or_null(st, "waiting_since");
	hs_time_or_null(st, "started_at");
	hs_time_or_null(st, "finished_at");
	want_type(st, "duration_ms", JSON_INTEGER, true);
	hs_time_or_null(st, "next_attempt_at");
	want_type(st, "error", JSON_STRING, true);
	want_type(st, "result", JSON_OBJECT, true);
}

void hs_assert_workflow_shape(const json_t *wf)
{
	static const char *const statuses[] = {"pending", "running",   "completed",
					       "failed",  "cancelled", NULL};
	assert_true(json_is_object(wf));
	hs_str(wf, "id");
	hs_str(wf, "resource");
	if (!in_set(hs_str(wf, "status"), statuses))
		fail_msg("workflow status %s is not documented", hs_str(wf, "status"));
	hs_time(wf, "created_at");
	hs_time_or_null(wf, "started_at");
	hs_time_or_null(wf, "finished_at");
	want_type(wf, "cancel_requested", JSON_TRUE, false);
	json_t *retry = json_object_get(wf, "retry");
	want_type(wf, "retry", JSON_OBJECT, false);
	hs_int(retry, "max_attempts");
	hs_int(retry, "first_retry_ms");
	want_type(retry, "backoff", JSON_REAL, false);
	hs_int(retry, "max_delay_ms");
	const char *on_failure = hs_str(wf, "on_failure");
	if (strcmp(on_failure, "fail") != 0 && strcmp(on_failure, "continue") != 0)
		fail_msg("on_failure is %s", on_failure);
	want_type(wf, "steps", JSON_ARRAY, false);
	want_type(wf, "result", JSON_OBJECT, true);
	want_type(wf, "error", JSON_STRING, true);
	json_t *steps = json_object_get(wf, "steps");
	json_int_t completed = 0;
	size_t i;
	json_t *st;
	json_array_foreach(steps, i, st)
	{
		assert_step_shape(st, i);
		completed += strcmp(hs_str(st, "status"), "completed") == 0;
	}
	if (hs_int(wf, "steps_total") != (json_int_t)json_array_size(steps))
		fail_msg("steps_total %lld but %zu steps", (long long)hs_int(wf, "steps_total"),
			 json_array_size(steps));
	if (hs_int(wf, "steps_completed") != completed)
		fail_msg("steps_completed %lld but %lld steps completed",
			 (long long)hs_int(wf, "steps_completed"), (long long)completed);
}

void hs_assert_problem(const hs_response *r, long status, const char *slug, const char *what)
{
	if (r->status != status)
		fail_msg("%s: status %ld, expected %ld; body %.600s (%s)", what, r->status, status,
			 r->body ? r->body : "(none)", r->error);
	if (!is_json_type(r->content_type, "application/problem+json"))
		fail_msg("%s: Content-Type %s, expected application/problem+json", what,
			 r->content_type ? r->content_type : "(none)");
	if (!json_is_object(r->json))
		fail_msg("%s: body is not a JSON object: %.600s", what, r->body ? r->body : "");
	char type[256];
	snprintf(type, sizeof type, "https://baton.dev/problems/%s", slug);
	json_t *j = r->json;
	const char *got_type = json_string_value(json_object_get(j, "type"));
	if (!got_type || strcmp(got_type, type) != 0)
		fail_msg("%s: problem type %s, expected %s", what, got_type ? got_type : "(none)",
			 type);
	const char *title = json_string_value(json_object_get(j, "title"));
	const char *detail = json_string_value(json_object_get(j, "detail"));
	json_t *st = json_object_get(j, "status");
	if (!title || !*title || !detail || !*detail || !json_is_integer(st) ||
	    json_integer_value(st) != status)
		fail_msg("%s: problem needs title, detail and status %ld: %.600s", what, status,
			 r->body);
}

/* Whether the comma-separated token list `list` holds `tok`. */
static bool list_has(const char *list, const char *tok, size_t toklen)
{
	const char *p = list;
	while (*p) {
		while (*p == ' ' || *p == ',')
			p++;
		size_t n = strcspn(p, ", ");
		if (n == toklen && strncmp(p, tok, n) == 0)
			return true;
		p += n;
	}
	return false;
}

static size_t list_len(const char *list)
{
	size_t count = 0;
	const char *p = list;
	while (*p) {
		while (*p == ' ' || *p == ',')
			p++;
		size_t n = strcspn(p, ", ");
		if (n > 0)
			count++;
		p += n;
	}
	return count;
}

void hs_assert_allow(const hs_response *r, const char *methods)
{
	if (!r->allow)
		fail_msg("405 without an Allow header (expected \"%s\")", methods);
	const char *p = methods;
	while (*p) {
		while (*p == ' ' || *p == ',')
			p++;
		size_t n = strcspn(p, ", ");
		if (n > 0 && !list_has(r->allow, p, n))
			fail_msg("Allow: %s lacks %.*s", r->allow, (int)n, p);
		p += n;
	}
	if (list_len(r->allow) != list_len(methods))
		fail_msg("Allow: %s, expected exactly %s", r->allow, methods);
}

/* ---- waits ----------------------------------------------------------------------- */

bool hs_wait_until(hs_pred pred, void *arg, int timeout_ms)
{
	int64_t deadline = hs_mono_ms() + timeout_ms;
	for (;;) {
		if (pred(arg))
			return true;
		if (hs_mono_ms() >= deadline)
			return false;
		hs_pause_ms(HS_POLL_MS);
	}
}

static bool is_final(const char *status)
{
	return strcmp(status, "completed") == 0 || strcmp(status, "failed") == 0 ||
	       strcmp(status, "cancelled") == 0;
}

/* Shared loop of the two waits: step < 0 waits on the workflow's own status. */
static json_t *wait_status(const hs_server *s, const char *id, long step, const char *status,
			   int timeout_ms)
{
	int64_t deadline = hs_mono_ms() + timeout_ms;
	char last[64] = "";
	for (;;) {
		json_t *wf = hs_get_workflow(s, id);
		const char *wf_status = hs_str(wf, "status");
		const char *got = wf_status;
		if (step >= 0) {
			json_t *st = json_array_get(json_object_get(wf, "steps"), (size_t)step);
			if (!st)
				fail_msg("workflow %s has no step %ld", id, step);
			got = hs_str(st, "status");
		}
		if (strcmp(got, status) == 0)
			return wf;
		snprintf(last, sizeof last, "%s", got);
		bool hopeless = is_final(wf_status) && (step >= 0 || is_final(got));
		json_decref(wf);
		if (hopeless || hs_mono_ms() >= deadline) {
			hs_dump_log(s, 3000);
			if (step >= 0)
				fail_msg(
				    "workflow %s step %ld: status %s (workflow %s), waited for %s",
				    id, step, last, hopeless ? "finished" : "running", status);
			fail_msg("workflow %s: status %s, waited %s for %s", id, last,
				 hopeless ? "(final)" : "in vain", status);
		}
		hs_pause_ms(HS_POLL_MS);
	}
}

json_t *hs_wait_workflow(const hs_server *s, const char *id, const char *status, int timeout_ms)
{
	return wait_status(s, id, -1, status, timeout_ms);
}

json_t *hs_wait_step(const hs_server *s, const char *id, size_t step, const char *status,
		     int timeout_ms)
{
	return wait_status(s, id, (long)step, status, timeout_ms);
}

/* ---- baton specifics ------------------------------------------------------------- */

int hs_default_work_ms(const char *worker)
{
	uint32_t h = 2166136261u;
	for (const unsigned char *p = (const unsigned char *)worker; *p; p++) {
		h ^= *p;
		h *= 16777619u;
	}
	return 100 + (int)(h % 100);
}

static bool event_matches(const json_t *ev, const char *type, int step, int attempt)
{
	const char *t = json_string_value(json_object_get(ev, "type"));
	if (!t || strcmp(t, type) != 0)
		return false;
	if (step >= 0 && json_integer_value(json_object_get(ev, "step")) != step)
		return false;
	if (attempt >= 0 && json_integer_value(json_object_get(ev, "attempt")) != attempt)
		return false;
	return true;
}

json_t *hs_event_find(const json_t *events, const char *type, int step, int attempt)
{
	size_t i;
	json_t *ev;
	json_array_foreach(events, i, ev)
	{
		if (event_matches(ev, type, step, attempt))
			return ev;
	}
	return NULL;
}

size_t hs_event_count(const json_t *events, const char *type, int step, int attempt)
{
	size_t n = 0, i;
	json_t *ev;
	json_array_foreach(events, i, ev)
	{
		if (event_matches(ev, type, step, attempt))
			n++;
	}
	return n;
}

json_t *hs_step_at(const json_t *wf, size_t i)
{
	json_t *st = json_array_get(json_object_get(wf, "steps"), i);
	assert_non_null(st);
	return st;
}

long hs_post_half_closed(const hs_server *s, const char *path, const char *body, json_t **out)
{
	*out = NULL;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return 0;
	struct timeval tv = {HS_REQUEST_TIMEOUT_MS / 1000, 0};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)hs_port(s))};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	char req[4096];
	int n = snprintf(req, sizeof req,
			 "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
			 "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
			 path, strlen(body), body);
	long status = 0;
	if (n > 0 && (size_t)n < sizeof req &&
	    connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && write(fd, req, (size_t)n) == n &&
	    shutdown(fd, SHUT_WR) == 0) {
		static char resp[65536];
		size_t len = 0;
		ssize_t got;
		while (len < sizeof resp - 1 &&
		       (got = read(fd, resp + len, sizeof resp - 1 - len)) > 0)
			len += (size_t)got;
		resp[len] = 0;
		if (sscanf(resp, "HTTP/1.1 %ld", &status) != 1)
			status = 0;
		const char *b = strstr(resp, "\r\n\r\n");
		if (b)
			*out = json_loads(b + 4, JSON_DISABLE_EOF_CHECK, NULL);
	}
	close(fd);
	return status;
}
