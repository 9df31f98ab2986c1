/*
 * cluster.c - several batond nodes on one PostgreSQL database (see cluster.h).
 */
#include "cluster.h"
#include "prom.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>

#define MAX_EXTRA 12

typedef struct node_env {
	const char *name;
	const char *const *values; /* one for each node */
} node_env;

static int open_nodes(cluster *c, int n, int lease_ms, const char *const *extra, int proxied,
		      const node_env *env);

int cl_open(cluster *c, int n, int lease_ms, const char *const *extra)
{
	return open_nodes(c, n, lease_ms, extra, 0, NULL);
}

int cl_open_proxied(cluster *c, int n, int lease_ms, const char *const *extra)
{
	return open_nodes(c, n, lease_ms, extra, 1, NULL);
}

int cl_open_proxied_env(cluster *c, int n, int lease_ms, const char *const *extra,
			const char *env_name, const char *const *env_values)
{
	node_env env = {env_name, env_values};
	return open_nodes(c, n, lease_ms, extra, 1, &env);
}

/* Node i's server, through its own proxy when proxied; started. NULL after printing why. */
static hs_server *start_node(cluster *c, int i, const char *const *args, int proxied,
			     const node_env *env)
{
	if (!proxied)
		return i == 0 ? hs_open(args) : hs_open_node(c->node[0], args);
	int pg[2], n = hs_pg_ports(pg, 2);
	if (n < 1 || pg[0] <= 0 || !(c->px[i] = hs_proxy_open(pg[0])) ||
	    (n == 2 && !(c->px2[i] = hs_proxy_open(pg[1]))))
		return NULL;
	int via[2] = {hs_proxy_port(c->px[i]), n == 2 ? hs_proxy_port(c->px2[i]) : 0};
	hs_server *s = hs_new(i == 0 ? NULL : c->node[0], args);
	if (s && env)
		hs_set_env(s, env->name, env->values[i]);
	if (s && (hs_route_db_hosts(s, via, n) != 0 || hs_start(s) != 0)) {
		hs_close(s);
		s = NULL;
	}
	return s;
}

static int open_nodes(cluster *c, int n, int lease_ms, const char *const *extra, int proxied,
		      const node_env *env)
{
	memset(c, 0, sizeof *c);
	if (n < 1 || n > CL_MAX_NODES) {
		fprintf(stderr, "cluster: %d nodes asked, 1 to %d possible\n", n, CL_MAX_NODES);
		return -1;
	}
	c->lease_ms = lease_ms;
	char lease[16];
	snprintf(lease, sizeof lease, "%d", lease_ms);
	for (int i = 0; i < n; i++) {
		snprintf(c->id[i], sizeof c->id[i], "node%d", i);
		const char *args[5 + MAX_EXTRA] = {"--node-id", c->id[i], "--lease-ms", lease};
		int k = lease_ms > 0 ? 4 : 2; /* 0: batond's default lease */
		for (int j = 0; extra && extra[j]; j++) {
			if (j == MAX_EXTRA) {
				fprintf(stderr, "cluster: more than %d extra arguments\n",
					MAX_EXTRA);
				cl_close(c);
				return -1;
			}
			args[k++] = extra[j];
		}
		args[k] = NULL;
		c->node[i] = start_node(c, i, args, proxied, env);
		c->n = i + 1;
		if (!c->node[i]) {
			fprintf(stderr, "cluster: node %d did not start\n", i);
			cl_close(c);
			return -1;
		}
	}
	return 0;
}

int cl_close(cluster *c)
{
	int rc = 0;
	for (int i = 0; i < c->n; i++) {
		if ((c->px[i] && hs_proxy_heal(c->px[i]) != 0) ||
		    (c->px2[i] && hs_proxy_heal(c->px2[i]) != 0))
			fprintf(stderr, "cluster: node %d's proxy cannot listen again\n", i);
		if (c->node[i])
			hs_signal(c->node[i], SIGCONT);
	}
	for (int i = c->n - 1; i >= 0; i--) {
		if (hs_close(c->node[i]) != 0) {
			fprintf(stderr, "cluster: closing node %d (%s) failed\n", i, c->id[i]);
			rc = -1;
		}
		c->node[i] = NULL;
	}
	for (int i = 0; i < CL_MAX_NODES; i++) {
		hs_proxy_close(c->px[i]);
		hs_proxy_close(c->px2[i]);
		c->px[i] = c->px2[i] = NULL;
	}
	c->n = 0;
	return rc;
}

void cl_cut(cluster *c, int i)
{
	assert_non_null(c->px[i]);
	hs_proxy_cut(c->px[i]);
	if (c->px2[i])
		hs_proxy_cut(c->px2[i]);
}

void cl_heal(cluster *c, int i)
{
	assert_non_null(c->px[i]);
	assert_int_equal(hs_proxy_heal(c->px[i]), 0);
	if (c->px2[i])
		assert_int_equal(hs_proxy_heal(c->px2[i]), 0);
}

int cl_index(const cluster *c, const char *id)
{
	for (int i = 0; id && i < c->n; i++)
		if (strcmp(c->id[i], id) == 0)
			return i;
	return -1;
}

int cl_part_of(const char *resource)
{
	uint32_t h = 2166136261u;
	for (const unsigned char *p = (const unsigned char *)resource; *p; p++) {
		h ^= *p;
		h *= 16777619u;
	}
	return (int)(h % CL_PARTS);
}

/* The database is node 0's; its URL stays usable after node 0 was killed or stopped. */
static long long db_value(const cluster *c, const char *sql)
{
	return c->node[0] ? hs_db_count(c->node[0], sql) : -1;
}

int cl_part_owner(const cluster *c, int p)
{
	char sql[512];
	int len = snprintf(sql, sizeof sql, "SELECT COALESCE((SELECT CASE owner");
	for (int i = 0; i < c->n; i++)
		len += snprintf(sql + len, sizeof sql - (size_t)len, " WHEN '%s' THEN %d", c->id[i],
				i);
	snprintf(sql + len, sizeof sql - (size_t)len,
		 " ELSE 1000 END FROM partitions WHERE id = %d), 1000)", p);
	long long v = db_value(c, sql);
	if (v < 0)
		return -2;
	return v == 1000 ? -1 : (int)v;
}

int cl_free_parts(const cluster *c)
{
	return (int)db_value(c, "SELECT count(*) FROM partitions WHERE owner IS NULL");
}

/* GET /nodes on node `via`; NULL when it did not answer 200 with a "nodes" array. */
static json_t *nodes_of(const cluster *c, int via)
{
	hs_response r;
	json_t *nodes = NULL;
	if (hs_get(c->node[via], "/nodes", &r) == 0 && r.status == 200 &&
	    json_is_array(json_object_get(r.json, "nodes")))
		nodes = json_incref(json_object_get(r.json, "nodes"));
	hs_response_fini(&r);
	return nodes;
}

/* The partitions node `who` drives, claimed and loaded, as its baton_node_partitions says;
 * -1 when its metrics could not be read. */
static int loaded_by(const cluster *c, int who)
{
	hs_response r = {0}; /* freed below even when no request was sent */
	json_t *doc = NULL;
	char err[256];
	int n = -1;
	if (c->node[who] && hs_get(c->node[who], "/metrics", &r) == 0 && r.status == 200 &&
	    r.body && prom_parse(r.body, &doc, err, sizeof err) == 0) {
		double v = prom_metric(doc, "baton_node_partitions", "");
		n = v == v ? (int)v : -1; /* NAN: absent */
	}
	json_decref(doc);
	hs_response_fini(&r);
	return n;
}

bool cl_balanced(const cluster *c, int via, unsigned live)
{
	json_t *nodes = nodes_of(c, via);
	if (!nodes)
		return false;
	int want = __builtin_popcount(live), share = (CL_PARTS + want - 1) / want, sum = 0;
	int held[CL_MAX_NODES] = {0};
	unsigned seen = 0;
	bool ok = (int)json_array_size(nodes) == want;
	size_t i;
	json_t *n;
	json_array_foreach(nodes, i, n)
	{
		int who = cl_index(c, json_string_value(json_object_get(n, "id")));
		json_int_t parts = json_integer_value(json_object_get(n, "partitions"));
		if (who < 0 || !(live >> who & 1) || parts < 1 || parts > share)
			ok = false;
		else
			seen |= 1u << who;
		if (who >= 0)
			held[who] = (int)parts;
		sum += (int)parts;
	}
	json_decref(nodes);
	ok = ok && seen == live && sum == CL_PARTS && cl_free_parts(c) == 0;
	/* The database says who claimed what; a node answers for a partition only once it has
	 * loaded it (until then 503, "has just been taken over"). */
	for (int who = 0; ok && who < c->n; who++)
		if (live >> who & 1)
			ok = loaded_by(c, who) == held[who];
	return ok;
}

bool cl_wait_balanced(const cluster *c, int via, unsigned live, int timeout_ms)
{
	int64_t deadline = hs_mono_ms() + timeout_ms;
	while (!cl_balanced(c, via, live)) {
		if (hs_mono_ms() >= deadline)
			return false;
		hs_pause_ms(50);
	}
	return true;
}

bool cl_lists(const cluster *c, int via, int who)
{
	json_t *nodes = nodes_of(c, via);
	bool found = false;
	size_t i;
	json_t *n;
	json_array_foreach(nodes, i, n)
	{
		if (cl_index(c, json_string_value(json_object_get(n, "id"))) == who)
			found = true;
	}
	json_decref(nodes);
	return found;
}

void cl_pick_resource(const cluster *c, int owner, const char *prefix, unsigned long long *avoid,
		      char *out, size_t size)
{
	int owners[CL_PARTS];
	for (int p = 0; p < CL_PARTS; p++)
		owners[p] = -3; /* not read yet */
	for (int k = 0; k < 10000; k++) {
		snprintf(out, size, "%s-%d", prefix, k);
		int p = cl_part_of(out);
		if (avoid && (*avoid >> p & 1))
			continue;
		if (owners[p] == -3)
			owners[p] = cl_part_owner(c, p);
		if (owners[p] == owner) {
			if (avoid)
				*avoid |= 1ull << p;
			return;
		}
	}
	fail_msg("no resource %s-K below 10000 is in a partition of %s", prefix, c->id[owner]);
}
