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
 * PostgreSQL run on the real clock). And the clients' own network: every client reaches
 * node i through a proxy of the test (cpx[i], tests/harness/proxy.h), which for three to
 * five seconds strikes half of their requests with one fault: the answer dropped, a reset
 * in mid-request or in mid-answer, the request held back. The clients are the real
 * `baton lock` and `baton worker`, so they retry as they do (the same request_id, the next
 * node). The short form (make test) strikes each kind once in a seeded order;
 * make torture strikes faults chosen at random for LOCKFAULTS_MINUTES minutes of faults (or
 * LOCKFAULTS_ROUNDS=N faults), and adds one more
 * kind: PostgreSQL fails over. For that mode the cluster's database is a pair the test
 * owns (tests/harness/pgpair.h): a primary and a streaming standby that every commit waits
 * for (synchronous_standby_names '*' on both), and every node names both servers in a
 * libpq multi-host URL with target_session_attrs=read-write, each through a proxy of its
 * own (a cut cuts both). The failover crashes (pg_ctl stop -m immediate) or stops the
 * primary, promotes the standby (pg_ctl promote), and makes the old primary the new
 * standby (a fresh pg_basebackup -R from the new primary), so that the next one goes the
 * other way; until it streams again every commit waits for it. The standby is synchronous
 * because that is where baton promises no two holders through a promotion: an asynchronous
 * standby may lack acknowledged grants, so a lease a command still holds may be gone and
 * granted again (the weakening README documents), which the checks below would report.
 * "PostgreSQL restarted" then restarts the primary of the pair. Tokens granted after a
 * promotion carry the new timeline's generation ((timeline - 1) << 40), so they are above
 * every token before it, and the checks hold as they are. The short form runs on the one
 * server of the run and leaves the failover out (its servers cost more than the fault).
 * Checks: no two runs overlap; fencing tokens strictly increase in the order the runs
 * started; the lock stays live: once the faults are over, every node, asked directly,
 * grants a lease on resources nobody used yet, one in a partition of each node (its own
 * and those it passes on), within FRESH_MS, and a command completes after the last fault.
 *
 * Permits: a second resource, of PLIMIT permits (set with PUT through a node at the start),
 * on the partition of the first, so that every fault that strikes the one's driver strikes
 * the other's. PCLIENTS more client threads run `baton lock` on it, one command in four
 * with --exclusive, under the same faults; their commands stamp as the others do, and also
 * write their lease, BATON_SLOT and whether they asked for all permits. Checks of the runs:
 * never more than PLIMIT at once; an exclusive run overlaps no other run; runs at once have
 * different slots; tokens strictly increase in run order wherever the grants were ordered
 * (the runs of one slot; every run against an exclusive one), while runs granted side by
 * side may start in either order; every run's lease, token, slot and exclusiveness are those
 * of a grant in the resource's history. Checks of that history (GET
 * /resources/{name}/events, in seq order): tokens strictly increase in grant order; no
 * grant exceeds the permits (an exclusive one only to nobody else), and each plain grant
 * takes the lowest free slot; no waiter is overtaken: a request is granted only when every
 * request queued before it has been granted or has left the queue (workflow_cancelled).
 * And the permits stay live: one of their commands completes after the last fault too.
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
#include "../harness/pgpair.h"

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
#define TASKS_OPEN  24	  /* at most this many unfinished (the short form submits 18) */
#define WORKER_CAP  15000 /* a baton worker --once still waiting then is stopped */
#define PLIMIT	    3	  /* the permits of the second resource */
#define PCLIENTS    4	  /* its clients: one more than its permits, so that they queue */
#define MAX_HOLDERS 64	  /* a history that shows more holders at once has failed already */
#define ALL_CLIENTS (CLIENTS + WORKERS + PCLIENTS)

/* The node faults, then the clients' own (each one enum hs_fault of the clients' proxies,
 * in its order). */
enum fault {
	F_CUT,
	F_PAUSE,
	F_KILL,
	F_PG_RESTART,
	F_CLOCK,
	F_FAILOVER,
	F_DROP_ANSWER,
	F_RESET_REQUEST,
	F_RESET_ANSWER,
	F_HOLD_REQUEST,
	F_KINDS
};
#define F_CLIENT     F_DROP_ANSWER /* the first of the clients' faults */
#define STRIKE_SHARE 50		   /* percent of the clients' requests struck meanwhile */
#define FRESH_MS     10000 /* after the faults, every node grants a fresh resource within this */
static const char *const fault_name[F_KINDS] = {"cut off the database", "paused",
						"killed and restarted", "PostgreSQL restarted",
						"wall clock stepped",	"PostgreSQL failed over",
						"answers dropped",	"reset in mid-request",
						"reset in mid-answer",	"requests held back"};

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

/* The permits' command: the stamper's, with its lease, slot and kind on the first line. */
static const char permit_stamper[] =
    "import os, sys, time\n"
    "f = open(sys.argv[1], 'w')\n"
    "f.write('token %s slot %s %s %s\\n' % (os.environ.get('BATON_FENCING_TOKEN', '0'),"
    " os.environ.get('BATON_SLOT', 'unset') or '-', sys.argv[3],"
    " os.environ.get('BATON_LEASE_ID', '-')))\n"
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

/* The `baton lock` commands of one resource: started, exited 0, how each exited. */
typedef struct tally {
	atomic_int runs, completed, exits[256];
} tally;

typedef struct suite {
	cluster cl;
	char dir[PATH_MAX];
	char python[PATH_MAX]; /* the interpreter itself, not a shim that looks it up per run */
	pthread_t clients[ALL_CLIENTS];
	int started;
	atomic_int stop;
	tally mutex;		  /* RESOURCE's commands (files named run-N) */
	tally permits;		  /* the permits' commands (prun-N) */
	char presource[32];	  /* the permits' resource: RESOURCE's partition */
	pid_t child[ALL_CLIENTS]; /* each client's running baton, 0 for none */
	hs_proxy *cpx[NODES];	  /* the clients reach node i through cpx[i], which strikes them */
	int faults;		  /* faults struck */
	char clock_file[NODES][PATH_MAX + 16]; /* each node's libfaketime offset */
	int offset[NODES];		       /* its wall clock's step so far, in s */
	pthread_mutex_t mu; /* guards child[] and the cluster's node pointers' use */
	unsigned seed;
	int ntasks;    /* workflows lfw-0 .. lfw-(ntasks-1) submitted */
	int open_from; /* lfw-0 .. lfw-(open_from-1) have ended */
	pair *pg;      /* random faults: the primary and its synchronous standby, or NULL */
	int primary;   /* which of pg->n is the primary */
	int failovers; /* promotions struck */
} suite;

static suite *the; /* for the client threads */

static int64_t mono(void)
{
	return hs_mono_ms();
}

/* The URL of every running node's client proxy, comma-separated, starting at node `first`
 * (each client names them in another order, as `baton lock --server` takes them); "" when
 * none runs. */
static void server_list(suite *t, int first, char *out, size_t n)
{
	size_t len = 0;
	out[0] = 0;
	pthread_mutex_lock(&t->mu);
	for (int k = 0; k < NODES; k++) {
		hs_server *s = t->cl.node[(first + k) % NODES];
		if (s && hs_running(s))
			len += (size_t)snprintf(out + len, n - len, "%shttp://127.0.0.1:%d",
						len ? "," : "",
						hs_proxy_port(t->cpx[(first + k) % NODES]));
	}
	pthread_mutex_unlock(&t->mu);
}

/* The index of the node that drives RESOURCE, as the database says; -1 when unknown. */
static int owner(suite *t)
{
	int who = cl_part_owner(&t->cl, cl_part_of(RESOURCE));
	return who >= 0 && who < NODES ? who : -1;
}

/* Runs the client with args (argv[1]...; NULL-terminated) as client `me`'s child, killed
 * after COMMAND_CAP; returns its exit code (128 + signal), or -1 when it could not fork. */
static int run_client(suite *t, int me, const char *const *args)
{
	pid_t pid = fork();
	if (pid == 0) {
		hs_faketime_env(0); /* batond's alone */
		const char *bin = getenv("BATON_CLIENT");
		const char *argv[24] = {bin};
		for (int i = 0; args[i] && i < 22; i++)
			argv[i + 1] = args[i];
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	if (pid < 0)
		return -1;
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
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/*
 * A client: `baton lock` on one resource again and again, naming every node in another
 * order each round. On RESOURCE (permits 0) every command is plain; on the permits'
 * resource one in four asks for all the permits (--exclusive) and says so to its stamper.
 */
static void lock_clients(suite *t, int me, int permits, unsigned rnd)
{
	tally *tl = permits ? &t->permits : &t->mutex;
	const char *resource = permits ? t->presource : RESOURCE;
	for (int round = 0; !atomic_load(&t->stop); round++) {
		char url[3 * 32];
		server_list(t, me + round, url, sizeof url);
		if (!url[0]) {
			hs_pause_ms(100);
			continue;
		}
		int n = atomic_fetch_add(&tl->runs, 1);
		if (n >= MAX_RUNS)
			break;
		int excl = permits && rand_r(&rnd) % 4 == 0;
		char file[PATH_MAX + 32], ms[16], holder[24];
		snprintf(file, sizeof file, "%s/%s-%d", t->dir, permits ? "prun" : "run", n);
		snprintf(ms, sizeof ms, "%u", 50 + rand_r(&rnd) % (excl ? 450 : 1450));
		if (permits)
			snprintf(holder, sizeof holder, "pclient-%d", me - CLIENTS - WORKERS);
		else
			snprintf(holder, sizeof holder, "client-%d", me);
		const char *argv[24];
		int k = 0;
		argv[k++] = "--server";
		argv[k++] = url;
		argv[k++] = "lock";
		if (excl)
			argv[k++] = "--exclusive";
		const char *const rest[] = {resource,	"--ttl", "6s", "--wait",  "20s",
					    "--holder", holder,	 "--", t->python, "-c"};
		for (size_t r = 0; r < sizeof rest / sizeof *rest; r++)
			argv[k++] = rest[r];
		argv[k++] = permits ? permit_stamper : stamper;
		argv[k++] = file;
		argv[k++] = ms;
		if (permits)
			argv[k++] = excl ? "exclusive" : "plain";
		argv[k] = NULL;
		int code = run_client(t, me, argv);
		if (code < 0)
			break;
		atomic_fetch_add(&tl->exits[code & 255], 1);
		if (code == 0)
			atomic_fetch_add(&tl->completed, 1);
	}
}

static void *client_main(void *arg)
{
	int me = (int)(intptr_t)arg;
	lock_clients(the, me, 0, the->seed * 31u + (unsigned)me);
	return NULL;
}

static void *pclient_main(void *arg)
{
	int me = (int)(intptr_t)arg;
	lock_clients(the, me, 1, the->seed * 37u + (unsigned)me);
	return NULL;
}

/* 1 when process pid has a child: a baton worker that runs its task's command. */
static int has_child(pid_t pid)
{
	char path[64], buf[16];
	snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	size_t n = fread(buf, 1, sizeof buf, f);
	fclose(f);
	return n > 0;
}

/* An external worker: `baton worker --once` again and again, naming every node, its command
 * stamping its task's runs; one still waiting for a task after WORKER_CAP is stopped
 * (SIGTERM) and started again, so that it names the nodes' current ports. One that runs its
 * task's command is left to finish it (up to COMMAND_CAP): stopped, its attempt would fail
 * for nothing, and on a loaded machine, where a command takes seconds to start, the attempts
 * of the workflows, one after another on one resource, would hardly ever complete. */
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
			      WRESOURCE, "--ttl", "6s", "--once", "--", t->python, "-c",
			      task_stamper, t->dir, (char *)NULL);
			_exit(127);
		}
		if (pid < 0)
			break;
		pthread_mutex_lock(&t->mu);
		t->child[me] = pid;
		pthread_mutex_unlock(&t->mu);
		int status = 0, stopped = 0;
		int64_t begun = mono(), cap = begun + WORKER_CAP;
		while (waitpid(pid, &status, WNOHANG) == 0) {
			int64_t now = mono();
			int due = now > cap && (!has_child(pid) || now > begun + COMMAND_CAP);
			if (!stopped && (due || atomic_load(&t->stop))) {
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

/* The cluster's PostgreSQL for the random faults: a primary and a standby that every commit
 * waits for (synchronous_standby_names '*', on both, so that it holds after each
 * promotion), named to the harness as a multi-host URL (the nodes then name both, through
 * proxies). 0, or -1 with the servers stopped. */
static int start_pair(suite *t)
{
	if (!(t->pg = calloc(1, sizeof *t->pg)) || start_servers(t->pg) != 0)
		return -1;
	for (int i = 0; i < 2; i++)
		if (append_conf(&t->pg->n[i], "synchronous_standby_names = '*'\n") != 0 ||
		    node_sql(&t->pg->n[i], "SELECT pg_reload_conf()") != 0)
			return -1;
	int64_t deadline = mono() + 60000;
	while (node_value(&t->pg->n[0], "SELECT count(*) FROM pg_stat_replication"
					" WHERE sync_state = 'sync'") != 1)
		if (mono() > deadline || (hs_pause_ms(50), 0))
			return -1;
	char url[256];
	snprintf(url, sizeof url,
		 "postgresql://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres"
		 "?target_session_attrs=read-write",
		 t->pg->n[0].port, t->pg->n[1].port);
	return setenv("BATON_TEST_PG", url, 1);
}

static void stop_pair(suite *t)
{
	void *p = t->pg;
	if (p)
		pair_teardown(&p);
	t->pg = NULL;
}

/* The random form (make torture): LOCKFAULTS_ROUNDS faults, or as many as strike within
 * LOCKFAULTS_MINUTES minutes of faults, whichever ends first (either alone bounds it); else
 * the short form, each fault once. Either out parameter may be NULL. */
static bool random_form(int *rounds, int *minutes)
{
	const char *r = getenv("LOCKFAULTS_ROUNDS");
	const char *m = getenv("LOCKFAULTS_MINUTES");
	int nr = r && *r ? atoi(r) : 0, nm = m && *m ? atoi(m) : 0;
	if (rounds)
		*rounds = nr > 0 ? nr : 0;
	if (minutes)
		*minutes = nm > 0 ? nm : 0;
	return nr > 0 || nm > 0;
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
	if (hs_store_is_pg() && random_form(NULL, NULL) && start_pair(t) != 0) {
		fprintf(stderr, "lockfaults: the primary and its standby did not start\n");
		stop_pair(t);
		rmdir(t->dir);
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
	for (int i = 0; i < ALL_CLIENTS; i++)
		if (t->child[i] > 0)
			kill(t->child[i], SIGTERM);
	pthread_mutex_unlock(&t->mu);
	for (int i = 0; i < t->started; i++)
		pthread_join(t->clients[i], NULL);
	for (int i = 0; i < NODES; i++)
		hs_proxy_close(t->cpx[i]);
	int rc = cl_close(&t->cl);
	hs_faketime_env(0);
	stop_pair(t);
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

/* The commands' interpreter: python3's own sys.executable, so that a version manager's shim
 * (pyenv's is a chain of shell scripts, seconds on a loaded machine) does not run before
 * every command; "python3" when it cannot be asked. */
static void find_python(suite *t)
{
	snprintf(t->python, sizeof t->python, "python3");
	FILE *p = popen("python3 -c 'import sys; print(sys.executable)'", "r");
	if (!p)
		return;
	char line[PATH_MAX];
	if (fgets(line, sizeof line, p) && line[0] == '/') {
		line[strcspn(line, "\n")] = 0;
		snprintf(t->python, sizeof t->python, "%s", line);
	}
	pclose(p);
	print_message("lockfaults: commands run %s\n", t->python);
}

/* The node to strike: most often the one that drives the resource. */
static int target(suite *t, unsigned *rnd)
{
	int who = owner(t);
	return who >= 0 && rand_r(rnd) % 4 ? who : (int)(rand_r(rnd) % NODES);
}

/* The clients' fault f (F_CLIENT ...): for a few seconds, STRIKE_SHARE percent of the
 * requests through every client proxy are struck by it, and for longer until one was (all
 * the clients may be waiting on requests sent before; each sends again within its --wait). */
static void strike_clients(suite *t, enum fault f, unsigned *rnd)
{
	int ms = 3000 + (int)(rand_r(rnd) % 2000), before = 0, now = 0;
	enum hs_fault kind = (enum hs_fault)(f - F_CLIENT);
	print_message("lockfaults: clients' %s for %d ms\n", fault_name[f], ms);
	for (int k = 0; k < NODES; k++) {
		before += hs_proxy_struck(t->cpx[k], kind);
		hs_proxy_strike(t->cpx[k], 1u << kind, STRIKE_SHARE, (unsigned)rand_r(rnd));
	}
	int64_t start = mono(), end = start + ms, cap = start + 2 * LIVE_MS;
	for (now = before; mono() < end || (now == before && mono() < cap);) {
		hs_pause_ms(100);
		now = 0;
		for (int k = 0; k < NODES; k++)
			now += hs_proxy_struck(t->cpx[k], kind);
	}
	for (int k = 0; k < NODES; k++)
		hs_proxy_strike(t->cpx[k], 0, 0, 0);
	print_message("lockfaults: %d requests struck in %lld ms\n", now - before,
		      (long long)(mono() - start));
	if (now == before)
		fail_msg("the clients' %s struck no request in %lld ms (seed %u)", fault_name[f],
			 (long long)(mono() - start), t->seed);
}

/* The standby is promoted while the primary crashes or stops, and the old primary is made
 * the new standby (a fresh pg_basebackup -R from the new primary), so that the next failover
 * goes the other way. Until it streams again, every commit waits for it. */
static void failover(suite *t, unsigned *rnd)
{
	pg_node *old = &t->pg->n[t->primary], *now = &t->pg->n[1 - t->primary];
	int crash = rand_r(rnd) % 2;
	int64_t start = mono();
	hs_faketime_env(0); /* PostgreSQL runs on the real clock */
	if (crash)
		node_crash(old);
	else
		node_stop(old);
	node_promote(now);
	int64_t promoted = mono();
	assert_int_equal(shell("rm -rf %s/data", old->dir), 0);
	assert_int_equal(shell("%s%s/pg_basebackup -h 127.0.0.1 -p %d -U postgres -D %s/data -R"
			       " -X stream -c fast",
			       as_owner(), pg_bin(), now->port, old->dir),
			 0);
	assert_int_equal(append_conf(old, "unix_socket_directories = '%s'\n", old->dir), 0);
	assert_int_equal(node_start(old), 0);
	hs_faketime_env(1);
	t->primary = 1 - t->primary;
	t->failovers++;
	while (node_value(now, "SELECT count(*) FROM pg_stat_replication"
			       " WHERE sync_state = 'sync'") != 1) {
		if (mono() > promoted + LIVE_MS)
			fail_msg("the rebuilt standby did not stream within %d ms (seed %u)",
				 LIVE_MS, t->seed);
		hs_pause_ms(50);
	}
	print_message("lockfaults: failover %d: server %d %s, server %d promoted in %lld ms,"
		      " server %d its synchronous standby again %lld ms later\n",
		      t->failovers, (int)(old - t->pg->n), crash ? "crashed" : "stopped",
		      (int)(now - t->pg->n), (long long)(promoted - start), (int)(old - t->pg->n),
		      (long long)(mono() - promoted));
}

static void strike(suite *t, enum fault f, unsigned *rnd)
{
	if (f == F_FAILOVER && !t->pg)
		return; /* the short form runs on one server */
	t->faults++;
	if (f >= F_CLIENT) {
		strike_clients(t, f, rnd);
		return;
	}
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
		hs_proxy_cut(t->cpx[k]); /* its clients are refused, as by the node itself */
		pthread_mutex_lock(&t->mu);
		hs_kill(t->cl.node[k]);
		pthread_mutex_unlock(&t->mu);
		hs_pause_ms(ms);
		pthread_mutex_lock(&t->mu);
		int rc = hs_start(t->cl.node[k]);
		pthread_mutex_unlock(&t->mu);
		assert_int_equal(rc, 0);
		hs_proxy_retarget(t->cpx[k], hs_port(t->cl.node[k])); /* it listens anew */
		assert_int_equal(hs_proxy_heal(t->cpx[k]), 0);
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
	case F_FAILOVER:
		print_message("lockfaults: %s\n", fault_name[f]);
		failover(t, rnd);
		break;
	default: {
		print_message("lockfaults: %s\n", fault_name[f]);
		hs_faketime_env(0); /* PostgreSQL runs on the real clock */
		int restarted = t->pg ? shell("sh %s restart %s >/dev/null", pg_script(),
					      t->pg->n[t->primary].dir)
				      : hs_pg_restart();
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
	int nr = 0, total = atomic_load(&t->mutex.runs);
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
		      atomic_load(&t->mutex.completed));
	for (int c = 0; c < 256; c++)
		if (atomic_load(&t->mutex.exits[c]))
			print_message(" %d x%d", c, atomic_load(&t->mutex.exits[c]));
	print_message("\n");
}

/* ---- the permits ---------------------------------------------------------------------- */

/* A name for the permits' resource on RESOURCE's partition: the same node drives both, so
 * the faults aimed at RESOURCE's driver strike both. */
static void pick_presource(suite *t)
{
	for (int k = 0;; k++) {
		snprintf(t->presource, sizeof t->presource, "lockfaults-p%d", k);
		if (cl_part_of(t->presource) == cl_part_of(RESOURCE))
			return;
	}
}

/* One request through the first live node that answers, starting at node `first`; the
 * status (0: none answered), *out the JSON body (new reference) when out is not NULL. */
static long through_any(suite *t, int first, const hs_request *req, json_t **out)
{
	long st = 0;
	if (out)
		*out = NULL;
	pthread_mutex_lock(&t->mu);
	for (int k = 0; k < NODES && (st == 0 || st == 503); k++) {
		hs_server *s = t->cl.node[(first + k) % NODES];
		hs_response r;
		if (!s || !hs_running(s))
			continue;
		if (hs_send(s, req, &r) == 0) {
			st = r.status;
			if (out) {
				json_decref(*out);
				*out = json_incref(r.json);
			}
		}
		hs_response_fini(&r);
	}
	pthread_mutex_unlock(&t->mu);
	return st;
}

/* PUT /resources/{presource} {"limit": PLIMIT} through a node chosen by the seed (the node
 * that drives it, or one that passes it on). */
static void set_permits(suite *t)
{
	char path[64], body[32];
	snprintf(path, sizeof path, "/resources/%s", t->presource);
	snprintf(body, sizeof body, "{\"limit\": %d}", PLIMIT);
	hs_request req = {.method = "PUT",
			  .path = path,
			  .content_type = "application/json",
			  .body = body,
			  .body_len = strlen(body)};
	long st = 0;
	json_t *res = NULL;
	for (int64_t end = mono() + 60000; st != 200 && mono() < end;) {
		json_decref(res);
		st = through_any(t, (int)(t->seed % NODES), &req, &res);
		if (st != 200)
			hs_pause_ms(200);
	}
	if (st != 200)
		fail_msg("PUT %s %s: HTTP %ld (seed %u)", path, body, st, t->seed);
	assert_int_equal(hs_int(res, "limit"), PLIMIT);
	json_decref(res);
	print_message("lockfaults: %s has %d permits\n", t->presource, PLIMIT);
}

typedef struct prun {
	long long token, slot; /* slot -1: BATON_SLOT was empty */
	int excl;	       /* the command asked for all the permits */
	char lease[128];
	long long first, last; /* ns, CLOCK_MONOTONIC */
	int n;
} prun;

static int by_pfirst(const void *a, const void *b)
{
	const prun *x = a, *y = b;
	return (x->first > y->first) - (x->first < y->first);
}

/* Reads the first line of a permit run ("token T slot S|- exclusive|plain LEASE"). */
static void read_prun_head(const suite *t, int i, const char *line, prun *r)
{
	char slot[32], kind[16];
	if (sscanf(line, "token %lld slot %31s %15s %127s", &r->token, slot, kind, r->lease) != 4)
		fail_msg("prun-%d: a first line of another shape: %s (seed %u)", i, line, t->seed);
	r->excl = strcmp(kind, "exclusive") == 0;
	r->slot = -1;
	if (strcmp(slot, "-") != 0) {
		char *end;
		r->slot = strtoll(slot, &end, 10);
		if (end == slot || *end || r->slot < 0)
			fail_msg("prun-%d: BATON_SLOT \"%s\" (seed %u)", i, slot, t->seed);
	}
	if (r->excl ? r->slot != -1 : r->slot >= PLIMIT || r->slot < 0)
		fail_msg("prun-%d: token %lld, %s, ran with BATON_SLOT \"%s\" (seed %u)", i,
			 r->token, kind, slot, t->seed);
}

/* Reads every permit run's file; returns how many ran (stamped at least once). */
static int read_pruns(const suite *t, prun *out)
{
	int nr = 0, total = atomic_load(&t->permits.runs);
	for (int i = 0; i < total && i < MAX_RUNS; i++) {
		char file[PATH_MAX + 32], line[256];
		snprintf(file, sizeof file, "%s/prun-%d", t->dir, i);
		FILE *f = fopen(file, "r");
		if (!f)
			continue; /* never granted, or its command never started */
		prun r = {0};
		if (fgets(line, sizeof line, f)) {
			long long v;
			read_prun_head(t, i, line, &r);
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

/* Runs at once: never more than PLIMIT, an exclusive one alone, each with its own slot.
 * Returns the most that ran at once. */
static int check_overlaps(const suite *t, const prun *runs, int n)
{
	int active[PLIMIT + 1], na = 0, most = 0;
	for (int i = 0; i < n; i++) {
		const prun *r = &runs[i];
		int k = 0;
		for (int j = 0; j < na; j++) /* those still running when r started */
			if (runs[active[j]].last >= r->first)
				active[k++] = active[j];
		na = k;
		for (int j = 0; j < na; j++) {
			const prun *o = &runs[active[j]];
			if (r->excl || o->excl)
				fail_msg(
				    "an exclusive run overlaps another: token %lld (%s) ran from"
				    " %lld, before token %lld (%s) ended at %lld (ns,"
				    " CLOCK_MONOTONIC; seed %u)",
				    r->token, r->excl ? "exclusive" : "plain", r->first, o->token,
				    o->excl ? "exclusive" : "plain", o->last, t->seed);
			if (r->slot == o->slot)
				fail_msg("slot %lld ran twice at once: token %lld from %lld, before"
					 " token %lld ended at %lld (seed %u)",
					 r->slot, r->token, r->first, o->token, o->last, t->seed);
		}
		if (na + 1 > PLIMIT)
			fail_msg("%d runs at once on %d permits: token %lld started at %lld while"
				 " token %lld and %d others ran (seed %u)",
				 na + 1, PLIMIT, r->token, r->first, runs[active[0]].token, na - 1,
				 t->seed);
		active[na++] = i;
		most = na > most ? na : most;
	}
	return most;
}

/*
 * Tokens against the order the runs started (runs sorted by first stamp). Grants side by
 * side may start their commands in either order; where the grants were ordered, the runs
 * are too: a slot is granted again only after its holder left (its run ended), and an
 * exclusive grant comes after every grant before it ended and before any grant after it.
 */
static void check_token_order(const suite *t, const prun *runs, int n)
{
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++) { /* runs[i] started before runs[j] */
			const prun *a = &runs[i], *b = &runs[j];
			int ordered = a->excl || b->excl || a->slot == b->slot;
			if (a->token == b->token || (ordered && a->token > b->token))
				fail_msg(
				    "token %lld (%s, slot %lld) ran from %lld, after token %lld"
				    " (%s, slot %lld) from %lld (seed %u)",
				    b->token, b->excl ? "exclusive" : "plain", b->slot, b->first,
				    a->token, a->excl ? "exclusive" : "plain", a->slot, a->first,
				    t->seed);
		}
}

/* GET /resources/{presource}/events, page after page, through any live node (new
 * reference: the events in seq order). */
static json_t *permit_history(suite *t)
{
	json_t *all = json_array();
	long long after = 0;
	for (;;) {
		char path[128];
		snprintf(path, sizeof path, "/resources/%s/events?after=%lld&limit=10000",
			 t->presource, after);
		json_t *page = NULL;
		long st = 0;
		for (int64_t end = mono() + 30000; st != 200 && mono() < end;) {
			json_decref(page);
			st = through_any(t, 0, &(hs_request){.method = "GET", .path = path}, &page);
			if (st != 200)
				hs_pause_ms(200);
		}
		if (st != 200)
			fail_msg("GET %s: HTTP %ld (seed %u)", path, st, t->seed);
		json_array_extend(all, json_object_get(page, "events"));
		const json_t *next = json_object_get(page, "next_after");
		after = json_integer_value(next);
		int more = json_is_integer(next);
		json_decref(page);
		if (!more)
			return all;
	}
}

/* The resource's holders, as its history shows them at one moment. */
typedef struct holders {
	struct {
		const char *id;
		long long token, slot;
		int excl;
	} h[MAX_HOLDERS];
	int n;
} holders;

static int holder_at(const holders *hs, const char *id)
{
	for (int i = 0; i < hs->n; i++)
		if (strcmp(hs->h[i].id, id) == 0)
			return i;
	return -1;
}

/* A grant of the history (event ev, seq) to id: within the permits, and a plain one to the
 * lowest free slot; then id holds. */
static void grant(const suite *t, holders *hs, const json_t *ev, const char *id)
{
	long long seq = hs_int(ev, "seq"), token = hs_int(ev, "fencing_token");
	const json_t *js = json_object_get(ev, "slot");
	long long slot = json_is_integer(js) ? json_integer_value(js) : -1;
	int excl = json_is_true(json_object_get(ev, "exclusive")), plain = 0, alone = -1;
	unsigned used = 0;
	for (int i = 0; i < hs->n; i++) {
		if (hs->h[i].excl)
			alone = i;
		else if (plain++, hs->h[i].slot >= 0 && hs->h[i].slot < 32)
			used |= 1u << hs->h[i].slot;
	}
	if ((excl && hs->n) || alone >= 0 || plain >= PLIMIT)
		fail_msg("event %lld grants %s (token %lld, %s) while %d hold (%d plain%s; token"
			 " %lld first) (seed %u)",
			 seq, id, token, excl ? "exclusive" : "plain", hs->n, plain,
			 alone >= 0 ? ", one exclusive" : "", hs->h[0].token, t->seed);
	long long lowest = 0;
	while (used & (1u << lowest))
		lowest++;
	if (excl ? slot != -1 : slot != lowest)
		fail_msg("event %lld grants %s (token %lld, %s) slot %lld; the lowest free is %lld"
			 " (seed %u)",
			 seq, id, token, excl ? "exclusive" : "plain", slot, excl ? -1 : lowest,
			 t->seed);
	if (hs->n == MAX_HOLDERS)
		fail_msg("more than %d holders (seed %u)", MAX_HOLDERS, t->seed);
	hs->h[hs->n].id = id;
	hs->h[hs->n].token = token;
	hs->h[hs->n].slot = slot;
	hs->h[hs->n].excl = excl;
	hs->n++;
}

/*
 * The history in seq order: tokens strictly increase from grant to grant; each grant goes
 * to the first request still in the queue (nobody overtaken: every request queued before
 * it was granted or left the queue before), within the permits (grant). Returns what was
 * granted, by lease id: {"token", "slot", "exclusive"} (new reference).
 */
static json_t *check_history(const suite *t, const json_t *events, int *grants)
{
	json_t *granted = json_object(), *queue = json_array(); /* [id, seq of its request] */
	holders hs = {.n = 0};
	long long last_token = 0;
	size_t i;
	const json_t *ev;
	json_array_foreach(events, i, ev)
	{
		const char *type = hs_str(ev, "type"), *id = hs_str(ev, "workflow_id");
		long long seq = hs_int(ev, "seq");
		size_t at = SIZE_MAX, k;
		const json_t *q;
		json_array_foreach(queue, k, q)
		{
			if (at == SIZE_MAX &&
			    strcmp(json_string_value(json_array_get(q, 0)), id) == 0)
				at = k;
		}
		if (strcmp(type, "lock_requested") == 0) {
			if (at != SIZE_MAX || holder_at(&hs, id) >= 0)
				fail_msg("event %lld: %s requested again while %s (seed %u)", seq,
					 id, at != SIZE_MAX ? "it waited" : "it held", t->seed);
			json_array_append_new(queue, json_pack("[s, I]", id, (json_int_t)seq));
		} else if (strcmp(type, "lock_acquired") == 0) {
			long long token = hs_int(ev, "fencing_token");
			if (token <= last_token)
				fail_msg("event %lld grants token %lld after token %lld (seed %u)",
					 seq, token, last_token, t->seed);
			last_token = token;
			if (at == SIZE_MAX)
				fail_msg("event %lld grants %s, which was not queued (seed %u)",
					 seq, id, t->seed);
			if (at > 0) {
				const json_t *head = json_array_get(queue, 0);
				fail_msg(
				    "event %lld grants %s, queued at event %lld, while %s, queued"
				    " before it at event %lld, still waited (seed %u)",
				    seq, id,
				    (long long)json_integer_value(
					json_array_get(json_array_get(queue, at), 1)),
				    json_string_value(json_array_get(head, 0)),
				    (long long)json_integer_value(json_array_get(head, 1)),
				    t->seed);
			}
			json_array_remove(queue, 0);
			grant(t, &hs, ev, id);
			json_object_set_new(granted, id,
					    json_pack("{s:I, s:I, s:b}", "token", (json_int_t)token,
						      "slot", (json_int_t)hs.h[hs.n - 1].slot,
						      "exclusive", hs.h[hs.n - 1].excl));
			(*grants)++;
		} else { /* lock_released, lease_expired, workflow_cancelled: it holds no more,
			  * or it left the queue */
			int h = holder_at(&hs, id);
			if (h >= 0)
				hs.h[h] = hs.h[--hs.n];
			if (at != SIZE_MAX)
				json_array_remove(queue, at);
		}
	}
	json_decref(queue);
	return granted;
}

/* The permits' runs and history (the checks of the file's opening comment). */
static void check_permits(suite *t)
{
	static prun runs[MAX_RUNS];
	int n = read_pruns(t, runs), grants = 0, excl = 0;
	qsort(runs, (size_t)n, sizeof *runs, by_pfirst);
	int most = check_overlaps(t, runs, n);
	check_token_order(t, runs, n);

	json_t *events = permit_history(t);
	json_t *granted = check_history(t, events, &grants);
	for (int i = 0; i < n; i++) {
		const prun *r = &runs[i];
		const json_t *g = json_object_get(granted, r->lease);
		excl += r->excl;
		if (!g)
			fail_msg("token %lld ran under lease %s, which the history never granted"
				 " (seed %u)",
				 r->token, r->lease, t->seed);
		if (hs_int(g, "token") != r->token || hs_int(g, "slot") != r->slot ||
		    json_is_true(json_object_get(g, "exclusive")) != r->excl)
			fail_msg("%s ran with token %lld, slot %lld, %s; its grant says token %lld,"
				 " slot %lld, %s (seed %u)",
				 r->lease, r->token, r->slot, r->excl ? "exclusive" : "plain",
				 (long long)hs_int(g, "token"), (long long)hs_int(g, "slot"),
				 json_is_true(json_object_get(g, "exclusive")) ? "exclusive"
									       : "plain",
				 t->seed);
	}
	json_decref(granted);
	json_decref(events);

	char path[64];
	json_t *res = NULL;
	snprintf(path, sizeof path, "/resources/%s", t->presource);
	long st = through_any(t, 0, &(hs_request){.method = "GET", .path = path}, &res);
	if (st != 200 || hs_int(res, "limit") != PLIMIT)
		fail_msg("GET %s: HTTP %ld, limit %lld after the faults, not %d (seed %u)", path,
			 st, res ? (long long)hs_int(res, "limit") : -1, PLIMIT, t->seed);
	json_decref(res);
	print_message("lockfaults: %s: %d runs checked (%d exclusive), at most %d at once, %d"
		      " grants in its history, %d commands completed; exits:",
		      t->presource, n, excl, most, grants, atomic_load(&t->permits.completed));
	for (int c = 0; c < 256; c++)
		if (atomic_load(&t->permits.exits[c]))
			print_message(" %d x%d", c, atomic_load(&t->permits.exits[c]));
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

static bool task_ended(suite *t, int k)
{
	json_t *wf = task_workflow(t, k);
	const char *st = json_string_value(json_object_get(wf, "status"));
	bool ended = st && (strcmp(st, "completed") == 0 || strcmp(st, "failed") == 0);
	json_decref(wf);
	return ended;
}

static bool tasks_ended(void *arg)
{
	suite *t = arg;
	for (int k = 0; k < t->ntasks; k++)
		if (!task_ended(t, k))
			return false;
	return true;
}

/* Submits up to n workflows, as long as fewer than TASKS_OPEN are unfinished: they take
 * turns on one resource, so in a long run (make torture) the backlog would otherwise outgrow
 * what two workers can do in the 2 * LIVE_MS after the last fault, and the check would
 * measure throughput instead of liveness. */
static void submit_some_tasks(suite *t, int n)
{
	while (t->open_from < t->ntasks && task_ended(t, t->open_from))
		t->open_from++;
	int open = 0;
	for (int k = t->open_from; k < t->ntasks; k++)
		open += !task_ended(t, k);
	if (n > TASKS_OPEN - open)
		n = TASKS_OPEN - open;
	if (n > 0)
		submit_tasks(t, n);
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

/* ---- liveness after the faults ------------------------------------------------------ */

/* Asks node i, directly, for a lease on `resource` (no wait); the status, and on a grant
 * the lease's id in `lease`, else the answer's detail in `detail`. */
static long ask_fresh(suite *t, int i, const char *resource, char *lease, char *detail, size_t n)
{
	char path[96], body[160];
	snprintf(path, sizeof path, "/resources/%s/leases", resource);
	snprintf(body, sizeof body,
		 "{\"holder\": \"fresh\", \"ttl_ms\": 10000, \"request_id\": \"%s-%d\"}", resource,
		 i);
	hs_request req = {.method = "POST",
			  .path = path,
			  .content_type = "application/json",
			  .body = body,
			  .body_len = strlen(body)};
	hs_response r;
	long st = 0;
	detail[0] = 0;
	pthread_mutex_lock(&t->mu);
	if (hs_send(t->cl.node[i], &req, &r) == 0) {
		st = r.status;
		const char *state = json_string_value(json_object_get(r.json, "state"));
		const char *id = json_string_value(json_object_get(r.json, "id"));
		const char *why = json_string_value(json_object_get(r.json, "detail"));
		if ((st == 200 || st == 201) && state && strcmp(state, "held") == 0 && id)
			snprintf(lease, n, "%s", id);
		else
			snprintf(detail, n, "%s", why ? why : state ? state : "");
	} else {
		snprintf(detail, n, "no answer");
	}
	hs_response_fini(&r);
	pthread_mutex_unlock(&t->mu);
	return st;
}

/*
 * Once the faults are over: every node grants a lease on resources nobody used yet, one in
 * a partition of each node (as the database says when the check starts), so that each node
 * is asked both for what it drives and for what it passes on, within FRESH_MS of the first
 * request. Returns 1, or 0 after writing into why which nodes did not and their last
 * answers. The leases granted are released.
 */
static int fresh_grants(suite *t, char *why, size_t size)
{
	int owners[CL_PARTS];
	for (int p = 0; p < CL_PARTS; p++)
		owners[p] = -3; /* not read yet */
	char name[NODES][NODES][48], lease[NODES][NODES][128], detail[NODES][NODES][128];
	long last[NODES][NODES];
	int pending = 0, asked = 0;
	for (int i = 0; i < NODES; i++)
		for (int j = 0; j < NODES; j++) {
			for (int k = 0; k < 10000; k++) { /* a name in a partition of node j */
				snprintf(name[i][j], sizeof name[i][j], "fresh-%d-%d-%d", i, j, k);
				int p = cl_part_of(name[i][j]);
				if (owners[p] == -3)
					owners[p] = cl_part_owner(&t->cl, p);
				if (owners[p] == j)
					break;
			}
			lease[i][j][0] = 0;
			last[i][j] = 0;
			pending++;
		}
	int64_t deadline = mono() + FRESH_MS;
	while (pending && mono() < deadline) {
		for (int i = 0; i < NODES; i++)
			for (int j = 0; j < NODES; j++) {
				if (lease[i][j][0])
					continue;
				asked++;
				last[i][j] = ask_fresh(t, i, name[i][j], lease[i][j], detail[i][j],
						       sizeof detail[i][j]);
				if (lease[i][j][0])
					pending--;
			}
		if (pending)
			hs_pause_ms(100);
	}
	size_t len = 0;
	for (int i = 0; i < NODES; i++)
		for (int j = 0; j < NODES; j++) {
			if (lease[i][j][0]) {
				char path[160];
				hs_response r;
				snprintf(path, sizeof path, "/leases/%s", lease[i][j]);
				pthread_mutex_lock(&t->mu);
				if (hs_send(t->cl.node[i],
					    &(hs_request){.method = "DELETE", .path = path},
					    &r) == 0)
					hs_response_fini(&r);
				pthread_mutex_unlock(&t->mu);
			} else if (len < size) {
				len += (size_t)snprintf(
				    why + len, size - len,
				    "%snode%d granted no lease on %s (a partition of node%d when"
				    " asked) within %d ms: HTTP %ld \"%s\"",
				    len ? "; " : "", i, name[i][j], j, FRESH_MS, last[i][j],
				    detail[i][j]);
			}
		}
	print_message("lockfaults: fresh resources: %d of %d granted, one per node and driver,"
		      " in %d requests\n",
		      NODES * NODES - pending, NODES * NODES, asked);
	return pending == 0;
}

static void test_lock_under_faults(void **state)
{
	if (!hs_store_is_pg())
		skip(); /* a cluster shares one PostgreSQL database */
	suite *t = *state;
	const char *s = getenv("LOCKFAULTS_SEED");
	t->seed =
	    s && *s ? (unsigned)strtoul(s, NULL, 10) : (unsigned)time(NULL) ^ (unsigned)getpid();
	int rounds, minutes;
	bool random_faults = random_form(&rounds, &minutes);
	print_message("lockfaults: seed %u (LOCKFAULTS_SEED=%u replays it), %s\n", t->seed, t->seed,
		      random_faults ? "random faults" : "each fault once");
	unsigned rnd = t->seed;
	find_python(t);
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
	for (int i = 0; i < NODES; i++) /* the clients' network to each node */
		assert_non_null(t->cpx[i] = hs_proxy_open(hs_port(t->cl.node[i])));
	pick_presource(t);
	set_permits(t);
	the = t;
	for (int i = 0; i < ALL_CLIENTS; i++) {
		void *(*fn)(void *) = i < CLIENTS	      ? client_main
				      : i < CLIENTS + WORKERS ? worker_main
							      : pclient_main;
		assert_int_equal(pthread_create(&t->clients[i], NULL, fn, (void *)(intptr_t)i), 0);
		t->started++;
	}
	enum fault order[F_KINDS];
	for (int i = 0; i < F_KINDS; i++)
		order[i] = (enum fault)i;
	for (int i = F_KINDS - 1; i > 0; i--) { /* a seeded shuffle */
		int j = (int)(rand_r(&rnd) % (unsigned)(i + 1));
		enum fault x = order[i];
		order[i] = order[j];
		order[j] = x;
	}
	int total = random_faults ? rounds : F_KINDS;
	int64_t first = mono();
	for (int i = 0; total == 0 || i < total; i++) {
		if (minutes && mono() - first >= (int64_t)minutes * 60000)
			break;
		if (!random_faults && order[i] == F_FAILOVER && !t->pg)
			continue; /* the short form has no standby to promote */
		hs_pause_ms(2000 + (int)(rand_r(&rnd) % 2000)); /* traffic between faults */
		enum fault f = random_faults ? (enum fault)(rand_r(&rnd) % F_KINDS) : order[i];
		if (f == F_CLOCK && !clocks)
			continue;
		submit_some_tasks(t, TASKS / F_KINDS + 1);
		strike(t, f, &rnd);
	}
	int64_t fault_end = mono();
	/* Live: every node grants a fresh resource, whoever drives it; a command completes
	 * after the last fault, on each resource. */
	char fresh_why[2048];
	int fresh = fresh_grants(t, fresh_why, sizeof fresh_why);
	int before = atomic_load(&t->mutex.completed), pbefore = atomic_load(&t->permits.completed);
	int64_t deadline = mono() + LIVE_MS;
	while ((atomic_load(&t->mutex.completed) <= before ||
		atomic_load(&t->permits.completed) <= pbefore) &&
	       mono() < deadline)
		hs_pause_ms(100);
	int live = atomic_load(&t->mutex.completed) > before;
	int plive = atomic_load(&t->permits.completed) > pbefore;
	bool tasks_live = hs_wait_until(tasks_ended, t, 2 * LIVE_MS);
	atomic_store(&t->stop, 1);
	for (int i = 0; i < t->started; i++)
		pthread_join(t->clients[i], NULL);
	t->started = 0;
	print_message(
	    "lockfaults: %d faults struck in %.1f minutes; requests struck in the clients'"
	    " network:",
	    t->faults, (double)(fault_end - first) / 60000.0);
	for (int f = 0; f < HS_FAULTS; f++) {
		int n = 0;
		for (int k = 0; k < NODES; k++)
			n += hs_proxy_struck(t->cpx[k], (enum hs_fault)f);
		print_message(" %s x%d", fault_name[F_CLIENT + f], n);
	}
	print_message("\n");
	check_runs(t);
	check_tasks(t);
	check_permits(t);
	if (!fresh)
		fail_msg("%s (seed %u)", fresh_why, t->seed);
	if (!live)
		fail_msg("no command completed within %d ms after the last fault (seed %u)",
			 LIVE_MS, t->seed);
	if (!plive)
		fail_msg("no command on %s completed within %d ms after the last fault (seed %u)",
			 t->presource, LIVE_MS, t->seed);
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
