/*
 * metrics.c - GET /metrics in the Prometheus text format (version 0.0.4): the engine's
 * counters and histograms, workflows by status, per-resource lock wait and hold times
 * and queue depth, and the HTTP layer's requests by route, method and status with a
 * latency histogram. Names follow Prometheus conventions: counters end in _total,
 * durations are in seconds.
 */
#include "server.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SERIES 512

static const double latency_le[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
				    0.1,    0.25,  0.5,	   1,	  2.5,	5,     10};
#define NLE (sizeof latency_le / sizeof latency_le[0])

static struct {
	pthread_mutex_t mu;
	struct series {
		const char *route, *method; /* static strings, or interned below */
		int status;
		unsigned long long n;
	} series[MAX_SERIES];
	int nseries;
	unsigned long long le[NLE], count;
	double sum;
} http = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Methods other than the usual ones are counted as "OTHER", so labels stay bounded. */
static const char *method_label(const char *m)
{
	static const char *const known[] = {"GET",    "POST", "PUT",	"PATCH",
					    "DELETE", "HEAD", "OPTIONS"};
	for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
		if (strcmp(m, known[i]) == 0)
			return known[i];
	return "OTHER";
}

void srv_metrics_request(const char *route, const char *method, int status, double seconds,
			 int streaming)
{
	const char *m = method_label(method);
	pthread_mutex_lock(&http.mu);
	int i;
	for (i = 0; i < http.nseries; i++)
		if (http.series[i].route == route && http.series[i].method == m &&
		    http.series[i].status == status)
			break;
	if (i == http.nseries && i < MAX_SERIES)
		http.series[http.nseries++] = (struct series){route, m, status, 0};
	if (i < MAX_SERIES)
		http.series[i].n++;
	if (!streaming) {
		for (size_t b = 0; b < NLE; b++)
			if (seconds <= latency_le[b])
				http.le[b]++;
		http.count++;
		http.sum += seconds;
	}
	pthread_mutex_unlock(&http.mu);
}

typedef struct buf {
	char *p;
	size_t len, cap;
} buf;

static void put(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(buf *b, const char *fmt, ...)
{
	for (;;) {
		va_list ap;
		va_start(ap, fmt);
		int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
		va_end(ap);
		if (n < 0)
			return;
		if ((size_t)n < b->cap - b->len) {
			b->len += (size_t)n;
			return;
		}
		size_t cap = (b->cap + (size_t)n) * 2;
		char *p = realloc(b->p, cap);
		if (!p)
			return;
		b->p = p;
		b->cap = cap;
	}
}

static void family(buf *b, const char *name, const char *type, const char *help)
{
	put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One histogram from the engine's JSON form; labels is "" or `resource="x",`. */
static void histogram(buf *b, const char *name, const char *labels, const json_t *h)
{
	size_t i;
	json_t *le;
	json_array_foreach(json_object_get(h, "le"), i, le)
	{
		put(b, "%s_bucket{%sle=\"%g\"} %lld\n", name, labels, json_real_value(le),
		    (long long)json_integer_value(json_array_get(json_object_get(h, "counts"), i)));
	}
	long long count = (long long)json_integer_value(json_object_get(h, "count"));
	put(b, "%s_bucket{%sle=\"+Inf\"} %lld\n", name, labels, count);
	size_t n = strlen(labels);
	put(b, "%s_sum%s%.*s%s %.6f\n", name, n ? "{" : "", n ? (int)n - 1 : 0, labels,
	    n ? "}" : "", json_real_value(json_object_get(h, "sum")));
	put(b, "%s_count%s%.*s%s %lld\n", name, n ? "{" : "", n ? (int)n - 1 : 0, labels,
	    n ? "}" : "", count);
}

static void counter(buf *b, const char *name, const char *help, const json_t *m, const char *key)
{
	family(b, name, "counter", help);
	put(b, "%s %lld\n", name, (long long)json_integer_value(json_object_get(m, key)));
}

static void engine_metrics(buf *b, const json_t *m)
{
	const char *key;
	json_t *v;
	family(b, "baton_workflows", "gauge", "Workflows stored, by status.");
	json_object_foreach((json_t *)json_object_get(m, "workflows"), key, v)
	{
		put(b, "baton_workflows{status=\"%s\"} %lld\n", key,
		    (long long)json_integer_value(v));
	}
	counter(b, "baton_steps_completed_total", "Step attempts that completed.", m,
		"steps_completed");
	counter(b, "baton_steps_failed_total", "Steps that failed for good.", m, "steps_failed");
	counter(b, "baton_steps_retried_total", "Failed step attempts that will be retried.", m,
		"steps_retried");
	counter(b, "baton_commits_total", "Checkpoint transactions committed.", m, "commits");
	counter(b, "baton_checkpoints_total", "Step outcomes checkpointed.", m, "checkpoints");
	counter(b, "baton_workflows_deleted_total",
		"Finished workflows deleted (by retention or DELETE), with their events.", m,
		"workflows_deleted");
	counter(b, "baton_deletes_total",
		"Transactions that deleted workflows (a retention batch or one DELETE).", m,
		"deletes");
	const json_t *leases = json_object_get(m, "leases");
	counter(b, "baton_leases_granted_total", "Leases granted.", leases, "granted");
	counter(b, "baton_leases_released_total", "Leases released by their holder.", leases,
		"released");
	counter(b, "baton_leases_expired_total", "Leases that expired without a renewal.", leases,
		"expired");
	counter(b, "baton_leases_refused_total",
		"Lease requests not granted (busy, wait_ms over, client gone).", leases, "refused");
	family(b, "baton_commit_duration_seconds", "histogram",
	       "Time to write and commit one group of checkpoints (fsync included).");
	histogram(b, "baton_commit_duration_seconds", "", json_object_get(m, "commit_seconds"));
	family(b, "baton_checkpoints_per_commit", "histogram",
	       "Step outcomes sharing one commit (group commit).");
	histogram(b, "baton_checkpoints_per_commit", "",
		  json_object_get(m, "checkpoints_per_commit"));
	family(b, "baton_engine_timers", "gauge",
	       "Timers the engine keeps: retries, lease and claim deadlines.");
	put(b, "baton_engine_timers %lld\n",
	    (long long)json_integer_value(json_object_get(m, "timers")));
	family(b, "baton_finished_cache_bytes", "gauge",
	       "Bytes of finished workflows' text kept in memory (at most --cache-bytes).");
	put(b, "baton_finished_cache_bytes %lld\n",
	    (long long)json_integer_value(json_object_get(m, "finished_cache_bytes")));
	json_t *res = json_object_get(m, "resources");
	family(b, "baton_resource_queue_depth", "gauge", "Steps waiting for the resource.");
	json_object_foreach(res, key, v)
	{
		put(b, "baton_resource_queue_depth{resource=\"%s\"} %lld\n", key,
		    (long long)json_integer_value(json_object_get(v, "queue_depth")));
	}
	family(b, "baton_resource_held", "gauge", "1 while anyone holds the resource.");
	json_object_foreach(res, key, v)
	{
		put(b, "baton_resource_held{resource=\"%s\"} %d\n", key,
		    json_integer_value(json_object_get(v, "holders")) > 0);
	}
	family(b, "baton_resource_permits_in_use", "gauge",
	       "Permits held: one per holder, the limit for an exclusive holder.");
	json_object_foreach(res, key, v)
	{
		put(b, "baton_resource_permits_in_use{resource=\"%s\"} %lld\n", key,
		    (long long)json_integer_value(json_object_get(v, "permits_in_use")));
	}
	family(b, "baton_resource_permit_limit", "gauge",
	       "How many may hold the resource at once (PUT /resources/{name}).");
	json_object_foreach(res, key, v)
	{
		put(b, "baton_resource_permit_limit{resource=\"%s\"} %lld\n", key,
		    (long long)json_integer_value(json_object_get(v, "limit")));
	}
	char labels[300];
	family(b, "baton_lock_wait_seconds", "histogram", "Time a step waited for its resource.");
	json_object_foreach(res, key, v)
	{
		snprintf(labels, sizeof labels, "resource=\"%s\",", key);
		histogram(b, "baton_lock_wait_seconds", labels, json_object_get(v, "wait_seconds"));
	}
	family(b, "baton_lock_hold_seconds", "histogram", "Time a step held its resource.");
	json_object_foreach(res, key, v)
	{
		snprintf(labels, sizeof labels, "resource=\"%s\",", key);
		histogram(b, "baton_lock_hold_seconds", labels, json_object_get(v, "hold_seconds"));
	}
}

static void http_metrics(buf *b)
{
	pthread_mutex_lock(&http.mu);
	family(b, "baton_http_requests_total", "counter", "HTTP requests answered.");
	for (int i = 0; i < http.nseries; i++)
		put(b, "baton_http_requests_total{route=\"%s\",method=\"%s\",status=\"%d\"} %llu\n",
		    http.series[i].route, http.series[i].method, http.series[i].status,
		    http.series[i].n);
	family(b, "baton_http_request_duration_seconds", "histogram",
	       "Time from a request's arrival to its answer (event streams excluded).");
	for (size_t i = 0; i < NLE; i++)
		put(b, "baton_http_request_duration_seconds_bucket{le=\"%g\"} %llu\n",
		    latency_le[i], http.le[i]);
	put(b, "baton_http_request_duration_seconds_bucket{le=\"+Inf\"} %llu\n", http.count);
	put(b, "baton_http_request_duration_seconds_sum %.6f\n", http.sum);
	put(b, "baton_http_request_duration_seconds_count %llu\n", http.count);
	pthread_mutex_unlock(&http.mu);
	family(b, "baton_event_streams", "gauge", "Open event streams.");
	put(b, "baton_event_streams %d\n", srv_streams_count());
	unsigned long long passed, failed;
	srv_forward_counts(&passed, &failed);
	family(b, "baton_requests_passed_on_total", "counter",
	       "Lease and task requests passed on to the node that drives their resource.");
	put(b, "baton_requests_passed_on_total %llu\n", passed);
	family(b, "baton_requests_passed_on_failed_total", "counter",
	       "Of those, the ones that got no answer from that node (answered 503 here).");
	put(b, "baton_requests_passed_on_failed_total %llu\n", failed);
}

/* This node's place in the cluster (one node alone on SQLite). */
static void cluster_metrics(buf *b, baton_engine *e)
{
	json_t *c = baton_engine_cluster(e);
	family(b, "baton_cluster_nodes", "gauge", "Live nodes on this database, as last read.");
	put(b, "baton_cluster_nodes %lld\n",
	    (long long)json_integer_value(json_object_get(c, "nodes")));
	family(b, "baton_node_partitions", "gauge",
	       "Partitions this node drives (of 64): claimed, and their work loaded.");
	put(b, "baton_node_partitions %lld\n",
	    (long long)json_integer_value(json_object_get(c, "partitions")));
	family(b, "baton_node_lease_expires_in_seconds", "gauge",
	       "Time left on this node's lease (0 without a cluster).");
	put(b, "baton_node_lease_expires_in_seconds %.3f\n",
	    json_is_true(json_object_get(c, "clustered"))
		? (double)json_integer_value(json_object_get(c, "lease_left_ms")) / 1000.0
		: 0.0);
	counter(b, "baton_node_partitions_gained_total", "Partitions this node took over.", c,
		"partitions_gained");
	counter(b, "baton_node_partitions_lost_total",
		"Partitions taken from this node while its lease had run out.", c,
		"partitions_lost");
	counter(b, "baton_node_lease_renew_failures_total", "Lease renewals that failed.", c,
		"renew_failures");
	json_decref(c);
	/* PostgreSQL only: on SQLite they do not apply, and are left out. */
	json_t *st = baton_engine_store(e);
	json_t *sync = json_object_get(st, "sync_replication");
	if (json_is_boolean(sync)) {
		family(b, "baton_store_sync_replication", "gauge",
		       "1 when the database replicates commits synchronously"
		       " (synchronous_standby_names set), else 0; as last read.");
		put(b, "baton_store_sync_replication %d\n", json_is_true(sync));
		family(b, "baton_store_sync_standbys", "gauge",
		       "Standbys that pg_stat_replication shows as sync or quorum.");
		put(b, "baton_store_sync_standbys %lld\n",
		    (long long)json_integer_value(json_object_get(st, "sync_standbys")));
	}
	json_decref(st);
}

int h_metrics(srv *s, const request *r, const char *const *p, response *out)
{
	json_t *m;
	baton_error err = {0};
	(void)r;
	(void)p;
	if (baton_engine_metrics(s->engine, &m, &err))
		return reply_error(out, &err);
	buf b = {0};
	engine_metrics(&b, m);
	cluster_metrics(&b, s->engine);
	http_metrics(&b);
	json_decref(m);
	if (!b.p)
		return reply_problem(out, 500, "out of memory");
	out->status = 200;
	out->text = b.p;
	out->content_type = "text/plain; version=0.0.4; charset=utf-8";
	return 200;
}
