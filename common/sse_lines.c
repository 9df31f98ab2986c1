/*
 * sse_lines.c - splitting an event stream into fields, once for the client and the test
 * harness (see sse_lines.h).
 */
#include "sse_lines.h"

#include <stdlib.h>
#include <string.h>

void sse_lines_init(sse_lines *l, size_t max_line, sse_field_fn fn, void *ud)
{
	memset(l, 0, sizeof *l);
	l->line.max = max_line + 1; /* and its NUL */
	l->fn = fn;
	l->ud = ud;
}

void sse_lines_reset(sse_lines *l)
{
	l->line.len = 0;
	l->after_cr = 0;
}

void sse_lines_fini(sse_lines *l)
{
	if (l)
		curl_body_fini(&l->line);
}

static int add(sse_lines *l, const char *p, size_t n)
{
	return n == 0 || curl_body_write((char *)p, 1, n, &l->line) == n ? 0 : -1;
}

/* One complete line (NUL-terminated in place), without its end. */
static int line_done(sse_lines *l)
{
	char *line = l->line.data ? l->line.data : (char *)"";
	size_t len = l->line.len;
	if (len == 0)
		return l->fn(l->ud, NULL, NULL, 0);
	char *colon = memchr(line, ':', len);
	if (colon == line)
		return 0; /* ": comment" */
	char *v = colon ? colon + 1 : line + len;
	size_t vlen = (size_t)(line + len - v);
	if (colon)
		*colon = 0;
	if (vlen > 0 && *v == ' ') {
		v++;
		vlen--;
	}
	return l->fn(l->ud, line, v, vlen);
}

int sse_lines_feed(sse_lines *l, const char *p, size_t n)
{
	size_t i = 0;
	while (i < n) {
		if (l->after_cr && p[i] == '\n') {
			l->after_cr = 0; /* CR LF is one line end */
			i++;
			continue;
		}
		l->after_cr = 0;
		size_t j = i;
		while (j < n && p[j] != '\r' && p[j] != '\n')
			j++;
		if (add(l, p + i, j - i) < 0)
			return -1;
		if (j == n)
			break; /* the line goes on in the next chunk */
		l->after_cr = p[j] == '\r';
		int rc = line_done(l);
		l->line.len = 0;
		if (rc < 0)
			return -1;
		i = j + 1;
	}
	return 0;
}
