/*
 * worker.c - `baton worker --worker NAME [--resource R] [--ttl 30s] [--once [--wait 60s]]
 * -- COMMAND`: does the steps of an external worker (POST /tasks/claim) with a command.
 *
 * Design. A loop of long-polling claims. For each task, the command runs once, in its
 * own process group, with the task as JSON on its stdin and its fields in the environment
 * (BATON_TASK_ID, BATON_WORKFLOW_ID, BATON_STEP, BATON_WORKER, BATON_RESOURCE,
 * BATON_ATTEMPT, BATON_FENCING_TOKEN). While it runs, the claim is heartbeaten every
 * third of its ttl; a heartbeat refused (410: the attempt expired or was superseded)
 * stops the command's group (TERM, then KILL) and nothing is reported. As baton lock
 * does with its lease (lock.c), the worker also decides by its own monotonic clock,
 * counting the claim from when its request was *sent* (the server starts the ttl later,
 * at the claim) and then from each successful heartbeat's send: when none succeeded for
 * two thirds of the ttl (the server unreachable, or answering 5xx), the group gets TERM,
 * then KILL a sixth of the ttl later, before the server can expire the claim and hand
 * the step to another attempt, and nothing is reported. A claim whose answer took a
 * third of the ttl or more is heartbeaten before the command starts. The group is run
 * and ended with baton lock's code (group.c): the worker is its subreaper, and the task
 * is over when nothing of the group is left, not when the command exits, so a child that
 * ignores SIGTERM still gets the SIGKILL, and a background child keeps the claim,
 * heartbeaten, until it ends. Then
 * exit status 0 completes the task with its stdout (JSON when it parses, else the text
 * as a string); any other status fails it (retryable) with the status and the last lines
 * of its stderr. SIGINT, SIGTERM, SIGHUP or SIGQUIT (Ctrl-C, Ctrl-\ in a terminal, whose
 * foreground group is the worker's: the command reads its task, not the terminal): the
 * command gets it, its outcome is reported, and the loop ends (exit 0). An idle worker's
 * long poll for a claim ends at once (http_set_abort); a claim the server answered
 * meanwhile is given back by it, as any claim answered to nobody.
 *
 * Ctrl-Z (SIGTSTP) while a command runs stops the command's group and then the worker, so
 * that the shell sees its job stopped and gives its prompt back; `fg` continues the
 * worker, which continues the command. A stopped worker cannot heartbeat, so a keeper, a
 * child in the worker's group with its own connection and the claim in shared memory,
 * heartbeats meanwhile, as baton lock's keeper renews its lease (lock.c): a stopped
 * command keeps its claim, and one whose claim is lost meanwhile is ended (TERM) and the
 * worker continued. Without a command running, Ctrl-Z simply stops the worker: a claim
 * answered while it is stopped is heartbeaten before its command starts, as any late one. --once:
 * one task, then exit 0 if it completed, 1 if not; when no task came within --wait (default 60 s;
 * each claim's long poll shortened to what is left of it), EXIT_NOT_ACQUIRED, as baton lock does
 * when no lease came: nothing ran.
 *
 * In a cluster a claim naming its resource is passed on to the node that drives it, but a
 * node has only the tasks of the resources it drives: without --resource and with several
 * servers, each long poll gets its share of CLAIM_WAIT and a claim that found nothing
 * moves on to the next server, so that every node is asked in turn.
 *
 * Each claim carries a request_id, kept until the claim is answered (a task, 204 or a
 * refusal): a claim whose answer was lost (the connection cut after it was sent) is asked
 * again with it, on the next server at once (http.c) and after a pause once every server
 * failed, and the server answers it with the claim it made instead of claiming a second
 * step while the first is held for nobody until its ttl runs out.
 */
#include "client.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_OUTPUT (1 << 20)
#define ERR_TAIL   2048
#define CLAIM_WAIT 30000

/* stop_signal: the last ending signal not yet passed to the command; stopping: one came,
 * and the loop ends after this task; stop_asked: a SIGTSTP while a command runs. */
static volatile sig_atomic_t stop_signal, stopping, stop_asked;

static void on_stop(int sig)
{
	stop_signal = sig;
	__atomic_store_n(&stopping, 1, __ATOMIC_RELAXED); /* read atomically by http.c too */
}

static void on_tstp(int sig)
{
	(void)sig;
	stop_asked = 1;
}

/* SIGTSTP: noted while a command runs (on), the default (a plain stop) otherwise. */
static void catch_tstp(int on)
{
	struct sigaction sa = {.sa_handler = on ? on_tstp : SIG_DFL};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTSTP, &sa, NULL);
}

struct worker_opts {
	const char *worker, *resource;
	long long ttl_ms, wait_ms; /* wait_ms: --once only */
	int once;
	char **command;
};

static int parse_args(int argc, char **argv, struct worker_opts *o)
{
	*o = (struct worker_opts){.ttl_ms = 30000, .wait_ms = 60000};
	int i, waits = 0;
	for (i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
		const char *a = argv[i];
		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			usage(stdout);
			return EXIT_OK;
		}
		if (strcmp(a, "--once") == 0) {
			o->once = 1;
			continue;
		}
		if (strcmp(a, "--worker") && strcmp(a, "--resource") && strcmp(a, "--ttl") &&
		    strcmp(a, "--wait"))
			return usage_error("worker: unknown option or argument: %s", a);
		if (i + 1 >= argc)
			return usage_error("worker: %s needs a value", a);
		const char *v = argv[++i];
		if (strcmp(a, "--worker") == 0)
			o->worker = v;
		else if (strcmp(a, "--resource") == 0)
			o->resource = v;
		else if (strcmp(a, "--wait") == 0) {
			waits = 1;
			if (parse_duration(v, MAX_WAIT_MS, &o->wait_ms))
				return usage_error("worker: --wait: a duration up to 168h: %s", v);
		} else if (parse_duration(v, MAX_TTL_MS, &o->ttl_ms) || o->ttl_ms < 1000)
			return usage_error("worker: --ttl: a duration from 1s to 24h: %s", v);
	}
	if (!o->worker)
		return usage_error("worker: --worker NAME is required");
	if (waits && !o->once)
		return usage_error("worker: --wait bounds --once only: add --once, or drop --wait");
	if (i >= argc - 1)
		return usage_error("worker: no command given (baton worker --worker NAME -- CMD)");
	o->command = argv + i + 1;
	return -1;
}

/* ---- one task ---- */

struct run {
	struct sbuf out, err;
	const char *in;
	size_t in_len, in_off;
	int fd_in, fd_out, fd_err;
};

static void set_env(const json_t *task)
{
	static const char *const names[][2] = {{"BATON_TASK_ID", "id"},
					       {"BATON_WORKFLOW_ID", "workflow_id"},
					       {"BATON_STEP", "step"},
					       {"BATON_WORKER", "worker"},
					       {"BATON_RESOURCE", "resource"},
					       {"BATON_ATTEMPT", "attempt"},
					       {"BATON_FENCING_TOKEN", "fencing_token"}};
	for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
		const json_t *v = json_object_get(task, names[i][1]);
		char buf[64];
		if (json_is_integer(v))
			snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
		setenv(names[i][0], json_is_string(v) ? json_string_value(v) : buf, 1);
	}
}

static pid_t spawn(char **command, const json_t *task, struct run *r)
{
	int in[2], out[2], err[2];
	if (pipe(in) || pipe(out) || pipe(err))
		return -1;
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid == 0) {
		setpgid(0, 0);
		signal(SIGINT, SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		signal(SIGHUP, SIG_DFL);
		signal(SIGQUIT, SIG_DFL);
		signal(SIGTSTP, SIG_DFL);
		signal(SIGPIPE, SIG_DFL);
		dup2(in[0], 0);
		dup2(out[1], 1);
		dup2(err[1], 2);
		for (int fd = 3; fd < 64; fd++)
			close(fd);
		set_env(task);
		execvp(command[0], command);
		fprintf(stderr, "cannot run %s: %s\n", command[0], strerror(errno));
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	close(err[1]);
	if (pid < 0)
		return -1;
	setpgid(pid, pid);
	r->fd_in = in[1];
	r->fd_out = out[0];
	r->fd_err = err[0];
	fcntl(r->fd_in, F_SETFL, O_NONBLOCK);
	return pid;
}

/* Moves what is ready between the pipes and the buffers, for up to ms. */
static void pump(struct run *r, int ms)
{
	struct pollfd p[3] = {{.fd = r->fd_out, .events = POLLIN},
			      {.fd = r->fd_err, .events = POLLIN},
			      {.fd = r->fd_in, .events = POLLOUT}};
	if (poll(p, 3, ms) <= 0)
		return;
	char buf[4096];
	for (int i = 0; i < 2; i++) {
		int *fd = i ? &r->fd_err : &r->fd_out;
		if (*fd < 0 || !(p[i].revents & (POLLIN | POLLHUP)))
			continue;
		ssize_t n = read(*fd, buf, sizeof buf);
		if (n <= 0) {
			close(*fd);
			*fd = -1;
		} else if (i == 0) {
			sbuf_add(&r->out, buf, (size_t)n, MAX_OUTPUT);
		} else {
			if (r->err.len + (size_t)n > 4 * ERR_TAIL) { /* keep the tail only */
				size_t keep = ERR_TAIL;
				memmove(r->err.p, r->err.p + r->err.len - keep, keep);
				r->err.len = keep;
			}
			sbuf_add(&r->err, buf, (size_t)n, 8 * ERR_TAIL);
		}
	}
	if (r->fd_in >= 0 && (p[2].revents & (POLLOUT | POLLERR | POLLHUP))) {
		ssize_t n = write(r->fd_in, r->in + r->in_off, r->in_len - r->in_off);
		if (n > 0)
			r->in_off += (size_t)n;
		if (n < 0 || r->in_off == r->in_len) {
			close(r->fd_in);
			r->fd_in = -1;
		}
	}
}

/* 200: ok; 410 or 404: the attempt is over; 0: no answer. */
static long post_task(struct cli *cli, const char *id, const char *what, const json_t *body)
{
	char path[400];
	struct http_reply r;
	snprintf(path, sizeof path, "/tasks/%s/%s", id, what);
	if (http_request(cli->http, "POST", path, body, &r))
		return 0;
	long status = r.status;
	if (status >= 300)
		fprintf(stderr, "baton: worker: %s %s: HTTP %ld: %s\n", what, id, status,
			jstr(r.body, "detail", ""));
	http_reply_fini(&r);
	return status;
}

static json_t *outcome_body(int ws, struct run *r, int *ok)
{
	*ok = WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
	if (*ok) {
		size_t n = r->out.len;
		while (n && (r->out.p[n - 1] == '\n' || r->out.p[n - 1] == '\r'))
			n--;
		json_t *v = n ? json_loadb(r->out.p, n, JSON_DECODE_ANY, NULL) : json_null();
		if (!v)
			v = json_stringn(r->out.p, n);
		return json_pack("{s:o?}", "result", v ? v : json_null());
	}
	char error[ERR_TAIL + 64];
	int code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
	size_t n = r->err.len, start = n > ERR_TAIL ? n - ERR_TAIL : 0;
	while (n > start && r->err.p[n - 1] == '\n')
		n--;
	snprintf(error, sizeof error, "exit status %d%s%.*s", code, n > start ? ": " : "",
		 (int)(n - start), n > start ? r->err.p + start : "");
	json_t *e = json_stringn(error, strlen(error));
	if (!e) /* not UTF-8: say so without the text */
		e = json_sprintf("exit status %d (stderr not UTF-8)", code);
	return json_pack("{s:o, s:b}", "error", e, "retryable", 1);
}

/* The claim by the worker's clock: when it may be lost, and the next heartbeat is due. */
struct claim {
	const char *id;
	long long ttl, deadline, next;
};

static void claim_count_from(struct claim *c, long long sent)
{
	c->deadline = sent + c->ttl - c->ttl / 3;
	c->next = sent + c->ttl / 3;
}

enum beat { BEAT_KEPT, BEAT_RENEWED, BEAT_LOST };

/* Heartbeats the claim if one is due at `now`: BEAT_KEPT (none due, or no success yet
 * before the deadline), BEAT_RENEWED, or BEAT_LOST (refused, or the deadline passed). */
static enum beat keep_claim(struct cli *cli, struct claim *c, long long now)
{
	if (now >= c->deadline) {
		fprintf(stderr,
			"baton: worker: no successful heartbeat for %lld ms: the claim of %s may "
			"be lost; stopping the command\n",
			c->ttl - c->ttl / 3, c->id);
		return BEAT_LOST;
	}
	if (now < c->next)
		return BEAT_KEPT;
	long long left = c->deadline - now, servers = (long long)http_server_count(cli->http);
	http_set_timeout(cli->http,
			 (long)((left < c->ttl / 3 ? left : c->ttl / 3) / servers) + 100);
	long st = post_task(cli, c->id, "heartbeat", NULL);
	http_set_timeout(cli->http, 0);
	if (st == 410 || st == 404)
		return BEAT_LOST;
	if (st == 200) {
		claim_count_from(c, now);
		return BEAT_RENEWED;
	}
	c->next = monotonic_ms() + (c->ttl / 10 < 1000 ? c->ttl / 10 : 1000);
	return BEAT_KEPT;
}

/* Before the command starts: a heartbeat when the claim's answer came late. 0 or -1. */
static int confirm_claim(struct cli *cli, struct claim *c)
{
	enum beat b = monotonic_ms() >= c->next ? BEAT_KEPT : BEAT_RENEWED;
	while (b == BEAT_KEPT && !stopping) {
		b = keep_claim(cli, c, monotonic_ms());
		if (b == BEAT_KEPT)
			sleep_ms(20);
	}
	return b == BEAT_LOST ? -1 : 0;
}

/* One turn of the keeper while the worker is stopped (suspend): heartbeats the claim
 * (shared) when due; nonzero when it was lost, after ending the command's group (arg). */
static int keep(struct cli *kc, void *shared, void *arg)
{
	const pid_t *pgid = arg;
	if (keep_claim(kc, shared, monotonic_ms()) != BEAT_LOST)
		return 0;
	kill(-*pgid, SIGTERM);
	kill(-*pgid, SIGCONT);
	return 1;
}

/*
 * Ctrl-Z while the command (group pgid) runs: the command's group is stopped, then the
 * worker, while a keeper (a child in the worker's own group, with its own connection and the
 * claim in shared memory) heartbeats; once the worker is continued (`fg`, `bg`, a shell's
 * `kill %1`, or the keeper) the keeper ends and the command is continued. A claim lost
 * meanwhile: the keeper ends the command's group (TERM) and continues the worker. Returns 1
 * then. When nobody could continue the worker (its group orphaned) nothing stops.
 */
static int suspend(struct cli *cli, struct claim *c, pid_t pgid)
{
	if (!job_can_stop())
		return 0;
	kill(-pgid, SIGTSTP);
	int lost = job_stop_with_keeper(cli, c, sizeof *c, keep, &pgid, &stopping);
	if (lost <= 0)
		kill(-pgid, SIGCONT);
	return lost == 1;
}

/*
 * Runs the command's group g until nothing of it is left, heartbeating the claim, as baton
 * lock runs its command under its lease (group.c): a signal goes to the command, or, once it
 * has ended, ends what is left of its group; a claim lost ends the whole group, TERM at two
 * thirds of the ttl by the worker's clock, KILL a sixth of the ttl later, and the worker
 * waits for every process of the group, not just the command. Returns 1 when the claim
 * was lost (or may be), else 0.
 */
static int supervise(struct cli *cli, struct claim *c, struct run *r, struct group *g)
{
	int lost = 0, said = 0;
	long long grace = c->ttl / 6;
	stop_asked = 0;
	catch_tstp(1);
	for (;;) {
		group_reap(g);
		if (g->exited && !group_left(g))
			break;
		if (stop_asked && !lost && !g->exited) {
			stop_asked = 0;
			if (suspend(cli, c, g->pgid)) {
				fprintf(stderr,
					"baton: worker: the claim of %s was lost while stopped; "
					"stopping the command\n",
					c->id);
				lost = 1;
				group_end(g, monotonic_ms(), grace);
			}
		}
		long long now = monotonic_ms();
		if (stop_signal && !lost) { /* each signal once: a second Ctrl-C is a second */
			if (!g->exited)
				kill(-g->pgid, stop_signal);
			else
				group_end(g, now, grace);
			stop_signal = 0;
		}
		if (g->exited && !lost && !g->ending && !said++)
			fprintf(
			    stderr,
			    "baton: worker: the command ended; processes of its group still run: "
			    "the claim of %s is kept until they end\n",
			    c->id);
		pump(r, 20);
		now = monotonic_ms();
		if (!lost && keep_claim(cli, c, now) == BEAT_LOST) {
			lost = 1;
			group_end(g, now, grace);
		}
		group_tick(g, now);
	}
	catch_tstp(0);
	return lost;
}

/* Runs one task claimed by a request sent at `sent`; 1 when it completed, 0 when not. */
static int run_task(struct cli *cli, const struct worker_opts *o, const json_t *task,
		    long long sent)
{
	struct claim c = {.id = jstr(task, "id", ""), .ttl = jint(task, "ttl_ms", o->ttl_ms)};
	claim_count_from(&c, sent);
	long long arrived = monotonic_ms();
	if (arrived >= c.next) {
		/* A late answer (a long poll that waited for its task): the server granted the
		 * claim some time after the send, so counting from the send may already say it
		 * is lost. Nothing runs before a heartbeat succeeds, and from then on the claim
		 * counts from that heartbeat's send; until then it is given two thirds of a ttl. */
		c.deadline = arrived + c.ttl - c.ttl / 3;
		c.next = arrived;
	}
	if (confirm_claim(cli, &c))
		return 0;
	char *in = json_dumps(task, JSON_COMPACT);
	struct run r = {.in = in, .in_len = in ? strlen(in) : 0};
	pid_t pid = spawn(o->command, task, &r);
	if (pid < 0) {
		free(in);
		json_t *b =
		    json_pack("{s:s, s:b}", "error", "cannot start the command", "retryable", 1);
		post_task(cli, c.id, "fail", b);
		json_decref(b);
		return 0;
	}
	struct group g = {.pgid = pid, .cont = 1};
	int lost = supervise(cli, &c, &r, &g);
	/* What it wrote before it ended; a process that left the group (setsid) and keeps
	 * the pipes open is not waited for past a second of silence. */
	for (int quiet = 0; (r.fd_out >= 0 || r.fd_err >= 0) && quiet < 10;) {
		size_t had = r.out.len + r.err.len;
		int fds = r.fd_out + r.fd_err;
		pump(&r, 100);
		quiet = r.out.len + r.err.len == had && r.fd_out + r.fd_err == fds ? quiet + 1 : 0;
	}
	int *fds[] = {&r.fd_in, &r.fd_out, &r.fd_err};
	for (size_t i = 0; i < 3; i++)
		if (*fds[i] >= 0)
			close(*fds[i]);
	free(in);
	int ok = 0;
	if (!lost) {
		json_t *body = outcome_body(g.ws, &r, &ok);
		if (post_task(cli, c.id, ok ? "complete" : "fail", body) != 200)
			ok = 0;
		json_decref(body);
	}
	sbuf_fini(&r.out);
	sbuf_fini(&r.err);
	return ok && !lost;
}

int cmd_worker(struct cli *cli, int argc, char **argv)
{
	struct worker_opts o;
	int rc = parse_args(argc, argv, &o);
	if (rc >= 0)
		return rc;
	struct sigaction sa = {.sa_handler = on_stop};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	sigaction(SIGQUIT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	/* the command's group is ours to reap, what it leaves behind included (group.c) */
	prctl(PR_SET_CHILD_SUBREAPER, 1);
	/* a claim answered to nobody is given back by the server; heartbeats, completions
	 * and failures sent twice are refused the second time (410), never applied twice */
	http_set_resend(cli->http, 1);
	long long deadline = monotonic_ms() + o.wait_ms; /* --once */
	/* Without --resource, each node has only the tasks of the resources it drives: the
	 * claims go round the servers, each long poll a share of CLAIM_WAIT. */
	size_t servers = http_server_count(cli->http);
	int round = !o.resource && servers > 1;
	/* Each claim carries a request_id, the same until it is answered: a claim whose answer
	 * was lost (the connection cut after it was sent, on each server) is asked again with
	 * it, and the server answers the claim it made, not a second one that would hold its
	 * step for nobody until the ttl runs out. */
	char rid[48];
	int fresh = 1;
	srandom((unsigned)(getpid() ^ monotonic_ms()));
	while (!stopping) {
		if (fresh)
			snprintf(rid, sizeof rid, "claim-%08lx%08lx", (unsigned long)random(),
				 (unsigned long)monotonic_ms());
		fresh = 0;
		long long wait = round ? CLAIM_WAIT / (long long)servers : CLAIM_WAIT,
			  left = deadline - monotonic_ms();
		if (o.once && left < wait)
			wait = left > 0 ? left : 0;
		json_t *body =
		    json_pack("{s:s, s:I, s:I, s:s}", "worker", o.worker, "wait_ms",
			      (json_int_t)wait, "ttl_ms", (json_int_t)o.ttl_ms, "request_id", rid);
		if (o.resource)
			json_object_set_new(body, "resource", json_string(o.resource));
		struct http_reply r;
		http_set_timeout(cli->http, CLAIM_WAIT + 30000);
		http_set_abort(cli->http, &stopping); /* an idle worker stops at once */
		long long sent = monotonic_ms();
		rc = http_request(cli->http, "POST", "/tasks/claim", body, &r);
		http_set_abort(cli->http, NULL);
		http_set_timeout(cli->http, 0);
		json_decref(body);
		if (rc == EXIT_UNREACHABLE) {
			if (stopping)
				break; /* the poll was ended: a claim answered to nobody is given
					  back */
			if (o.once && monotonic_ms() >= deadline)
				return rc;
			for (int k = 0; k < 50 && !stopping; k++)
				sleep_ms(20);
			if (servers > 1) /* again, same request_id, from the next server on */
				http_next_server(cli->http);
			continue;
		}
		if (rc)
			return rc;
		if (r.status == 204) {
			fresh = 1;
			http_reply_fini(&r);
			if (round)
				http_next_server(cli->http);
			if (o.once && monotonic_ms() >= deadline) {
				fprintf(stderr, "baton: worker: no task for %s within --wait\n",
					o.worker);
				return EXIT_NOT_ACQUIRED;
			}
			continue;
		}
		if (r.status != 200) {
			fprintf(stderr, "baton: worker: claim: HTTP %ld: %s\n", r.status,
				jstr(r.body, "detail", ""));
			http_reply_fini(&r);
			if (r.status >= 500 && !(o.once && monotonic_ms() >= deadline)) {
				for (int k = 0; k < 50 && !stopping; k++)
					sleep_ms(20);
				continue;
			}
			return EXIT_FAILED;
		}
		fresh = 1;
		int done = run_task(cli, &o, r.body, sent);
		http_reply_fini(&r);
		if (o.once)
			return done ? EXIT_OK : EXIT_FAILED;
	}
	return EXIT_OK;
}
