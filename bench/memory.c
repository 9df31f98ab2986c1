/*
 * memory.c - batond's resident memory (VmRSS of /proc/PID/status): idle after start,
 * and after 25%, 50%, 75% and 100% of 100,000 finished one-step workflows on 100
 * resources. A bounded cache (SQLite's page caches, malloc's arenas) fills early and
 * then stays put, so growth per stored workflow is judged on the last quarter only:
 * RSS after 100,000 minus RSS after 75,000, over 25,000 workflows (under 512 KiB, about
 * 21 bytes a workflow, passes).
 *
 * Then the same with every workflow on a resource of its own (100,000 distinct
 * resources): idle resources leave memory (lib/idle.c keeps the 1,024 most recently
 * used), so the last quarter must not grow either.
 *
 * The floor of the idle figure is bench/minjson's idle RSS: what libmicrohttpd with
 * the same thread pool costs before batond adds anything.
 */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct mem_ctx {
	long base, nres;
	char body[256];
} mem_ctx;

static int next_mem(void *ctx, long n, const char **method, char *path, size_t pathlen,
		    const char **body)
{
	mem_ctx *m = ctx;
	snprintf(m->body, sizeof m->body,
		 "{\"resource\":\"mem-%03ld\",\"workers\":[{\"name\":\"w\",\"work_ms\":0}]}",
		 (m->base + n) % m->nres);
	*method = "POST";
	snprintf(path, pathlen, "/workflows");
	*body = m->body;
	return 0;
}

/* RSS once it has settled: the smallest of a few samples a moment apart. */
static long settled_rss(pid_t pid, long *anon)
{
	long best = -1;
	for (int i = 0; i < 5; i++) {
		long a = -1, v = proc_rss_kib(pid, &a);
		if (v > 0 && (best < 0 || v < best)) {
			best = v;
			*anon = a;
		}
		sleep_ms(100);
	}
	return best;
}

static long minjson_idle(const char *dir)
{
	pid_t pid;
	int port;
	if (minjson_start(dir, NULL, &pid, &port) != 0)
		return -1;
	sleep_ms(500);
	long anon, kib = settled_rss(pid, &anon);
	child_stop(pid);
	return kib;
}

/* Starts batond in dir, and takes its RSS idle (rss[0]) and after each quarter of `total`
 * one-step workflows on `nres` resources. 0, or -1 after saying why. */
static int measure(const char *dir, long nres, long total, long rss[5], long anon[5])
{
	server s;
	long quarter = total / 4;
	if (server_start(&s, dir, NULL) != 0)
		return -1;
	/* Idle: after start-up and one request of each kind the benchmark uses. */
	server_metric(s.port, "baton_commits_total");
	sleep_ms(1000);
	rss[0] = settled_rss(s.pid, &anon[0]);
	printf("  idle: %ld KiB, of which anonymous %ld KiB\n", rss[0], anon[0]);
	int failed = 0;
	for (int part = 1; part <= 4 && !failed; part++) {
		mem_ctx m = {.base = quarter * (part - 1), .nres = nres};
		load_result lr;
		double t0 = now_s();
		load_run(s.port, 32, quarter, 600, next_mem, &m, &lr);
		failed = lr.ok != quarter || wait_finished(s.port, quarter * part, 300) != 0;
		load_result_free(&lr);
		rss[part] = settled_rss(s.pid, &anon[part]);
		printf("  after %ld finished workflows: %ld KiB, of which anonymous %ld KiB (%.1f "
		       "s)\n",
		       quarter * part, rss[part], anon[part], now_s() - t0);
	}
	server_stop(&s);
	return failed ? -1 : 0;
}

int bench_memory(void)
{
	const char *what = "memory";
	char dir[BENCH_PATH_MAX], dir2[BENCH_PATH_MAX];
	long total = opt.smoke ? 1000 : 100000, quarter = total / 4, rss[5], anon[5];
	long drss[5], danon[5];
	printf("\n== %s: RSS idle and after %ld finished workflows (in 4 parts) on 100 resources,"
	       " then on %ld distinct resources\n",
	       what, total, total);
	if (tmpdir_new(dir, sizeof dir) != 0 || tmpdir_new(dir2, sizeof dir2) != 0) {
		table_fail(what, "no temporary directory");
		return -1;
	}
	long ref = minjson_idle(dir);
	printf("  minjson idle: %ld KiB\n", ref);
	int failed = ref < 0 || measure(dir, 100, total, rss, anon) != 0;
	printf("  each workflow on a resource of its own:\n");
	failed = failed || measure(dir2, total, total, drss, danon) != 0;
	tmpdir_remove(dir);
	tmpdir_remove(dir2);
	if (failed) {
		table_fail(what, "batond did not start, or submissions failed or did not finish "
				 "(see above)");
		return -1;
	}
	row r = {.verdict = rss[0] * 1024 < 10 * 1000 * 1000 ? V_PASS : V_MISS};
	snprintf(r.what, sizeof r.what, "memory idle");
	snprintf(r.figure, sizeof r.figure, "%.1f MB RSS", (double)rss[0] * 1024 / 1e6);
	snprintf(r.floor, sizeof r.floor, "minjson %.1f MB", (double)ref * 1024 / 1e6);
	snprintf(r.ratio, sizeof r.ratio, "%.1fx", (double)rss[0] / (double)ref);
	snprintf(r.target, sizeof r.target, "< 10 MB");
	snprintf(r.note, sizeof r.note,
		 "VmRSS one second after start (smallest of 5 samples); anonymous %ld KiB, the rest"
		 " shared-library pages",
		 anon[0]);
	table_add(&r);

	/* The caches fill early and slowly: growth is judged on the last quarter. */
	double per = (double)(rss[4] - rss[3]) * 1024 / (double)quarter;
	row g = {.verdict = rss[4] - rss[3] < 512 ? V_PASS : V_MISS};
	snprintf(g.what, sizeof g.what, "memory per workflow");
	snprintf(g.figure, sizeof g.figure, "%.1f B/workflow (%.1f MB at %ldk)", per,
		 (double)rss[4] * 1024 / 1e6, total / 1000);
	snprintf(g.floor, sizeof g.floor, "idle %.1f MB", (double)rss[0] * 1024 / 1e6);
	snprintf(g.ratio, sizeof g.ratio, "%.1fx", (double)rss[4] / (double)rss[0]);
	snprintf(g.target, sizeof g.target, "no growth (< 512 KiB/25k)");
	snprintf(g.note, sizeof g.note,
		 "KiB idle/25/50/75/100%%: RSS %ld/%ld/%ld/%ld/%ld, anonymous %ld/%ld/%ld/%ld/%ld",
		 rss[0], rss[1], rss[2], rss[3], rss[4], anon[0], anon[1], anon[2], anon[3],
		 anon[4]);
	table_add(&g);

	double dper = (double)(drss[4] - drss[3]) * 1024 / (double)quarter;
	row d = {.verdict = drss[4] - drss[3] < 512 ? V_PASS : V_MISS};
	snprintf(d.what, sizeof d.what, "memory per resource");
	snprintf(d.figure, sizeof d.figure, "%.1f B/resource (%.1f MB at %ldk)", dper,
		 (double)drss[4] * 1024 / 1e6, total / 1000);
	snprintf(d.floor, sizeof d.floor, "100 resources %.1f MB", (double)rss[4] * 1024 / 1e6);
	snprintf(d.ratio, sizeof d.ratio, "%.2fx", (double)drss[4] / (double)rss[4]);
	snprintf(d.target, sizeof d.target, "no growth (< 512 KiB/25k)");
	snprintf(d.note, sizeof d.note,
		 "%ld workflows on as many resources; KiB idle/25/50/75/100%%: RSS "
		 "%ld/%ld/%ld/%ld/%ld, anonymous %ld/%ld/%ld/%ld/%ld",
		 total, drss[0], drss[1], drss[2], drss[3], drss[4], danon[0], danon[1], danon[2],
		 danon[3], danon[4]);
	table_add(&d);
	return 0;
}
