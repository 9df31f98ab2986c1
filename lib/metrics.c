/*
 * metrics.c - fixed-bucket histograms for the engine's metrics: observing is a few
 * comparisons and adds, and a snapshot renders as JSON with cumulative counts, ready for
 * the Prometheus exposition that batond serves.
 */
#include "internal.h"

/* Seconds: from a millisecond to a minute. */
const double hist_seconds[HIST_BUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
					   0.25,   0.5,	  1,	  2.5,	 5,    10,    30,   60};
/* Counts: checkpoints sharing one commit. */
const double hist_counts[HIST_BUCKETS] = {1,   2,   4,	  8,	16,   32,   64,	   128,
					  256, 512, 1024, 2048, 4096, 8192, 16384, 32768};

void hist_observe(histogram *h, const double *bounds, double v)
{
	for (int i = 0; i < HIST_BUCKETS; i++)
		if (v <= bounds[i]) {
			h->buckets[i]++;
			break;
		}
	h->count++;
	h->sum += v;
}

json_t *hist_json(const histogram *h, const double *bounds)
{
	json_t *le = json_array(), *counts = json_array();
	uint64_t cum = 0;
	for (int i = 0; i < HIST_BUCKETS; i++) {
		cum += h->buckets[i];
		json_array_append_new(le, json_real(bounds[i]));
		json_array_append_new(counts, json_integer((json_int_t)cum));
	}
	return json_pack("{s:o, s:o, s:I, s:f}", "le", le, "counts", counts, "count",
			 (json_int_t)h->count, "sum", h->sum);
}
