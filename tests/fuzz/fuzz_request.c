/*
 * fuzz_request.c - libFuzzer target: arbitrary bytes as the body of POST /workflows,
 * through JSON decoding, every validation rule of codec.c, and the rendering of the
 * accepted workflow. Any crash, leak or undefined behaviour is a finding.
 */
#include "internal.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const allow[] = {"http://127.0.0.1:9000/api/", "https://pay.example",
					    NULL};
	json_error_t jerr;
	json_t *req = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &jerr);
	if (!req)
		return 0;
	wf_row *wf = xcalloc(1, sizeof *wf);
	baton_error err;
	if (codec_parse_request(req, wf, allow, &err) == BATON_OK) {
		wf->id = wf->id ? wf->id : xstrdup("fuzz");
		json_decref(codec_workflow(wf));
	}
	wf_row_free(wf);
	json_decref(req);
	return 0;
}
