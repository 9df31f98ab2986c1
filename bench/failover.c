/*
 * failover.c - how long after PostgreSQL fails over the first lease is granted again
 * (issue 40), through the node that drives the resource and through another node.
 *
 * Each repetition builds its own servers, so that the one run by run.sh is never crashed:
 * a primary (bench/pg.sh start) and a streaming standby copied from it (bench/pg.sh
 * standby: pg_basebackup -R), asynchronous, each in a directory of its own under /tmp; a
 * database on the primary; two batond nodes (--lease-ms 2000, as cluster.c's) on the libpq
 * multi-host URL that names both servers with target_session_attrs=read-write, settled (the
 * 64 partitions shared). Two resources driven by the same node are used once each, so that
 * their partitions are loaded. Then the primary is crashed (pg_ctl stop -m immediate) and
 * the standby promoted (pg_ctl promote -w); two threads, started once the crash returned,
 * each ask for a lease without waiting (POST /resources/NAME/leases) every 5 ms until one is
 * granted: one through the driving node, the other, on the other resource, through the node
 * that passes it on. The figures are the times from `pg_ctl promote` returning to each first
 * 201, and from the crash; a grant can come before promote returns (pg_ctl polls for the end
 * of the promotion), so a figure from the promotion can be negative. Medians over the
 * repetitions. Nothing is compared with a floor: it is reported.
 */
#include "bench.h"

#include <libpq-fe.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define FO_WAIT_S 60
#define FO_NAMES  64 /* resources tried to find two of one driver */

typedef struct pg_pair {
	char dir[2][64]; /* bench/pg.sh's directories: [0] the primary, [1] the standby */
	int port[2];
} pg_pair;

/* Runs bench/pg.sh with args; its last line of output (a URL) in out when not NULL. */
static int pg_script(char *out, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int pg_script(char *out, size_t len, const char *fmt, ...)
{
	char args[512], cmd[600], line[256] = "";
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(args, sizeof args, fmt, ap);
	va_end(ap);
	snprintf(cmd, sizeof cmd, "sh bench/pg.sh %s", args);
	FILE *p = popen(cmd, "r");
	if (!p)
		return -1;
	while (fgets(line, sizeof line, p))
		if (out)
			snprintf(out, len, "%.*s", (int)strcspn(line, "\n"), line);
	int st = pclose(p);
	if (st != 0)
		fprintf(stderr, "bench: failover: `%s` failed (%d)\n", cmd, st);
	return st == 0 ? 0 : -1;
}

static int url_port(const char *url)
{
	const char *colon = strrchr(url, ':');
	return colon ? atoi(colon + 1) : -1;
}

static void pair_stop(pg_pair *p)
{
	for (int i = 0; i < 2; i++) {
		if (!p->dir[i][0])
			continue;
		pg_script(NULL, 0, "stop %s", p->dir[i]);
		if (!opt.keep) {
			char cmd[128];
			snprintf(cmd, sizeof cmd, "rm -rf %s", p->dir[i]);
			if (system(cmd) != 0)
				fprintf(stderr, "bench: failover: cannot remove %s\n", p->dir[i]);
		}
		p->dir[i][0] = 0;
	}
}

/* The primary with a database baton, and its standby. 0, or -1 with both stopped. */
static int pair_start(pg_pair *p)
{
	memset(p, 0, sizeof *p);
	char url[256];
	for (int i = 0; i < 2; i++) {
		snprintf(p->dir[i], sizeof p->dir[i], "/tmp/baton-bench-fo.XXXXXX");
		if (!mkdtemp(p->dir[i]) || chmod(p->dir[i], 0755) != 0) {
			p->dir[i][0] = 0;
			pair_stop(p);
			return -1;
		}
		int rc = i == 0
			     ? pg_script(url, sizeof url, "start %s %d", p->dir[0], (int)getpid())
			     : pg_script(url, sizeof url, "standby %s %d %d", p->dir[1], p->port[0],
					 (int)getpid());
		if (rc != 0 || (p->port[i] = url_port(url)) <= 0) {
			pair_stop(p);
			return -1;
		}
		if (i == 0) {
			PGconn *c = PQconnectdb(url);
			PGresult *r = PQexec(c, "CREATE DATABASE baton");
			int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
			if (!ok)
				fprintf(stderr, "bench: failover: CREATE DATABASE: %s",
					PQerrorMessage(c));
			PQclear(r);
			PQfinish(c);
			if (!ok) {
				pair_stop(p);
				return -1;
			}
		}
	}
	return 0;
}

/* Two nodes on the multi-host URL of the pair, settled. 0, or -1 with them stopped. */
static int nodes_start(cluster *c, const pg_pair *p)
{
	char url[160];
	snprintf(url, sizeof url,
		 "postgresql://postgres@127.0.0.1:%d,127.0.0.1:%d/baton"
		 "?target_session_attrs=read-write",
		 p->port[0], p->port[1]);
	if (cluster_start_on(c, 2, url) != 0)
		return -1;
	if (cluster_settle(c, 60) < 0) {
		cluster_stop(c);
		return -1;
	}
	return 0;
}

/* One lease on name through port, not waiting: the HTTP status; with release, a lease
 * granted is released at once. */
static int ask(int port, const char *name, int release)
{
	char path[96], *text = NULL;
	snprintf(path, sizeof path, "/resources/%s/leases", name);
	int st = http_do(port, "POST", path, "{\"holder\":\"bench\",\"ttl_ms\":60000}",
			 release ? &text : NULL);
	if (st == 201 && release) {
		json_t *doc = json_loads(text ? text : "", 0, NULL);
		const char *id = json_string_value(json_object_get(doc, "id"));
		snprintf(path, sizeof path, "/leases/%s", id ? id : "-");
		if (http_do(port, "DELETE", path, NULL, NULL) != 204)
			st = -1;
		json_decref(doc);
	}
	free(text);
	return st;
}

/* The node index that drives name (GET /resources/NAME's node), or -1. */
static int driver(const cluster *c, const char *name)
{
	char path[96], *text = NULL;
	snprintf(path, sizeof path, "/resources/%s", name);
	int k = -1;
	if (http_do(c->node[0].port, "GET", path, NULL, &text) == 200 && text) {
		json_t *doc = json_loads(text, 0, NULL);
		k = cluster_node_index(c, json_string_value(json_object_get(doc, "node")));
		json_decref(doc);
	}
	free(text);
	return k;
}

/* Two resources of one driver, each granted and released once, so that their partition is
 * loaded: names[0], names[1]; the driver's index, or -1. */
static int pick(const cluster *c, char names[2][32])
{
	int who = -1, found = 0;
	for (int i = 0; i < FO_NAMES && found < 2; i++) {
		char name[32];
		snprintf(name, sizeof name, "fo-%d", i);
		double until = now_s() + FO_WAIT_S;
		while (ask(c->node[0].port, name, 1) != 201)
			if (now_s() > until || (sleep_ms(20), 0))
				return -1;
		int k = driver(c, name);
		if (k < 0 || (who >= 0 && k != who))
			continue;
		who = k;
		snprintf(names[found++], 32, "%s", name);
	}
	return found == 2 ? who : -1;
}

typedef struct asker {
	int port;
	char name[32];
	double granted; /* now_s() of the first 201, 0 for none */
} asker;

static void *ask_until_granted(void *arg)
{
	asker *a = arg;
	double until = now_s() + FO_WAIT_S;
	while (now_s() < until) {
		if (ask(a->port, a->name, 0) == 201) {
			a->granted = now_s();
			break;
		}
		sleep_ms(5);
	}
	http_thread_done();
	return NULL;
}

/* One failover: from promote returning and from the crash to the first grant through the
 * driver (v[0], v[1]) and through the other node (v[2], v[3]), in ms. 0 or -1. */
static int one_failover(double v[4])
{
	pg_pair p;
	cluster c;
	char names[2][32];
	if (pair_start(&p) != 0)
		return -1;
	int rc = -1;
	if (nodes_start(&c, &p) != 0) {
		pair_stop(&p);
		return -1;
	}
	int who = pick(&c, names);
	if (who >= 0) {
		asker a[2] = {{.port = c.node[who].port}, {.port = c.node[1 - who].port}};
		for (int i = 0; i < 2; i++)
			snprintf(a[i].name, sizeof a[i].name, "%s", names[i]);
		double crashed = now_s();
		pthread_t t[2];
		if (pg_script(NULL, 0, "crash %s", p.dir[0]) == 0) {
			for (int i = 0; i < 2; i++)
				pthread_create(&t[i], NULL, ask_until_granted, &a[i]);
			int promoted_ok = pg_script(NULL, 0, "promote %s", p.dir[1]) == 0;
			double promoted = now_s();
			for (int i = 0; i < 2; i++)
				pthread_join(t[i], NULL);
			if (promoted_ok && a[0].granted > 0 && a[1].granted > 0) {
				for (int i = 0; i < 2; i++) {
					v[2 * i] = (a[i].granted - promoted) * 1000;
					v[2 * i + 1] = (a[i].granted - crashed) * 1000;
				}
				rc = 0;
			}
		}
	}
	cluster_stop(&c);
	pair_stop(&p);
	return rc;
}

int bench_failover(void)
{
	const char *what = "failover";
	int reps = 3;
	if (opt.smoke) { /* two servers and two nodes built per failover: not for CI */
		printf("  failover: not in --smoke\n");
		return 0;
	}
	dvec d[4] = {{0}};
	for (int r = 0; r < reps; r++) {
		double v[4];
		if (one_failover(v) != 0) {
			table_fail(what, "a failover did not complete (see stderr)");
			for (int i = 0; i < 4; i++)
				dvec_free(&d[i]);
			return -1;
		}
		printf("  failover %d: first grant through the driver %.0f ms after promote"
		       " returned (%.0f after the crash), through the other node %.0f ms (%.0f)\n",
		       r + 1, v[0], v[1], v[2], v[3]);
		for (int i = 0; i < 4; i++)
			dvec_push(&d[i], v[i]);
	}
	row rw = {.verdict = V_INFO};
	snprintf(rw.what, sizeof rw.what, "failover, first grant");
	snprintf(rw.figure, sizeof rw.figure, "driver %.0f ms, other node %.0f ms",
		 median(d[0].v, d[0].n), median(d[2].v, d[2].n));
	snprintf(rw.floor, sizeof rw.floor, "after the crash: %.0f, %.0f ms",
		 median(d[1].v, d[1].n), median(d[3].v, d[3].n));
	snprintf(rw.ratio, sizeof rw.ratio, "-");
	snprintf(rw.target, sizeof rw.target, "- (reported)");
	snprintf(rw.note, sizeof rw.note,
		 "from pg_ctl promote returning to the first 201 of a lease asked every 5 ms,"
		 " medians of %d failovers (a primary crashed, its asynchronous standby"
		 " promoted); 2 nodes on a multi-host URL, --lease-ms 2000",
		 reps);
	table_add(&rw);
	for (int i = 0; i < 4; i++)
		dvec_free(&d[i]);
	return 0;
}
