/*
 * curl_body.h - an answer's body collected by libcurl, for every HTTP client around
 * batond: the client (client/http.c), the benchmarks (bench/common.c), the test harness
 * (tests/harness/requests.c, sse.c) and the torture run (tests/torture/torture.c), which
 * each compile common/curl_body.c in.
 */
#ifndef BATON_COMMON_CURL_BODY_H
#define BATON_COMMON_CURL_BODY_H

#include <stddef.h>

typedef struct curl_body {
	char *data; /* NUL-terminated once anything arrived; NULL before */
	size_t len, cap;
	size_t max;   /* bytes it may reach, 0: no limit */
	int overflow; /* the answer passed max (the transfer was aborted) */
} curl_body;

/*
 * CURLOPT_WRITEFUNCTION with a curl_body as CURLOPT_WRITEDATA: appends the bytes.
 * Returns what it took; 0 (which aborts the transfer) when memory ran out or the body
 * would pass max (overflow set).
 */
size_t curl_body_write(char *p, size_t size, size_t n, void *body);

/* Frees the bytes and empties the body (accepts NULL). */
void curl_body_fini(curl_body *b);

#endif
