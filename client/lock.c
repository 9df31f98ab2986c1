/*
 * lock.c - `baton lock [--exclusive] RESOURCE [--ttl 15s] [--wait 60s] [--holder NAME] --
 * COMMAND ...`: runs a command while holding a lease on RESOURCE (POST
 * /resources/{name}/leases): one of the resource's permits, or all of them with
 * --exclusive (the request says "exclusive": true).
 *
 * Design. The command runs in its own process group, with BATON_FENCING_TOKEN,
 * BATON_LEASE_ID, BATON_RESOURCE and BATON_SLOT (the permit's slot, 0 to limit - 1; empty
 * for an exclusive lease, which has none) in its environment; every signal this process sends
 * goes to the whole group (killing only `sh -c` would leave its children running). This
 * process renews the lease every third of the ttl and decides that the lease is lost by
 * its own monotonic clock, which counts the lease from when each request was *sent*: the
 * acquire that was granted, then every successful renewal. The server counts the ttl from
 * the grant or from when it received the renewal, both later, so an answer held back on
 * the way (a slow server, a slow network) leaves baton lock believing it has less time,
 * never more; a grant that took longer than a third of the ttl to come back is renewed
 * before the command starts. When a renewal is refused, or when none succeeded for
 * ttl - margin since the last successful send, the command gets SIGTERM, then SIGKILL
 * after a grace period that still ends before the server can expire the lease and grant
 * the resource to the next waiter. consul lock kills late, once the server has confirmed
 * the loss; here the command is gone before anybody else can hold the resource, as long
 * as the clocks of both machines run at about the same rate.
 *
 * The lease is released only once nothing of the command's process group is left: a
 * background child (`sh -c 'job & exit 0'`) keeps the lease held, and renewed, until it
 * ends too. baton lock is the group's subreaper (prctl PR_SET_CHILD_SUBREAPER): the
 * children the command leaves behind become its own, and it reaps them, so the group's
 * end (kill(-pgid, 0) answering ESRCH) never waits for an init that does not reap, as in a
 * container without one, where zombies would stay in the group forever. A process that
 * leaves the group (setsid, a daemon) is neither waited for nor stopped.
 *
 * A --wait longer than the server's limit of one request's wait (300 s) keeps its place
 * in the queue: the next acquire request, with the same request_id, goes out on a second
 * connection a tenth of that limit before the previous one's wait ends, and the server
 * moves the waiter over to it (answering the previous one 409); sent after the previous
 * wait had ended, it would find the request gone from the queue and start at its back.
 *
 * With several servers (--server URL,URL,...), http.c moves each request on to the next
 * when one refuses, times out or answers 503; the acquire is sent again with the same
 * request_id, so that a server that did receive it (a cluster shares one queue) never
 * gives it a second place; each renewal gives every server its share of the time left
 * before the deadline, so that a frozen server leaves the next one time to answer. Until
 * some server has answered a request, an acquire that no server answers is given up after
 * --connect-timeout (a wrong --server, exit 3, one line naming each server and why);
 * afterwards it is asked again until --wait runs out (a failover may be under way).
 *
 * SIGINT, SIGTERM and SIGHUP while the acquire waits end its requests in flight (http.c's
 * abort flag) and release the lease of its request_id, which takes the waiter out of the
 * queue, or ends a grant that raced the signal; nothing runs, and baton lock exits 128 + the
 * signal. Once the command runs, SIGINT, SIGTERM and SIGHUP go to the command's group first (shells
 * make background jobs ignore SIGINT); once the command has ended, whatever is left of
 * its group gets SIGTERM, then SIGKILL after the grace period, and a second such signal
 * does that to the whole group at once. A lost lease ends the whole group the same way.
 * Either way the lease is released once nothing of the group is left.
 *
 * In a terminal (stdin one, and baton lock in its foreground), the command's group is
 * the terminal's foreground group while it runs, as a shell makes a foreground job's:
 * it reads the terminal, and Ctrl-C and Ctrl-\ reach it, not baton lock, which then
 * sees it end as from any signal. The terminal comes back to baton lock when the command
 * ends. Ctrl-Z stops the command (waitpid WUNTRACED); baton lock then takes the terminal
 * back and stops itself with SIGTSTP, so that the user's shell sees its job stopped and
 * gives its prompt back, and `fg` (SIGCONT to baton lock's group) continues it: it gives
 * the terminal to the command again and continues the command's group. Merely renewing
 * until somebody continued the command would leave the shell waiting on a job that it
 * does not see stopped, with no prompt to type `fg` at. A stopped process cannot renew,
 * so a keeper, a child in baton lock's own group with its own connection and the lease in
 * shared memory, renews it meanwhile; a lease lost then ends the command's group and
 * continues baton lock, which exits 76. Signals sent to a stopped group are followed by
 * SIGCONT, or they would wait for its continuation. When nobody could continue baton lock
 * (its group orphaned: no shell above it in its session), it does not stop but keeps
 * renewing, and the terminal is the command's again once somebody continues it.
 *
 * Exit status: the
 * command's own (128 + N when signal N ended it; its background children's do not
 * count), EXIT_NOT_ACQUIRED when the lease was not granted within --wait or ran out
 * before the command could start (nothing was run), EXIT_LEASE_LOST when the lease was
 * lost while the command or its group ran.
 */
#include "client.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_WAIT_PER_REQUEST_MS 300000 /* the server's limit of wait_ms */

/* How long one acquire request waits at most: the server's limit, or less when
 * BATON_LOCK_REQUEST_WAIT_MS says so (100 to 300000; the tests' seam for waits longer
 * than one request). */
static long long request_wait_cap(void)
{
	const char *v = getenv("BATON_LOCK_REQUEST_WAIT_MS");
	char *end;
	long long ms = v ? strtoll(v, &end, 10) : 0;
	if (!v || end == v || *end || ms < 100 || ms > MAX_WAIT_PER_REQUEST_MS)
		return MAX_WAIT_PER_REQUEST_MS;
	return ms;
}

static volatile sig_atomic_t got_signal;

/* The terminal on stdin when baton lock was started in its foreground; -1 without. */
static int tty = -1;

/* Makes pgid the terminal's foreground group. A background group may do so only with
 * SIGTTOU blocked (the kernel would stop it otherwise), as a shell does for its jobs. */
static void tty_give(pid_t pgid)
{
	if (tty < 0)
		return;
	sigset_t ttou, old;
	sigemptyset(&ttou);
	sigaddset(&ttou, SIGTTOU);
	pthread_sigmask(SIG_BLOCK, &ttou, &old);
	tcsetpgrp(tty, pgid);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* Takes the terminal back from group `from`, unless somebody else has it already (the
 * user's shell, after `bg`). */
static void tty_take_back(pid_t from)
{
	if (tty >= 0 && tcgetpgrp(tty) == from)
		tty_give(getpgrp());
}

/* Stored atomically: the acquire's threads read it too (http.c's abort callback). */
static void on_signal(int sig)
{
	__atomic_store_n(&got_signal, sig, __ATOMIC_RELAXED);
}

struct lock_opts {
	const char *resource, *holder;
	int exclusive; /* --exclusive: all of the resource's permits */
	long long ttl_ms, wait_ms;
	long long connect_ms; /* --connect-timeout: no server answered anything within it */
	char **command;
	char holder_buf[128];
};

static void default_holder(struct lock_opts *o)
{
	char host[64] = "host";
	gethostname(host, sizeof host - 1);
	for (char *p = host; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		      (*p >= '0' && *p <= '9') || *p == '.' || *p == '-' || *p == '_'))
			*p = '_';
	snprintf(o->holder_buf, sizeof o->holder_buf, "%s:%ld", host, (long)getpid());
	o->holder = o->holder_buf;
}

static int parse_args(int argc, char **argv, struct lock_opts *o)
{
	*o = (struct lock_opts){.ttl_ms = 15000, .wait_ms = 60000, .connect_ms = 5000};
	int i;
	for (i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
		const char *a = argv[i];
		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			usage(stdout);
			return EXIT_OK;
		}
		int ttl = strcmp(a, "--ttl") == 0, wait = strcmp(a, "--wait") == 0;
		int connect = strcmp(a, "--connect-timeout") == 0;
		if (strcmp(a, "--exclusive") == 0) {
			o->exclusive = 1;
		} else if (ttl || wait || connect || strcmp(a, "--holder") == 0) {
			if (i + 1 >= argc)
				return usage_error("lock: %s needs a value", a);
			const char *v = argv[++i];
			long long ms = 0, max = ttl ? MAX_TTL_MS : MAX_WAIT_MS;
			int bad = ttl || wait || connect ? parse_duration(v, max, &ms) : 0;
			if (bad == -1)
				return usage_error("lock: %s: not a duration: %s", a, v);
			if (bad == -2)
				return usage_error("lock: %s: at most %s: %s", a,
						   ttl ? "24h" : "168h", v);
			if (ttl)
				o->ttl_ms = ms;
			else if (connect)
				o->connect_ms = ms;
			else if (wait)
				o->wait_ms = ms;
			else
				o->holder = v;
		} else if (a[0] == '-' && a[1]) {
			return usage_error("lock: unknown option: %s", a);
		} else if (!o->resource) {
			o->resource = a;
		} else {
			return usage_error("lock: the command goes after \"--\": %s", a);
		}
	}
	if (!o->resource)
		return usage_error("lock: no resource given");
	if (i >= argc - 1)
		return usage_error("lock: no command given (baton lock RESOURCE -- COMMAND ...)");
	if (o->ttl_ms < 1000)
		return usage_error("lock: --ttl must be at least 1s");
	o->command = argv + i + 1;
	if (!o->holder)
		default_holder(o);
	return -1;
}

/* ---- the lease over HTTP ---- */

struct lease {
	char id[160];
	long long token, ttl_ms;
	long long slot; /* the permit's slot; -1 for an exclusive lease (null) */
	int exclusive;
	long long sent_at; /* monotonic ms: the send of the acquire that was granted */
	/* By baton lock's clock: when the lease may be lost, and the next renewal is due. */
	long long deadline, next_renew;
};

/*
 * One acquire request in flight, on its own connection and thread: a --wait longer than
 * one request's sends the next request, with the same request_id, while the previous one
 * still waits, so that the server moves the waiter over to it in its place in the queue
 * (and answers the previous one 409). Sent only after the previous request's wait has
 * ended, the next would find the lease gone from the queue.
 */
struct attempt {
	http *http; /* its own handle */
	const char *path;
	json_t *body;
	long long sent_at, wait;
	int rc, done;
	struct http_reply r;
	pthread_t thread;
};

static pthread_mutex_t attempt_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t attempt_cv;
static pthread_once_t attempt_cv_once = PTHREAD_ONCE_INIT;

/* The condition variable times its waits on CLOCK_MONOTONIC, as --wait is counted: a step
 * of the wall clock (NTP, a VM resumed) neither stretches nor cuts a wait. */
static void attempt_cv_init(void)
{
	pthread_condattr_t attr;
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&attempt_cv, &attr);
	pthread_condattr_destroy(&attr);
}

static void *attempt_main(void *arg)
{
	struct attempt *a = arg;
	struct http_reply r;
	http_set_timeout(a->http, (long)a->wait + 30000);
	int rc = http_request(a->http, "POST", a->path, a->body, &r);
	pthread_mutex_lock(&attempt_mu);
	a->rc = rc;
	a->r = r;
	a->done = 1;
	pthread_cond_broadcast(&attempt_cv);
	pthread_mutex_unlock(&attempt_mu);
	return NULL;
}

/* Sends the acquire for request_id rid, waiting up to wait ms; 0, or -1 (no thread). */
static int attempt_start(struct attempt *a, const struct lock_opts *o, const char *rid,
			 long long wait)
{
	a->body = json_pack("{s:s, s:I, s:I, s:s}", "holder", o->holder, "ttl_ms",
			    (json_int_t)o->ttl_ms, "wait_ms", (json_int_t)wait, "request_id", rid);
	if (a->body && o->exclusive) /* only then: a server without permits knows no such key */
		json_object_set_new(a->body, "exclusive", json_true());
	a->wait = wait;
	a->done = 0;
	a->rc = EXIT_FAILED;
	a->r = (struct http_reply){0};
	a->sent_at = monotonic_ms();
	pthread_once(&attempt_cv_once, attempt_cv_init);
	if (!a->body || pthread_create(&a->thread, NULL, attempt_main, a) != 0) {
		fprintf(stderr, "baton: lock: cannot send the acquire request\n");
		json_decref(a->body);
		a->body = NULL;
		return -1;
	}
	return 0;
}

/* Waits until a has its answer, or until `until` (monotonic ms; 0: no limit), or until an
 * ending signal came. 1 when it has its answer (then joined: a->rc and a->r hold it). */
static int attempt_wait(struct attempt *a, long long until)
{
	pthread_mutex_lock(&attempt_mu);
	while (!a->done && (!until || monotonic_ms() < until) && !got_signal) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += 50 * 1000000L; /* a slice: a signal is looked at every 50 ms */
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&attempt_cv, &attempt_mu, &ts);
	}
	int done = a->done;
	pthread_mutex_unlock(&attempt_mu);
	if (done) {
		pthread_join(a->thread, NULL);
		json_decref(a->body);
		a->body = NULL;
	}
	return done;
}

/* Waits for a request in flight (if any) to end, whatever its answer, and forgets it: one
 * answered at once, or one a signal ends (http_set_abort). */
static void attempt_finish(struct attempt *a)
{
	if (!a->body)
		return; /* not in flight */
	pthread_join(a->thread, NULL);
	json_decref(a->body);
	a->body = NULL;
	http_reply_fini(&a->r);
}

enum answer { GRANTED, ASK_AGAIN, ASK_ANEW, ENDED };

/* Says why the lease was refused, in the user's words: the server's "not granted within
 * wait_ms" is this --wait. */
static void print_refusal(const struct lock_opts *o, const char *why)
{
	static const char api[] = "not granted within wait_ms";
	if (strncmp(why, api, sizeof api - 1) != 0) {
		fprintf(stderr, "baton: lock: %s: %s\n", o->resource, why);
		return;
	}
	char wait[32];
	format_secs(wait, sizeof wait, o->wait_ms);
	fprintf(stderr, "baton: lock: %s: not granted within --wait (%s s)%s\n", o->resource, wait,
		why + sizeof api - 1);
}

/* What an acquire's answer means; fills l on GRANTED; *rc is the exit status on ENDED. */
static enum answer answer_of(const struct lock_opts *o, struct attempt *a, struct lease *l,
			     long long deadline, int *rc)
{
	long status = a->rc ? 0 : a->r.status;
	int in_time = monotonic_ms() < deadline, held = 0;
	*rc = a->rc;
	if (status == 200 || status == 201)
		held = strcmp(jstr(a->r.body, "state", ""), "held") == 0;
	if (held) {
		snprintf(l->id, sizeof l->id, "%s", jstr(a->r.body, "id", ""));
		l->token = jint(a->r.body, "fencing_token", 0);
		l->ttl_ms = jint(a->r.body, "ttl_ms", o->ttl_ms);
		l->slot = jint(a->r.body, "slot", -1);
		l->exclusive = json_is_true(json_object_get(a->r.body, "exclusive"));
		l->sent_at = a->sent_at;
	}
	const char *why = jstr(a->r.body, "detail", "not granted");
	enum answer out = ENDED;
	if (held)
		out = GRANTED;
	else if ((a->rc == EXIT_UNREACHABLE || status == 503) && in_time)
		out = ASK_AGAIN; /* every server failed: again, with the same request_id */
	else if ((status == 409 || status == 200 || status == 201) &&
		 monotonic_ms() < deadline - 1000)
		out = ASK_ANEW; /* the request left the queue: a new one, at its back */
	else if (status == 200 || status == 201) {
		fprintf(stderr, "baton: lock: the lease ended before it was used\n");
		*rc = EXIT_NOT_ACQUIRED;
	} else if (a->rc == EXIT_UNREACHABLE) {
		char servers[1600];
		http_why_unreachable(a->http, servers, sizeof servers);
		fprintf(stderr, "baton: lock: %s: no server answers: %s\n", o->resource, servers);
	} else if (!a->rc) {
		print_refusal(o, why);
		*rc = status == 409 ? EXIT_NOT_ACQUIRED : EXIT_FAILED;
	}
	http_reply_fini(&a->r);
	return out;
}

/*
 * Every server failed the acquire (no answer, or 503). Until some server has answered a
 * request, baton lock gives up once --connect-timeout has passed since it started: a
 * wrong --server fails in seconds, not after --wait. Once one did, the servers may be
 * failing over: the lock waits on, as the lease rules say, and says so once. Returns 1
 * when it gives up, after one line naming each server and why.
 */
static int no_server(const struct lock_opts *o, const struct attempt *at, long long start,
		     int *said)
{
	char servers[1600], secs[32];
	int answered = http_answered(at[0].http) || (at[1].http && http_answered(at[1].http));
	if (answered && *said)
		return 0;
	http_why_unreachable(at[0].http, servers, sizeof servers);
	if (answered) {
		fprintf(stderr, "baton: lock: no server answers now (%s); asking again\n", servers);
		*said = 1;
		return 0;
	}
	if (monotonic_ms() - start < o->connect_ms)
		return 0;
	format_secs(secs, sizeof secs, o->connect_ms);
	fprintf(stderr, "baton: lock: no server answered within %s s (--connect-timeout): %s\n",
		secs, servers);
	return 1;
}

/* 0 released (or already ended), 1 it had expired, -1 no answer. */
static int release(struct cli *cli, const struct lease *l);

/*
 * An ending signal came while the acquire waited (SIGINT, SIGTERM, SIGHUP): the requests in
 * flight end unanswered (http_set_abort), and the lease of request_id rid is released, which
 * takes its waiter out of the queue, or ends at once a grant that raced the signal (the
 * server answers DELETE for either, as etcd's Lock leaves its queue). Returns 128 + the
 * signal: nothing runs.
 */
static int leave_queue(struct cli *cli, struct attempt *at, const char *rid)
{
	int sig = got_signal;
	attempt_finish(&at[0]);
	attempt_finish(&at[1]);
	struct lease l = {.token = 0};
	snprintf(l.id, sizeof l.id, "lease-%s", rid);
	http_set_abort(cli->http, NULL);
	release(cli, &l);
	return 128 + sig;
}

static void new_request_id(char *rid, size_t n)
{
	snprintf(rid, n, "lock-%08lx%08lx", (unsigned long)random(), (unsigned long)monotonic_ms());
}

/* Acquires the lease within o->wait_ms: EXIT_OK, EXIT_NOT_ACQUIRED, or another status. */
static int acquire(struct cli *cli, const struct lock_opts *o, struct lease *l)
{
	char rid[40], *res = http_escape(o->resource), path[400];
	snprintf(path, sizeof path, "/resources/%s/leases", res);
	free(res);
	long long start = monotonic_ms(), deadline = start + o->wait_ms;
	long long cap = request_wait_cap(), lead = cap / 10;
	struct attempt at[2] = {{.http = cli->http, .path = path}, {.path = path}};
	l->id[0] = '\0'; /* set on the grant only */
	int cur = 0, rc = EXIT_FAILED, started, said = 0;
	http_set_abort(cli->http, &got_signal); /* a signal ends the requests in flight */
	new_request_id(rid, sizeof rid);
	started = !attempt_start(&at[cur], o, rid, deadline - start < cap ? deadline - start : cap);
	while (started) {
		/* the next request is due before this one's wait ends, if --wait goes on */
		long long next_at = at[cur].sent_at + at[cur].wait - lead;
		int more = at[cur].sent_at + at[cur].wait < deadline - 1000;
		int answered = attempt_wait(&at[cur], more ? next_at : 0);
		if (got_signal) {
			/* an answer that came is freed here; a request still in flight is
			 * joined, and its answer freed, by leave_queue */
			if (answered)
				http_reply_fini(&at[cur].r);
			rc = leave_queue(cli, at, rid);
			break;
		}
		if (!answered) {
			int nxt = !cur;
			if (!at[nxt].http && !(at[nxt].http = http_clone(cli->http)))
				started = 0;
			else
				http_set_abort(at[nxt].http, &got_signal);
			long long left = deadline - monotonic_ms();
			if (started) {
				fprintf(stderr, "baton: lock: still waiting for %s after %lld s\n",
					o->resource, (monotonic_ms() - start) / 1000);
				started = !attempt_start(&at[nxt], o, rid, left < cap ? left : cap);
			}
			attempt_wait(&at[cur], 0); /* 409 once the next took its place */
			if (got_signal) {
				rc = leave_queue(cli, at, rid);
				break;
			}
			if (answer_of(o, &at[cur], l, deadline, &rc) == GRANTED) {
				attempt_finish(&at[nxt]); /* the same lease, at once */
				rc = EXIT_OK;
				break;
			}
			cur = nxt;
			continue;
		}
		int unreachable = at[cur].rc == EXIT_UNREACHABLE;
		enum answer ans = answer_of(o, &at[cur], l, deadline, &rc);
		if (ans == GRANTED)
			rc = EXIT_OK;
		if (ans == GRANTED || ans == ENDED)
			break;
		if (ans == ASK_AGAIN && unreachable && no_server(o, at, start, &said)) {
			rc = EXIT_UNREACHABLE;
			break;
		}
		if (ans != ASK_AGAIN || !unreachable)
			said = 0; /* an answer came: a later outage is said again */
		if (ans == ASK_AGAIN)
			for (int k = 0; k < 25 && !got_signal; k++)
				sleep_ms(20);
		else
			new_request_id(rid, sizeof rid);
		if (got_signal) {
			rc = leave_queue(cli, at, rid);
			break;
		}
		long long left = deadline - monotonic_ms();
		left = left < 0 ? 0 : left > cap ? cap : left;
		started = !attempt_start(&at[cur], o, rid, left);
	}
	http_set_abort(cli->http, NULL);
	if (at[1].http != cli->http)
		http_free(at[1].http);
	/* not granted: an answer that ended the wait said why; a request not sent did too */
	return rc == EXIT_OK && !l->id[0] ? EXIT_FAILED : rc;
}

enum renewal { RENEWED, REFUSED, NO_ANSWER };

static enum renewal renew(struct cli *cli, const struct lease *l, long timeout_ms)
{
	char path[256];
	struct http_reply r;
	snprintf(path, sizeof path, "/leases/%s/renew", l->id);
	http_set_timeout(cli->http, timeout_ms);
	int rc = http_request(cli->http, "POST", path, NULL, &r);
	http_set_timeout(cli->http, 0);
	if (rc)
		return NO_ANSWER;
	enum renewal out = r.status == 200 ? RENEWED : r.status >= 500 ? NO_ANSWER : REFUSED;
	if (out == REFUSED)
		fprintf(stderr, "baton: lock: renewal refused (HTTP %ld): %s\n", r.status,
			jstr(r.body, "detail", ""));
	http_reply_fini(&r);
	return out;
}

/* 0 released (or already ended), 1 it had expired, -1 no answer. */
static int release(struct cli *cli, const struct lease *l)
{
	char path[256];
	struct http_reply r;
	snprintf(path, sizeof path, "/leases/%s", l->id);
	http_set_timeout(cli->http, 10000);
	int rc = http_request(cli->http, "DELETE", path, NULL, &r);
	if (rc)
		return -1;
	long status = r.status;
	http_reply_fini(&r);
	return status == 410 ? 1 : status < 300 ? 0 : -1;
}

/* ---- the command ---- */

static pid_t start_command(const struct lock_opts *o, const struct lease *l)
{
	char token[32], slot[32] = "";
	snprintf(token, sizeof token, "%lld", l->token);
	if (l->slot >= 0)
		snprintf(slot, sizeof slot, "%lld", l->slot);
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid == 0) {
		setpgid(0, 0);
		tty_give(getpid()); /* also here: the terminal is its own before it reads */
		signal(SIGINT, SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		signal(SIGHUP, SIG_DFL);
		setenv("BATON_FENCING_TOKEN", token, 1);
		setenv("BATON_LEASE_ID", l->id, 1);
		setenv("BATON_RESOURCE", o->resource, 1);
		setenv("BATON_SLOT", slot, 1);
		execvp(o->command[0], o->command);
		fprintf(stderr, "baton: lock: cannot run %s: %s\n", o->command[0], strerror(errno));
		_exit(127);
	}
	if (pid > 0) {
		setpgid(pid, pid); /* also here: no race with a signal sent at once */
		tty_give(pid);
	}
	return pid;
}

/* Counts the lease from a request sent at `sent`, which the server answered with it held. */
static void count_from(struct lease *l, long long sent)
{
	l->deadline = sent + l->ttl_ms - l->ttl_ms / 3;
	l->next_renew = sent + l->ttl_ms / 3;
}

enum hold { KEPT, RENEWED_NOW, LOST };

/*
 * Renews the lease if a renewal is due at `now`. Returns KEPT (no renewal due, or one
 * without answer before the deadline), RENEWED_NOW, or LOST once the lease is lost or
 * may be (a renewal refused, or no renewal succeeded before the deadline), after saying
 * so on stderr.
 */
static enum hold keep_lease(struct cli *cli, const struct lock_opts *o, struct lease *l,
			    long long now)
{
	long long ttl = l->ttl_ms;
	if (now >= l->deadline) {
		fprintf(stderr,
			"baton: lock: no successful renewal for %lld ms: the lease on %s "
			"may be lost\n",
			ttl - ttl / 3, o->resource);
		return LOST;
	}
	if (now < l->next_renew)
		return KEPT;
	/* each server gets its share: a frozen one leaves the next time to answer */
	long timeout = (long)(l->deadline - now < ttl / 3 ? l->deadline - now : ttl / 3) /
		       (long)http_server_count(cli->http);
	enum renewal r = renew(cli, l, timeout > 100 ? timeout : 100);
	if (r == REFUSED)
		return LOST;
	if (r == RENEWED) {
		count_from(l, now);
		return RENEWED_NOW;
	}
	l->next_renew = monotonic_ms() + (ttl / 10 < 1000 ? ttl / 10 : 1000);
	return KEPT;
}

/* What the keeper renews with, and stops on loss, while baton lock is stopped (suspend). */
struct keeper {
	const struct lock_opts *o;
	const struct group *g;
};

/* One turn of the keeper: renews the lease (shared) when due; nonzero when it was lost,
 * after ending the command's group. */
static int keep(struct cli *kc, void *shared, void *arg)
{
	const struct keeper *k = arg;
	if (keep_lease(kc, k->o, shared, monotonic_ms()) != LOST)
		return 0;
	group_signal(k->g, SIGTERM);
	return 1;
}

/*
 * The command was stopped from the terminal (Ctrl-Z): baton lock takes the terminal
 * back and stops itself, so that the user's shell sees its job stopped and gives its
 * prompt back; `fg` continues baton lock, which gives the terminal to the command again
 * and continues it. A stopped process cannot renew, so a keeper, a child in baton lock's
 * own group, renews the lease meanwhile (its own connection, the lease in shared memory);
 * if the lease is lost it ends the command's group and continues baton lock. Returns 1
 * when the lease was lost while stopped.
 */
static int suspend(struct cli *cli, const struct lock_opts *o, struct lease *l, struct group *g)
{
	tty_take_back(g->pgid);
	if (!job_can_stop())
		return 0; /* nobody to continue us: keep renewing until the command continues */
	struct keeper k = {o, g};
	int lost = job_stop_with_keeper(cli, l, sizeof *l, keep, &k, &got_signal);
	if (lost < 0)
		return 0; /* stays in the foreground of its shell, renewing */
	if (lost == 0) {
		if (tty >= 0 && tcgetpgrp(tty) == getpgrp()) /* `fg`; not after `bg` */
			tty_give(g->pgid);
		kill(-g->pgid, SIGCONT);
	}
	return lost == 1;
}

/* Runs the command under the lease until nothing of its group is left; returns baton
 * lock's exit status. */
static int supervise(struct cli *cli, const struct lock_opts *o, struct lease *l)
{
	long long grace = l->ttl_ms / 6;
	int lost = 0, signals = 0, said = 0, was_stopped = 0;
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	/* With a terminal, the command's stops are noted, and signals continue it. */
	struct group g = {.pgid = start_command(o, l), .untraced = tty >= 0, .cont = tty >= 0};
	if (g.pgid < 0) {
		fprintf(stderr, "baton: lock: cannot fork: %s\n", strerror(errno));
		release(cli, l);
		return EXIT_FAILED;
	}
	for (;;) {
		group_reap(&g);
		if (g.exited)
			tty_take_back(g.pgid);
		if (g.exited && !group_left(&g))
			break;
		/* A signal that came while baton lock was stopped is acted on first: the command,
		 * continued in the background, may have stopped again reading the terminal
		 * (SIGTTIN), and suspending again then would wait for a continue nobody sends. */
		if (g.stopped != was_stopped && !g.exited && !signals && !lost && !got_signal) {
			if (g.stopped && suspend(cli, o, l, &g)) {
				fprintf(stderr,
					"baton: lock: stopping the command's process group\n");
				group_end(&g, monotonic_ms(), grace);
				lost = 1;
			} else if (!g.stopped && tty >= 0 && tcgetpgrp(tty) == getpgrp()) {
				tty_give(g.pgid); /* continued by somebody else, while ours */
			}
			was_stopped = g.stopped;
		}
		long long now = monotonic_ms();
		if (got_signal) { /* the command first; then what is left of its group */
			if (!signals++ && !g.exited)
				group_signal(&g, got_signal);
			else
				group_end(&g, now, grace);
			got_signal = 0;
		}
		if (signals && g.exited)
			group_end(&g, now, grace);
		if (g.exited && !signals && !lost && !said++)
			fprintf(stderr,
				"baton: lock: the command ended; processes of its group still run: "
				"the lease on %s is kept until they end\n",
				o->resource);
		if (!lost && keep_lease(cli, o, l, now) == LOST) {
			fprintf(stderr, "baton: lock: stopping the command's process group\n");
			group_end(&g, now, grace);
			lost = 1;
		}
		group_tick(&g, now);
		sleep_ms(20);
	}
	int gone = release(cli, l);
	if (lost || gone == 1) {
		fprintf(stderr, "baton: lock: the lease on %s was lost while the command ran\n",
			o->resource);
		return EXIT_LEASE_LOST;
	}
	return group_status(&g);
}

int cmd_lock(struct cli *cli, int argc, char **argv)
{
	struct lock_opts o;
	int rc = parse_args(argc, argv, &o);
	if (rc >= 0)
		return rc;
	srandom((unsigned)(getpid() ^ monotonic_ms()));
	/* the acquire carries a request_id; renewing and releasing twice is harmless */
	http_set_resend(cli->http, 1);
	struct sigaction sa = {.sa_handler = on_signal};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	/* A terminal whose foreground baton lock is in: the command's while it runs. */
	if (isatty(STDIN_FILENO) && tcgetpgrp(STDIN_FILENO) == getpgrp())
		tty = STDIN_FILENO;
	struct lease l;
	/* The acquire says itself why no server answered (no_server, answer_of). */
	http_set_quiet(cli->http, 1);
	if (o.connect_ms < 5000)
		http_set_connect_timeout(cli->http, o.connect_ms > 100 ? (long)o.connect_ms : 100);
	rc = acquire(cli, &o, &l);
	http_set_quiet(cli->http, 0);
	http_set_connect_timeout(cli->http, 0);
	if (rc)
		return rc;
	if (o.exclusive && !l.exclusive) { /* the command would not run alone: never run it */
		release(cli, &l);
		fprintf(stderr,
			"baton: lock: %s: the server granted a lease that is not exclusive\n",
			o.resource);
		return EXIT_FAILED;
	}
	/* The server counted the ttl from the grant, after the acquire was sent. A grant
	 * whose answer took a third of the ttl or more is renewed before the command runs. */
	count_from(&l, l.sent_at);
	long long arrived = monotonic_ms();
	if (arrived >= l.next_renew) {
		/* Granted after a wait in the queue, some time after the send: counted from the
		 * send the lease may look lost already. Nothing runs before a renewal succeeds,
		 * and from then on the lease counts from that renewal's send; until then it is
		 * given two thirds of a ttl. */
		l.deadline = arrived + l.ttl_ms - l.ttl_ms / 3;
		l.next_renew = arrived;
	}
	enum hold h = arrived >= l.next_renew ? KEPT : RENEWED_NOW;
	while (!got_signal && h == KEPT) {
		h = keep_lease(cli, &o, &l, monotonic_ms());
		if (h == LOST) {
			release(cli, &l);
			fprintf(stderr,
				"baton: lock: the lease on %s ended before the command could run\n",
				o.resource);
			return EXIT_NOT_ACQUIRED;
		}
		if (h == KEPT)
			sleep_ms(20);
	}
	if (got_signal) { /* asked to stop before anything ran */
		release(cli, &l);
		return 128 + got_signal;
	}
	return supervise(cli, &o, &l);
}
