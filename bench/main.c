/*
 * main.c - batonbench: runs baton's benchmarks (issue 7) and prints one table.
 *
 *     batonbench [--smoke] [--batond PATH] [--minjson PATH] [--dir PARENT]
 *                [--threads N] [--http-threads N] [--keep]
 *                [--store sqlite|postgres|both] [--pg URL] [NAME...]
 *
 * NAME is any of floor, steps, group, contended, accept, read, memory, recovery, calls,
 * leases, permits, cluster, failover, lockpath (default: all, in that order; cluster and
 * failover run on PostgreSQL
 * only; lockpath runs once, after the others, on every store selected, beside etcd). Every
 * benchmark starts its own batond on 127.0.0.1:0 with a fresh database under PARENT
 * (default $TMPDIR or /tmp) and removes it after. With --store postgres (or both: SQLite
 * first), the benchmarks that have a PostgreSQL form run again on the PostgreSQL server
 * at URL (bench/run.sh starts a throwaway one with bench/pg.sh): the floor over libpq on
 * that server, and batond on a new database of it for every run (cluster: N batond nodes
 * on one new database).
 * Exit status: 0 when everything ran and (without --smoke) every target was met; 1 when
 * a target was missed; 2 when a benchmark could not run or on a usage error.
 */
#include "bench.h"

#include <curl/curl.h>
#include <libpq-fe.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

bench_opts opt = {
    .batond = "server/batond",
    .minjson = "build/bench/minjson",
    .http_threads = 0,
    .threads = 0,
};

int bench_floor(void)
{
	char dir[BENCH_PATH_MAX];
	floor_result f;
	int runs = opt.smoke ? 1 : 5;
	if (opt.store == STORE_POSTGRES)
		printf("\n== floor: one single-row INSERT per transaction over libpq,"
		       " synchronous_commit=on, %d runs\n",
		       runs);
	else
		printf("\n== floor: one INSERT per transaction, WAL, synchronous=FULL, %d runs\n",
		       runs);
	if (tmpdir_new(dir, sizeof dir) != 0) {
		table_fail("floor", "no temporary directory");
		return -1;
	}
	int rc = floor_measure(dir, runs, opt.smoke ? 300 : 5000, opt.smoke ? 0.3 : 2.0, &f);
	tmpdir_remove(dir);
	if (rc) {
		table_fail("floor", "the database failed (see above)");
		return -1;
	}
	row r = {.verdict = V_INFO};
	snprintf(r.what, sizeof r.what, "floor");
	snprintf(r.figure, sizeof r.figure, "%.0f commits/s", f.commits_per_s);
	snprintf(r.floor, sizeof r.floor, "(the reference)");
	snprintf(r.ratio, sizeof r.ratio, "1x");
	snprintf(r.target, sizeof r.target, "-");
	char pgcpu[96] = "";
	if (opt.store == STORE_POSTGRES)
		snprintf(pgcpu, sizeof pgcpu, "; PostgreSQL CPU %.0f us/commit", f.server_us);
	snprintf(r.note, sizeof r.note,
		 "median of %d runs, %ld commits; commit latency median %.3f ms, p99 %.3f ms, mean"
		 " %.3f ms%s",
		 runs, f.commits, f.commit_ms, f.p99_ms, 1000.0 / f.commits_per_s, pgcpu);
	table_add(&r);
	return 0;
}

/* The stores a benchmark runs on: memory and recovery are SQLite's own, cluster is
 * PostgreSQL's (several nodes on one database). ON_ONCE runs once, in the last store's
 * pass (PostgreSQL is open then when selected), and measures every store selected side
 * by side itself. */
enum {
	ON_SQLITE = 1 << STORE_SQLITE,
	ON_PG = 1 << STORE_POSTGRES,
	ON_BOTH = ON_SQLITE | ON_PG,
	ON_ONCE = 1 << 8
};
static const struct {
	const char *name;
	int (*fn)(void);
	int on;
} benches[] = {
    {"floor", bench_floor, ON_BOTH},	    {"steps", bench_step_overhead, ON_BOTH},
    {"group", bench_group_commit, ON_BOTH}, {"contended", bench_contended, ON_BOTH},
    {"accept", bench_http_accept, ON_BOTH}, {"read", bench_http_read, ON_BOTH},
    {"memory", bench_memory, ON_SQLITE},    {"recovery", bench_recovery, ON_SQLITE},
    {"calls", bench_http_steps, ON_BOTH},   {"leases", bench_leases, ON_BOTH},
    {"permits", bench_permits, ON_BOTH},    {"cluster", bench_cluster, ON_PG},
    {"failover", bench_failover, ON_PG},    {"lockpath", bench_lockpath, ON_ONCE},
};
#define NBENCH (sizeof benches / sizeof benches[0])

static void usage(FILE *f)
{
	fprintf(f, "usage: batonbench [--smoke] [--batond PATH] [--minjson PATH] [--dir PARENT]\n"
		   "                  [--threads N] [--http-threads N] [--keep]\n"
		   "                  [--store sqlite|postgres|both] [--pg URL] [NAME...]\n"
		   "NAME: floor steps group contended accept read memory recovery calls leases "
		   "permits cluster failover lockpath (default: all)\n");
}

static void on_signal(int sig)
{
	/* The servers die with us (PR_SET_PDEATHSIG); their directories stay behind. */
	signal(sig, SIG_DFL);
	raise(sig);
}

static void print_context(void)
{
	struct utsname u;
	double load[3] = {0};
	time_t now = time(NULL);
	char when[32];
	strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
	uname(&u);
	getloadavg(load, 3);
	printf("batonbench%s: %s, %s %s, %ld cores, load average %.2f %.2f %.2f\n",
	       opt.smoke ? " --smoke (tiny sizes, targets not enforced)" : "", when, u.sysname,
	       u.release, sysconf(_SC_NPROCESSORS_ONLN), load[0], load[1], load[2]);
	printf("batond %s, minjson %s, directories under %s, SQLite %s, %s\n", opt.batond,
	       opt.minjson, opt.parent, sqlite3_libversion(), curl_version());
}

static int parse_args(int argc, char **argv, int *want, int *stores)
{
	int any = 0;
	*stores = 1 << STORE_SQLITE;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		int has_value = i + 1 < argc;
		if (strcmp(a, "--smoke") == 0) {
			opt.smoke = 1;
		} else if (strcmp(a, "--keep") == 0) {
			opt.keep = 1;
		} else if (strcmp(a, "--batond") == 0 && has_value) {
			opt.batond = argv[++i];
		} else if (strcmp(a, "--minjson") == 0 && has_value) {
			opt.minjson = argv[++i];
		} else if (strcmp(a, "--dir") == 0 && has_value) {
			opt.parent = argv[++i];
		} else if (strcmp(a, "--threads") == 0 && has_value) {
			opt.threads = atoi(argv[++i]);
		} else if (strcmp(a, "--http-threads") == 0 && has_value) {
			opt.http_threads = atoi(argv[++i]);
		} else if (strcmp(a, "--pg") == 0 && has_value) {
			opt.pg_url = argv[++i];
		} else if (strcmp(a, "--store") == 0 && has_value) {
			const char *v = argv[++i];
			*stores = strcmp(v, "sqlite") == 0     ? 1 << STORE_SQLITE
				  : strcmp(v, "postgres") == 0 ? 1 << STORE_POSTGRES
				  : strcmp(v, "both") == 0
				      ? (1 << STORE_SQLITE) | (1 << STORE_POSTGRES)
				      : 0;
			if (!*stores) {
				usage(stderr);
				return -1;
			}
		} else if (strcmp(a, "--help") == 0) {
			usage(stdout);
			exit(0);
		} else {
			size_t k;
			for (k = 0; k < NBENCH && strcmp(a, benches[k].name) != 0; k++)
				;
			if (k == NBENCH) {
				usage(stderr);
				return -1;
			}
			want[k] = 1;
			any = 1;
		}
	}
	for (size_t k = 0; !any && k < NBENCH; k++)
		want[k] = 1;
	if ((*stores & (1 << STORE_POSTGRES)) && !opt.pg_url) {
		fprintf(stderr, "batonbench: --store postgres needs --pg URL (bench/run.sh gives"
				" one)\n");
		return -1;
	}
	return 0;
}

/* The wanted benchmarks on one store; how many ran (or tried to). */
static int run_store(int store, const int *want)
{
	int ran = 0;
	opt.store = store;
	if (store == STORE_POSTGRES) {
		printf("\n==== PostgreSQL: %s\n", opt.pg_url);
		if (pg_open() != 0) {
			table_fail("PostgreSQL", "could not connect (see above)");
			return 1;
		}
		printf("%s\n", pg_version());
	}
	for (size_t k = 0; k < NBENCH; k++) {
		if (!want[k])
			continue;
		if (benches[k].on == ON_ONCE) {
			int last = (opt.stores & ON_PG) ? STORE_POSTGRES : STORE_SQLITE;
			if (store != last)
				continue;
		} else if (!(benches[k].on & (1 << store))) {
			printf("\n== %s: %s only\n", benches[k].name,
			       store == STORE_POSTGRES ? "SQLite" : "PostgreSQL");
			continue;
		}
		benches[k].fn();
		ran++;
	}
	if (store == STORE_POSTGRES)
		pg_close();
	return ran;
}

int main(int argc, char **argv)
{
	int want[NBENCH] = {0}, stores;
	const char *tmp = getenv("TMPDIR");
	opt.parent = tmp && *tmp ? tmp : "/tmp";
	if (parse_args(argc, argv, want, &stores) != 0)
		return 2;
	opt.stores = stores;
	if (access(opt.batond, X_OK) != 0 || access(opt.minjson, X_OK) != 0) {
		fprintf(stderr, "batonbench: %s or %s is not an executable (run make first)\n",
			opt.batond, opt.minjson);
		return 2;
	}
	/* batond's default (8); minjson takes the same so the threading modes match. */
	if (opt.http_threads <= 0)
		opt.http_threads = 8;
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	signal(SIGPIPE, SIG_IGN);
	/* When run.sh is killed, its watchdog stops PostgreSQL: end with it, not against a
	 * server that is gone (and the batonds end with us). */
	pid_t parent = getppid();
	prctl(PR_SET_PDEATHSIG, SIGTERM);
	if (getppid() != parent)
		raise(SIGTERM);
	curl_global_init(CURL_GLOBAL_DEFAULT);
	setvbuf(stdout, NULL, _IOLBF, 0);
	print_context();
	int ran = 0;
	for (int store = STORE_SQLITE; store <= STORE_POSTGRES; store++)
		if (stores & (1 << store))
			ran += run_store(store, want);
	table_print();
	curl_global_cleanup();
	int misses = table_misses() - table_errors();
	if (table_errors()) {
		printf("\n%d benchmark(s) could not run\n", table_errors());
		if (opt.smoke)
			printf("%d passed, %d failed\n", ran - table_errors(), table_errors());
		return 2;
	}
	if (opt.smoke) {
		printf("\nsmoke: every benchmark ran (targets not enforced)\n%d passed, 0 failed\n",
		       ran);
		return 0;
	}
	printf("\n%s\n", misses ? "some targets were missed" : "every target was met");
	return misses ? 1 : 0;
}
