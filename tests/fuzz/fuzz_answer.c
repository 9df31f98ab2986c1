/*
 * fuzz_answer.c - libFuzzer target: arbitrary bytes as what a resource sends back to an
 * HTTP step (lib/answer.c), then stored and read back as the store does (compact dump,
 * json_loads with JSON_DECODE_ANY). The first byte chooses: bit 0, the body was cut at
 * the size bound; bit 1, the bytes up to the first '\n' are the Content-Type. The
 * stored text must always read back, equal to what was stored, with a UTF-8 string body
 * equal to the bytes sent when it is shown as text. Any crash, leak, undefined behaviour
 * or abort is a finding.
 */
#include "internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size == 0)
		return 0;
	int truncated = data[0] & 1;
	const char *p = (const char *)data + 1;
	size_t n = size - 1;
	char *ct = NULL;
	if (data[0] & 2) {
		const char *nl = memchr(p, '\n', n);
		size_t ct_len = nl ? (size_t)(nl - p) : n;
		ct = strndup(p, ct_len);
		p += nl ? ct_len + 1 : ct_len;
		n -= nl ? ct_len + 1 : ct_len;
	}
	json_t *r = answer_json(200, ct, p, n, truncated);
	if (!r)
		abort();
	char *text = json_dumps(r, JSON_COMPACT | JSON_ENCODE_ANY);
	json_t *back = text ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
	if (!back || !json_equal(r, back))
		abort();
	const json_t *body = json_object_get(back, "body");
	if (!truncated && json_is_string(body) && !json_object_get(back, "encoding") &&
	    (json_string_length(body) != n || memcmp(json_string_value(body), p, n) != 0)) {
		/* a string that is not the text sent must be JSON that parsed as one */
		json_t *again = json_loadb(p, n, JSON_DECODE_ANY, NULL);
		if (!again || !json_equal(again, body))
			abort();
		json_decref(again);
	}
	json_decref(back);
	free(text);
	json_decref(r);
	free(ct);
	return 0;
}
