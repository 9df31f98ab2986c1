/* unit.h - shared includes and helpers of the cmocka unit tests of lib/. */
#ifndef BATON_UNIT_H
#define BATON_UNIT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* Parses JSON text given by the test; fails the test when it is not JSON. */
static inline json_t *js(const char *text)
{
	json_error_t e;
	json_t *v = json_loads(text, 0, &e);
	if (!v)
		fail_msg("bad test JSON: %s", e.text);
	return v;
}

/* A workflow row parsed from a request, as the engine would hold it. */
static inline wf_row *wf_from(const char *request)
{
	wf_row *wf = calloc(1, sizeof *wf);
	json_t *req = js(request);
	baton_error err = {0};
	int rc = codec_parse_request(req, wf, NULL, &err);
	json_decref(req);
	if (rc)
		fail_msg("request rejected: %s", err.msg);
	wf->id = wf->id ? wf->id : xstrdup("wf");
	wf->dirty_lo = wf->steps_total;
	return wf;
}

#endif
