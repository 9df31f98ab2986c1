/*
 * text.c - JSON text written directly, for the engine's hot path: the event rows of every
 * commit and the JSON values of step and workflow rows. The text is byte for byte what
 * jansson's compact dump writes (test_codec checks it), without its allocations, its
 * printf of integers or its two passes over a value; reals, which no hot row holds, are
 * still formatted by jansson.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

void textbuf_reserve(textbuf *b, size_t n)
{
	if (b->len + n <= b->cap)
		return;
	size_t cap = b->cap ? b->cap : 4096;
	while (cap < b->len + n)
		cap *= 2;
	char *p = realloc(b->v, cap);
	if (!p)
		abort();
	b->v = p;
	b->cap = cap;
}

void textbuf_put(textbuf *b, const char *p, size_t n)
{
	textbuf_reserve(b, n);
	memcpy(b->v + b->len, p, n);
	b->len += n;
}

/* s as a JSON string, escaped as jansson escapes it (UTF-8 passes through as is). Runs of
 * characters that need no escape, nearly all of them, are copied whole. */
static void text_string(textbuf *b, const char *s, size_t n)
{
	static const char hex[] = "0123456789ABCDEF";
	textbuf_reserve(b, 2 + 6 * n);
	char *o = b->v + b->len;
	*o++ = '"';
	size_t i = 0;
	while (i < n) {
		size_t run = i;
		while (run < n && (unsigned char)s[run] >= 0x20 && s[run] != '"' && s[run] != '\\')
			run++;
		memcpy(o, s + i, run - i);
		o += run - i;
		if (run == n)
			break;
		unsigned char c = (unsigned char)s[run];
		const char *esc = c == '"'    ? "\\\""
				  : c == '\\' ? "\\\\"
				  : c == '\b' ? "\\b"
				  : c == '\f' ? "\\f"
				  : c == '\n' ? "\\n"
				  : c == '\r' ? "\\r"
				  : c == '\t' ? "\\t"
					      : NULL;
		if (esc) {
			*o++ = esc[0];
			*o++ = esc[1];
		} else {
			memcpy(o, "\\u00", 4);
			o[4] = hex[c >> 4];
			o[5] = hex[c & 15];
			o += 6;
		}
		i = run + 1;
	}
	*o++ = '"';
	b->len = (size_t)(o - b->v);
}

void textbuf_int(textbuf *b, int64_t x)
{
	char num[24], *o = num + sizeof num;
	/* The magnitude as unsigned: negating the smallest json_int_t would overflow. */
	uint64_t u = x < 0 ? 0 - (uint64_t)x : (uint64_t)x;
	do
		*--o = (char)('0' + u % 10);
	while (u /= 10);
	if (x < 0)
		*--o = '-';
	textbuf_put(b, o, (size_t)(num + sizeof num - o));
}

static void text_value(textbuf *b, const json_t *v, int sorted);

static int cmp_key(const void *x, const void *y)
{
	return strcmp(*(const char *const *)x, *(const char *const *)y);
}

/* ,"key":value for each member, in the object's order or, when sorted, in strcmp's order
 * of the keys (as JSON_SORT_KEYS orders them; keys never hold a NUL here). */
static void text_members(textbuf *b, const json_t *obj, int sorted)
{
	const char *key;
	json_t *v;
	if (!sorted) {
		json_object_foreach((json_t *)obj, key, v)
		{
			textbuf_put(b, ",", 1);
			text_string(b, key, strlen(key));
			textbuf_put(b, ":", 1);
			text_value(b, v, 0);
		}
		return;
	}
	size_t n = json_object_size(obj), k = 0;
	const char *small[16], **keys = n <= 16 ? small : malloc(n * sizeof *keys);
	if (!keys)
		abort();
	json_object_foreach((json_t *)obj, key, v) keys[k++] = key;
	qsort(keys, n, sizeof *keys, cmp_key);
	for (k = 0; k < n; k++) {
		textbuf_put(b, ",", 1);
		text_string(b, keys[k], strlen(keys[k]));
		textbuf_put(b, ":", 1);
		text_value(b, json_object_get(obj, keys[k]), 1);
	}
	if (keys != small)
		free(keys);
}

static void text_value(textbuf *b, const json_t *v, int sorted)
{
	switch (json_typeof(v)) {
	case JSON_STRING:
		text_string(b, json_string_value(v), json_string_length(v));
		return;
	case JSON_INTEGER:
		textbuf_int(b, json_integer_value(v));
		return;
	case JSON_NULL:
		textbuf_put(b, "null", 4);
		return;
	case JSON_TRUE:
		textbuf_put(b, "true", 4);
		return;
	case JSON_FALSE:
		textbuf_put(b, "false", 5);
		return;
	case JSON_OBJECT: {
		size_t at = b->len;
		text_members(b, v, sorted);
		if (b->len == at)
			textbuf_put(b, "{", 1);
		else
			b->v[at] = '{'; /* the first member's comma */
		textbuf_put(b, "}", 1);
		return;
	}
	case JSON_ARRAY:
		textbuf_put(b, "[", 1);
		for (size_t i = 0; i < json_array_size(v); i++) {
			if (i)
				textbuf_put(b, ",", 1);
			text_value(b, json_array_get(v, i), sorted);
		}
		textbuf_put(b, "]", 1);
		return;
	default: /* reals: jansson's own formatting */
		break;
	}
	size_t room = b->cap - b->len;
	size_t need = json_dumpb(v, b->v + b->len, room, JSON_COMPACT | JSON_ENCODE_ANY);
	if (need > room) {
		textbuf_reserve(b, need);
		need = json_dumpb(v, b->v + b->len, need, JSON_COMPACT | JSON_ENCODE_ANY);
	}
	b->len += need;
}

void codec_text(textbuf *b, const json_t *v)
{
	text_value(b, v, 0);
}

void codec_text_members(textbuf *b, const json_t *obj)
{
	text_members(b, obj, 0);
}

/* NULL for no value, as json_dumps answers (a value that failed to build). */
static char *text_of(const json_t *v, int sorted, char end, size_t *len)
{
	if (!v)
		return NULL;
	textbuf b = {0};
	textbuf_reserve(&b, 256);
	text_value(&b, v, sorted);
	if (end)
		textbuf_put(&b, &end, 1);
	textbuf_put(&b, "", 1);
	if (len)
		*len = b.len - 1;
	return b.v;
}

char *baton_json_text(const json_t *v, char end, size_t *len)
{
	return text_of(v, 0, end, len);
}

char *codec_text_sorted(const json_t *v)
{
	return text_of(v, 1, 0, NULL);
}
