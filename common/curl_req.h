/*
 * curl_req.h - one HTTP request over a libcurl easy handle, set up the same way by every
 * HTTP client around batond: the client (client/http.c), the benchmarks (bench/common.c),
 * the test harness (tests/harness/requests.c, sse.c) and the torture run
 * (tests/torture/torture.c), which each compile common/curl_req.c in.
 *
 * It sets only what those requests share (URL, method and body, header lines, the body
 * collector, timeouts, NOSIGNAL) and never resets the handle: each caller resets a reused
 * handle itself and sets its own options (authentication, user agent, error buffer,
 * header capture, NOPROXY, a writer of its own) before the call.
 */
#ifndef BATON_COMMON_CURL_REQ_H
#define BATON_COMMON_CURL_REQ_H

#include <stddef.h>

#include <curl/curl.h>

#include "curl_body.h"

typedef struct curl_req {
	const char *method; /* "GET", "POST", "HEAD" (CURLOPT_NOBODY: no body awaited),
			     * or any other, sent as a custom request */
	const char *url;
	/* The body: body_len bytes from body (not copied: it must live until the call
	 * returns), or, when read is set, what read returns (CURLOPT_READFUNCTION with
	 * read_data; a chunked upload when the header lines say so). With neither, a POST
	 * sends an empty body and any other method none. */
	const char *body;
	size_t body_len;
	curl_read_callback read;
	void *read_data;
	struct curl_slist *headers; /* header lines (the caller's; NULL: libcurl's own) */
	long connect_timeout_ms;    /* 0: libcurl's default (300 s) */
	long timeout_ms;	    /* the whole request; 0: no limit */
} curl_req;

/*
 * Sets req on c and performs it. The answer's body goes to b (curl_body_write) when b is
 * not NULL, else wherever the caller's CURLOPT_WRITEFUNCTION says. Returns the answer's
 * HTTP status (libcurl's CURLINFO_RESPONSE_CODE: it may come with a transfer that failed
 * later), 0 when no answer came, -1 when libcurl refused the request's options (nothing
 * was sent). *rc (when rc is not NULL) is the transfer's result: CURLE_OK, or why it
 * failed or was refused.
 */
long curl_req_perform(CURL *c, const curl_req *req, curl_body *b, CURLcode *rc);

#endif
