/*
 * log.c - the library's only way to say anything: format a line and hand it to the
 * callback given at open. The level check happens before formatting (log_at).
 */
#include "internal.h"

#include <stdio.h>

void logf_(const logger *lg, int level, const char *wf_id, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	lg->fn(lg->ud, level, wf_id, buf);
}
