/*
 * cluster.h - several batond nodes on one PostgreSQL database, for the multi-node suite
 * (tests/http/test_cluster.c): starting them with node ids and a lease, stopping exactly
 * those processes (also the paused ones), and reading who owns which partition.
 *
 * Node 0 is started with hs_open and owns the database; the others join it with
 * hs_open_node, so cl_close closes them first. Each node runs with --node-id
 * "<prefix><i>" (node0, node1, ...) and --lease-ms as given.
 *
 * cl_open and cl_close return error codes (they run in setup and teardown); the waits
 * return whether their condition came; cl_pick_resource fails the running cmocka test.
 */
#ifndef BATON_TEST_CLUSTER_H
#define BATON_TEST_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "harness.h"
#include "proxy.h"

#define CL_MAX_NODES 4
#define CL_PARTS     64 /* lib/internal.h PARTS */

typedef struct cluster {
	int n;
	int lease_ms;
	hs_server *node[CL_MAX_NODES]; /* NULL once closed (or never started) */
	char id[CL_MAX_NODES][32];
	hs_proxy *px[CL_MAX_NODES]; /* cl_open_proxied: node i reaches PostgreSQL through px[i] */
	/* When BATON_TEST_PG names two hosts (a primary and its standby, tests/harness/pgpair.h),
	 * node i reaches the second through px2[i], on a multi-host URL of both proxies. */
	hs_proxy *px2[CL_MAX_NODES];
} cluster;

/*
 * Starts `n` nodes (at most CL_MAX_NODES) with --node-id nodeI --lease-ms lease_ms (0: no
 * --lease-ms, batond's default) and
 * the `extra` arguments (NULL-terminated, may be NULL, at most 12). Returns 0, or -1 after
 * printing why and closing what it had started (c is then empty).
 */
int cl_open(cluster *c, int n, int lease_ms, const char *const *extra);

/* Like cl_open, but each node reaches PostgreSQL through a proxy of its own (proxy.h), so that
 * cl_cut can partition it from the database while its clients still reach it. */
int cl_open_proxied(cluster *c, int n, int lease_ms, const char *const *extra);
/* The same, with one environment variable set for each node's batond (env_values[i] for node
 * i; kept for its restarts), on top of the test process's own environment. */
int cl_open_proxied_env(cluster *c, int n, int lease_ms, const char *const *extra,
			const char *env_name, const char *const *env_values);
/* Cuts node i off PostgreSQL, every server of it (every connection dropped, new ones
 * refused) / lets it back. They
 * fail the running test on a cluster that is not proxied, or a port that cannot be bound. */
void cl_cut(cluster *c, int i);
void cl_heal(cluster *c, int i);

/*
 * Heals every proxy, resumes every node (SIGCONT: one may have been left paused by a failed
 * test), closes
 * nodes n-1 .. 1 and then node 0 (whose database it is) with hs_close. Returns 0, or -1
 * when one of the hs_close failed (its exit status, its log). Accepts an empty cluster.
 */
int cl_close(cluster *c);

/* The index of the node named `id`, or -1. */
int cl_index(const cluster *c, const char *id);

/* The partition of a resource, as batond computes it (FNV-1a 32-bit of the name % 64). */
int cl_part_of(const char *resource);

/* The index of the node that the database shows as the owner of partition `p`; -1 when it
 * has none (or one that is not ours), -2 when the database could not be read. */
int cl_part_owner(const cluster *c, int p);

/* How many partitions the database shows without an owner; -1 on error. */
int cl_free_parts(const cluster *c);

/*
 * GET /nodes on node `via`: whether it lists exactly the nodes whose bits are set in
 * `live` (bit i: node i), each with at least one partition and at most its fair share
 * (ceil(64 / live nodes)), together 64, and the database shows no free partition; and
 * each of those nodes has loaded what it claimed (its baton_node_partitions is its count):
 * a partition claimed and not loaded yet is answered 503 ("has just been taken over").
 */
bool cl_balanced(const cluster *c, int via, unsigned live);

/* Polls cl_balanced until it holds (true) or timeout_ms passed (false). */
bool cl_wait_balanced(const cluster *c, int via, unsigned live, int timeout_ms);

/* Whether GET /nodes on node `via` lists node `who`; false also when no answer came. */
bool cl_lists(const cluster *c, int via, int who);

/*
 * Writes into out a resource name "<prefix>-<k>" whose partition node `owner` holds (the
 * first k from 0 that fits; `avoid` names partitions not to use, bit p, and the chosen
 * one's bit is added to it). Fails the test when no k below 10000 fits.
 */
void cl_pick_resource(const cluster *c, int owner, const char *prefix, unsigned long long *avoid,
		      char *out, size_t size);

#endif
