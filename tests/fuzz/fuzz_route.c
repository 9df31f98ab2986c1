/*
 * fuzz_route.c - libFuzzer target: arbitrary methods and paths through batond's routes
 * table (server/routes.c): matching, segment capture, HEAD served by GET routes, and the
 * Allow list for 405.
 * The first byte picks a method (or, past the known ones, uses the next bytes up to a
 * space as the method); the rest is the path.
 */
#include "server.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const methods[] = {"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"};
	if (size < 1 || size > 4096)
		return 0;
	char *text = malloc(size);
	memcpy(text, data + 1, size - 1);
	text[size - 1] = 0;
	const char *method, *path = text;
	if (data[0] < 6) {
		method = methods[data[0]];
	} else {
		char *sp = strchr(text, ' ');
		if (!sp) {
			free(text);
			return 0;
		}
		*sp = 0;
		method = text;
		path = sp + 1;
	}
	char caps[MAX_PARAMS][MAX_SEGMENT], allow[64];
	const route_def *r = route_lookup(method, path, caps, allow, sizeof allow);
	/* A route for another method: only GET's, which serves HEAD too. */
	if (r && strcmp(r->method, method) != 0 &&
	    !(strcmp(method, "HEAD") == 0 && strcmp(r->method, "GET") == 0))
		abort();
	if (r && strchr(r->pattern, '{') && strlen(caps[0]) == 0)
		abort(); /* an empty capture */
	free(text);
	return 0;
}
