/*
 * text.c - JSON text written directly, for the engine's hot path: the event rows of every
 * commit and the JSON values of step and workflow rows. The text is byte for byte what
 * jansson's compact dump writes (test_codec checks it), without its allocations, its
 * printf of integers or its two passes over a value; reals, which no hot row holds, are
 * still formatted by jansson.
 */
#include "internal.h"

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

static void text_value(textbuf *b, const json_t *v)
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
		codec_text_members(b, v);
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
			text_value(b, json_array_get(v, i));
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
	text_value(b, v);
}

void codec_text_members(textbuf *b, const json_t *obj)
{
	const char *key;
	json_t *v;
	json_object_foreach((json_t *)obj, key, v)
	{
		textbuf_put(b, ",", 1);
		text_string(b, key, strlen(key));
		textbuf_put(b, ":", 1);
		text_value(b, v);
	}
}

char *baton_json_text(const json_t *v, char end, size_t *len)
{
	textbuf b = {0};
	textbuf_reserve(&b, 256);
	text_value(&b, v);
	if (end)
		textbuf_put(&b, &end, 1);
	textbuf_put(&b, "", 1);
	if (len)
		*len = b.len - 1;
	return b.v;
}
