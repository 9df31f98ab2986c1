/*
 * util.c - small helpers shared by the library: clocks, RFC 3339 times, ids, errors,
 * and a string-keyed hash map (open addressing, linear probing, tombstones).
 */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

int64_t wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static pthread_once_t clock_once = PTHREAD_ONCE_INIT;
static int64_t wall_minus_mono_ns; /* set once, by the first now_ms() */

static int64_t ns_of(clockid_t id)
{
	struct timespec ts;
	clock_gettime(id, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The wall clock read between two reads of the monotonic one, again when the thread was
 * held up between them (a loaded machine), so that the offset is the wall clock's own. */
static void clock_base(void)
{
	int64_t best = INT64_MAX;
	for (int i = 0; i < 16 && best > 20000; i++) {
		int64_t m1 = ns_of(CLOCK_MONOTONIC), w = ns_of(CLOCK_REALTIME);
		int64_t m2 = ns_of(CLOCK_MONOTONIC);
		if (m2 - m1 < best) {
			best = m2 - m1;
			wall_minus_mono_ns = w - (m1 + (m2 - m1) / 2);
		}
	}
}

int64_t now_ms(void)
{
	pthread_once(&clock_once, clock_base);
	return (ns_of(CLOCK_MONOTONIC) + wall_minus_mono_ns) / 1000000;
}

void cond_init_monotonic(pthread_cond_t *c)
{
	pthread_condattr_t a;
	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(c, &a);
	pthread_condattr_destroy(&a);
}

int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void format_time(int64_t ms, char buf[32])
{
	time_t secs = (time_t)(ms / 1000);
	struct tm tm;
	gmtime_r(&secs, &tm);
	size_t n = strftime(buf, 32, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf + n, 32 - n, ".%03dZ", (int)(ms % 1000));
}

json_t *time_json(int64_t ms)
{
	char buf[32];
	if (ms == 0)
		return json_null();
	format_time(ms, buf);
	return json_string(buf);
}

int err_set(baton_error *err, int code, const char *fmt, ...)
{
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof err->msg, fmt, ap);
		va_end(ap);
		err->code = code;
	}
	return code;
}

const char *baton_code_name(int code)
{
	static const char *names[] = {"ok",	   "invalid", "not found", "conflict",	"busy",
				      "i/o error", "corrupt", "internal",  "too large", "gone"};
	if (code < 0 || (size_t)code >= sizeof names / sizeof names[0])
		return "unknown";
	return names[code];
}

int random_id(char out[33])
{
	unsigned char b[16];
	size_t got = 0;
	while (got < sizeof b) {
		ssize_t n = getrandom(b + got, sizeof b - got, 0);
		if (n < 0 && errno != EINTR)
			return -1;
		if (n > 0)
			got += (size_t)n;
	}
	static const char hex[] = "0123456789abcdef";
	for (int i = 0; i < 16; i++) {
		out[2 * i] = hex[b[i] >> 4];
		out[2 * i + 1] = hex[b[i] & 15];
	}
	out[32] = 0;
	return 0;
}

uint32_t fnv1a(const char *s)
{
	uint32_t h = 2166136261u;
	for (; *s; s++) {
		h ^= (unsigned char)*s;
		h *= 16777619u;
	}
	return h;
}

static void oom(void)
{
	fputs("baton: out of memory\n", stderr);
	abort();
}

char *xstrdup(const char *s)
{
	char *d = strdup(s);
	if (!d)
		oom();
	return d;
}

void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);
	if (!p)
		oom();
	return p;
}

/* ---- jansson allocation tracking ---- */

_Thread_local int json_oom;
static void *(*json_inner_malloc)(size_t) = malloc;

static void *tracked_malloc(size_t n)
{
	void *p = json_inner_malloc(n);
	if (!p)
		json_oom = 1;
	return p;
}

void json_alloc_track(void *(*inner)(size_t))
{
	json_inner_malloc = inner ? inner : malloc;
	json_set_alloc_funcs(tracked_malloc, free);
}

/* ---- strmap ---- */

static char tombstone;

struct strmap {
	const char **keys; /* NULL: empty, &tombstone: deleted */
	void **vals;
	size_t cap, len, used;
};

strmap *strmap_new(void)
{
	strmap *m = xcalloc(1, sizeof *m);
	m->cap = 64;
	m->keys = xcalloc(m->cap, sizeof *m->keys);
	m->vals = xcalloc(m->cap, sizeof *m->vals);
	return m;
}

void strmap_free(strmap *m)
{
	if (!m)
		return;
	free(m->keys);
	free(m->vals);
	free(m);
}

static size_t slot_of(const strmap *m, const char *key, int for_insert)
{
	size_t i = fnv1a(key) & (m->cap - 1), first_free = (size_t)-1;
	for (;;) {
		const char *k = m->keys[i];
		if (!k)
			return (for_insert && first_free != (size_t)-1) ? first_free : i;
		if (k == &tombstone) {
			if (first_free == (size_t)-1)
				first_free = i;
		} else if (strcmp(k, key) == 0) {
			return i;
		}
		i = (i + 1) & (m->cap - 1);
	}
}

static void grow(strmap *m)
{
	const char **keys = m->keys;
	void **vals = m->vals;
	size_t cap = m->cap;
	m->cap = m->len * 4 > cap ? cap * 2 : cap; /* rehash in place when mostly tombstones */
	m->keys = xcalloc(m->cap, sizeof *m->keys);
	m->vals = xcalloc(m->cap, sizeof *m->vals);
	m->used = m->len;
	for (size_t i = 0; i < cap; i++) {
		if (keys[i] && keys[i] != &tombstone) {
			size_t j = slot_of(m, keys[i], 1);
			m->keys[j] = keys[i];
			m->vals[j] = vals[i];
		}
	}
	free(keys);
	free(vals);
}

void *strmap_get(const strmap *m, const char *key)
{
	size_t i = slot_of(m, key, 0);
	return m->keys[i] ? m->vals[i] : NULL;
}

void strmap_put(strmap *m, const char *key, void *value)
{
	if ((m->used + 1) * 2 > m->cap)
		grow(m);
	size_t i = slot_of(m, key, 1);
	if (!m->keys[i] || m->keys[i] == &tombstone) {
		if (!m->keys[i])
			m->used++;
		m->len++;
	}
	m->keys[i] = key;
	m->vals[i] = value;
}

void strmap_del(strmap *m, const char *key)
{
	size_t i = slot_of(m, key, 0);
	if (m->keys[i]) {
		m->keys[i] = &tombstone;
		m->vals[i] = NULL;
		m->len--;
	}
}

size_t strmap_len(const strmap *m)
{
	return m->len;
}

void strmap_each(const strmap *m, void (*fn)(void *ctx, void *value), void *ctx)
{
	for (size_t i = 0; i < m->cap; i++)
		if (m->keys[i] && m->keys[i] != &tombstone)
			fn(ctx, m->vals[i]);
}

void strmap_free_values(strmap *m, void (*fn)(void *))
{
	if (!m)
		return;
	for (size_t i = 0; i < m->cap; i++)
		if (m->keys[i] && m->keys[i] != &tombstone)
			fn(m->vals[i]);
	strmap_free(m);
}

/* ---- rows ---- */

static const char *wf_names[WF_NSTATUS] = {"pending", "running", "completed", "failed",
					   "cancelled"};
static const char *step_names[ST_NSTATUS] = {"pending",	  "waiting", "running",	 "retrying",
					     "completed", "failed",  "cancelled"};

const char *wf_status_name(int s)
{
	return (s >= 0 && s < WF_NSTATUS) ? wf_names[s] : "unknown";
}

int wf_status_parse(const char *s)
{
	for (int i = 0; i < WF_NSTATUS; i++)
		if (strcmp(s, wf_names[i]) == 0)
			return i;
	return -1;
}

const char *step_status_name(int s)
{
	return (s >= 0 && s < ST_NSTATUS) ? step_names[s] : "unknown";
}

int step_status_parse(const char *s)
{
	for (int i = 0; i < ST_NSTATUS; i++)
		if (strcmp(s, step_names[i]) == 0)
			return i;
	return -1;
}

void wf_row_free(wf_row *wf)
{
	if (!wf)
		return;
	for (int i = 0; wf->steps && i < wf->steps_total; i++) {
		step_row *st = &wf->steps[i];
		free(st->worker);
		free(st->node);
		json_decref(st->params);
		free(st->error);
		json_decref(st->result);
	}
	free(wf->steps);
	free(wf->task_claim_rid);
	free(wf->id);
	free(wf->resource);
	free(wf->definition);
	json_decref(wf->result);
	free(wf->error);
	free(wf);
}

void resource_row_fini(resource_row *r)
{
	free(r->name);
	r->name = NULL;
	free(r->holders);
	r->holders = NULL;
}

static void put_str(char *out, size_t n, size_t *k, const char *s)
{
	for (; *s && *k + 1 < n; s++)
		out[(*k)++] = *s;
}

void baton_db_redact(const char *db, char *out, size_t n)
{
	if (!n)
		return;
	/* The password of user:PASSWORD@ in the URL's authority, if there is one. */
	const char *pw = NULL, *pw_end = NULL, *auth = strstr(db, "://");
	if (auth) {
		auth += 3;
		const char *at = auth + strcspn(auth, "@/?");
		const char *colon = *at == '@' ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
		if (colon) {
			pw = colon + 1;
			pw_end = at;
		}
	}
	size_t k = 0;
	for (const char *p = db; *p && k + 1 < n;) {
		if (p == pw) {
			put_str(out, n, &k, "***");
			p = pw_end;
		} else if (strncmp(p, "password=", 9) == 0 && (p == db || strchr("?& ", p[-1]))) {
			put_str(out, n, &k, "password=***");
			p += 9 + strcspn(p + 9, "& ");
		} else {
			out[k++] = *p++;
		}
	}
	out[k] = 0;
}
