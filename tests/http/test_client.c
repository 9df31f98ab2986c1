/*
 * test_client.c - the command-line client `baton`, run as a real process against a real
 * batond: `watch` (live lines through a pipe, plain output, exit codes for completed,
 * failed, cancelled, unknown and unreachable, usage errors, --json lines, reconnection
 * across a batond restart without a duplicate or a gap, the progress bar and the retry
 * countdown on a pseudo-terminal, and against a scripted server the SSE parsing of
 * frames cut at every byte and the resume with Last-Event-ID) and the basic output and
 * exit codes of get, list, cancel and resources, with --server and BATON_URL.
 *
 * Each test that needs a server starts its own batond (harness.h). The client binary
 * comes from $BATON_CLIENT; its stdout and stderr are read incrementally through pipes
 * (or stdout through a pty) from the test's own thread, with poll and a deadline, so a
 * test can act when a given line has arrived and while the client still runs.
 * $BATON_CLIENT_WRAPPER, when set, prefixes the client's command line (split at
 * spaces), e.g. "valgrind -q --leak-check=full --error-exitcode=99".
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "../harness/harness.h"

#define WAIT_MS	  60000 /* a client run, a workflow: generous for valgrind and loaded CI */
#define MAX_ARGS  32
#define MAX_PROCS 4

extern char **environ;

/* ---- the client as a child process --------------------------------------------------- */

typedef struct text {
	char *p; /* NUL-terminated, "" when nothing arrived */
	size_t len;
} text;

typedef struct proc {
	pid_t pid;    /* 0 once reaped */
	int out, err; /* read ends; -1 at end of file */
	text o, e;
	int status; /* exit code once reaped; 128 + signal; -1 before */
	bool used;
} proc;

/*
 * The children, outside the tests' stack frames: a failed assertion leaves its test
 * with a longjmp, and teardown must still kill, reap and free what it started.
 */
static proc procs[MAX_PROCS];

static void text_add(text *t, const char *p, size_t n)
{
	char *b = realloc(t->p, t->len + n + 1);
	assert_non_null(b);
	memcpy(b + t->len, p, n);
	t->p = b;
	t->len += n;
	t->p[t->len] = '\0';
}

/* "http://127.0.0.1:PORT" of the server (a static buffer). */
static const char *url_of(const hs_server *s)
{
	static char url[64];
	snprintf(url, sizeof url, "http://127.0.0.1:%d", hs_port(s));
	return url;
}

/* A port of 127.0.0.1 on which nothing listens (bound, then closed). */
static int closed_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof a;
	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	close(fd);
	return ntohs(a.sin_port);
}

/*
 * The environment of the client: the test's, without BATON_URL and proxies (the client
 * must reach 127.0.0.1 directly), plus BATON_URL=baton_url when it is not NULL.
 */
static char **client_env(const char *baton_url)
{
	static const char *const drop[] = {
	    "BATON_URL=",   "http_proxy=", "HTTP_PROXY=", "https_proxy=",
	    "HTTPS_PROXY=", "all_proxy=",  "ALL_PROXY=",  NULL};
	size_t n = 0;
	while (environ[n])
		n++;
	char **env = calloc(n + 2, sizeof *env);
	size_t k = 0;
	assert_non_null(env);
	for (size_t i = 0; i < n; i++) {
		int keep = 1;
		for (size_t d = 0; drop[d]; d++)
			keep &= strncmp(environ[i], drop[d], strlen(drop[d])) != 0;
		if (keep)
			env[k++] = strdup(environ[i]);
	}
	if (baton_url && asprintf(&env[k], "BATON_URL=%s", baton_url) >= 0)
		k++;
	env[k] = NULL;
	return env;
}

static void env_free(char **env)
{
	for (size_t i = 0; env[i]; i++)
		free(env[i]);
	free(env);
}

/* argv: $BATON_CLIENT_WRAPPER words, $BATON_CLIENT, then args. Words are strdup'ed. */
static void client_argv(const char *const *args, char **argv)
{
	const char *bin = getenv("BATON_CLIENT");
	const char *wrap = getenv("BATON_CLIENT_WRAPPER");
	size_t n = 0;
	if (!bin || !*bin)
		fail_msg("set BATON_CLIENT to the absolute path of client/baton");
	if (wrap && *wrap) {
		char *copy = strdup(wrap), *save = NULL;
		for (char *w = strtok_r(copy, " ", &save); w && n < MAX_ARGS / 2;
		     w = strtok_r(NULL, " ", &save))
			argv[n++] = strdup(w);
		free(copy);
	}
	argv[n++] = strdup(bin);
	for (size_t i = 0; args[i]; i++) {
		assert_true(n < MAX_ARGS - 1);
		argv[n++] = strdup(args[i]);
	}
	argv[n] = NULL;
}

/*
 * Starts the client with args (NULL-terminated). stdout is a pipe, or the slave of a
 * pseudo-terminal (raw: no output translation, 100 columns) when use_pty; stderr is a
 * pipe; stdin is /dev/null.
 */
static proc *spawn(const char *const *args, const char *baton_url, bool use_pty)
{
	char *argv[MAX_ARGS];
	int out[2], err[2];
	proc *p = NULL;

	for (size_t i = 0; i < MAX_PROCS && !p; i++)
		p = procs[i].used ? NULL : &procs[i];
	assert_non_null(p);
	memset(p, 0, sizeof *p);
	p->used = true;
	p->out = p->err = -1;
	p->status = -1;
	text_add(&p->o, "", 0);
	text_add(&p->e, "", 0);

	char **env = client_env(baton_url);
	int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
	client_argv(args, argv);
	assert_true(devnull >= 0);
	assert_int_equal(pipe2(err, O_CLOEXEC), 0);
	if (use_pty) {
		struct termios tio;
		struct winsize ws = {.ws_row = 40, .ws_col = 100};
		memset(&tio, 0, sizeof tio);
		cfmakeraw(&tio);
		assert_int_equal(openpty(&out[0], &out[1], NULL, &tio, &ws), 0);
		fcntl(out[0], F_SETFD, FD_CLOEXEC);
		fcntl(out[1], F_SETFD, FD_CLOEXEC);
	} else {
		assert_int_equal(pipe2(out, O_CLOEXEC), 0);
	}
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(devnull, STDIN_FILENO);
		dup2(out[1], STDOUT_FILENO);
		dup2(err[1], STDERR_FILENO);
		execvpe(argv[0], argv, env); /* the wrapper is looked up in PATH */
		dprintf(STDERR_FILENO, "cannot exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	close(devnull);
	close(out[1]);
	close(err[1]);
	for (size_t i = 0; argv[i]; i++)
		free(argv[i]);
	env_free(env);
	p->pid = pid;
	p->out = out[0];
	p->err = err[0];
	return p;
}

/* Reads what is available within timeout_ms. Returns false when both streams ended. */
static bool pump(proc *p, int timeout_ms)
{
	struct pollfd fds[2] = {{.fd = p->out, .events = POLLIN}, {.fd = p->err, .events = POLLIN}};
	if (p->out < 0 && p->err < 0)
		return false;
	if (poll(fds, 2, timeout_ms) < 0)
		return true; /* EINTR: try again */
	for (int i = 0; i < 2; i++) {
		int *fd = i == 0 ? &p->out : &p->err;
		if (*fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
			continue;
		char buf[8192];
		ssize_t n = read(*fd, buf, sizeof buf);
		if (n > 0) {
			text_add(i == 0 ? &p->o : &p->e, buf, (size_t)n);
		} else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
			close(*fd); /* end of file; EIO from a pty whose slave closed */
			*fd = -1;
		}
	}
	return p->out >= 0 || p->err >= 0;
}

/* Reads stdout until it holds needle; fails the test at the deadline or at EOF. */
static void read_until(proc *p, const char *needle)
{
	int64_t deadline = hs_mono_ms() + WAIT_MS;
	while (!strstr(p->o.p, needle)) {
		if (hs_mono_ms() > deadline || !pump(p, 100))
			fail_msg("the client's stdout has no \"%s\" (%s)\nstdout:\n%s\nstderr:\n%s",
				 needle, hs_mono_ms() > deadline ? "timeout" : "it ended", p->o.p,
				 p->e.p);
	}
}

/* Whether the child still runs (reaps it, recording its status, when it exited). */
static bool running(proc *p)
{
	int st;
	if (p->pid <= 0)
		return false;
	if (waitpid(p->pid, &st, WNOHANG) != p->pid)
		return true;
	p->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	p->pid = 0;
	return false;
}

/* Reads everything and reaps the child. Returns its exit code; fails at the deadline. */
static int finish(proc *p)
{
	int64_t deadline = hs_mono_ms() + WAIT_MS;
	while (pump(p, 100) || running(p)) {
		if (hs_mono_ms() > deadline) {
			kill(p->pid, SIGKILL);
			fail_msg("the client did not exit within %d ms\nstdout:\n%s\nstderr:\n%s",
				 WAIT_MS, p->o.p, p->e.p);
		}
	}
	return p->status;
}

/* Releases a child: kills and reaps it if it still runs, frees its buffers. */
static void proc_fini(proc *p)
{
	if (p->pid > 0) {
		kill(p->pid, SIGKILL);
		waitpid(p->pid, NULL, 0);
		p->pid = 0;
	}
	if (p->out >= 0)
		close(p->out);
	if (p->err >= 0)
		close(p->err);
	p->out = p->err = -1;
	free(p->o.p);
	free(p->e.p);
	p->o.p = p->e.p = NULL;
	p->used = false;
}

static void procs_fini(void)
{
	for (size_t i = 0; i < MAX_PROCS; i++) {
		if (procs[i].used)
			proc_fini(&procs[i]);
	}
}

/* Runs the client to its end and asserts its exit code; its output stays in the result. */
static proc *expect_exit(int code, const char *baton_url, const char *const *args)
{
	proc *p = spawn(args, baton_url, false);
	int rc = finish(p);
	if (rc != code) {
		fprintf(stderr, "args:");
		for (size_t i = 0; args[i]; i++)
			fprintf(stderr, " %s", args[i]);
		fail_msg("exit %d, expected %d\nstdout:\n%s\nstderr:\n%s", rc, code, p->o.p,
			 p->e.p);
	}
	return p;
}

/* ---- fixtures ------------------------------------------------------------------------ */

static int setup(void **state)
{
	hs_server *s = hs_open(NULL);
	*state = s;
	return s ? 0 : -1;
}

/*
 * A server on a fixed port, chosen free by binding 127.0.0.1:0 first: a restart keeps
 * it (the harness passes --listen 127.0.0.1:0, and the later --listen wins).
 */
static int setup_fixed_port(void **state)
{
	char listen[32];
	snprintf(listen, sizeof listen, "127.0.0.1:%d", closed_port());
	const char *const args[] = {"--listen", listen, NULL};
	hs_server *s = hs_open(args);
	*state = s;
	return s ? 0 : -1;
}

static int teardown(void **state)
{
	procs_fini();
	return hs_close(*state);
}

static int teardown_no_server(void **state)
{
	(void)state;
	procs_fini();
	return 0;
}

/* ---- workflows and output checks ----------------------------------------------------- */

/* Workers A, B (fails its first attempt, retried after retry_ms; holds the resource 400 ms
 * per attempt, time enough for a bar to show it), C on resource "gw". */
static void submit_retrying(const hs_server *s, const char *id, int retry_ms)
{
	json_t *body = json_pack("{s:s, s:s, s:[s, {s:s, s:i, s:i}, s], s:{s:i, s:f}}", "id", id,
				 "resource", "gw", "workers", "worker-A", "name", "worker-B",
				 "fail_attempts", 1, "work_ms", 400, "worker-C", "retry",
				 "initial_delay_ms", retry_ms, "backoff", 1.0);
	assert_non_null(body);
	json_decref(hs_create_workflow(s, body));
}

/* One worker that fails its first attempt and then waits ten minutes to retry
 * (max_delay_ms too: it caps the wait, at 30 s by default). */
static void submit_stuck(const hs_server *s, const char *id)
{
	json_t *body = json_pack("{s:s, s:s, s:[{s:s, s:i}], s:{s:i, s:i}}", "id", id, "resource",
				 "gw", "workers", "name", "worker-S", "fail_attempts", 1, "retry",
				 "initial_delay_ms", 600000, "max_delay_ms", 600000);
	assert_non_null(body);
	json_decref(hs_create_workflow(s, body));
}

/* The second word of each line of out (a watch line's event type), as a JSON array. */
static json_t *line_types(const char *out)
{
	json_t *types = json_array();
	for (const char *line = out; *line;) {
		const char *eol = strchr(line, '\n');
		size_t len = eol ? (size_t)(eol - line) : strlen(line);
		char time[64] = "", type[64] = "";
		char *copy = strndup(line, len);
		if (sscanf(copy, "%63s %63s", time, type) == 2)
			json_array_append_new(types, json_string(type));
		else
			json_array_append_new(types, json_string(""));
		free(copy);
		line += len + (eol ? 1 : 0);
	}
	return types;
}

/* The line of out that holds both a and b (a static copy), or fails the test. */
static const char *line_with(const char *out, const char *a, const char *b)
{
	static char found[1024];
	for (const char *line = out; *line;) {
		const char *eol = strchr(line, '\n');
		size_t len = eol ? (size_t)(eol - line) : strlen(line);
		snprintf(found, sizeof found, "%.*s", (int)len, line);
		if (strstr(found, a) && strstr(found, b))
			return found;
		line += len + (eol ? 1 : 0);
	}
	fail_msg("no line with \"%s\" and \"%s\" in:\n%s", a, b, out);
	return NULL;
}

/* Asserts one plain line per event of the workflow, in order, with its type. */
static void assert_one_line_per_event(const hs_server *s, const char *id, const char *out)
{
	json_t *events = hs_get_events(s, id);
	json_t *types = line_types(out);
	size_t i;
	json_t *ev;
	if (json_array_size(types) != json_array_size(events))
		fail_msg("%zu lines for %zu events:\n%s", json_array_size(types),
			 json_array_size(events), out);
	json_array_foreach(events, i, ev)
	{
		assert_string_equal(json_string_value(json_array_get(types, i)),
				    hs_str(ev, "type"));
	}
	json_decref(types);
	json_decref(events);
}

/* Asserts that --json output is one event object per line, exactly the workflow's events. */
static void assert_json_lines_are_events(const hs_server *s, const char *id, const char *out)
{
	json_t *events = hs_get_events(s, id);
	size_t n = 0;
	json_int_t prev = -1;
	for (const char *line = out; *line; n++) {
		const char *eol = strchr(line, '\n');
		json_error_t err;
		assert_non_null(eol); /* every line ends */
		json_t *ev = json_loadb(line, (size_t)(eol - line), 0, &err);
		if (!json_is_object(ev))
			fail_msg("line %zu is not a JSON object (%s): %.*s", n + 1, err.text,
				 (int)(eol - line), line);
		json_int_t seq = hs_int(ev, "seq");
		if (seq <= prev)
			fail_msg("seq %lld after %lld: repeated or out of order\n%s",
				 (long long)seq, (long long)prev, out);
		prev = seq;
		json_t *want = json_array_get(events, n);
		if (!want)
			fail_msg("more lines than the %zu events:\n%s", json_array_size(events),
				 out);
		assert_int_equal(seq, hs_int(want, "seq")); /* none missed */
		assert_string_equal(hs_str(ev, "type"), hs_str(want, "type"));
		assert_string_equal(hs_str(ev, "workflow_id"), id);
		json_decref(ev);
		line = eol + 1;
	}
	assert_int_equal(n, json_array_size(events));
	json_decref(events);
}

static void assert_no_escape_codes(const char *out)
{
	if (strchr(out, '\033') || strchr(out, '\r'))
		fail_msg("escape codes or CR in output that is not a terminal:\n%s", out);
}

/* ---- watch ------------------------------------------------------------------------- */

/* Lines arrive while the workflow runs, one per event, plain through a pipe; exit 0. */
static void test_watch_live_lines_and_exit_0(void **state)
{
	hs_server *s = *state;
	proc *p;
	submit_retrying(s, "live", 3000);
	const char *const args[] = {"--server", url_of(s), "watch", "live", NULL};
	p = spawn(args, NULL, false);

	/* worker-B failed and waits 3 s to retry: its line must be out before the end. */
	read_until(p, "step_failed");
	json_t *wf = hs_get_workflow(s, "live");
	assert_string_equal(hs_str(wf, "status"), "running");
	assert_true(hs_int(wf, "steps_completed") < hs_int(wf, "steps_total"));
	json_decref(wf);
	assert_null(strstr(p->o.p, "workflow_completed"));
	assert_true(running(p));

	assert_int_equal(finish(p), 0);
	assert_no_escape_codes(p->o.p);
	assert_one_line_per_event(s, "live", p->o.p);
	/* The fields of the lines: worker, attempt, token, duration, error and retry. */
	json_t *events = hs_get_events(s, "live");
	json_t *grant = hs_event_find(events, "lock_acquired", 1, 2);
	char token[32];
	assert_non_null(grant);
	snprintf(token, sizeof token, "token %lld", (long long)hs_int(grant, "fencing_token"));
	line_with(p->o.p, "lock_acquired", token);
	assert_non_null(strstr(line_with(p->o.p, "lock_acquired", token), "attempt 2"));
	const char *failed = line_with(p->o.p, "step_failed", "worker-B");
	assert_non_null(strstr(failed, "attempt 1"));
	assert_non_null(strstr(failed, "error: "));
	assert_non_null(strstr(failed, "retry in 3s"));
	assert_non_null(strstr(line_with(p->o.p, "step_completed", "worker-C"), "ms"));
	line_with(p->o.p, "workflow_completed", "3 steps processed");
	json_decref(events);
	proc_fini(p);
}

/* A workflow that fails (no retries) exits 1, with its error. */
static void test_watch_failed_exits_1(void **state)
{
	hs_server *s = *state;
	proc *p;
	json_t *body = json_pack("{s:s, s:s, s:[{s:s, s:i}], s:{s:i}}", "id", "bad", "resource",
				 "gw", "workers", "name", "worker-F", "fail_attempts", 1, "retry",
				 "max_attempts", 1);
	json_decref(hs_create_workflow(s, body));
	const char *const args[] = {"--server", url_of(s), "watch", "bad", NULL};
	p = expect_exit(1, NULL, args);
	line_with(p->o.p, "step_failed", "no retries left");
	line_with(p->o.p, "workflow_failed", "error: ");
	assert_one_line_per_event(s, "bad", p->o.p);
	proc_fini(p);
}

/* watch waits while the workflow waits; a cancel ends it with exit 1. */
static void test_watch_cancelled_exits_1(void **state)
{
	hs_server *s = *state;
	proc *p;
	hs_response r;
	submit_stuck(s, "stop");
	const char *const args[] = {"--server", url_of(s), "watch", "stop", NULL};
	p = spawn(args, NULL, false);
	read_until(p, "step_failed");
	json_decref(hs_wait_step(s, "stop", 0, "retrying", WAIT_MS));
	assert_true(running(p)); /* the workflow is not over: neither is watch */

	assert_int_equal(hs_post(s, "/workflows/stop/cancel", NULL, &r), 0);
	assert_int_equal(r.status, 200);
	hs_response_fini(&r);
	assert_int_equal(finish(p), 1);
	line_with(p->o.p, "workflow_cancelled", "");
	assert_one_line_per_event(s, "stop", p->o.p);
	proc_fini(p);
}

/* 404 for an unknown workflow: exit 1 and the server's reason. */
static void test_watch_unknown_workflow_exits_1(void **state)
{
	hs_server *s = *state;
	proc *p;
	const char *const args[] = {"--server", url_of(s), "watch", "no-such-id", NULL};
	p = expect_exit(1, NULL, args);
	assert_non_null(strstr(p->e.p, "404"));
	assert_string_equal(p->o.p, "");
	proc_fini(p);
}

/* --json: one JSON object per line, exactly the workflow's events in order. */
static void test_watch_json_lines(void **state)
{
	hs_server *s = *state;
	proc *p;
	submit_retrying(s, "js", 500);
	const char *const args[] = {"--server", url_of(s), "--json", "watch", "js", NULL};
	p = expect_exit(0, NULL, args);
	assert_no_escape_codes(p->o.p);
	assert_json_lines_are_events(s, "js", p->o.p);
	proc_fini(p);
}

/* Nothing listens: exit 3, through --server and through BATON_URL, for every command. */
static void test_unreachable_exits_3(void **state)
{
	(void)state;
	char url[64];
	proc *p;
	snprintf(url, sizeof url, "http://127.0.0.1:%d", closed_port());
	const char *const cmds[][3] = {{"watch", "x", NULL},
				       {"get", "x", NULL},
				       {"list", NULL, NULL},
				       {"cancel", "x", NULL},
				       {"resources", NULL, NULL}};
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
		const char *const flag[] = {"--server", url, cmds[i][0], cmds[i][1], NULL};
		int64_t t0 = hs_mono_ms();
		p = expect_exit(3, NULL, flag);
		assert_non_null(strstr(p->e.p, "unreachable"));
		assert_true(hs_mono_ms() - t0 < WAIT_MS / 2); /* at once, not after retries */
		proc_fini(p);
		const char *const env[] = {cmds[i][0], cmds[i][1], NULL};
		p = expect_exit(3, url, env);
		proc_fini(p);
	}
}

/* Bad command lines exit 2 with the usage, before any request (the URL is dead). */
static void test_usage_errors_exit_2(void **state)
{
	(void)state;
	char url[64];
	proc *p;
	snprintf(url, sizeof url, "http://127.0.0.1:%d", closed_port());
	const char *const cases[][4] = {
	    {"watch", NULL},	     {"watch", "a", "b", NULL}, {"watch", "--bogus", "x", NULL},
	    {"get", NULL},	     {"cancel", NULL},		{"cancel", "a", "b", NULL},
	    {"list", "extra", NULL}, {"list", "--bogus", NULL}, {"resources", "a", "b", NULL},
	    {"frobnicate", NULL},    {"--bogus", "list", NULL}, {NULL},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		const char *args[8] = {"--server", url};
		for (size_t k = 0; k < 4 && cases[i][k]; k++)
			args[2 + k] = cases[i][k];
		p = expect_exit(2, NULL, args);
		assert_non_null(strstr(p->e.p, "usage: baton"));
		proc_fini(p);
	}
	const char *const help[] = {"--help", NULL};
	p = expect_exit(0, NULL, help);
	assert_non_null(strstr(p->o.p, "watch ID"));
	proc_fini(p);
}

/* SIGKILL and restart of batond mid-workflow: both watchers reconnect, no line twice. */
static void test_watch_survives_restart(void **state)
{
	hs_server *s = *state;
	proc *plain, *json;
	int port = hs_port(s);
	char url[64];
	snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
	submit_retrying(s, "phoenix", 3000);
	const char *const a1[] = {"--server", url, "watch", "phoenix", NULL};
	const char *const a2[] = {"--server", url, "--json", "watch", "phoenix", NULL};
	plain = spawn(a1, NULL, false);
	json = spawn(a2, NULL, false);
	read_until(plain, "step_failed");
	read_until(json, "\"step_failed\"");

	hs_kill(s); /* worker-B waits to retry: the streams are open, mid-workflow */
	assert_int_equal(hs_start(s), 0);
	if (hs_port(s) != port)
		fail_msg("batond came back on port %d, not %d", hs_port(s), port);

	assert_int_equal(finish(plain), 0);
	assert_int_equal(finish(json), 0);
	assert_non_null(strstr(plain->e.p, "reconnecting")); /* the drop happened, and was seen */
	assert_non_null(strstr(json->e.p, "reconnecting"));
	assert_one_line_per_event(s, "phoenix", plain->o.p);
	assert_json_lines_are_events(s, "phoenix", json->o.p);
	proc_fini(plain);
	proc_fini(json);
}

/* Number of distinct "retry 2 in Ns" values in out. */
static int countdown_values(const char *out)
{
	int seen[64] = {0}, distinct = 0;
	for (const char *p = out; (p = strstr(p, "retry 2 in ")) != NULL; p++) {
		int secs;
		if (sscanf(p, "retry 2 in %ds", &secs) == 1 && secs >= 0 && secs < 64 &&
		    !seen[secs]) {
			seen[secs] = 1;
			distinct++;
		}
	}
	return distinct;
}

/* On a terminal: a bar redrawn in place, steps done/total, holder, a ticking countdown. */
static void test_watch_tty_progress_bar(void **state)
{
	hs_server *s = *state;
	proc *p;
	submit_retrying(s, "tty", 3000);
	const char *const args[] = {"--server", url_of(s), "watch", "tty", NULL};
	p = spawn(args, NULL, true);
	assert_int_equal(finish(p), 0);

	const char *out = p->o.p;
	assert_non_null(strstr(out, "\r\033[K["));   /* drawn in place */
	assert_non_null(strstr(out, "] 1/3 steps")); /* steps done / total */
	assert_non_null(strstr(out, "] 3/3 steps  completed\n"));
	assert_non_null(strstr(out, " holds gw (token ")); /* holder and token */
	if (countdown_values(out) < 2)			   /* 3 s: "in 3s", "in 2s", "in 1s" */
		fail_msg("the retry countdown did not tick:\n%s", out);
	assert_non_null(strstr(out, "step_failed")); /* the event lines are there too */
	assert_null(strchr(p->e.p, '\033'));

	/* --json on a terminal stays plain JSON lines: no bar. */
	proc_fini(p);
	const char *const jargs[] = {"--server", url_of(s), "--json", "watch", "tty", NULL};
	p = spawn(jargs, NULL, true);
	assert_int_equal(finish(p), 0);
	assert_null(strchr(p->o.p, '\033'));
	assert_json_lines_are_events(s, "tty", p->o.p);
	proc_fini(p);
}

/* ---- watch against a scripted server ------------------------------------------------ */

/*
 * A one-thread HTTP server that plays a scripted event stream, so that the client's
 * parser meets what batond never sends all at once: frames cut at every byte, CRLF line
 * ends, comments, a data field split over two lines, a connection closed mid-frame and
 * an event sent again after the reconnection. It records each request's head.
 */
typedef struct fake {
	int lfd, port;
	char req[2][4096]; /* the heads of the two requests */
	pthread_t thread;
} fake;

#define FAKE_HEAD                                                                                  \
	"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"        \
	"Connection: close\r\n\r\n"
#define EV(seq, type, rest)                                                                        \
	"id: " #seq "\r\nevent: " type "\r\ndata: {\"seq\":" #seq                                  \
	",\"ts\":\"2026-11-30T05:40:00.00" #seq "Z\",\"type\":\"" type                             \
	"\",\"workflow_id\":\"fake\"" rest "}\r\n\r\n"
#define STEP ",\"step\":0,\"worker\":\"worker-Z\",\"attempt\":1"

/* Events 1..3 (2 with its data over two lines), then event 4 cut short. */
static const char FIRST[] =
    "retry: 1000\r\n\r\n"
    ": a comment\r\n\r\n" EV(
	1, "workflow_submitted",
	",\"resource\":\"gw\",\"steps_total\":1") "id: 2\r\nevent: lock_acquired\r\ndata: "
						  "{\"seq\":2,\"ts\":\"2026-11-30T05:40:00.002Z\","
						  "\"type\":\"lock_acquired\",\"workflow_id\":"
						  "\"fake\"" STEP "\r\ndata: "
						  ",\"fencing_token\":9,\"waited_ms\":0}"
						  "\r\n\r\n" EV(
						      3, "step_completed",
						      STEP
						      ",\"duration_ms\":5") "id: 4\r\nevent: "
									    "lock_released\r\ndata:"
									    " {\"seq\":4,";
/* Event 3 again (the client must skip it), then 4 and the final 5. */
static const char SECOND[] = EV(3, "step_completed", STEP ",\"duration_ms\":5")
    EV(4, "lock_released", STEP ",\"fencing_token\":9,\"hold_ms\":5")
	EV(5, "workflow_completed", ",\"result\":{\"workersProcessed\":1,\"totalMs\":5}");

static void read_head(int fd, char *head, size_t cap)
{
	size_t n = 0;
	while (n + 1 < cap && !strstr(head, "\r\n\r\n")) {
		ssize_t got = read(fd, head + n, 1);
		if (got <= 0)
			break;
		n += (size_t)got;
		head[n] = '\0';
	}
}

static void *fake_main(void *arg)
{
	fake *f = arg;
	for (int i = 0; i < 2; i++) {
		int fd = accept(f->lfd, NULL, NULL);
		if (fd < 0)
			break;
		int one = 1;
		struct timeval tv = {WAIT_MS / 1000, 0};
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
		read_head(fd, f->req[i], sizeof f->req[i]);
		if (write(fd, FAKE_HEAD, strlen(FAKE_HEAD)) < 0)
			break;
		const char *body = i == 0 ? FIRST : SECOND;
		for (size_t k = 0; body[k]; k++) { /* one byte per segment */
			if (write(fd, body + k, 1) != 1)
				break;
			struct timespec pause = {0, 500000};
			nanosleep(&pause, NULL);
		}
		close(fd);
	}
	return NULL;
}

static void fake_start(fake *f)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof a;
	memset(f, 0, sizeof *f);
	f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(f->lfd >= 0);
	assert_int_equal(bind(f->lfd, (struct sockaddr *)&a, sizeof a), 0);
	assert_int_equal(listen(f->lfd, 4), 0);
	/* accept and read give up after WAIT_MS: a client that never comes back fails the
	 * test instead of hanging it in pthread_join. */
	struct timeval tv = {WAIT_MS / 1000, 0};
	setsockopt(f->lfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	assert_int_equal(getsockname(f->lfd, (struct sockaddr *)&a, &len), 0);
	f->port = ntohs(a.sin_port);
	assert_int_equal(pthread_create(&f->thread, NULL, fake_main, f), 0);
}

/* Frames cut anywhere, CRLF, comments, two data lines; resume with Last-Event-ID. */
static void test_watch_parses_split_frames_and_resumes(void **state)
{
	(void)state;
	fake f;
	char url[64];
	fake_start(&f);
	snprintf(url, sizeof url, "http://127.0.0.1:%d", f.port);
	const char *const args[] = {"--server", url, "watch", "fake", NULL};
	proc *p = spawn(args, NULL, false);
	int rc = finish(p);
	pthread_join(f.thread, NULL);
	close(f.lfd);
	if (rc != 0)
		fail_msg("exit %d\nstdout:\n%s\nstderr:\n%s", rc, p->o.p, p->e.p);

	assert_non_null(strstr(f.req[0], "GET /workflows/fake/events HTTP/1.1\r\n"));
	assert_non_null(strstr(f.req[0], "Accept: text/event-stream\r\n"));
	assert_null(strstr(f.req[0], "Last-Event-ID"));
	assert_non_null(strstr(f.req[1], "Last-Event-ID: 3\r\n"));
	json_t *types = line_types(p->o.p);
	json_t *want = json_pack("[s, s, s, s, s]", "workflow_submitted", "lock_acquired",
				 "step_completed", "lock_released", "workflow_completed");
	if (!json_equal(types, want))
		fail_msg("lines:\n%s", p->o.p);
	json_decref(types);
	json_decref(want);
	line_with(p->o.p, "lock_acquired", "worker-Z    attempt 1  token 9  waited 0ms");
	line_with(p->o.p, "05:40:00.003  step_completed", "5ms");
	assert_non_null(strstr(p->e.p, "reconnecting"));
	proc_fini(p);
}

/* ---- get, list, cancel, resources -------------------------------------------------- */

static json_t *parse_stdout(const proc *p)
{
	json_error_t err;
	json_t *doc = json_loads(p->o.p, 0, &err);
	if (!doc)
		fail_msg("stdout is not JSON (%s):\n%s", err.text, p->o.p);
	return doc;
}

/* Whether the --json list page holds a workflow with this id. */
static bool page_has(const json_t *page, const char *id)
{
	size_t i;
	json_t *wf;
	json_array_foreach(json_object_get(page, "workflows"), i, wf)
	{
		if (strcmp(hs_str(wf, "id"), id) == 0)
			return true;
	}
	return false;
}

static void test_get_list_cancel_resources(void **state)
{
	hs_server *s = *state;
	const char *url = url_of(s);
	char dead[64];
	proc *p;
	json_t *body = json_pack("{s:s, s:s, s:[s, s]}", "id", "done", "resource", "gw", "workers",
				 "worker-A", "worker-B");
	json_decref(hs_create_workflow(s, body));
	json_decref(hs_wait_workflow(s, "done", "completed", WAIT_MS));
	submit_stuck(s, "stuck");
	json_decref(hs_wait_step(s, "stuck", 0, "retrying", WAIT_MS));

	/* get */
	const char *const get[] = {"--server", url, "get", "done", NULL};
	p = expect_exit(0, NULL, get);
	assert_non_null(strstr(p->o.p, "id        done\n"));
	assert_non_null(strstr(p->o.p, "completed, 2/2 steps completed"));
	assert_non_null(strstr(p->o.p, "worker-B"));
	proc_fini(p);
	const char *const get_json[] = {"--server", url, "--json", "get", "done", NULL};
	p = expect_exit(0, NULL, get_json);
	json_t *wf = parse_stdout(p);
	assert_string_equal(hs_str(wf, "id"), "done");
	assert_string_equal(hs_str(wf, "status"), "completed");
	json_decref(wf);
	proc_fini(p);
	const char *const get_404[] = {"--server", url, "get", "nope", NULL};
	p = expect_exit(1, NULL, get_404);
	assert_non_null(strstr(p->e.p, "404"));
	proc_fini(p);

	/* BATON_URL is used, and --server wins over it. */
	const char *const get_env[] = {"get", "done", NULL};
	p = expect_exit(0, url, get_env);
	proc_fini(p);
	snprintf(dead, sizeof dead, "http://127.0.0.1:%d", closed_port());
	p = expect_exit(0, dead, get);
	proc_fini(p);

	/* list */
	const char *const list[] = {"--server", url, "list", NULL};
	p = expect_exit(0, NULL, list);
	assert_non_null(strstr(p->o.p, "ID"));
	line_with(p->o.p, "done ", "completed");
	line_with(p->o.p, "stuck ", "running");
	proc_fini(p);
	const char *const list_json[] = {"--server", url,	  "--json", "list",
					 "--status", "completed", NULL};
	p = expect_exit(0, NULL, list_json);
	json_t *page = parse_stdout(p);
	assert_true(page_has(page, "done"));
	assert_false(page_has(page, "stuck"));
	json_decref(page);
	proc_fini(p);
	const char *const list_400[] = {"--server", url, "list", "--status", "bogus", NULL};
	p = expect_exit(1, NULL, list_400);
	assert_non_null(strstr(p->e.p, "400"));
	proc_fini(p);

	/* resources */
	const char *const res[] = {"--server", url, "resources", NULL};
	p = expect_exit(0, NULL, res);
	line_with(p->o.p, "gw", "");
	proc_fini(p);
	const char *const res_one[] = {"--server", url, "resources", "gw", NULL};
	p = expect_exit(0, NULL, res_one);
	assert_non_null(strstr(p->o.p, "name      gw\n"));
	proc_fini(p);
	const char *const res_json[] = {"--server", url, "--json", "resources", NULL};
	p = expect_exit(0, NULL, res_json);
	json_t *doc = parse_stdout(p);
	assert_string_equal(hs_str(json_array_get(json_object_get(doc, "resources"), 0), "name"),
			    "gw");
	json_decref(doc);
	proc_fini(p);
	const char *const res_404[] = {"--server", url, "resources", "nope", NULL};
	p = expect_exit(1, NULL, res_404);
	proc_fini(p);

	/* cancel */
	const char *const cancel[] = {"--server", url, "cancel", "stuck", NULL};
	p = expect_exit(0, NULL, cancel);
	assert_string_equal(p->o.p, "cancelled stuck\n");
	proc_fini(p);
	wf = hs_get_workflow(s, "stuck");
	assert_string_equal(hs_str(wf, "status"), "cancelled");
	json_decref(wf);
	const char *const cancel_409[] = {"--server", url, "cancel", "done", NULL};
	p = expect_exit(1, NULL, cancel_409);
	assert_non_null(strstr(p->e.p, "409"));
	proc_fini(p);
	const char *const cancel_404[] = {"--server", url, "cancel", "nope", NULL};
	p = expect_exit(1, NULL, cancel_404);
	proc_fini(p);
}

static int setup_token(void **state)
{
	static const char *const args[] = {"--token", "s3cret-token", NULL};
	hs_server *s = hs_open(args);
	*state = s;
	return s ? 0 : -1;
}

/* With a token on the server: health needs none, the rest needs --token or $BATON_TOKEN. */
static void test_token_and_health(void **state)
{
	hs_server *s = *state;
	const char *url = url_of(s);
	proc *p = expect_exit(0, url, (const char *const[]){"health", NULL});
	assert_non_null(strstr(p->o.p, "ok"));
	proc_fini(p);
	p = expect_exit(1, url, (const char *const[]){"list", NULL});
	assert_non_null(strstr(p->e.p, "401"));
	proc_fini(p);
	proc_fini(expect_exit(1, url, (const char *const[]){"--token", "wrong", "list", NULL}));
	proc_fini(
	    expect_exit(0, url, (const char *const[]){"--token", "s3cret-token", "list", NULL}));
	proc_fini(expect_exit(0, url,
			      (const char *const[]){"--token", "s3cret-token", "submit", "--id",
						    "tok-1", "--resource", "r", "a", NULL}));
	proc_fini(expect_exit(
	    0, url, (const char *const[]){"--token", "s3cret-token", "watch", "tok-1", NULL}));
	/* $BATON_TOKEN, as a container would set it. */
	setenv("BATON_TOKEN", "s3cret-token", 1);
	p = spawn((const char *const[]){"list", NULL}, url, false);
	unsetenv("BATON_TOKEN");
	assert_int_equal(finish(p), 0);
	proc_fini(p);
	char closed[32];
	snprintf(closed, sizeof closed, "http://127.0.0.1:%d", closed_port());
	proc_fini(expect_exit(3, closed, (const char *const[]){"health", NULL}));
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_token_and_health, setup_token, teardown),
	    cmocka_unit_test_setup_teardown(test_watch_live_lines_and_exit_0, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_watch_failed_exits_1, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_watch_cancelled_exits_1, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_watch_unknown_workflow_exits_1, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_watch_json_lines, setup, teardown),
	    cmocka_unit_test_teardown(test_unreachable_exits_3, teardown_no_server),
	    cmocka_unit_test_teardown(test_usage_errors_exit_2, teardown_no_server),
	    cmocka_unit_test_setup_teardown(test_watch_survives_restart, setup_fixed_port,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_watch_tty_progress_bar, setup, teardown),
	    cmocka_unit_test_teardown(test_watch_parses_split_frames_and_resumes,
				      teardown_no_server),
	    cmocka_unit_test_setup_teardown(test_get_list_cancel_resources, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
