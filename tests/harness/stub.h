/*
 * stub.h - a stand-in for batond in the client's tests: an in-process HTTP server
 * (libmicrohttpd, one thread per connection) on 127.0.0.1, port 0, whose answers the
 * test decides. It stands for what a real batond cannot be made to do on demand: answer
 * 503 to everything, or hold an answer back for a given time after it decided it (a slow
 * server, or a slow network on the way back).
 *
 * Each request is answered by the rule of the first route whose method and path prefix
 * match (a default 404 when none does), after the rule's delay_ms; its arrival is
 * recorded, with the first bytes of its body and the monotonic time (CLOCK_MONOTONIC ms, the clock
 * of hs_mono_ms). A delay ends early when the stub is closed. All functions are thread-safe.
 */
#ifndef BATON_TEST_STUB_H
#define BATON_TEST_STUB_H

#include <stddef.h>
#include <stdint.h>

typedef struct stub stub;

typedef struct stub_rule {
	const char *method; /* "POST"; NULL: any */
	const char *prefix; /* the path starts with it; NULL: any */
	int status;
	const char *body; /* application/json when not NULL; NULL: no body */
	int delay_ms;	  /* before the answer is queued */
} stub_rule;

/* Starts the stub on 127.0.0.1 with an ephemeral port; NULL (after printing why). */
stub *stub_open(void);
/* Stops it (ending every delay) and frees it. Accepts NULL. */
void stub_close(stub *s);
/* "http://127.0.0.1:PORT" (a new string, the caller frees it). */
char *stub_url(const stub *s);
/* Adds a route (strings copied); routes are tried in the order they were added. */
void stub_route(stub *s, stub_rule r);

/* How many requests arrived so far, and how many of them match method and prefix. */
size_t stub_count(stub *s, const char *method, const char *prefix);
/* The arrival time of the first request that matches method and prefix; -1 if none. */
int64_t stub_first_arrival(stub *s, const char *method, const char *prefix);
/* The first 511 bytes of the body of the first request that matches method and prefix
 * (a new string, the caller frees it); NULL if none arrived. */
char *stub_body(stub *s, const char *method, const char *prefix);

#endif
