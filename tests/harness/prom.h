/*
 * prom.h - a strict parser of the Prometheus text exposition format 0.0.4, and the
 * checks the HTTP tests make with it on batond's GET /metrics.
 *
 * The parser stands in for a scraper, so it is stricter than the grammar alone: see
 * prom_parse. A parsed exposition is a JSON document that the lookups below read:
 *   {"families": {name: {"type": "counter", "help": true, ...}},
 *    "samples": [{"name", "family", "labels": {...}, "value": "text"}]}
 *
 * prom_parse and prom_metric only compute; the other functions fail the running cmocka
 * test when their expectation is not met, so they belong to the test's own thread.
 */
#ifndef BATON_TEST_PROM_H
#define BATON_TEST_PROM_H

#include <jansson.h>
#include <stddef.h>

#include "harness.h"

/*
 * Parses `text` into *out (a new reference) and returns 0, or returns -1 with the first
 * offending line in err (`errlen` bytes, always written). Beyond the grammar (metric and
 * label names, label escapes, values, optional timestamps) it demands what a scraper
 * relies on: one HELP and one TYPE per family, both before the family's samples; every
 * sample in a TYPEd family, each family's lines contiguous, no series twice, counters
 * named *_total and >= 0, histogram samples only as _bucket (with le), _sum and _count,
 * buckets in ascending le with non-decreasing integer counts ending at le="+Inf", which
 * equals _count. Stricter than Prometheus in one respect: tokens are separated by
 * exactly one space.
 */
int prom_parse(const char *text, json_t **out, char *err, size_t errlen);

/*
 * The value of sample `name` in `doc` with exactly the labels "k=v,k=v" ("" for none;
 * values unescaped, without quotes); NAN when there is no such sample.
 */
double prom_metric(const json_t *doc, const char *name, const char *labels);

/* The same, failing the test when the sample is absent. */
double prom_metric_of(const json_t *doc, const char *name, const char *labels);

/* Asserts that name{labels} is present and equals `want`. */
void prom_assert_metric(const json_t *doc, const char *name, const char *labels, double want);

/*
 * GET /metrics, asserted 200 with Content-Type text/plain; version=0.0.4 and a body that
 * prom_parse accepts. Returns the parsed document (new reference).
 */
json_t *prom_scrape(const hs_server *s);

/* Polls /metrics until name{labels} == want; fails the test after `timeout_ms`. */
void prom_wait_metric(const hs_server *s, const char *name, const char *labels, double want,
		      int timeout_ms);

/*
 * Asserts that no counter sample, and no histogram _bucket or _count sample, of the
 * exposition `before` went down in the later exposition `after` (same name and labels).
 */
void prom_assert_monotonic(const json_t *before, const json_t *after);

#endif
