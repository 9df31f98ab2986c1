/*
 * util.c: JSON field access, output and time helpers shared by the commands and the demo.
 *
 * The server's documents are read leniently: a missing or mistyped field yields the
 * caller's default instead of a crash, so that a newer server never breaks an older client.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client.h"

const char *jstr(const json_t *obj, const char *key, const char *dflt)
{
	const char *s = json_string_value(json_object_get(obj, key));

	return s ? s : dflt;
}

json_int_t jint(const json_t *obj, const char *key, json_int_t dflt)
{
	const json_t *v = json_object_get(obj, key);

	return json_is_integer(v) ? json_integer_value(v) : dflt;
}

int jhas(const json_t *obj, const char *key)
{
	const json_t *v = json_object_get(obj, key);

	return v && !json_is_null(v);
}

void print_json(FILE *out, const json_t *v)
{
	json_dumpf(v, out, JSON_INDENT(2) | JSON_ENCODE_ANY);
	fputc('\n', out);
}

static int plain_token(const char *s)
{
	if (!*s)
		return 0;
	for (; *s; s++) {
		if (!strchr("._:/@+-", *s) && !(*s >= 'a' && *s <= 'z') &&
		    !(*s >= 'A' && *s <= 'Z') && !(*s >= '0' && *s <= '9'))
			return 0;
	}
	return 1;
}

void print_token(FILE *out, const char *s)
{
	if (plain_token(s)) {
		fputs(s, out);
		return;
	}
	json_t *str = json_string(s);
	if (str)
		json_dumpf(str, out, JSON_ENCODE_ANY);
	else
		fputs("\"?\"", out); /* not UTF-8: jansson refuses it */
	json_decref(str);
}

void format_secs(char *buf, size_t len, json_int_t ms)
{
	const char *sign = ms < 0 ? "-" : "";
	unsigned long long a = ms < 0 ? -(unsigned long long)ms : (unsigned long long)ms;
	unsigned long long frac = a % 1000;

	if (frac == 0) {
		snprintf(buf, len, "%s%llu", sign, a / 1000);
		return;
	}
	int digits = 3;
	while (frac % 10 == 0) {
		frac /= 10;
		digits--;
	}
	snprintf(buf, len, "%s%llu.%0*llu", sign, a / 1000, digits, frac);
}

long long monotonic_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

	/* Bounded: each EINTR resumes with the time left, which only shrinks. */
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

int sbuf_add(struct sbuf *b, const char *s, size_t n, size_t max)
{
	if (b->len + n + 1 > max)
		return -1;
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->len + n + 1)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p)
			return -1;
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
	return 0;
}

void sbuf_fini(struct sbuf *b)
{
	if (!b)
		return;
	free(b->p);
	b->p = NULL;
	b->len = b->cap = 0;
}
