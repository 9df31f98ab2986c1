/*
 * sse_lines.h - the lines of a Server-Sent Events stream (the "event stream" format of the
 * WHATWG HTML standard, section "Server-sent events"), for the two readers of batond's
 * streams: the client's `baton watch` (client/sse.c builds its frames) and the test
 * harness (tests/harness/sse.c checks every block strictly). Both compile
 * common/sse_lines.c in.
 *
 * Bytes are fed as the network delivers them, cut anywhere: in the middle of a line, of
 * a CR LF pair, of a multi-byte character. Lines end with LF, CR LF or CR. Each complete
 * line goes to the caller's field function as "name: value" (one space after the colon
 * dropped; a line without a colon is a name with an empty value), except comments (a
 * line that starts with ':', such as batond's keepalive), which are skipped; a blank
 * line, which ends an event block, comes as a NULL name.
 */
#ifndef BATON_COMMON_SSE_LINES_H
#define BATON_COMMON_SSE_LINES_H

#include <stddef.h>

#include "curl_body.h"

/*
 * One field (name and value NUL-terminated, valid during the call; vlen may count NULs
 * inside the value), or the end of a block (name NULL). Returns 0, or -1 to stop the
 * stream (sse_lines_feed then returns -1).
 */
typedef int (*sse_field_fn)(void *ud, const char *name, const char *value, size_t vlen);

typedef struct sse_lines {
	curl_body line; /* the line being received; its max: bytes one line may reach */
	int after_cr;	/* the last byte was CR: an LF right after it ends no line */
	sse_field_fn fn;
	void *ud;
} sse_lines;

void sse_lines_init(sse_lines *l, size_t max_line, sse_field_fn fn, void *ud);
/* Forgets a partial line: the stream starts again (a new connection). */
void sse_lines_reset(sse_lines *l);
/* Parses n more bytes; 0, or -1 when a line passes max_line, memory ran out, or the
 * field function asked to stop. */
int sse_lines_feed(sse_lines *l, const char *p, size_t n);
/* Frees the line buffer (accepts NULL). */
void sse_lines_fini(sse_lines *l);

#endif
