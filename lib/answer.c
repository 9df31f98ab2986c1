/*
 * answer.c - what a resource sent back to an HTTP step, as a JSON value that every part of
 * baton can store, read back and serve: the store, the event streams and the client only
 * ever see valid UTF-8 JSON without NUL characters, whatever bytes the resource sent.
 *
 * One representation (openapi.yaml, StepResult.response):
 *   {"status": 200, "content_type": "text/plain" | null, "body": ...,
 *    "encoding": "base64" (only when base64), "truncated": true (only when cut)}
 * and `body` is, in this order:
 *   1. the JSON value, when the whole body (not cut) is JSON (whatever its Content-Type);
 *   2. a string, when the body is UTF-8 text: valid UTF-8 with no control character but
 *      tab, LF and CR (so no NUL, and escaping at most doubles its size); an empty body
 *      is "";
 *   3. otherwise the bytes in base64 (RFC 4648, with padding), and `encoding` says so.
 * A body cut at the size bound may end in the middle of a UTF-8 sequence: that incomplete
 * tail is dropped before the text test (the body is marked truncated either way), so a
 * long text stays text.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#define MAX_CONTENT_TYPE 256

/* Length of the UTF-8 sequence starting at s (n bytes available), 0 when invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
	unsigned char c = s[0];
	size_t len;
	unsigned min;
	unsigned cp;
	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		len = 2, cp = c & 0x1f, min = 0x80;
	else if (c >= 0xe0 && c <= 0xef)
		len = 3, cp = c & 0x0f, min = 0x800;
	else if (c >= 0xf0 && c <= 0xf4)
		len = 4, cp = c & 0x07, min = 0x10000;
	else
		return 0;
	if (len > n)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3f);
	}
	if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return len;
}

/* How many bytes at the end of s are the start of a sequence cut short (0-3). */
static size_t cut_tail(const unsigned char *s, size_t n)
{
	for (size_t back = 1; back <= 3 && back <= n; back++) {
		unsigned char c = s[n - back];
		if ((c & 0xc0) == 0x80)
			continue; /* a continuation byte: look further back */
		size_t want = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
		return want > back ? back : 0;
	}
	return 0;
}

/* 1 when s is UTF-8 text: valid, with no control character but \t, \n and \r. */
static int is_text(const unsigned char *s, size_t n)
{
	for (size_t i = 0; i < n;) {
		if (s[i] < 0x20 && s[i] != '\t' && s[i] != '\n' && s[i] != '\r')
			return 0;
		size_t k = utf8_seq(s + i, n - i);
		if (!k)
			return 0;
		i += k;
	}
	return 1;
}

static json_t *base64(const unsigned char *s, size_t n)
{
	static const char abc[] =
	    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t out_len = (n + 2) / 3 * 4;
	char *out = malloc(out_len + 1);
	if (!out)
		return NULL;
	char *o = out;
	for (size_t i = 0; i < n; i += 3) {
		unsigned v = (unsigned)s[i] << 16;
		if (i + 1 < n)
			v |= (unsigned)s[i + 1] << 8;
		if (i + 2 < n)
			v |= s[i + 2];
		*o++ = abc[v >> 18 & 63];
		*o++ = abc[v >> 12 & 63];
		*o++ = i + 1 < n ? abc[v >> 6 & 63] : '=';
		*o++ = i + 2 < n ? abc[v & 63] : '=';
	}
	json_t *j = json_stringn_nocheck(out, out_len);
	free(out);
	return j;
}

/* The Content-Type as a string, or null: printable ASCII only (others become '?'), at
 * most 256 bytes, as the header is ASCII by its grammar. */
static json_t *content_type_json(const char *ct)
{
	if (!ct)
		return json_null();
	char buf[MAX_CONTENT_TYPE + 1];
	size_t n = 0;
	for (; ct[n] && n < MAX_CONTENT_TYPE; n++)
		buf[n] = (unsigned char)ct[n] >= 0x20 && (unsigned char)ct[n] < 0x7f ? ct[n] : '?';
	buf[n] = 0;
	return json_string(buf);
}

json_t *answer_json(long status, const char *content_type, const char *body, size_t len,
		    int truncated)
{
	const unsigned char *b = (const unsigned char *)(body ? body : "");
	if (!body)
		len = 0;
	json_t *value = NULL;
	int is_base64 = 0;
	if (!truncated && len)
		value = json_loadb((const char *)b, len, JSON_DECODE_ANY, NULL);
	if (!value) {
		size_t text_len = truncated ? len - cut_tail(b, len) : len;
		if (is_text(b, text_len)) {
			value = json_stringn_nocheck((const char *)b, text_len);
		} else {
			value = base64(b, len);
			is_base64 = 1;
		}
	}
	if (!value)
		return NULL;
	json_t *r = json_object();
	if (!r) {
		json_decref(value);
		return NULL;
	}
	json_object_set_new(r, "status", json_integer(status));
	json_object_set_new(r, "content_type", content_type_json(content_type));
	json_object_set_new(r, "body", value);
	if (is_base64)
		json_object_set_new(r, "encoding", json_string("base64"));
	if (truncated)
		json_object_set_new(r, "truncated", json_true());
	return r;
}

void utf8_trim(char *s)
{
	size_t n = strlen(s);
	s[n - cut_tail((const unsigned char *)s, n)] = 0;
}
