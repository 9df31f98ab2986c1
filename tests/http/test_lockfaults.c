/*
 * test_lockfaults.c - the lock under faults, as its users see it: `baton lock` commands on
 * one resource of a three-node cluster while one fault at a time strikes, then a check of
 * what really ran. PostgreSQL only (a cluster shares one database); on SQLite it skips.
 *
 * Cluster: three nodes, each reaching PostgreSQL through a proxy of its own that the test
 * can cut (tests/harness/proxy.h), --lease-ms LEASE_MS.
 * Clients: CLIENTS threads, each running `baton lock` again and again on the resource,
 * naming every node (--server URL,URL,URL), each client and each command in another order:
 * the client moves on from a node that refuses, times out or answers 503. The command is a small
 * Python program that writes the lease's fencing token, then a CLOCK_MONOTONIC stamp every
 * 10 ms, to a file of its own, for 50 to 1500 ms. A command that is killed stops stamping,
 * so a run (first stamp to last) is what really ran under the lease.
 * Faults, one at a time, chosen by a seeded generator (LOCKFAULTS_SEED replays a run; the
 * seed is printed): the driving node (or another) cut off from the database for 2.5 to 4.5
 * node leases; paused (SIGSTOP) past its lease; killed (SIGKILL) and started again; the
 * PostgreSQL server restarted; its wall clock stepped by an hour either way (every node
 * runs under libfaketime, reading an offset from a file of its own; the clients and
 * PostgreSQL run on the real clock). The short form (make test) strikes each kind once in a
 * seeded order; LOCKFAULTS_ROUNDS=N (make torture) strikes N faults chosen at random.
 * Checks: no two runs overlap; fencing tokens strictly increase in the order the runs
 * started; the lock stays live (a command completes after the last fault).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../harness/cluster.h"
#include "../harness/harness.h"

#define NODES	    3
#define LEASE_MS    2000
#define CLIENTS	    3
#define MAX_RUNS    4096
#define LIVE_MS	    60000  /* after the last fault, a command must complete within this */
#define COMMAND_CAP 120000 /* a baton lock still running after this is killed (a hang) */
#define RESOURCE    "lockfaults"
#define WRESOURCE   "lockfaults-w" /* the external workers' steps */
#define WORKERS	    2
#define TASKS	    12	  /* workflows of one external step each */
#define WORKER_CAP  15000 /* a baton worker --once still waiting then is stopped */

enum fault { F_CUT, F_PAUSE, F_KILL, F_PG_RESTART, F_CLOCK, F_KINDS };
static const char *const fault_name[F_KINDS] = {"cut off the database", "paused",
						"killed and restarted", "PostgreSQL restarted",
						"wall clock stepped"};

static const char stamper[] =
    "import os, sys, time\n"
    "f = open(sys.argv[1], 'w')\n"
    "f.write('token %s\\n' % os.environ.get('BATON_FENCING_TOKEN', '0'))\n"
    "end = time.monotonic() + int(sys.argv[2]) / 1000.0\n"
    "while True:\n"
    "    f.write('%d\\n' % time.monotonic_ns())\n"
    "    f.flush()\n"
    "    if time.monotonic() >= end:\n"
    "        break\n"
    "    time.sleep(0.01)\n";

static const char task_stamper[] =
    "import os, random, sys, time\n"
    "f = open(os.path.join(sys.argv[1], 'task-%s-%d' % (os.environ['BATON_TASK_ID'],"
    " os.getpid())), 'w')\n"
    "f.write('task %s %s\\n' % (os.environ['BATON_TASK_ID'], os.environ['BATON_FENCING_TOKEN']))\n"
    "end = time.monotonic() + random.uniform(0.05, 0.8)\n"
    "while True:\n"
    "    f.write('%d\\n' % time.monotonic_ns())\n"
    "    f.flush()\n"
    "    if time.monotonic() >= end:\n"
    "        break\n"
    "    time.sleep(0.01)\n"
    "print('{}')\n";

typedef struct suite {
	cluster cl;
	char dir[PATH_MAX];
	pthread_t clients[CLIENTS + WORKERS];
	int started;
	atomic_int stop;
	atomic_int runs;		       /* commands started (files named run-N) */
	atomic_int completed;		       /* commands that exited 0 */
	atomic_int exits[256];		       /* how commands exited */
	pid_t child[CLIENTS + WORKERS];	       /* each client's running baton, 0 for none */
	char clock_file[NODES][PATH_MAX + 16]; /* each node's libfaketime offset */
	int offset[NODES];		       /* its wall clock's step so far, in s */
	pthread_mutex_t mu; /* guards child[] and the cluster's node pointers' use */
	unsigned seed;
	int ntasks; /* workflows lfw-0 .. lfw-(ntasks-1) submitted */
} suite;

static suite *the; /* for the client threads */

static int64_t mono(void)
{
	return hs_mono_ms();
}

/* Every running node's URL, comma-separated, starting at node `first` (each client names
 * them in another order, as `baton lock --server` takes them); "" when none runs. */
static void server_list(suite *t, int first, char *out, size_t n)
{
	size_t len = 0;
	out[0] = 0;
	pthread_mutex_lock(&t->mu);
	for (int k = 0; k < NODES; k++) {
		hs_server *s = t->cl.node[(first + k) % NODES];
		if (s && hs_running(s))
			len += (size_t)snprintf(out + len, n - len, "%shttp://127.0.0.1:%d",
						len ? "," : "", hs_port(s));
	}
	pthread_mutex_unlock(&t->mu);
}

/* The index of the node that drives RESOURCE, as the database says; -1 when unknown. */
static int owner(suite *t)
{
	int who = cl_part_owner(&t->cl, cl_part_of(RESOURCE));
	return who >= 0 && who < NODES ? who : -1;
}

static void *client_main(void *arg)
{
	suite *t = the;
	int me = (int)(intptr_t)arg;
	unsigned rnd = t->seed * 31u + (unsigned)me;
	for (int round = 0; !atomic_load(&t->stop); round++) {
		char url[3 * 32];
		server_list(t, me + round, url, sizeof url);
		if (!url[0]) {
			hs_pause_ms(100);
			continue;
		}
		int n = atomic_fetch_add(&t->runs, 1);
		if (n >= MAX_RUNS)
			break;
		char file[PATH_MAX + 32], ms[16], holder[16];
		snprintf(file, sizeof file, "%s/run-%d", t->dir, n);
		snprintf(ms, sizeof ms, "%u", 50 + rand_r(&rnd) % 1450);
		snprintf(holder, sizeof holder, "client-%d", me);
		pid_t pid = fork();
		if (pid == 0) {
			hs_faketime_env(0); /* batond's alone */
			const char *bin = getenv("BATON_CLIENT");
			execl(bin, bin, "--server", url, "lock", RESOURCE, "--ttl", "6s", "--wait",
			      "20s", "--holder", holder, "--", "python3", "-c", stamper, file, ms,
			      (char *)NULL);
			_exit(127);
		}
		if (pid < 0)
			break;
		pthread_mutex_lock(&t->mu);
		t->child[me] = pid;
		pthread_mutex_unlock(&t->mu);
		int status = 0;
		int64_t deadline = mono() + COMMAND_CAP;
		while (waitpid(pid, &status, WNOHANG) == 0) {
			if (mono() > deadline) {
				kill(pid, SIGKILL);
				waitpid(pid, &status, 0);
				break;
			}
			hs_pause_ms(20);
		}
		pthread_mutex_lock(&t->mu);
		t->child[me] = 0;
		pthread_mutex_unlock(&t->mu);
		int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
		atomic_fetch_add(&t->exits[code & 255], 1);
		if (code == 0)
			atomic_fetch_add(&t->completed, 1);
	}
	return NULL;
}

/* An external worker: `baton worker --once` again and again, naming every node, its command
 * stamping its task's runs; one still waiting for a task after WORKER_CAP is stopped
 * (SIGTERM) and started again, so that it names the nodes' current ports. */
static void *worker_main(void *arg)
{
	suite *t = the;
	int me = (int)(intptr_t)arg;
	for (int round = 0; !atomic_load(&t->stop); round++) {
		char url[3 * 32];
		server_list(t, me + round, url, sizeof url);
		if (!url[0]) {
			hs_pause_ms(100);
			continue;
		}
		pid_t pid = fork();
		if (pid == 0) {
			hs_faketime_env(0);
			const char *bin = getenv("BATON_CLIENT");
			execl(bin, bin, "--server", url, "worker", "--worker", "lfw", "--resource",
			      WRESOURCE, "--ttl", "6s", "--once", "--", "python3", "-c",
			      task_stamper, t->dir, (char *)NULL);
			_exit(127);
		}
		if (pid < 0)
			break;
		pthread_mutex_lock(&t->mu);
		t->child[me] = pid;
		pthread_mutex_unlock(&t->mu);
		int status = 0, stopped = 0;
		int64_t cap = mono() + WORKER_CAP;
		while (waitpid(pid, &status, WNOHANG) == 0) {
			if (!stopped && (mono() > cap || atomic_load(&t->stop))) {
				kill(pid, SIGTERM);
				stopped = 1;
				cap = mono() + COMMAND_CAP;
			} else if (stopped && mono() > cap) {
				kill(pid, SIGKILL);
				waitpid(pid, &status, 0);
				break;
			}
			hs_pause_ms(20);
		}
		pthread_mutex_lock(&t->mu);
		t->child[me] = 0;
		pthread_mutex_unlock(&t->mu);
	}
	return NULL;
}

static int setup(void **state)
{
	suite *t = calloc(1, sizeof *t);
	if (!t)
		return -1;
	pthread_mutex_init(&t->mu, NULL);
	const char *tmp = getenv("TMPDIR");
	snprintf(t->dir, sizeof t->dir, "%s/baton-lockfaults-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(t->dir)) {
		free(t);
		return -1;
	}
	*state = t;
	return 0;
}

/* Stops the clients (their running commands by pid), then the nodes and proxies. */
static int teardown(void **state)
{
	suite *t = *state;
	atomic_store(&t->stop, 1);
	pthread_mutex_lock(&t->mu);
	for (int i = 0; i < CLIENTS + WORKERS; i++)
		if (t->child[i] > 0)
			kill(t->child[i], SIGTERM);
	pthread_mutex_unlock(&t->mu);
	for (int i = 0; i < t->started; i++)
		pthread_join(t->clients[i], NULL);
	int rc = cl_close(&t->cl);
	hs_faketime_env(0);
	if (!getenv("BATON_TEST_KEEP")) {
		char cmd[PATH_MAX + 16];
		snprintf(cmd, sizeof cmd, "rm -rf '%s'", t->dir);
		if (system(cmd) != 0)
			fprintf(stderr, "lockfaults: cannot remove %s\n", t->dir);
	}
	pthread_mutex_destroy(&t->mu);
	free(t);
	return rc;
}

/* The node to strike: most often the one that drives the resource. */
static int target(suite *t, unsigned *rnd)
{
	int who = owner(t);
	return who >= 0 && rand_r(rnd) % 4 ? who : (int)(rand_r(rnd) % NODES);
}

static void strike(suite *t, enum fault f, unsigned *rnd)
{
	int k = target(t, rnd);
	int ms;
	switch (f) {
	case F_CUT:
		ms = LEASE_MS * 5 / 2 + (int)(rand_r(rnd) % (2 * LEASE_MS));
		print_message("lockfaults: node%d %s for %d ms\n", k, fault_name[f], ms);
		cl_cut(&t->cl, k);
		hs_pause_ms(ms);
		cl_heal(&t->cl, k);
		break;
	case F_PAUSE:
		ms = LEASE_MS * 3 / 2 + (int)(rand_r(rnd) % LEASE_MS);
		print_message("lockfaults: node%d %s for %d ms\n", k, fault_name[f], ms);
		assert_int_equal(hs_signal(t->cl.node[k], SIGSTOP), 0);
		hs_pause_ms(ms);
		assert_int_equal(hs_signal(t->cl.node[k], SIGCONT), 0);
		break;
	case F_KILL:
		ms = 200 + (int)(rand_r(rnd) % 2000);
		print_message("lockfaults: node%d %s after %d ms\n", k, fault_name[f], ms);
		pthread_mutex_lock(&t->mu);
		hs_kill(t->cl.node[k]);
		pthread_mutex_unlock(&t->mu);
		hs_pause_ms(ms);
		pthread_mutex_lock(&t->mu);
		int rc = hs_start(t->cl.node[k]);
		pthread_mutex_unlock(&t->mu);
		assert_int_equal(rc, 0);
		break;
	case F_CLOCK: {
		int step = rand_r(rnd) % 2 ? 3600 : -3600;
		t->offset[k] += step;
		print_message("lockfaults: node%d %s by %+d s\n", k, fault_name[f], step);
		char tmp[PATH_MAX + 32];
		snprintf(tmp, sizeof tmp, "%s.tmp", t->clock_file[k]);
		FILE *fp = fopen(tmp, "w");
		assert_non_null(fp);
		fprintf(fp, "%+d\n", t->offset[k]);
		assert_int_equal(fclose(fp), 0);
		assert_int_equal(rename(tmp, t->clock_file[k]), 0);
		break;
	}
	default: {
		print_message("lockfaults: %s\n", fault_name[f]);
		hs_faketime_env(0); /* PostgreSQL runs on the real clock */
		int restarted = hs_pg_restart();
		hs_faketime_env(1);
		assert_int_equal(restarted, 0);
	}
	}
}

typedef struct run {
	long long token;
	long long first, last; /* ns, CLOCK_MONOTONIC */
	int n;
} run;

static int by_first(const void *a, const void *b)
{
	const run *x = a, *y = b;
	return (x->first > y->first) - (x->first < y->first);
}

/* Reads every run's file; returns how many ran (stamped at least once). */
static int read_runs(const suite *t, run *out)
{
	int nr = 0, total = atomic_load(&t->runs);
	for (int i = 0; i < total && i < MAX_RUNS; i++) {
		char file[PATH_MAX + 32];
		snprintf(file, sizeof file, "%s/run-%d", t->dir, i);
		FILE *f = fopen(file, "r");
		if (!f)
			continue; /* never granted, or its command never started */
		run r = {0};
		char line[64];
		if (fgets(line, sizeof line, f) && sscanf(line, "token %lld", &r.token) == 1) {
			long long v;
			while (fgets(line, sizeof line, f))
				if (sscanf(line, "%lld", &v) == 1) {
					if (!r.n++)
						r.first = v;
					r.last = v;
				}
		}
		fclose(f);
		if (r.n)
			out[nr++] = r;
	}
	return nr;
}

static void check_runs(suite *t)
{
	static run runs[MAX_RUNS];
	int n = read_runs(t, runs);
	qsort(runs, (size_t)n, sizeof *runs, by_first);
	long long last_end = 0, last_token = 0;
	for (int i = 0; i < n; i++) {
		if (i && runs[i].first <= last_end)
			fail_msg(
			    "runs overlap: token %lld ran from %lld, before token %lld ended at"
			    " %lld (ns, CLOCK_MONOTONIC; seed %u)",
			    runs[i].token, runs[i].first, last_token, last_end, t->seed);
		if (i && runs[i].token <= last_token)
			fail_msg("token %lld ran after token %lld (seed %u)", runs[i].token,
				 last_token, t->seed);
		last_end = runs[i].last;
		last_token = runs[i].token;
	}
	print_message("lockfaults: %d runs checked, %d commands completed; exits:", n,
		      atomic_load(&t->completed));
	for (int c = 0; c < 256; c++)
		if (atomic_load(&t->exits[c]))
			print_message(" %d x%d", c, atomic_load(&t->exits[c]));
	print_message("\n");
}

/* Submits n workflows of one external step through a live node (any node takes them). */
static void submit_tasks(suite *t, int n)
{
	for (int k = 0; k < n; k++) {
		char body[256];
		snprintf(body, sizeof body,
			 "{\"id\": \"lfw-%d\", \"resource\": \"" WRESOURCE "\", \"workers\":"
			 " [{\"name\": \"lfw\", \"external\": true}], \"retry\":"
			 " {\"max_attempts\": 50, \"first_retry_ms\": 200}}",
			 t->ntasks);
		long st = 0;
		for (int64_t end = mono() + 60000; mono() < end && st != 201;) {
			pthread_mutex_lock(&t->mu);
			for (int i = 0; i < NODES && st != 201; i++) {
				hs_server *s = t->cl.node[i];
				hs_response r;
				if (s && hs_running(s) && hs_post(s, "/workflows", body, &r) == 0)
					st = r.status == 200 ? 201 : r.status;
				if (s && hs_running(s))
					hs_response_fini(&r);
			}
			pthread_mutex_unlock(&t->mu);
			if (st != 201)
				hs_pause_ms(200);
		}
		assert_int_equal(st, 201);
		t->ntasks++;
	}
}

/* The stored workflow lfw-k through a live node (new reference), or NULL. */
static json_t *task_workflow(suite *t, int k)
{
	char path[64];
	snprintf(path, sizeof path, "/workflows/lfw-%d", k);
	json_t *wf = NULL;
	pthread_mutex_lock(&t->mu);
	for (int i = 0; i < NODES && !wf; i++) {
		hs_server *s = t->cl.node[i];
		hs_response r;
		if (!s || !hs_running(s))
			continue;
		if (hs_get(s, path, &r) == 0 && r.status == 200)
			wf = json_incref(r.json);
		hs_response_fini(&r);
	}
	pthread_mutex_unlock(&t->mu);
	return wf;
}

static bool tasks_ended(void *arg)
{
	suite *t = arg;
	for (int k = 0; k < t->ntasks; k++) {
		json_t *wf = task_workflow(t, k);
		const char *st = json_string_value(json_object_get(wf, "status"));
		bool ended = st && (strcmp(st, "completed") == 0 || strcmp(st, "failed") == 0);
		json_decref(wf);
		if (!ended)
			return false;
	}
	return true;
}

typedef struct task_run {
	int wf, attempt;
	long long token, first, last;
} task_run;

static int by_task_then_first(const void *a, const void *b)
{
	const task_run *x = a, *y = b;
	if (x->wf != y->wf)
		return (x->wf > y->wf) - (x->wf < y->wf);
	return (x->first > y->first) - (x->first < y->first);
}

/* The external workers' runs: for each step, no two attempts ran at once, tokens increase
 * in run order, no attempt ran twice, and nothing ran after the attempt that completed. */
static void check_tasks(suite *t)
{
	static task_run runs[MAX_RUNS];
	int n = 0;
	DIR *d = opendir(t->dir);
	assert_non_null(d);
	struct dirent *de;
	while ((de = readdir(d)) && n < MAX_RUNS) {
		if (strncmp(de->d_name, "task-", 5) != 0)
			continue;
		char file[PATH_MAX + 300], id[200];
		snprintf(file, sizeof file, "%s/%s", t->dir, de->d_name);
		FILE *f = fopen(file, "r");
		if (!f)
			continue;
		task_run r = {0};
		char line[256];
		int stamps = 0, step;
		if (fgets(line, sizeof line, f) &&
		    sscanf(line, "task %199s %lld", id, &r.token) == 2 &&
		    sscanf(id, "lfw-%d.%d.%d", &r.wf, &step, &r.attempt) == 3) {
			long long v;
			while (fgets(line, sizeof line, f))
				if (sscanf(line, "%lld", &v) == 1) {
					if (!stamps++)
						r.first = v;
					r.last = v;
				}
		}
		fclose(f);
		if (stamps)
			runs[n++] = r;
	}
	closedir(d);
	qsort(runs, (size_t)n, sizeof *runs, by_task_then_first);
	int completed = 0;
	for (int i = 0; i < n; i++) {
		const task_run *r = &runs[i], *p = i ? &runs[i - 1] : NULL;
		if (p && p->wf == r->wf) {
			if (r->first <= p->last)
				fail_msg("lfw-%d: attempts %d and %d ran at once (seed %u)", r->wf,
					 p->attempt, r->attempt, t->seed);
			if (r->token <= p->token || r->attempt <= p->attempt)
				fail_msg(
				    "lfw-%d: attempt %d (token %lld) ran after attempt %d (token"
				    " %lld) (seed %u)",
				    r->wf, r->attempt, r->token, p->attempt, p->token, t->seed);
		}
		if (i + 1 < n && runs[i + 1].wf == r->wf)
			continue;
		/* r is the step's last run: if the step completed, it is the attempt that did */
		json_t *wf = task_workflow(t, r->wf);
		const char *st = json_string_value(json_object_get(wf, "status"));
		if (st && strcmp(st, "completed") == 0) {
			json_int_t a = hs_int(hs_step_at(wf, 0), "attempts");
			if (a != r->attempt)
				fail_msg(
				    "lfw-%d completed with attempt %lld, but attempt %d ran last"
				    " (seed %u)",
				    r->wf, (long long)a, r->attempt, t->seed);
			completed++;
		}
		json_decref(wf);
	}
	print_message("lockfaults: %d task runs checked, %d of %d workflows completed\n", n,
		      completed, t->ntasks);
}

static void test_lock_under_faults(void **state)
{
	if (!hs_store_is_pg())
		skip(); /* a cluster shares one PostgreSQL database */
	suite *t = *state;
	const char *s = getenv("LOCKFAULTS_SEED");
	t->seed =
	    s && *s ? (unsigned)strtoul(s, NULL, 10) : (unsigned)time(NULL) ^ (unsigned)getpid();
	const char *r = getenv("LOCKFAULTS_ROUNDS");
	int rounds = r && *r ? atoi(r) : 0;
	print_message("lockfaults: seed %u (LOCKFAULTS_SEED=%u replays it), %s\n", t->seed, t->seed,
		      rounds ? "random faults" : "each fault once");
	unsigned rnd = t->seed;
	/* Every node runs under libfaketime with a clock file of its own (offset 0 until a
	 * clock fault steps it); PostgreSQL and the clients run on the real clock. */
	const char *files[NODES];
	for (int i = 0; i < NODES; i++) {
		snprintf(t->clock_file[i], sizeof t->clock_file[i], "%s/clock-%d", t->dir, i);
		FILE *fp = fopen(t->clock_file[i], "w");
		assert_non_null(fp);
		fputs("+0\n", fp);
		assert_int_equal(fclose(fp), 0);
		files[i] = t->clock_file[i];
	}
	/* Without libfaketime (a ThreadSanitizer build, see hs_faketime_lib) the clock fault is
	 * left out. */
	int clocks = hs_faketime_env(1) == 0;
	assert_int_equal(
	    cl_open_proxied_env(&t->cl, NODES, LEASE_MS, NULL, "FAKETIME_TIMESTAMP_FILE", files),
	    0);
	assert_true(cl_wait_balanced(&t->cl, 0, (1u << NODES) - 1, 60000));
	the = t;
	for (int i = 0; i < CLIENTS + WORKERS; i++) {
		void *(*fn)(void *) = i < CLIENTS ? client_main : worker_main;
		assert_int_equal(pthread_create(&t->clients[i], NULL, fn, (void *)(intptr_t)i), 0);
		t->started++;
	}
	enum fault order[F_KINDS] = {F_CUT, F_PAUSE, F_KILL, F_PG_RESTART, F_CLOCK};
	for (int i = F_KINDS - 1; i > 0; i--) { /* a seeded shuffle */
		int j = (int)(rand_r(&rnd) % (unsigned)(i + 1));
		enum fault x = order[i];
		order[i] = order[j];
		order[j] = x;
	}
	int total = rounds ? rounds : F_KINDS;
	for (int i = 0; i < total; i++) {
		hs_pause_ms(2000 + (int)(rand_r(&rnd) % 2000)); /* traffic between faults */
		enum fault f = rounds ? (enum fault)(rand_r(&rnd) % F_KINDS) : order[i];
		if (f == F_CLOCK && !clocks)
			continue;
		submit_tasks(t, TASKS / F_KINDS + 1);
		strike(t, f, &rnd);
	}
	/* Live: a command completes after the last fault. */
	int before = atomic_load(&t->completed);
	int64_t deadline = mono() + LIVE_MS;
	while (atomic_load(&t->completed) <= before && mono() < deadline)
		hs_pause_ms(100);
	int live = atomic_load(&t->completed) > before;
	bool tasks_live = hs_wait_until(tasks_ended, t, 2 * LIVE_MS);
	atomic_store(&t->stop, 1);
	for (int i = 0; i < t->started; i++)
		pthread_join(t->clients[i], NULL);
	t->started = 0;
	check_runs(t);
	check_tasks(t);
	if (!live)
		fail_msg("no command completed within %d ms after the last fault (seed %u)",
			 LIVE_MS, t->seed);
	if (!tasks_live)
		fail_msg("the external workers' workflows did not all end within %d ms (seed %u)",
			 2 * LIVE_MS, t->seed);
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_lock_under_faults, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
