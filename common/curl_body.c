/*
 * curl_body.c - collecting an answer's body, once for every HTTP client around batond
 * (see curl_body.h).
 */
#include "curl_body.h"

#include <stdlib.h>
#include <string.h>

size_t curl_body_write(char *p, size_t size, size_t n, void *body)
{
	curl_body *b = body;
	size_t len = size * n;
	if (b->max && b->len + len + 1 > b->max) {
		b->overflow = 1;
		return 0;
	}
	if (b->len + len + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		while (cap < b->len + len + 1)
			cap *= 2;
		char *d = realloc(b->data, cap);
		if (!d)
			return 0;
		b->data = d;
		b->cap = cap;
	}
	memcpy(b->data + b->len, p, len);
	b->len += len;
	b->data[b->len] = 0;
	return len;
}

void curl_body_fini(curl_body *b)
{
	if (!b)
		return;
	free(b->data);
	b->data = NULL;
	b->len = b->cap = 0;
	b->overflow = 0;
}
