/*
 * cluster.c - several batond nodes on one PostgreSQL database (issue 14): aggregate
 * steps/s with 1, 2 and 3 nodes, and how long a submission to a node that does not drive
 * its resource takes to start, beside one posted to the node that does.
 *
 * Every run is one cluster's life: a fresh database, N nodes started on it at once
 * (--node-id bench-nK, --lease-ms CLUSTER_LEASE_MS, each with application_name=bench-nK
 * in its URL so that its PostgreSQL backends can be told apart), a wait until GET /nodes
 * shows the N nodes holding their fair shares of the 64 partitions and each node's
 * /metrics agrees, the measurement, then all nodes stopped together. WAL syncs are read
 * from pg_stat_wal after the nodes and their connections are gone (pg.c says why), so
 * they cover the life: start-up, the claims, lease renewals, the work.
 *
 * Throughput: many workflows of zero-work steps, each on a resource of its own, posted at
 * once over one connection each, round-robin across the nodes (so most land on a node
 * that does not drive their resource and are adopted by its owner); steps / (last end -
 * first start) over all of them, from the times batond stores. Each run comes right
 * after a floor run, as in paired_runs.
 *
 * Latency: with N = 3, resources are warmed (one workflow each) and their owners read
 * from GET /resources/NAME's `node`; then one-step zero-work workflows are posted one at
 * a time, alternately to a node that is not the owner and to the owner, and the time
 * from the 201 (the client's clock) to the step's started_at (batond's, same machine,
 * truncated to the millisecond, so its middle is taken) is taken for each, and from the
 * moment the POST was sent. started_at is when the owner granted the step, in the round
 * whose commit makes the grant durable; the 201 of a submission to the owner goes out
 * after that commit, so from the 201 the figure is negative: the step started before
 * the answer reached the client.
 */
#include "bench.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define MAX_NODES	 CLUSTER_MAX_NODES
#define PARTITIONS	 64
#define CLUSTER_LEASE_MS "2000"
#define MAX_BACKENDS	 64

static double realtime_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

/* The node index of a node id ("bench-n2" -> 1), -1 when it is none of ours. */
int cluster_node_index(const cluster *c, const char *id)
{
	for (int k = 0; id && k < c->n; k++)
		if (strcmp(c->id[k], id) == 0)
			return k;
	return -1;
}

void cluster_stop(cluster *c)
{
	servers_stop(c->node, c->n);
	tmpdir_remove(c->dir);
	c->dir[0] = 0;
}

/* A fresh database and n nodes on it, each listening; 0, or -1 with everything stopped. */
int cluster_start(cluster *c, int n)
{
	char db[sizeof c->db];
	if (pg_db_new(db, sizeof db))
		return -1;
	return cluster_start_on(c, n, db);
}

int cluster_start_on(cluster *c, int n, const char *db)
{
	memset(c, 0, sizeof *c);
	c->n = n;
	snprintf(c->db, sizeof c->db, "%s", db);
	if (tmpdir_new(c->dir, sizeof c->dir))
		return -1;
	for (int k = 0; k < n; k++) {
		server *s = &c->node[k];
		snprintf(c->id[k], sizeof c->id[k], "bench-n%d", k + 1);
		snprintf(s->dir, sizeof s->dir, "%.4000s/n%d", c->dir, k + 1);
		if (mkdir(s->dir, 0700) != 0 && errno != EEXIST) {
			fprintf(stderr, "bench: cluster: mkdir %s failed\n", s->dir);
			cluster_stop(c);
			return -1;
		}
		snprintf(s->db, sizeof s->db, "%.4000s%sapplication_name=%s", c->db,
			 strchr(c->db, '?') ? "&" : "?", c->id[k]);
		const char **x = c->extra[k];
		x[0] = "--node-id";
		x[1] = c->id[k];
		x[2] = "--lease-ms";
		x[3] = CLUSTER_LEASE_MS;
		x[4] = NULL;
		s->extra = x;
		if (server_spawn(s, x) != 0) {
			cluster_stop(c);
			return -1;
		}
	}
	for (int k = 0; k < n; k++)
		if (server_wait_listening(&c->node[k], 30) != 0) {
			cluster_stop(c);
			return -1;
		}
	return 0;
}

/* Waits until GET /nodes shows our n nodes, every partition held and none above its fair
 * share, and each node's own count (baton_node_partitions) and view of the cluster
 * (baton_cluster_nodes) agree. Returns the seconds it took, or -1 on timeout. */
double cluster_settle(cluster *c, double timeout_s)
{
	double t0 = now_s(), until = t0 + timeout_s;
	int share = (PARTITIONS + c->n - 1) / c->n;
	while (now_s() < until) {
		char *text = NULL;
		int held[MAX_NODES] = {0}, seen = 0, total = 0, ok = 1;
		if (http_do(c->node[0].port, "GET", "/nodes", NULL, &text) == 200 && text) {
			json_t *doc = json_loads(text, 0, NULL), *v;
			size_t i;
			json_array_foreach(json_object_get(doc, "nodes"), i, v)
			{
				int k = cluster_node_index(
				    c, json_string_value(json_object_get(v, "id")));
				int p = (int)json_integer_value(json_object_get(v, "partitions"));
				if (k < 0 || p > share)
					ok = 0;
				else
					held[k] = p, seen++;
				total += p;
			}
			json_decref(doc);
		} else {
			ok = 0;
		}
		free(text);
		ok = ok && seen == c->n && total == PARTITIONS;
		for (int k = 0; ok && k < c->n; k++) {
			char *m = NULL;
			ok = http_do(c->node[k].port, "GET", "/metrics", NULL, &m) == 200 && m &&
			     (int)metric_value(m, "baton_node_partitions") == held[k] &&
			     (int)metric_value(m, "baton_cluster_nodes") == c->n;
			free(m);
		}
		if (ok)
			return now_s() - t0;
		sleep_ms(20);
	}
	fprintf(stderr, "bench: cluster: %d nodes did not settle within %.0f s (see %s)\n", c->n,
		timeout_s, c->node[0].log);
	return -1;
}

/* ---- what the nodes and the database did in a window ---- */

typedef struct node_counts {
	double commits, checkpoints, steps;
	cpu_snap cpu;
} node_counts;

typedef struct window {
	node_counts node[MAX_NODES];
	pg_snap pg;
	int nb;
	pid_t backend[MAX_BACKENDS];
	char app[MAX_BACKENDS][64];
} window;

static int window_take(const cluster *c, window *w)
{
	for (int k = 0; k < c->n; k++) {
		char *m = NULL;
		node_counts *nc = &w->node[k];
		cpu_take(c->node[k].pid, &nc->cpu);
		int st = http_do(c->node[k].port, "GET", "/metrics", NULL, &m);
		nc->commits = m ? metric_value(m, "baton_commits_total") : -1;
		nc->checkpoints = m ? metric_value(m, "baton_checkpoints_total") : -1;
		nc->steps = m ? metric_value(m, "baton_steps_completed_total") : -1;
		free(m);
		if (st != 200 || nc->commits < 0 || nc->checkpoints < 0 || nc->steps < 0)
			return -1;
	}
	pg_snap_take(&w->pg, 0);
	w->nb = pg_backends(c->db, w->backend, w->app, MAX_BACKENDS);
	return w->nb < 0 ? -1 : 0;
}

static double pid_cpu(const pg_snap *p, pid_t pid)
{
	for (int i = 0; i < p->n; i++)
		if (p->pid[i] == pid)
			return p->s[i];
	return 0;
}

/* ---- throughput ---- */

typedef struct tp_result {
	double rate;			     /* steps/s over all nodes */
	double commits_per_step;	     /* all nodes' commits / steps */
	double share[MAX_NODES];	     /* each node's part of the commits */
	double steps_share[MAX_NODES];	     /* each node's part of the steps */
	double batond_us;		     /* CPU of all nodes, per step */
	double pg_us;			     /* CPU of PostgreSQL, per step */
	double pg_node_us[MAX_NODES];	     /* of each node's backends, per step */
	double pg_other_us;		     /* of its other processes, per step */
	double life_syncs;		     /* WAL syncs of the run's whole life */
	double wal_per_step, wal_per_commit; /* beyond an idle life's: per step, per commit */
	double wal_ms;			     /* mean time of one WAL sync over the life */
	double settle_s;
} tp_result;

typedef struct poster {
	int port, conns;
	char **bodies;
	long n;
	load_result lr;
	int rc;
} poster;

static int next_body(void *ctx, long n, const char **method, char *path, size_t pathlen,
		     const char **body)
{
	poster *p = ctx;
	if (n >= p->n)
		return -1;
	*method = "POST";
	snprintf(path, pathlen, "/workflows");
	*body = p->bodies[n];
	return 0;
}

static void *post_all(void *arg)
{
	poster *p = arg;
	p->rc = load_run(p->port, p->conns, p->n, 60, next_body, p, &p->lr);
	return NULL;
}

/* A workflow of `steps` zero-work workers (malloc'ed). */
static char *wf_body(const char *id, const char *resource, int steps)
{
	size_t cap = 128 + (size_t)steps * 40, len = 0;
	char *b = malloc(cap);
	if (!b)
		abort();
	len += (size_t)snprintf(b + len, cap - len,
				"{\"id\":\"%s\",\"resource\":\"%s\",\"workers\":[", id, resource);
	for (int i = 0; i < steps; i++)
		len += (size_t)snprintf(b + len, cap - len, "%s{\"name\":\"w%04d\",\"work_ms\":0}",
					i ? "," : "", i);
	snprintf(b + len, cap - len, "]}");
	return b;
}

/* First start and last end of the completed workflows whose id starts with prefix. */
static int cluster_span(int port, const char *prefix, long want, int64_t *first, int64_t *last)
{
	char *text = NULL;
	long seen = 0;
	*first = INT64_MAX;
	*last = 0;
	if (http_do(port, "GET", "/workflows?limit=1000", NULL, &text) == 200 && text) {
		json_t *doc = json_loads(text, 0, NULL), *w;
		size_t i;
		json_array_foreach(json_object_get(doc, "workflows"), i, w)
		{
			const char *id = json_string_value(json_object_get(w, "id"));
			const char *st = json_string_value(json_object_get(w, "status"));
			if (!id || strncmp(id, prefix, strlen(prefix)) != 0 || !st ||
			    strcmp(st, "completed") != 0)
				continue;
			int64_t a = rfc3339_ms(json_string_value(json_object_get(w, "started_at")));
			int64_t b =
			    rfc3339_ms(json_string_value(json_object_get(w, "finished_at")));
			if (a < 0 || b < a)
				continue;
			seen++;
			*first = a < *first ? a : *first;
			*last = b > *last ? b : *last;
		}
		json_decref(doc);
	}
	free(text);
	if (seen != want) {
		fprintf(stderr, "bench: cluster: %ld of %ld workflows %s* completed\n", seen, want,
			prefix);
		return -1;
	}
	return 0;
}

/* Posts nwf workflows (round-robin over the nodes) and waits for all of them. */
static int post_and_wait(cluster *c, const char *prefix, int nwf, int steps)
{
	poster p[MAX_NODES];
	pthread_t th[MAX_NODES];
	int rc = 0, started = 0;
	memset(p, 0, sizeof p);
	for (int k = 0; k < c->n; k++) {
		p[k].port = c->node[k].port;
		p[k].bodies = calloc((size_t)nwf, sizeof(char *));
		if (!p[k].bodies)
			abort();
	}
	for (int i = 0; i < nwf; i++) {
		char id[64];
		poster *t = &p[i % c->n];
		snprintf(id, sizeof id, "%s%04d", prefix, i);
		t->bodies[t->n++] = wf_body(id, id, steps);
	}
	for (int k = 0; k < c->n; k++) {
		p[k].conns = (int)p[k].n;
		if (pthread_create(&th[k], NULL, post_all, &p[k]) != 0)
			break;
		started++;
	}
	for (int k = 0; k < started; k++) {
		pthread_join(th[k], NULL);
		if (p[k].rc || p[k].lr.ok != p[k].n) {
			fprintf(stderr,
				"bench: cluster: %ld of %ld submissions to %s failed (%d)\n",
				p[k].n - p[k].lr.ok, p[k].n, c->id[k], p[k].lr.first_status);
			rc = -1;
		}
		load_result_free(&p[k].lr);
	}
	for (int k = 0; k < c->n; k++) {
		for (long i = 0; i < p[k].n; i++)
			free(p[k].bodies[i]);
		free(p[k].bodies);
	}
	if (started < c->n)
		rc = -1;
	return rc || wait_finished(c->node[0].port, nwf, 600) ? -1 : 0;
}

/* The WAL syncs and batond commits of one cluster life, from before its database was
 * created to after its nodes' connections are gone. */
typedef struct life {
	pg_snap w0;
	double syncs, sync_ms, commits;
} life;

/* The commits of every node so far (call before stopping them); 0 or -1. */
static int life_commits(const cluster *c, life *l)
{
	l->commits = 0;
	for (int k = 0; k < c->n; k++) {
		double v = server_metric(c->node[k].port, "baton_commits_total");
		if (v < 0)
			return -1;
		l->commits += v;
	}
	return 0;
}

static void life_end(life *l)
{
	pg_snap w1;
	pg_snap_take(&w1, 1);
	l->syncs = w1.wal_sync - l->w0.wal_sync;
	l->sync_ms = w1.wal_sync_ms - l->w0.wal_sync_ms;
}

/* A life of n nodes without work: start-up, claims, settling, lease renewals, stop. What
 * it costs the WAL is taken off the runs' lives to give the work's own syncs. */
static int idle_life(int n, life *l)
{
	cluster c;
	memset(l, 0, sizeof *l);
	pg_snap_take(&l->w0, 1);
	if (cluster_start(&c, n))
		return -1;
	int rc = cluster_settle(&c, 60) < 0 || life_commits(&c, l);
	cluster_stop(&c);
	if (rc)
		return -1;
	life_end(l);
	printf("  %d node%s, no work: %.0f WAL syncs, %.0f batond commits over a life"
	       " (start-up, CREATE DATABASE, claims, renewals)\n",
	       n, n > 1 ? "s" : "", l->syncs, l->commits);
	return 0;
}

/* One cluster life of n nodes: settle, post, wait, stop, read the WAL; idle is what a
 * life of n nodes without work cost. */
static int throughput_run(int n, int run, int nwf, int steps, const life *idle, tp_result *out)
{
	cluster c;
	life l = {0};
	window a, b;
	char prefix[32];
	int64_t first, last;
	memset(out, 0, sizeof *out);
	pg_snap_take(&l.w0, 1);
	if (cluster_start(&c, n))
		return -1;
	snprintf(prefix, sizeof prefix, "cl%d-%d-", n, run);
	int rc = (out->settle_s = cluster_settle(&c, 60)) < 0 || window_take(&c, &a) ||
		 post_and_wait(&c, prefix, nwf, steps) || window_take(&c, &b) ||
		 cluster_span(c.node[0].port, prefix, nwf, &first, &last) || life_commits(&c, &l);
	cluster_stop(&c);
	if (rc)
		return -1;
	life_end(&l);

	double total = (double)nwf * steps, commits = 0, ckpts = 0, bcpu = 0, busiest;
	for (int k = 0; k < n; k++) {
		commits += b.node[k].commits - a.node[k].commits;
		ckpts += b.node[k].checkpoints - a.node[k].checkpoints;
		bcpu += cpu_delta(&a.node[k].cpu, &b.node[k].cpu, &busiest);
	}
	out->rate = total / ((double)(last - first) / 1000.0);
	out->commits_per_step = commits / total;
	out->batond_us = bcpu / total * 1e6;
	for (int k = 0; k < n; k++) {
		out->share[k] = commits > 0 ? (b.node[k].commits - a.node[k].commits) / commits : 0;
		out->steps_share[k] = (b.node[k].steps - a.node[k].steps) / total;
	}
	/* PostgreSQL's CPU: all of it, each node's backends (by application_name), the rest. */
	double bw;
	char name[8];
	double pg_total = pg_snap_delta(&a.pg, &b.pg, &busiest, &bw, name, sizeof name);
	double pg_nodes = 0;
	for (int i = 0; i < b.nb; i++) {
		int k = cluster_node_index(&c, b.app[i]);
		if (k < 0)
			continue;
		double d = pid_cpu(&b.pg, b.backend[i]) - pid_cpu(&a.pg, b.backend[i]);
		out->pg_node_us[k] += d / total * 1e6;
		pg_nodes += d;
	}
	out->pg_us = pg_total / total * 1e6;
	out->pg_other_us = (pg_total - pg_nodes) / total * 1e6;
	if (out->pg_other_us < 0.05 && out->pg_other_us > -0.05)
		out->pg_other_us = 0; /* not "-0.0": the postmaster's reaped children, rounded */
	double work_syncs = l.syncs - idle->syncs, work_commits = l.commits - idle->commits;
	out->life_syncs = l.syncs;
	out->wal_per_step = work_syncs / total;
	out->wal_per_commit = work_commits > 0 ? work_syncs / work_commits : 0;
	out->wal_ms = l.syncs > 0 ? l.sync_ms / l.syncs : 0;

	printf("  %d node%s, run %d: settled in %.2f s; %.0f steps in %lld ms: %.0f steps/s;"
	       " %.4f commits/step (%.0f outcomes checkpointed)\n",
	       n, n > 1 ? "s" : "", run + 1, out->settle_s, total, (long long)(last - first),
	       out->rate, out->commits_per_step, ckpts);
	for (int k = 0; k < n; k++)
		printf("         %s: %.0f%% of the commits, %.0f%% of the steps; its PostgreSQL "
		       "backends %.1f us/step\n",
		       c.id[k], 100 * out->share[k], 100 * out->steps_share[k], out->pg_node_us[k]);
	printf("         CPU per step: batond (all nodes) %.1f us, PostgreSQL %.1f us (other "
	       "processes %.1f us); %.0f WAL syncs over the life (%.0f batond commits) of "
	       "%.3f ms each, %.0f beyond a life without work: %.4f/step, %.2f per commit\n",
	       out->batond_us, out->pg_us, out->pg_other_us, l.syncs, l.commits, out->wal_ms,
	       work_syncs, out->wal_per_step, out->wal_per_commit);
	return 0;
}

static int cmp_rate(const void *x, const void *y)
{
	double a = ((const tp_result *)x)->rate, b = ((const tp_result *)y)->rate;
	return (a > b) - (a < b);
}

/* ---- latency ---- */

typedef struct lat_result {
	dvec cross, same;	    /* from the 201 to started_at, ms */
	dvec cross_send, same_send; /* from sending the POST to started_at, ms */
	int wrong_node;		    /* steps that did not run on the resource's owner */
	int owners[MAX_NODES];	    /* warmed resources per owner */
} lat_result;

/* Waits until workflow id has completed; its first step's started_at (ms) and node. */
static int64_t wait_started(int port, const char *id, char *node, size_t nlen)
{
	double until = now_s() + 30;
	int pause = 1;
	while (now_s() < until) {
		json_t *wf = get_workflow(port, id);
		const char *st = json_string_value(json_object_get(wf, "status"));
		json_t *s0 = json_array_get(json_object_get(wf, "steps"), 0);
		int64_t t = rfc3339_ms(json_string_value(json_object_get(s0, "started_at")));
		if (st && strcmp(st, "completed") == 0 && t >= 0) {
			const char *nd = json_string_value(json_object_get(s0, "node"));
			snprintf(node, nlen, "%s", nd ? nd : "");
			json_decref(wf);
			return t;
		}
		json_decref(wf);
		sleep_ms(pause);
		if (pause < 16)
			pause *= 2;
	}
	fprintf(stderr, "bench: cluster: workflow %s did not complete within 30 s\n", id);
	return -1;
}

static int latency_run(int n, int samples, int nres, lat_result *out)
{
	cluster c;
	int owner[64];
	memset(out, 0, sizeof *out);
	if (nres > 64)
		nres = 64;
	if (cluster_start(&c, n))
		return -1;
	int rc = cluster_settle(&c, 60) < 0;
	/* Warm the resources: one workflow each, then their owners. */
	for (int r = 0; rc == 0 && r < nres; r++) {
		char body[160];
		snprintf(body, sizeof body,
			 "{\"id\":\"warm-%02d\",\"resource\":\"lat-%02d\",\"workers\":"
			 "[{\"name\":\"w\",\"work_ms\":0}]}",
			 r, r);
		rc = http_do(c.node[0].port, "POST", "/workflows", body, NULL) != 201;
	}
	rc = rc || wait_finished(c.node[0].port, nres, 60);
	for (int r = 0; rc == 0 && r < nres; r++) {
		char path[64], *text = NULL;
		snprintf(path, sizeof path, "/resources/lat-%02d", r);
		json_t *doc = NULL;
		if (http_do(c.node[0].port, "GET", path, NULL, &text) == 200 && text)
			doc = json_loads(text, 0, NULL);
		owner[r] = cluster_node_index(&c, json_string_value(json_object_get(doc, "node")));
		json_decref(doc);
		free(text);
		if (owner[r] < 0) {
			fprintf(stderr, "bench: cluster: lat-%02d has no owner of ours\n", r);
			rc = 1;
		} else {
			out->owners[owner[r]]++;
		}
	}
	/* Alternately to a node that is not the owner and to the owner. */
	for (int i = 0; rc == 0 && i < 2 * samples; i++) {
		int r = (i / 2) % nres, x = owner[r], cross = i % 2 == 0;
		int to = cross ? (x + 1 + (i / 2) % (n - 1)) % n : x;
		char body[160], id[32], node[32];
		snprintf(id, sizeof id, "lt-%05d", i);
		snprintf(body, sizeof body,
			 "{\"id\":\"%s\",\"resource\":\"lat-%02d\",\"workers\":"
			 "[{\"name\":\"w\",\"work_ms\":0}]}",
			 id, r);
		double sent = realtime_ms();
		int st = http_do(c.node[to].port, "POST", "/workflows", body, NULL);
		double answered = realtime_ms();
		if (st != 201) {
			fprintf(stderr, "bench: cluster: POST to %s answered %d\n", c.id[to], st);
			rc = 1;
			break;
		}
		int64_t started = wait_started(c.node[to].port, id, node, sizeof node);
		if (started < 0) {
			rc = 1;
			break;
		}
		out->wrong_node += cluster_node_index(&c, node) != x;
		/* started_at is truncated to its millisecond: its middle is the estimate. */
		double at = (double)started + 0.5;
		dvec_push(cross ? &out->cross : &out->same, at - answered);
		dvec_push(cross ? &out->cross_send : &out->same_send, at - sent);
	}
	cluster_stop(&c);
	return rc ? -1 : 0;
}

static void lat_free(lat_result *l)
{
	dvec_free(&l->cross);
	dvec_free(&l->same);
	dvec_free(&l->cross_send);
	dvec_free(&l->same_send);
}

/* ---- the benchmark ---- */

int bench_cluster(void)
{
	int nwf = opt.smoke ? 12 : 200, steps = opt.smoke ? 10 : 50;
	int runs = opt.smoke ? 1 : 3, samples = opt.smoke ? 20 : 300;
	double base = 0;
	printf("\n== cluster: 1, 2 and 3 nodes on one database (--lease-ms %s); %d workflows"
	       " on %d resources, %d zero-work steps each, posted round-robin across the nodes,"
	       " %d runs each\n",
	       CLUSTER_LEASE_MS, nwf, nwf, steps, runs);
	for (int n = 1; n <= MAX_NODES; n++) {
		tp_result res[5];
		dvec floors = {0}, ratios = {0};
		life idle;
		int rc = idle_life(n, &idle);
		for (int run = 0; run < runs && rc == 0; run++) {
			floor_result f;
			rc = pg_floor_measure(1, opt.smoke ? 300 : 5000, opt.smoke ? 0.3 : 1.0,
					      &f) ||
			     throughput_run(n, run, nwf, steps, &idle, &res[run]);
			if (rc == 0) {
				printf("         floor just before: %.0f commits/s; ratio %.2f\n",
				       f.commits_per_s, res[run].rate / f.commits_per_s);
				dvec_push(&floors, f.commits_per_s);
				dvec_push(&ratios, res[run].rate / f.commits_per_s);
			}
		}
		char what[48];
		snprintf(what, sizeof what, "cluster, %d node%s", n, n > 1 ? "s" : "");
		if (rc) {
			dvec_free(&floors);
			dvec_free(&ratios);
			table_fail(what, "a run failed (see above)");
			return -1;
		}
		/* The figure is the median run's; so are the costs beside it. */
		qsort(res, (size_t)runs, sizeof res[0], cmp_rate);
		const tp_result *m = &res[runs / 2];
		if (n == 1)
			base = m->rate;
		row r = {.verdict = V_INFO};
		snprintf(r.what, sizeof r.what, "%s", what);
		snprintf(r.figure, sizeof r.figure, "%.0f steps/s", m->rate);
		snprintf(r.floor, sizeof r.floor, "%.0f commits/s", median(floors.v, floors.n));
		snprintf(r.ratio, sizeof r.ratio, "%.1fx", median(ratios.v, ratios.n));
		snprintf(r.target, sizeof r.target, "- (reported)");
		char shares[160] = "", pgn[160] = "";
		for (int k = 0; k < n; k++) {
			size_t l = strlen(shares), lp = strlen(pgn);
			snprintf(shares + l, sizeof shares - l, "%s%.0f%%", k ? "/" : "",
				 100 * m->share[k]);
			snprintf(pgn + lp, sizeof pgn - lp, "%s%.1f", k ? "/" : "",
				 m->pg_node_us[k]);
		}
		snprintf(
		    r.note, sizeof r.note,
		    "median of %d runs, each a fresh database and cluster right after its floor;"
		    " %.1fx the 1-node figure; %.4f commits/step (nodes' shares %s); CPU per"
		    " step: batond %.1f us (all nodes), PostgreSQL %.1f us (each node's"
		    " backends %s us, other processes %.1f us); WAL syncs: %.0f over the"
		    " life, %.0f over a life of %d without work, the difference %.4f/step and"
		    " %.2f per batond commit, %.3f ms each",
		    runs, base > 0 ? m->rate / base : 0, m->commits_per_step, shares, m->batond_us,
		    m->pg_us, pgn, m->pg_other_us, m->life_syncs, idle.syncs, n, m->wal_per_step,
		    m->wal_per_commit, m->wal_ms);
		table_add(&r);
		dvec_free(&floors);
		dvec_free(&ratios);
	}

	printf("\n== cluster latency: %d nodes, one-step zero-work workflows on warmed resources,"
	       " %d posted to a node that does not drive the resource and %d to the one that"
	       " does, alternately\n",
	       MAX_NODES, samples, samples);
	lat_result l;
	if (latency_run(MAX_NODES, samples, 8 * MAX_NODES, &l) != 0) {
		lat_free(&l);
		table_fail("cluster, 201 to start", "the run failed (see above)");
		return -1;
	}
	double c50 = percentile(l.cross.v, l.cross.n, 50),
	       c99 = percentile(l.cross.v, l.cross.n, 99);
	double s50 = percentile(l.same.v, l.same.n, 50), s99 = percentile(l.same.v, l.same.n, 99);
	double cs50 = percentile(l.cross_send.v, l.cross_send.n, 50);
	double cs99 = percentile(l.cross_send.v, l.cross_send.n, 99);
	double ss50 = percentile(l.same_send.v, l.same_send.n, 50);
	double ss99 = percentile(l.same_send.v, l.same_send.n, 99);
	printf("  other node: 201 to start p50 %.1f, p99 %.1f ms (from the POST p50 %.1f, p99"
	       " %.1f)\n  same node:  201 to start p50 %.1f, p99 %.1f ms (from the POST p50 %.1f,"
	       " p99 %.1f); %d steps ran elsewhere than on the owner\n",
	       c50, c99, cs50, cs99, s50, s99, ss50, ss99, l.wrong_node);
	row r = {.verdict = l.wrong_node ? V_MISS : V_INFO};
	snprintf(r.what, sizeof r.what, "cluster, 201 to start");
	snprintf(r.figure, sizeof r.figure, "other node p50 %.1f, p99 %.1f ms", c50, c99);
	snprintf(r.floor, sizeof r.floor, "same node p50 %.1f, p99 %.1f ms", s50, s99);
	snprintf(r.ratio, sizeof r.ratio, "+%.1f ms p50", c50 - s50);
	snprintf(r.target, sizeof r.target, "- (reported)");
	snprintf(r.note, sizeof r.note,
		 "%zu samples each, alternating, %d nodes, %d warmed resources (owned %d/%d/%d);"
		 " from sending the POST: other node p50 %.1f, p99 %.1f ms, same node p50 %.1f,"
		 " p99 %.1f ms; started_at is the grant, to the ms (its middle taken); negative:"
		 " granted before the 201 arrived; %d steps ran off their owner",
		 l.cross.n, MAX_NODES, 8 * MAX_NODES, l.owners[0], l.owners[1], l.owners[2], cs50,
		 cs99, ss50, ss99, l.wrong_node);
	table_add(&r);
	lat_free(&l);
	return 0;
}
