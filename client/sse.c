/*
 * sse.c: an incremental parser of Server-Sent Events (the "event stream" format of the
 * WHATWG HTML standard, section "Server-sent events").
 *
 * Bytes are fed as the network delivers them, cut anywhere: in the middle of a line, of
 * a CR LF pair, of a multi-byte character. Lines end with LF, CR LF or CR. A line
 * "field: value" sets a field of the frame being received (one space after the colon is
 * dropped); "data" lines accumulate, joined by LF; a line starting with ':' is a comment
 * (batond's keepalive); a blank line ends the frame, which goes to the handler when it
 * had data. "retry" is left to the caller's reconnection policy and ignored here.
 */
#include <string.h>

#include "client.h"

void sse_init(struct sse *s, size_t max_frame, sse_handler on_frame, void *userdata)
{
	memset(s, 0, sizeof(*s));
	s->max = max_frame;
	s->on_frame = on_frame;
	s->userdata = userdata;
}

void sse_reset(struct sse *s)
{
	s->line.len = 0;
	s->data.len = 0;
	s->event[0] = s->id[0] = '\0';
	s->has_data = 0;
	s->after_cr = 0;
}

void sse_fini(struct sse *s)
{
	if (!s)
		return;
	sbuf_fini(&s->line);
	sbuf_fini(&s->data);
}

/* The blank line: hands the frame over (without the LF after its last data line). */
static void end_frame(struct sse *s)
{
	if (s->has_data) {
		if (s->data.len > 0)
			s->data.p[--s->data.len] = '\0';
		s->on_frame(s->userdata, s->id, s->event, s->data.p ? s->data.p : "", s->data.len);
	}
	s->data.len = 0;
	s->has_data = 0;
	s->event[0] = s->id[0] = '\0';
}

/* One complete line, without its end. -1 when the frame outgrows the limit. */
static int parse_line(struct sse *s, const char *line, size_t len)
{
	const char *colon = memchr(line, ':', len);
	size_t nlen = colon ? (size_t)(colon - line) : len;
	const char *v = colon ? colon + 1 : line + len;
	size_t vlen = (size_t)(line + len - v);

	if (len == 0) {
		end_frame(s);
		return 0;
	}
	if (nlen == 0)
		return 0; /* ": comment" */
	if (vlen > 0 && *v == ' ') {
		v++;
		vlen--;
	}
	if (nlen == 4 && !memcmp(line, "data", 4)) {
		s->has_data = 1;
		if (sbuf_add(&s->data, v, vlen, s->max) < 0 ||
		    sbuf_add(&s->data, "\n", 1, s->max) < 0)
			return -1;
	} else if (nlen == 5 && !memcmp(line, "event", 5)) {
		snprintf(s->event, sizeof(s->event), "%.*s", (int)vlen, v);
	} else if (nlen == 2 && !memcmp(line, "id", 2) && !memchr(v, '\0', vlen)) {
		snprintf(s->id, sizeof(s->id), "%.*s", (int)vlen, v);
	}
	return 0;
}

int sse_feed(struct sse *s, const char *p, size_t n)
{
	size_t i = 0;

	while (i < n) {
		if (s->after_cr && p[i] == '\n') {
			s->after_cr = 0; /* CR LF is one line end */
			i++;
			continue;
		}
		s->after_cr = 0;
		size_t j = i;
		while (j < n && p[j] != '\r' && p[j] != '\n')
			j++;
		if (sbuf_add(&s->line, p + i, j - i, s->max) < 0)
			return -1;
		if (j == n)
			break; /* the line goes on in the next chunk */
		s->after_cr = p[j] == '\r';
		if (parse_line(s, s->line.p ? s->line.p : "", s->line.len) < 0)
			return -1;
		s->line.len = 0;
		i = j + 1;
	}
	return 0;
}
