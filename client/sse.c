/*
 * sse.c: the frames of a Server-Sent Events stream for `baton watch`, built from the
 * fields that common/sse_lines.c splits the bytes into (lines cut anywhere by the
 * network, LF, CR LF or CR, comments such as batond's keepalive skipped).
 *
 * A field "name: value" sets a field of the frame being received; "data" lines
 * accumulate, joined by LF; a blank line ends the frame, which goes to the handler when
 * it had data. "retry" is left to the caller's reconnection policy and ignored here.
 */
#include <stdio.h>
#include <string.h>

#include "client.h"

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

/* One field, or the end of a frame (name NULL). -1 when the frame outgrows the limit. */
static int on_field(void *ud, const char *name, const char *v, size_t vlen)
{
	struct sse *s = ud;

	if (!name) {
		end_frame(s);
		return 0;
	}
	if (!strcmp(name, "data")) {
		s->has_data = 1;
		if (sbuf_add(&s->data, v, vlen, s->max) < 0 ||
		    sbuf_add(&s->data, "\n", 1, s->max) < 0)
			return -1;
	} else if (!strcmp(name, "event")) {
		snprintf(s->event, sizeof(s->event), "%.*s", (int)vlen, v);
	} else if (!strcmp(name, "id") && !memchr(v, '\0', vlen)) {
		snprintf(s->id, sizeof(s->id), "%.*s", (int)vlen, v);
	}
	return 0;
}

void sse_init(struct sse *s, size_t max_frame, sse_handler on_frame, void *userdata)
{
	memset(s, 0, sizeof(*s));
	s->max = max_frame;
	s->on_frame = on_frame;
	s->userdata = userdata;
	sse_lines_init(&s->lines, max_frame, on_field, s);
}

void sse_reset(struct sse *s)
{
	sse_lines_reset(&s->lines);
	s->data.len = 0;
	s->event[0] = s->id[0] = '\0';
	s->has_data = 0;
}

void sse_fini(struct sse *s)
{
	if (!s)
		return;
	sse_lines_fini(&s->lines);
	sbuf_fini(&s->data);
}

int sse_feed(struct sse *s, const char *p, size_t n)
{
	return sse_lines_feed(&s->lines, p, n);
}
