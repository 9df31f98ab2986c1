/*
 * rfc3339.h - reading the times batond writes, for the programs around it: the client
 * (client/), the benchmarks (bench/) and the test harness (tests/harness/), which each
 * compile common/rfc3339.c in. batond writes every time as RFC 3339 UTC with
 * milliseconds, "2026-11-30T05:40:00.123Z" (lib/util.c's time_json), and nothing else.
 */
#ifndef BATON_COMMON_RFC3339_H
#define BATON_COMMON_RFC3339_H

#include <stdint.h>

/*
 * Parses "YYYY-MM-DDTHH:MM:SS.mmmZ" (exactly those 24 characters, fields in range) into
 * *ms, milliseconds since the epoch. Returns 0, or -1 (and leaves *ms alone) for any
 * other text or NULL. Thread-safe.
 */
int rfc3339_parse_ms(const char *s, int64_t *ms);

#endif
