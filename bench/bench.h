/*
 * bench.h - what the benchmark files share: clocks and statistics, a temporary
 * directory, the batond processes under test, a blocking HTTP client for set-up and a
 * concurrent one for load (load.c), the SQLite floor (floor.c), and the result table.
 *
 * Every benchmark runs against a real batond started on 127.0.0.1:0 with its database
 * in a fresh temporary directory, and measures its floor (one INSERT per transaction,
 * WAL, synchronous=FULL) in that same directory just before, so that each figure is
 * compared with a floor taken on the same disk at nearly the same moment.
 */
#ifndef BATON_BENCH_H
#define BATON_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>

#define BENCH_PATH_MAX 4096

/* ---- options of one invocation ---- */

/* The store under test: batond's --db is DIR/baton.db, or a fresh PostgreSQL database. */
enum bench_store { STORE_SQLITE, STORE_POSTGRES };

typedef struct bench_opts {
	int store;	     /* the store of the benchmarks being run (enum bench_store) */
	const char *pg_url;  /* --pg: a PostgreSQL on this machine (bench/pg.sh starts one) */
	int smoke;	     /* tiny sizes, targets reported but not enforced */
	const char *batond;  /* path of the batond under test */
	const char *minjson; /* path of bench/minjson (the minimal MHD handler) */
	const char *parent;  /* where the temporary directories go */
	int threads;	     /* batond --threads */
	int http_threads;    /* batond --http-threads, and minjson's thread pool */
	int keep;	     /* keep the temporary directories (debugging) */
	int stores;	     /* the stores selected (1 << enum bench_store each) */
} bench_opts;

extern bench_opts opt;

/* ---- clocks and statistics ---- */

double now_s(void); /* CLOCK_MONOTONIC in seconds */
void sleep_ms(int ms);
double median(double *v, size_t n);		  /* sorts v; 0 when n == 0 */
double percentile(double *v, size_t n, double p); /* sorts v; p in [0, 100] */
/* "2026-11-30T05:40:00.123Z" -> ms; -1 if bad (common/rfc3339.c's parser). */
int64_t rfc3339_ms(const char *s);

/* A growable array of doubles. */
typedef struct dvec {
	double *v;
	size_t n, cap;
} dvec;
void dvec_push(dvec *d, double x);
void dvec_free(dvec *d);

/* ---- temporary directories ---- */

/* Creates PARENT/baton-bench.XXXXXX; the path is written to dir. Returns 0 or -1. */
int tmpdir_new(char *dir, size_t len);
/* Removes the directory and everything under it (unless --keep). */
void tmpdir_remove(const char *dir);

/* ---- batond under test ---- */

typedef struct server {
	char dir[BENCH_PATH_MAX];
	char db[BENCH_PATH_MAX + 16];
	char log[BENCH_PATH_MAX + 32];
	pid_t pid;
	int port;
	int starts;
	double started_at;	  /* now_s() at the last fork */
	const char *const *extra; /* the extra arguments of server_start */
} server;

/* Starts batond on DIR/baton.db (on PostgreSQL: on a new database) with the extra
 * arguments (NULL-terminated, may be NULL, kept: they must outlive the server) and waits
 * for its "listening on" line. Returns 0, or -1 with a message on stderr. */
int server_start(server *s, const char *dir, const char *const *extra);
/* A fresh temporary directory in dir and a server started on it: 0, or -1 once the row
 * `what` says which failed (and the directory is removed). */
int server_setup(const char *what, char *dir, size_t dlen, server *s);
/* Starts the same server again on the same files without waiting for anything. */
int server_spawn(server *s, const char *const *extra);
/* Waits up to timeout_s for the "listening on" line of the current start. */
int server_wait_listening(server *s, double timeout_s);
/* SIGTERM, then SIGKILL after a few seconds; reaps the process. On PostgreSQL, also
 * waits until its connections are gone (and have reported their statistics). */
void server_stop(server *s);
/* SIGTERM to all n at once, then SIGKILL to those still there after a few seconds;
 * reaps them. On PostgreSQL (the nodes of one cluster share their database), also waits
 * until their connections are gone. */
void servers_stop(server *v, int n);
/* SIGKILL at once; reaps the process. */
void server_kill9(server *s);
/* VmRSS of the process in KiB, -1 when unreadable; its anonymous part (heap, stacks)
 * in *anon_kib when not NULL (the rest is mostly shared-library pages). */
long proc_rss_kib(pid_t pid, long *anon_kib);

/* CPU time of a process, whole and per thread, for deltas around a run. */
#define CPU_MAX_THREADS 128
typedef struct cpu_snap {
	double total_s;
	int n;
	int tid[CPU_MAX_THREADS];
	double s[CPU_MAX_THREADS];
} cpu_snap;
void cpu_take(pid_t pid, cpu_snap *out);
/* CPU seconds between two snapshots: the process's, and its busiest thread's. */
double cpu_delta(const cpu_snap *a, const cpu_snap *b, double *busiest_thread_s);

/* Starts bench/minjson (the minimal MHD JSON handler) in dir; fills pid and port. With
 * commit_db, its POSTs and DELETEs are answered once a commit into that SQLite database
 * is durable (minjson.c). */
int minjson_start(const char *dir, const char *commit_db, pid_t *pid, int *port);
void child_stop(pid_t pid);

/* ---- blocking HTTP (set-up, polling) ---- */

/* One request on this thread's keep-alive connection. Returns the HTTP status, or -1
 * when the server could not be reached. The body (if wanted) is malloc'ed. */
int http_do(int port, const char *method, const char *path, const char *body, char **resp);
/* Closes this thread's connection (call before a thread that used http_do ends). */
void http_thread_done(void);
/* The value of one sample of /metrics ("name" or "name{labels}"); -1 if absent. */
double metric_value(const char *metrics_text, const char *series);
/* GET /metrics parsed for one series; -1 on failure. */
double server_metric(int port, const char *series);
/* Workflows stored with the status (baton_workflows{status=...}). */
long server_count(int port, const char *status);
/* Polls until `want` workflows are finished (completed + failed + cancelled), up to
 * timeout_s. Returns 0 when they are, -1 on timeout. */
int wait_finished(int port, long want, double timeout_s);
/* GET /workflows/{id} as JSON (new reference), NULL on failure. */
json_t *get_workflow(int port, const char *id);
/* For a completed workflow of `steps` steps: its first step's started_at and its last
 * step's finished_at (ms). Returns 0, or -1 with a message naming `what` on stderr. */
int workflow_span(int port, const char *id, int steps, const char *what, int64_t *first,
		  int64_t *last);

/* ---- concurrent HTTP load (load.c) ---- */

/* Fills the n-th request of a run: its method, path and body (NULL for none; copied at
 * once, so ctx may reuse the buffer). Returns 0, or -1 when nothing is left. */
typedef int (*load_next_fn)(void *ctx, long n, const char **method, char *path, size_t pathlen,
			    const char **body);

typedef struct load_result {
	long ok, failed;  /* 2xx answers, other answers and transport errors */
	double seconds;	  /* from the first request to the last answer */
	dvec lat_ms;	  /* latency of every 2xx answer */
	int first_status; /* status of the first failure, for the message */
} load_result;

/* Runs requests over `conns` keep-alive connections (libcurl multi, one thread) until
 * next() says stop, max_requests were sent, or max_seconds passed. */
int load_run(int port, int conns, long max_requests, double max_seconds, load_next_fn next,
	     void *ctx, load_result *out);
void load_result_free(load_result *r);

/* ---- the floor (floor.c) ---- */

typedef struct floor_result {
	double commits_per_s; /* median over the runs */
	double commit_ms;     /* median commit latency, over all commits of all runs */
	double p99_ms;
	int runs;
	long commits;
	double server_us; /* PostgreSQL: its processes' CPU per commit (batond's is 0) */
} floor_result;

/* One INSERT per transaction into DIR/floor.db (WAL, synchronous=FULL): `runs` runs of
 * up to max_commits commits or max_seconds each. Removes its files afterwards. On
 * PostgreSQL: pg_floor_measure. */
int floor_measure(const char *dir, int runs, long max_commits, double max_seconds,
		  floor_result *out);

/* ---- PostgreSQL (pg.c) ---- */

/* Connects to opt.pg_url and finds its postmaster; -1 with a message on stderr. */
int pg_open(void);
/* Drops the databases made by pg_db_new and disconnects. */
void pg_close(void);
const char *pg_version(void); /* "PostgreSQL 150018, libpq 150018" (static) */
/* CREATE DATABASE baton_bench_PID_N; its URL (opt.pg_url's, with that name) in url. */
int pg_db_new(char *url, size_t len);
/* Waits until no backend is connected to the database of url. */
int pg_wait_idle(const char *url, double timeout_s);
/* The backends connected to the database of url: their pids and application_names (up
 * to max); how many, or -1. */
int pg_backends(const char *url, pid_t *pid, char (*app)[64], int max);
/* The floor on PostgreSQL: single-row INSERTs over libpq, each its own transaction
 * (autocommit, one round trip), synchronous_commit=on, on opt.pg_url's database. */
int pg_floor_measure(int runs, long max_commits, double max_seconds, floor_result *out);

/* CPU of the postmaster (with the children it reaped) and of its live children, their
 * voluntary context switches (a backend waits once for each round trip from its client
 * and once for each WAL sync it does), and (with wal) pg_stat_wal's counters. */
#define PG_MAX_PROCS 256
typedef struct pg_snap {
	double total_s;
	int n;
	pid_t pid[PG_MAX_PROCS];
	double s[PG_MAX_PROCS];
	unsigned long long waits[PG_MAX_PROCS];
	double wal_sync, wal_write, wal_sync_ms;
} pg_snap;
void pg_snap_take(pg_snap *out, int wal);
/* CPU seconds of PostgreSQL between two snapshots; its busiest process's CPU, waits
 * and title ("postgres: walwriter", "postgres: postgres baton_bench_1_2 127.0.0.1"). */
double pg_snap_delta(const pg_snap *a, const pg_snap *b, double *busiest_s, double *busiest_waits,
		     char *busiest_name, size_t namelen);

/* ---- runs paired with their floor ---- */

/* One measured run against s: its figure and up to two more numbers (aux). */
typedef int (*run_fn)(const server *s, int run, void *ctx, double *figure, double aux[2]);

/* What the processes did in a run, per unit of work (step, request), for the notes:
 * filled by costs_end (steps.c's benchmarks) and, for the WAL syncs, by paired_runs. */
typedef struct run_costs {
	double units;	      /* steps or requests of the run; 0 when not measured */
	double commits;	      /* batond's commits (baton_commits_total) */
	double batond_us;     /* batond's CPU per unit */
	double pg_us;	      /* PostgreSQL's processes' CPU per unit */
	double pg_busiest_us; /* its busiest process's per unit */
	double pg_waits;      /* that process's waits (context switches) per batond commit */
	double commit_ms;     /* batond's mean commit (baton_commit_duration_seconds) */
	double wal_syncs;     /* WAL syncs per unit (pg_stat_wal, batond's whole life) */
	double wal_sync_ms;   /* mean time of one WAL sync */
	char pg_busiest[80];  /* its title, of the last run */
} run_costs;

typedef struct costs_snap {
	cpu_snap batond;
	pg_snap pg;
	double commits, commit_s; /* from /metrics */
} costs_snap;
void costs_begin(const server *s, costs_snap *c);
/* Prints batond's CPU per unit (and on PostgreSQL the server's) and keeps it for
 * paired_runs. */
void costs_end(const server *s, const costs_snap *c0, double units, const char *unit,
	       double wall_s);

typedef struct paired_result {
	int runs;
	double figure, ratio, aux[2]; /* medians over the runs */
	double floor_rate, floor_ms;  /* medians of the floors: commits/s, mean ms/commit */
	run_costs costs;	      /* medians over the runs (the title of the last) */
} paired_result;

/* Runs fn `runs` times, each right after a floor run (about a second) in dir, so that
 * every run has a floor taken on the same disk moments before; the machine is noisy and
 * its noise comes and goes. ratio is the median of the runs' figure / floor commits/s,
 * or with `latency`, of figure / floor mean commit ms. Returns -1 when a run failed.
 * On PostgreSQL every run gets a batond of its own on a fresh database (s is stopped
 * and started again), and its WAL syncs are read once it has stopped. */
int paired_runs(server *s, const char *dir, int runs, run_fn fn, void *ctx, int latency,
		paired_result *out);
/* A note on the costs of paired runs ("batond 25 us/step; PostgreSQL ..."), "" if none. */
void costs_note(const paired_result *pr, const char *unit, char *buf, size_t len);

/* ---- the result table ---- */

enum verdict { V_PASS, V_MISS, V_INFO };

typedef struct row {
	char store[24]; /* filled by table_add from opt.store when left empty */
	char what[48];
	char figure[64];
	char floor[64];
	char ratio[32];
	char target[48];
	enum verdict verdict;
	char note[720];
} row;

void table_add(const row *r);
void table_print(void);
int table_misses(void);

/* Benchmarks: each adds its rows to the table; returns 0 when it ran, -1 when it could
 * not (a row says why). */
int bench_floor(void);
int bench_step_overhead(void);
int bench_group_commit(void);
int bench_contended(void);
int bench_leases(void);	 /* leases.c */
int bench_permits(void); /* permits.c: issue 28, a resource of several permits */
int bench_http_accept(void);
int bench_http_read(void);
int bench_memory(void);
int bench_recovery(void);
int bench_http_steps(void); /* calls.c */
int bench_cluster(void);    /* cluster.c, PostgreSQL only */
int bench_failover(void);   /* failover.c, PostgreSQL only: issue 40 */
int bench_lockpath(void);   /* lockpath.c: once, on every store selected, beside etcd */

/* ---- a cluster of batond nodes on one PostgreSQL database (cluster.c) ---- */

#define CLUSTER_MAX_NODES 3
typedef struct cluster {
	char dir[BENCH_PATH_MAX];
	char db[BENCH_PATH_MAX + 16];
	int n;
	server node[CLUSTER_MAX_NODES];
	char id[CLUSTER_MAX_NODES][16];
	const char *extra[CLUSTER_MAX_NODES][5];
} cluster;

/* A fresh database and n nodes on it (--node-id bench-nK), each listening; 0, or -1
 * with everything stopped. Needs opt.store == STORE_POSTGRES and pg_open. */
int cluster_start(cluster *c, int n);
/* The same on the database of the URL db (a libpq URL; application_name is added). */
int cluster_start_on(cluster *c, int n, const char *db);
/* Waits until every partition is held and no node holds more than its fair share; the
 * seconds it took, or -1 on timeout. */
double cluster_settle(cluster *c, double timeout_s);
/* The node index of a node id ("bench-n2" -> 1), -1 when it is none of ours. */
int cluster_node_index(const cluster *c, const char *id);
/* Stops every node and removes the directory. */
void cluster_stop(cluster *c);

/* ---- etcd beside baton (etcd.c) ---- */

typedef struct etcd {
	char dir[BENCH_PATH_MAX];
	char log[BENCH_PATH_MAX + 16];
	pid_t pid;
	int port, peer_port; /* client and peer ports on 127.0.0.1 */
	char version[64];    /* GET /version, as etcd answers it */
	char why[300];	     /* why it could not start */
} etcd;

const char *etcd_path(void); /* $ETCD, or /usr/bin/etcd */
/* One member with its data in DIR/data, on free loopback ports; waits for /health.
 * Returns 0, or -1 with the reason in e->why (not installed, did not start). */
int etcd_start(etcd *e, const char *dir);
void etcd_stop(etcd *e); /* by its pid; accepts a stopped one */
/* The gateway's lock API on this thread's connection: each returns the HTTP status (200
 * on success) or -1. Lease ids and keys are strings as the gateway writes them. */
int etcd_lease_grant(int port, int ttl_s, char *id, size_t idlen);
int etcd_lease_revoke(int port, const char *id);
int etcd_lock(int port, const char *name, const char *lease, char *key, size_t keylen);
int etcd_unlock(int port, const char *key);

/* A row for a benchmark that could not run; counted in table_errors(). */
void table_fail(const char *what, const char *why);
int table_errors(void);

#endif
