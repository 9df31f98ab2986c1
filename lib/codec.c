/*
 * codec.c - JSON in and out: every rule a workflow request must meet, and the rendering
 * of workflows and steps for the API. Error messages name the offending field with a
 * JSON-path-like prefix ("workers[2].work_ms: ...") so that a client can fix its request.
 */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Defaults of a workflow's retry policy: the first retry comes after 2 s. */
static const retry_policy default_retry = {
    .max_attempts = 10,
    .first_retry_ms = 2000,
    .backoff = 2.0,
    .max_delay_ms = 30000,
};

#define MAX_WORK_MS		3600000
#define MAX_FAIL_ATTEMPTS	1000
#define MAX_ATTEMPTS		1000
#define MAX_DELAY_MS		86400000
#define MAX_CALL_TIMEOUT_MS	300000
#define DEFAULT_CALL_TIMEOUT_MS 10000
#define MAX_HEADER_VALUE	1024

/* What a submission may use beyond its own fields: the operator's allowed URL prefixes. */
typedef struct parse_ctx {
	const char *const *allow_call;
	const json_t *default_call; /* the workflow's "call", borrowed, or NULL */
} parse_ctx;

int baton_decode_json(const char *buf, size_t len, json_t **out, baton_error *err)
{
	json_error_t jerr;
	json_oom = 0;
	*out = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
	if (*out)
		return BATON_OK;
	if (json_oom)
		return err_set(err, BATON_EINTERNAL, "out of memory while decoding the body");
	return err_set(err, BATON_EINVAL, "malformed JSON at line %d, column %d: %s", jerr.line,
		       jerr.column, jerr.text);
}

int valid_name(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > MAX_NAME)
		return 0;
	for (; *s; s++) {
		char c = *s;
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == ':' || c == '-'))
			return 0;
	}
	return 1;
}

/* jansson guarantees valid UTF-8; this rejects control characters (C0, DEL and C1). */
static int valid_worker_name(const char *s, size_t n)
{
	if (n == 0 || n > MAX_NAME)
		return 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c < 0x20 || c == 0x7f)
			return 0;
		if (c == 0xc2 && i + 1 < n && (unsigned char)s[i + 1] >= 0x80 &&
		    (unsigned char)s[i + 1] <= 0x9f)
			return 0;
	}
	return 1;
}

static int only_fields(const json_t *obj, const char *const *allowed, const char *where,
		       baton_error *err)
{
	const char *key;
	json_t *v;
	json_object_foreach((json_t *)obj, key, v)
	{
		int ok = 0;
		for (const char *const *a = allowed; *a; a++)
			ok |= strcmp(key, *a) == 0;
		if (!ok)
			return err_set(err, BATON_EINVAL, "%s%sunknown field \"%.64s\"", where,
				       *where ? ": " : "", key);
	}
	return BATON_OK;
}

/* An optional integer field within [lo, hi]; *out keeps its default when absent. */
static int int_field(const json_t *obj, const char *key, json_int_t lo, json_int_t hi, int64_t *out,
		     const char *where, baton_error *err)
{
	json_t *v = json_object_get(obj, key);
	if (!v)
		return BATON_OK;
	if (!json_is_integer(v))
		return err_set(err, BATON_EINVAL, "%s%s: must be an integer", where, key);
	json_int_t i = json_integer_value(v);
	if (i < lo || i > hi)
		return err_set(err, BATON_EINVAL, "%s%s: must be between %lld and %lld", where, key,
			       (long long)lo, (long long)hi);
	*out = i;
	return BATON_OK;
}

static int parse_backoff(const json_t *b, double *out, baton_error *err)
{
	if (!b)
		return BATON_OK;
	if (!json_is_number(b))
		return err_set(err, BATON_EINVAL, "retry.backoff: must be a number");
	double d = json_number_value(b);
	if (!(d >= 1.0 && d <= 100.0))
		return err_set(err, BATON_EINVAL, "retry.backoff: must be between 1.0 and 100.0");
	*out = d;
	return BATON_OK;
}

/*
 * initial_delay_ms, the name first_retry_ms had before, meant that the first retry came
 * after initial_delay_ms * backoff; it is still taken (and still in databases written
 * then) with that meaning, and shown as first_retry_ms.
 */
static int parse_retry(const json_t *r, retry_policy *p, baton_error *err)
{
	static const char *const fields[] = {"max_attempts", "first_retry_ms", "initial_delay_ms",
					     "backoff",	     "max_delay_ms",   NULL};
	*p = default_retry;
	if (!r)
		return BATON_OK;
	if (!json_is_object(r))
		return err_set(err, BATON_EINVAL, "retry: must be an object");
	int64_t max_attempts = p->max_attempts, initial = -1;
	int rc;
	if ((rc = only_fields(r, fields, "retry", err)))
		return rc;
	if (json_object_get(r, "first_retry_ms") && json_object_get(r, "initial_delay_ms"))
		return err_set(err, BATON_EINVAL,
			       "retry: give first_retry_ms or initial_delay_ms, not both");
	if ((rc = int_field(r, "max_attempts", 1, MAX_ATTEMPTS, &max_attempts, "retry.", err)) ||
	    (rc = int_field(r, "first_retry_ms", 0, MAX_DELAY_MS, &p->first_retry_ms, "retry.",
			    err)) ||
	    (rc = int_field(r, "initial_delay_ms", 0, MAX_DELAY_MS, &initial, "retry.", err)) ||
	    (rc = int_field(r, "max_delay_ms", 0, MAX_DELAY_MS, &p->max_delay_ms, "retry.", err)) ||
	    (rc = parse_backoff(json_object_get(r, "backoff"), &p->backoff, err)))
		return rc;
	p->max_attempts = (int)max_attempts;
	if (initial >= 0) {
		double first = round((double)initial * p->backoff);
		p->first_retry_ms = first < MAX_DELAY_MS ? (int64_t)first : MAX_DELAY_MS;
	}
	return BATON_OK;
}

/* Keys in sorted order, as the stored definition has them, so a step reads the same
 * whether it comes from its row or from the definition (codec_pending_steps). */
json_t *codec_params_defaults(const char *name)
{
	return json_pack("{s:I, s:s, s:I}", "fail_attempts", (json_int_t)0, "name", name, "work_ms",
			 (json_int_t)(100 + fnv1a(name) % 100));
}

static int is_token_char(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* Headers the request may not set: baton's own, and those that frame the message. */
static int reserved_header(const char *name)
{
	static const char *const reserved[] = {
	    "idempotency-key", "host", "content-length", "transfer-encoding", "connection",
	    "expect",	       NULL};
	if (strncasecmp(name, "baton-", 6) == 0)
		return 1;
	for (const char *const *r = reserved; *r; r++)
		if (strcasecmp(name, *r) == 0)
			return 1;
	return 0;
}

static int parse_headers(const json_t *h, const char *where, baton_error *err)
{
	const char *key;
	json_t *v;
	if (!json_is_object(h))
		return err_set(err, BATON_EINVAL, "%s.headers: must be an object of strings",
			       where);
	json_object_foreach((json_t *)h, key, v)
	{
		size_t n = strlen(key);
		int ok = n > 0 && n <= 128;
		for (size_t i = 0; ok && i < n; i++)
			ok = is_token_char((unsigned char)key[i]);
		if (!ok)
			return err_set(err, BATON_EINVAL,
				       "%s.headers: \"%.64s\" is not a header name", where, key);
		if (reserved_header(key))
			return err_set(err, BATON_EINVAL,
				       "%s.headers: \"%s\" is set by baton and cannot be given",
				       where, key);
		if (!json_is_string(v) || json_string_length(v) > MAX_HEADER_VALUE ||
		    strcspn(json_string_value(v), "\r\n") != json_string_length(v))
			return err_set(err, BATON_EINVAL,
				       "%s.headers.%s: must be a string of at most %d bytes without"
				       " line breaks",
				       where, key, MAX_HEADER_VALUE);
	}
	return BATON_OK;
}

/* Whether url lies under one of the allowed prefixes, on a path boundary. */
static int url_allowed(const char *url, const char *const *allow)
{
	for (; allow && *allow; allow++) {
		size_t n = strlen(*allow);
		if (n == 0 || strncmp(url, *allow, n) != 0)
			continue;
		char next = url[n];
		if ((*allow)[n - 1] == '/' || next == 0 || next == '/' || next == '?' ||
		    next == '#')
			return 1;
	}
	return 0;
}

/* A "." or ".." path segment, literal or percent-encoded, could climb out of an allowed
 * prefix once the URL is normalized, by curl or by the server: such URLs are refused. */
static int has_dot_segment(const char *url)
{
	const char *path = strchr(strstr(url, "//") + 2, '/');
	for (const char *p = path; p && *p && *p != '?' && *p != '#';) {
		const char *seg = p + 1;
		size_t len = strcspn(seg, "/?#");
		int dots = 0, other = 0;
		for (size_t i = 0; i < len; i++) {
			if (seg[i] == '.')
				dots++;
			else if (seg[i] == '%' && i + 2 < len + 1 && seg[i + 1] == '2' &&
				 (seg[i + 2] == 'e' || seg[i + 2] == 'E')) {
				dots++;
				i += 2;
			} else
				other = 1;
		}
		if (!other && (dots == 1 || dots == 2))
			return 1;
		p = seg + len;
		if (*p != '/')
			break;
	}
	return 0;
}

static int check_url(const json_t *u, const char *where, const char *const *allow, baton_error *err)
{
	if (!u)
		return err_set(err, BATON_EINVAL, "%s.url: is required", where);
	const char *url = json_string_value(u);
	if (!url || json_string_length(u) > 2048 ||
	    (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0))
		return err_set(err, BATON_EINVAL, "%s.url: must be an http:// or https:// URL",
			       where);
	for (const char *c = url; *c; c++)
		if ((unsigned char)*c <= 0x20 || *c == 0x7f || *c == '\\')
			return err_set(err, BATON_EINVAL,
				       "%s.url: must not contain spaces, controls or backslashes",
				       where);
	if (has_dot_segment(url))
		return err_set(err, BATON_EINVAL,
			       "%s.url: must not contain \".\" or \"..\" path segments", where);
	if (!allow || !*allow)
		return err_set(
		    err, BATON_EINVAL,
		    "%s.url: HTTP calls are disabled on this server; start batond with"
		    " --allow-call PREFIX (or BATON_ALLOW_CALL) to allow URLs under PREFIX",
		    where);
	if (!url_allowed(url, allow))
		return err_set(err, BATON_EINVAL,
			       "%s.url: \"%.200s\" is not under a prefix allowed by --allow-call",
			       where, url);
	return BATON_OK;
}

static int check_method(const json_t *m, const char *where, baton_error *err)
{
	static const char *const methods[] = {"POST", "PUT", "PATCH", "GET", "DELETE", NULL};
	const char *s = json_string_value(m);
	for (const char *const *x = methods; s && *x; x++)
		if (strcmp(s, *x) == 0)
			return BATON_OK;
	return err_set(err, BATON_EINVAL, "%s.method: must be POST, PUT, PATCH, GET or DELETE",
		       where);
}

/* The fields of a "call" object, at workflow or worker level (url checked later). */
static int check_call_fields(const json_t *c, const char *where, baton_error *err)
{
	static const char *const fields[] = {"method", "url",	     "headers",
					     "body",   "timeout_ms", NULL};
	if (!json_is_object(c))
		return err_set(err, BATON_EINVAL, "%s: must be an object", where);
	char at[80];
	snprintf(at, sizeof at, "%s.", where);
	int64_t t = DEFAULT_CALL_TIMEOUT_MS;
	int rc;
	if ((rc = only_fields(c, fields, where, err)) ||
	    (rc = int_field(c, "timeout_ms", 1, MAX_CALL_TIMEOUT_MS, &t, at, err)))
		return rc;
	if (json_object_get(c, "method") &&
	    (rc = check_method(json_object_get(c, "method"), where, err)))
		return rc;
	if (json_object_get(c, "headers") &&
	    (rc = parse_headers(json_object_get(c, "headers"), where, err)))
		return rc;
	return BATON_OK;
}

/* Merges the workflow's call and the worker's (the worker's fields win, headers merge)
 * and fills defaults; returns a new object, or NULL with err set. */
static json_t *merge_call(const json_t *base, const json_t *own, const char *where,
			  const char *const *allow, baton_error *err)
{
	json_t *c = base ? json_deep_copy(base) : json_object();
	if (own) {
		json_t *h = json_object_get(c, "headers");
		json_t *oh = json_object_get(own, "headers");
		json_t *merged_h = h ? json_deep_copy(h) : NULL;
		json_object_update(c, (json_t *)own);
		if (merged_h && oh) {
			json_object_update(merged_h, oh);
			json_object_set(c, "headers", merged_h);
		}
		json_decref(merged_h);
	}
	if (!json_object_get(c, "method"))
		json_object_set_new(c, "method", json_string("POST"));
	if (!json_object_get(c, "timeout_ms"))
		json_object_set_new(c, "timeout_ms", json_integer(DEFAULT_CALL_TIMEOUT_MS));
	if (!json_object_get(c, "headers"))
		json_object_set_new(c, "headers", json_object());
	if (check_url(json_object_get(c, "url"), where, allow, err)) {
		json_decref(c);
		return NULL;
	}
	return c;
}

/* A worker with a call (its own or the workflow's): {"name", "call"}. */
static int worker_call(const json_t *w, const char *where, const parse_ctx *ctx, json_t *p,
		       json_t **out, baton_error *err)
{
	const json_t *own = json_is_object(w) ? json_object_get(w, "call") : NULL;
	char at[64];
	snprintf(at, sizeof at, "%s.call", where);
	int rc;
	if (own && (rc = check_call_fields(own, at, err)))
		return rc;
	if (json_is_object(w) &&
	    (json_object_get(w, "work_ms") || json_object_get(w, "fail_attempts")))
		return err_set(err, BATON_EINVAL,
			       "%s: a worker with a call does no simulated work; drop work_ms and"
			       " fail_attempts",
			       where);
	json_t *c = merge_call(ctx->default_call, own, at, ctx->allow_call, err);
	if (!c)
		return BATON_EINVAL;
	/* {"call", "name"}, the call's keys sorted too, as in the stored definition; p (the
	 * caller's on failure) gives way to it */
	char *text = codec_text_sorted(c);
	json_decref(c);
	json_t *sorted = text ? json_loads(text, 0, NULL) : NULL;
	free(text);
	*out = sorted ? json_pack("{s:o, s:O}", "call", sorted, "name", json_object_get(p, "name"))
		      : NULL;
	if (!*out)
		return err_set(err, BATON_EINTERNAL, "out of memory");
	json_decref(p);
	return BATON_OK;
}

/* One entry of "workers" but its "exclusive" (parse_worker); a new normalized object. */
static int parse_worker_kind(const json_t *w, size_t i, const parse_ctx *ctx, json_t **out,
			     baton_error *err)
{
	static const char *const fields[] = {
	    "name", "work_ms", "fail_attempts", "call", "external", "exclusive", NULL};
	char where[48];
	snprintf(where, sizeof where, "workers[%zu]", i);
	const json_t *name = json_is_object(w) ? json_object_get(w, "name") : w;
	if (!json_is_object(w) && !json_is_string(w))
		return err_set(err, BATON_EINVAL, "%s: must be a name or an object", where);
	if (!name)
		return err_set(err, BATON_EINVAL, "%s.name: is required", where);
	if (!json_is_string(name))
		return err_set(err, BATON_EINVAL, "%s.name: must be a string", where);
	if (!valid_worker_name(json_string_value(name), json_string_length(name)))
		return err_set(err, BATON_EINVAL, "%s.name: must be 1-128 bytes of printable UTF-8",
			       where);
	if (strlen(json_string_value(name)) != json_string_length(name))
		return err_set(err, BATON_EINVAL, "%s.name: must not contain NUL", where);
	json_t *p = codec_params_defaults(json_string_value(name));
	if (!p)
		return err_set(err, BATON_EINTERNAL, "out of memory");
	int rc0;
	if (json_is_object(w) && (rc0 = only_fields(w, fields, where, err))) {
		json_decref(p);
		return rc0;
	}
	const json_t *ext = json_is_object(w) ? json_object_get(w, "external") : NULL;
	if (ext && !json_is_boolean(ext)) {
		json_decref(p);
		return err_set(err, BATON_EINVAL, "%s.external: must be true or false", where);
	}
	if (json_is_true(ext)) { /* a process outside batond claims it (task.c) */
		json_decref(p);
		if (json_object_get(w, "call") || json_object_get(w, "work_ms") ||
		    json_object_get(w, "fail_attempts"))
			return err_set(
			    err, BATON_EINVAL,
			    "%s: an external worker has no call, work_ms or fail_attempts", where);
		*out = json_pack("{s:O, s:b}", "name", name, "external", 1);
		return *out ? BATON_OK : err_set(err, BATON_EINTERNAL, "out of memory");
	}
	if (ctx->default_call || (json_is_object(w) && json_object_get(w, "call"))) {
		int rc = worker_call(w, where, ctx, p, out, err);
		if (rc)
			json_decref(p);
		return rc;
	}
	if (json_is_object(w)) {
		int64_t work = json_integer_value(json_object_get(p, "work_ms")), fail = 0;
		char at[64];
		snprintf(at, sizeof at, "%s.", where);
		int rc;
		if ((rc = int_field(w, "work_ms", 0, MAX_WORK_MS, &work, at, err)) ||
		    (rc = int_field(w, "fail_attempts", 0, MAX_FAIL_ATTEMPTS, &fail, at, err))) {
			json_decref(p);
			return rc;
		}
		json_object_set_new(p, "work_ms", json_integer(work));
		json_object_set_new(p, "fail_attempts", json_integer(fail));
	}
	*out = p;
	return BATON_OK;
}

/* One entry of "workers": a name, or an object; returns a new normalized object. An
 * exclusive step takes all of its resource's permits (lock.c); the key is kept only when
 * true, so that a definition without it reads as it always did. */
static int parse_worker(const json_t *w, size_t i, const parse_ctx *ctx, json_t **out,
			baton_error *err)
{
	const json_t *ex = json_is_object(w) ? json_object_get(w, "exclusive") : NULL;
	if (ex && !json_is_boolean(ex))
		return err_set(err, BATON_EINVAL, "workers[%zu].exclusive: must be true or false",
			       i);
	int rc = parse_worker_kind(w, i, ctx, out, err);
	if (rc == BATON_OK && json_is_true(ex) &&
	    json_object_set_new(*out, "exclusive", json_true())) {
		json_decref(*out);
		return err_set(err, BATON_EINTERNAL, "out of memory");
	}
	return rc;
}

static int parse_workers(const json_t *ws, wf_row *wf, const parse_ctx *ctx, json_t *norm,
			 baton_error *err)
{
	if (!ws)
		return err_set(err, BATON_EINVAL, "workers: is required");
	if (!json_is_array(ws))
		return err_set(err, BATON_EINVAL, "workers: must be an array");
	size_t n = json_array_size(ws);
	if (n == 0 || n > MAX_WORKERS)
		return err_set(err, BATON_EINVAL, "workers: must hold 1 to %d workers",
			       MAX_WORKERS);
	wf->steps = xcalloc(n, sizeof *wf->steps);
	strmap *seen = strmap_new();
	int rc = BATON_OK;
	for (size_t i = 0; i < n && rc == BATON_OK; i++) {
		json_t *p = NULL;
		if ((rc = parse_worker(json_array_get(ws, i), i, ctx, &p, err)))
			break;
		step_row *st = &wf->steps[i];
		const char *name = json_string_value(json_object_get(p, "name"));
		if (!name) {
			json_decref(p);
			rc = err_set(err, BATON_EINTERNAL, "out of memory");
			break;
		}
		st->index = (int)i;
		st->worker = xstrdup(name);
		st->params = p;
		st->duration_ms = -1;
		wf->steps_total = (int)i + 1;
		json_array_append(norm, p);
		if (strmap_get(seen, st->worker))
			rc = err_set(err, BATON_EINVAL,
				     "workers[%zu]: duplicate worker name \"%.128s\"", i,
				     st->worker);
		strmap_put(seen, st->worker, st);
	}
	strmap_free(seen);
	return rc;
}

static int parse_on_failure(const json_t *v, int *out, baton_error *err)
{
	*out = ON_FAILURE_FAIL;
	if (!v)
		return BATON_OK;
	const char *s = json_string_value(v);
	if (s && strcmp(s, "fail") == 0)
		return BATON_OK;
	if (s && strcmp(s, "continue") == 0) {
		*out = ON_FAILURE_CONTINUE;
		return BATON_OK;
	}
	return err_set(err, BATON_EINVAL, "on_failure: must be \"fail\" or \"continue\"");
}

static int parse_name_field(const json_t *req, const char *key, int required, char **out,
			    baton_error *err)
{
	json_t *v = json_object_get(req, key);
	if (!v)
		return required ? err_set(err, BATON_EINVAL, "%s: is required", key) : BATON_OK;
	if (!json_is_string(v))
		return err_set(err, BATON_EINVAL, "%s: must be a string", key);
	if (strlen(json_string_value(v)) != json_string_length(v) ||
	    !valid_name(json_string_value(v)))
		return err_set(err, BATON_EINVAL, "%s: must be 1-128 characters of [A-Za-z0-9._:-]",
			       key);
	*out = xstrdup(json_string_value(v));
	return BATON_OK;
}

static json_t *retry_json(const retry_policy *p)
{
	return json_pack("{s:i, s:I, s:f, s:I}", "max_attempts", p->max_attempts, "first_retry_ms",
			 (json_int_t)p->first_retry_ms, "backoff", p->backoff, "max_delay_ms",
			 (json_int_t)p->max_delay_ms);
}

static int parse_request(const json_t *req, wf_row *wf, const char *const *allow_call,
			 baton_error *err);

int codec_parse_request(const json_t *req, wf_row *wf, const char *const *allow_call,
			baton_error *err)
{
	json_oom = 0;
	int rc = parse_request(req, wf, allow_call, err);
	if (json_oom) /* whatever was said, it was said without memory */
		return err_set(err, BATON_EINTERNAL, "out of memory while reading the request");
	return rc;
}

/* Ids that start with "lease-" are the leases' (lease.c). */
static int reserved_id(const char *id, baton_error *err)
{
	if (id && strncmp(id, "lease-", 6) == 0)
		return err_set(err, BATON_EINVAL,
			       "id: ids starting with \"lease-\" are for leases");
	return BATON_OK;
}

static int parse_request(const json_t *req, wf_row *wf, const char *const *allow_call,
			 baton_error *err)
{
	static const char *const fields[] = {"id",	   "resource", "workers", "retry",
					     "on_failure", "call",     NULL};
	parse_ctx ctx = {.allow_call = allow_call};
	if (!json_is_object(req))
		return err_set(err, BATON_EINVAL, "the body must be a JSON object");
	int rc;
	if ((rc = only_fields(req, fields, "", err)) ||
	    (rc = parse_name_field(req, "id", 0, &wf->id, err)) ||
	    (rc = reserved_id(wf->id, err)) ||
	    (rc = parse_name_field(req, "resource", 1, &wf->resource, err)) ||
	    (rc = parse_retry(json_object_get(req, "retry"), &wf->retry, err)) ||
	    (rc = parse_on_failure(json_object_get(req, "on_failure"), &wf->on_failure, err)))
		return rc;
	ctx.default_call = json_object_get(req, "call");
	if (ctx.default_call && (rc = check_call_fields(ctx.default_call, "call", err)))
		return rc;
	json_t *norm_workers = json_array();
	rc = parse_workers(json_object_get(req, "workers"), wf, &ctx, norm_workers, err);
	if (rc) {
		json_decref(norm_workers);
		return rc;
	}
	json_t *norm = json_pack("{s:s, s:o, s:o, s:s}", "resource", wf->resource, "workers",
				 norm_workers, "retry", retry_json(&wf->retry), "on_failure",
				 wf->on_failure == ON_FAILURE_CONTINUE ? "continue" : "fail");
	wf->definition = codec_text_sorted(norm);
	json_decref(norm);
	if (!wf->definition)
		return err_set(err, BATON_EINTERNAL, "out of memory");
	return BATON_OK;
}

int codec_pending_steps(wf_row *wf, const char *definition)
{
	json_t *def = json_loads(definition, 0, NULL);
	const json_t *workers = json_object_get(def, "workers");
	int rc = json_array_size(workers) == (size_t)wf->steps_total ? 0 : -1;
	for (int i = 0; rc == 0 && i < wf->steps_total; i++) {
		step_row *st = &wf->steps[i];
		json_t *p = json_array_get(workers, (size_t)i);
		const char *name = json_string_value(json_object_get(p, "name"));
		if (st->worker)
			continue;
		if (!name) {
			rc = -1;
			break;
		}
		st->index = i;
		st->worker = xstrdup(name);
		st->params = json_incref(p);
		st->status = ST_PENDING;
		st->duration_ms = -1;
	}
	json_decref(def);
	return rc;
}

char *codec_retry_text(const retry_policy *p)
{
	json_t *j = retry_json(p);
	char *text = baton_json_text(j, 0, NULL);
	json_decref(j);
	return text;
}

int codec_parse_retry(const char *text, retry_policy *p)
{
	json_t *j = text ? json_loads(text, 0, NULL) : NULL;
	int rc = parse_retry(j, p, NULL);
	json_decref(j);
	return j ? rc : BATON_ECORRUPT;
}

int codec_same_definition(const char *stored, const char *def)
{
	if (strcmp(stored, def) == 0)
		return 1;
	/* the one way an equal definition is stored in other words: written before
	 * first_retry_ms */
	json_t *old = json_loads(stored, 0, NULL);
	json_t *r = json_object_get(old, "retry");
	retry_policy p;
	int same = 0;
	if (json_object_get(r, "initial_delay_ms") && parse_retry(r, &p, NULL) == BATON_OK &&
	    json_object_set_new(old, "retry", retry_json(&p)) == 0) {
		char *text = codec_text_sorted(old);
		same = text && strcmp(text, def) == 0;
		free(text);
	}
	json_decref(old);
	return same;
}

static json_t *nullable_string(const char *s)
{
	return s ? json_string(s) : json_null();
}

static json_t *nullable_int(int64_t v, int is_set)
{
	return is_set ? json_integer(v) : json_null();
}

/* A call as the API shows it: header values may be secrets and are never echoed. */
static json_t *redacted_call(const json_t *call)
{
	json_t *c = json_deep_copy(call), *h = json_object_get(c, "headers");
	const char *key;
	json_t *v;
	json_object_foreach(h, key, v)
	{
		json_object_set_new(h, key, json_string("<redacted>"));
	}
	return c;
}

json_t *codec_step(const step_row *st, int ended)
{
	json_t *o = json_pack("{s:i, s:s}", "index", st->index, "worker", st->worker);
	const char *key;
	json_t *v;
	json_object_foreach(st->params, key, v)
	{
		if (strcmp(key, "call") == 0)
			json_object_set_new(o, key, redacted_call(v));
		else if (strcmp(key, "name") != 0 && strcmp(key, "wait_until") != 0)
			json_object_set(o, key, v); /* wait_until: a waiting lease's, internal */
	}
	/* The slot of its latest grant (lock.c); none for an exclusive grant. */
	int slot = lock_params_slot(st->params);
	json_object_set_new(o, "slot",
			    st->token > 0 && slot >= 0 ? json_integer(slot) : json_null());
	int waiting = st->status == ST_WAITING;
	/* A step not reached when its workflow failed or was cancelled will never run. */
	const char *status =
	    ended && st->status == ST_PENDING ? "skipped" : step_status_name(st->status);
	json_object_set_new(o, "status", json_string(status));
	json_object_set_new(o, "attempts", json_integer(st->attempts));
	json_object_set_new(o, "fencing_token", nullable_int(st->token, st->token > 0));
	json_object_set_new(o, "queue_position",
			    nullable_int(st->queue_position, waiting && st->queue_position > 0));
	json_object_set_new(o, "waiting_since", time_json(waiting ? st->requested_at : 0));
	json_object_set_new(o, "started_at", time_json(st->started_at));
	json_object_set_new(o, "finished_at", time_json(st->finished_at));
	json_object_set_new(o, "duration_ms", nullable_int(st->duration_ms, st->duration_ms >= 0));
	json_object_set_new(o, "next_attempt_at", time_json(st->next_attempt_at));
	json_object_set_new(o, "error", nullable_string(st->error));
	json_object_set_new(o, "result", st->result ? json_incref(st->result) : json_null());
	json_object_set_new(o, "node", nullable_string(st->node));
	return o;
}

json_t *codec_workflow_summary(const wf_row *wf)
{
	json_t *o = json_pack("{s:s, s:s, s:s}", "id", wf->id, "resource", wf->resource, "status",
			      wf_status_name(wf->status));
	json_object_set_new(o, "created_at", time_json(wf->created_at));
	json_object_set_new(o, "started_at", time_json(wf->started_at));
	json_object_set_new(o, "finished_at", time_json(wf->finished_at));
	json_object_set_new(o, "steps_total", json_integer(wf->steps_total));
	json_object_set_new(o, "steps_completed", json_integer(wf->steps_completed));
	return o;
}

json_t *codec_workflow(const wf_row *wf)
{
	json_t *o = codec_workflow_summary(wf);
	json_object_set_new(o, "cancel_requested", json_boolean(wf->cancel_requested));
	json_object_set_new(o, "retry", retry_json(&wf->retry));
	json_object_set_new(
	    o, "on_failure",
	    json_string(wf->on_failure == ON_FAILURE_CONTINUE ? "continue" : "fail"));
	json_t *steps = json_array();
	int ended = wf->status == WF_FAILED || wf->status == WF_CANCELLED;
	for (int i = 0; i < wf->steps_total; i++)
		json_array_append_new(steps, codec_step(&wf->steps[i], ended));
	json_object_set_new(o, "steps", steps);
	json_object_set_new(o, "result", wf->result ? json_incref(wf->result) : json_null());
	json_object_set_new(o, "error", nullable_string(wf->error));
	return o;
}
