/*
 * test_client.c - the command-line client `baton`, run as a real process against a real
 * batond: `watch` (live lines through a pipe, plain output, exit codes for completed,
 * failed, cancelled, unknown and unreachable, usage errors, --json lines, reconnection
 * across a batond restart without a duplicate or a gap, the progress bar and the retry
 * countdown on a pseudo-terminal, and against a scripted server the SSE parsing of
 * frames cut at every byte and the resume with Last-Event-ID) and the basic output and
 * exit codes of get, list, cancel and resources, with --server and BATON_URL; options
 * before or after the command and --json for every command, one-line usage errors,
 * tables aligned by display width with non-ASCII worker names, and exit status 4 for a
 * workflow that completed with failed steps.
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

#include "../harness/client.h"

#define WAIT_MS 60000 /* a client run, a workflow: generous for valgrind and loaded CI */

/* ---- fixtures ------------------------------------------------------------------------ */

/*
 * A server on a fixed port, chosen free by binding 127.0.0.1:0 first: a restart keeps
 * it (the harness passes --listen 127.0.0.1:0, and the later --listen wins).
 */
static int setup_fixed_port(void **state)
{
	char listen[32];
	snprintf(listen, sizeof listen, "127.0.0.1:%d", client_closed_port());
	const char *const args[] = {"--listen", listen, NULL};
	hs_server *s = hs_open(args);
	*state = s;
	return s ? 0 : -1;
}

static int teardown(void **state)
{
	client_free_all();
	return hs_close(*state);
}

static int teardown_no_server(void **state)
{
	(void)state;
	client_free_all();
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
				 "first_retry_ms", retry_ms, "backoff", 1.0);
	assert_non_null(body);
	json_decref(hs_create_workflow(s, body));
}

/* One worker that fails its first attempt and then waits ten minutes to retry
 * (max_delay_ms too: it caps the wait, at 30 s by default). */
static void submit_stuck(const hs_server *s, const char *id)
{
	json_t *body = json_pack("{s:s, s:s, s:[{s:s, s:i}], s:{s:i, s:i}}", "id", id, "resource",
				 "gw", "workers", "name", "worker-S", "fail_attempts", 1, "retry",
				 "first_retry_ms", 600000, "max_delay_ms", 600000);
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
	client_proc *p;
	submit_retrying(s, "live", 3000);
	const char *const args[] = {"--server", client_url_of(s), "watch", "live", NULL};
	p = client_spawn(args, NULL, false);

	/* worker-B failed and waits 3 s to retry: its line must be out before the end. */
	client_read_until(p, "step_failed");
	json_t *wf = hs_get_workflow(s, "live");
	assert_string_equal(hs_str(wf, "status"), "running");
	assert_true(hs_int(wf, "steps_completed") < hs_int(wf, "steps_total"));
	json_decref(wf);
	assert_null(strstr(p->o.p, "workflow_completed"));
	assert_true(client_running(p));

	assert_int_equal(client_finish(p), 0);
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
	client_free(p);
}

/* A workflow that fails (no retries) exits 1, with its error. */
static void test_watch_failed_exits_1(void **state)
{
	hs_server *s = *state;
	client_proc *p;
	json_t *body = json_pack("{s:s, s:s, s:[{s:s, s:i}], s:{s:i}}", "id", "bad", "resource",
				 "gw", "workers", "name", "worker-F", "fail_attempts", 1, "retry",
				 "max_attempts", 1);
	json_decref(hs_create_workflow(s, body));
	const char *const args[] = {"--server", client_url_of(s), "watch", "bad", NULL};
	p = client_expect_exit(1, NULL, args);
	line_with(p->o.p, "step_failed", "no retries left");
	line_with(p->o.p, "workflow_failed", "error: ");
	assert_one_line_per_event(s, "bad", p->o.p);
	client_free(p);
}

/* watch waits while the workflow waits; a cancel ends it with exit 1. */
static void test_watch_cancelled_exits_1(void **state)
{
	hs_server *s = *state;
	client_proc *p;
	hs_response r;
	submit_stuck(s, "stop");
	const char *const args[] = {"--server", client_url_of(s), "watch", "stop", NULL};
	p = client_spawn(args, NULL, false);
	client_read_until(p, "step_failed");
	json_decref(hs_wait_step(s, "stop", 0, "retrying", WAIT_MS));
	assert_true(client_running(p)); /* the workflow is not over: neither is watch */

	assert_int_equal(hs_post(s, "/workflows/stop/cancel", NULL, &r), 0);
	assert_int_equal(r.status, 200);
	hs_response_fini(&r);
	assert_int_equal(client_finish(p), 1);
	line_with(p->o.p, "workflow_cancelled", "");
	assert_one_line_per_event(s, "stop", p->o.p);
	client_free(p);
}

/* 404 for an unknown workflow: exit 1 and the server's reason. */
static void test_watch_unknown_workflow_exits_1(void **state)
{
	hs_server *s = *state;
	client_proc *p;
	const char *const args[] = {"--server", client_url_of(s), "watch", "no-such-id", NULL};
	p = client_expect_exit(1, NULL, args);
	assert_non_null(strstr(p->e.p, "404"));
	assert_string_equal(p->o.p, "");
	client_free(p);
}

/* --json: one JSON object per line, exactly the workflow's events in order. */
static void test_watch_json_lines(void **state)
{
	hs_server *s = *state;
	client_proc *p;
	submit_retrying(s, "js", 500);
	const char *const args[] = {"--server", client_url_of(s), "--json", "watch", "js", NULL};
	p = client_expect_exit(0, NULL, args);
	assert_no_escape_codes(p->o.p);
	assert_json_lines_are_events(s, "js", p->o.p);
	client_free(p);
}

/* Nothing listens: exit 3, through --server and through BATON_URL, for every command. */
static void test_unreachable_exits_3(void **state)
{
	(void)state;
	char url[64];
	client_proc *p;
	snprintf(url, sizeof url, "http://127.0.0.1:%d", client_closed_port());
	const char *const cmds[][3] = {{"watch", "x", NULL},
				       {"get", "x", NULL},
				       {"list", NULL, NULL},
				       {"cancel", "x", NULL},
				       {"resources", NULL, NULL}};
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
		const char *const flag[] = {"--server", url, cmds[i][0], cmds[i][1], NULL};
		p = client_expect_exit(3, NULL, flag);
		assert_non_null(strstr(p->e.p, "unreachable"));
		/* at once, not after retries: it says so when it retries */
		if (strstr(p->e.p, "reconnecting"))
			fail_msg("%s retried an unreachable server:\n%s", cmds[i][0], p->e.p);
		client_free(p);
		const char *const env[] = {cmds[i][0], cmds[i][1], NULL};
		p = client_expect_exit(3, url, env);
		client_free(p);
	}
}

/* Bad command lines exit 2 with the usage, before any request (the URL is dead). */
static void test_usage_errors_exit_2(void **state)
{
	(void)state;
	char url[64];
	client_proc *p;
	snprintf(url, sizeof url, "http://127.0.0.1:%d", client_closed_port());
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
		p = client_expect_exit(2, NULL, args);
		/* One line that says what is wrong, one hint; not the whole help. */
		const char *hint = "Try 'baton --help' for more information.\n";
		const char *nl = strchr(p->e.p, '\n');
		if (strncmp(p->e.p, "baton: ", 7) != 0 || !nl || strcmp(nl + 1, hint) != 0)
			fail_msg("stderr of a usage error:\n%s", p->e.p);
		assert_string_equal(p->o.p, "");
		client_free(p);
	}
	const char *const help[] = {"--help", NULL};
	p = client_expect_exit(0, NULL, help);
	assert_non_null(strstr(p->o.p, "watch ID"));
	client_free(p);
}

/* SIGKILL and restart of batond mid-workflow: both watchers reconnect, no line twice. */
static void test_watch_survives_restart(void **state)
{
	hs_server *s = *state;
	client_proc *plain, *json;
	int port = hs_port(s);
	char url[64];
	snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
	submit_retrying(s, "phoenix", 3000);
	const char *const a1[] = {"--server", url, "watch", "phoenix", NULL};
	const char *const a2[] = {"--server", url, "--json", "watch", "phoenix", NULL};
	plain = client_spawn(a1, NULL, false);
	json = client_spawn(a2, NULL, false);
	client_read_until(plain, "step_failed");
	client_read_until(json, "\"step_failed\"");

	hs_kill(s); /* worker-B waits to retry: the streams are open, mid-workflow */
	assert_int_equal(hs_start(s), 0);
	if (hs_port(s) != port)
		fail_msg("batond came back on port %d, not %d", hs_port(s), port);

	assert_int_equal(client_finish(plain), 0);
	assert_int_equal(client_finish(json), 0);
	assert_non_null(strstr(plain->e.p, "reconnecting")); /* the drop happened, and was seen */
	assert_non_null(strstr(json->e.p, "reconnecting"));
	assert_one_line_per_event(s, "phoenix", plain->o.p);
	assert_json_lines_are_events(s, "phoenix", json->o.p);
	client_free(plain);
	client_free(json);
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

/* On a terminal: a bar redrawn in place, steps done/total, holder, a ticking countdown.
 * The retry waits 10 s, so the countdown has whole seconds to tick even when the event
 * that starts it reaches the client late (batond under valgrind). */
static void test_watch_tty_progress_bar(void **state)
{
	hs_server *s = *state;
	client_proc *p;
	submit_retrying(s, "tty", 10000);
	const char *const args[] = {"--server", client_url_of(s), "watch", "tty", NULL};
	p = client_spawn(args, NULL, true);
	assert_int_equal(client_finish(p), 0);

	const char *out = p->o.p;
	assert_non_null(strstr(out, "\r\033[K["));   /* drawn in place */
	assert_non_null(strstr(out, "] 1/3 steps")); /* steps done / total */
	assert_non_null(strstr(out, "] 3/3 steps  completed\n"));
	assert_non_null(strstr(out, " holds gw (token ")); /* holder and token */
	if (countdown_values(out) < 2)			   /* "in 10s", "in 9s", ... */
		fail_msg("the retry countdown did not tick:\n%s", out);
	assert_non_null(strstr(out, "step_failed")); /* the event lines are there too */
	assert_null(strchr(p->e.p, '\033'));

	/* --json on a terminal stays plain JSON lines: no bar. */
	client_free(p);
	const char *const jargs[] = {"--server", client_url_of(s), "--json", "watch", "tty", NULL};
	p = client_spawn(jargs, NULL, true);
	assert_int_equal(client_finish(p), 0);
	assert_null(strchr(p->o.p, '\033'));
	assert_json_lines_are_events(s, "tty", p->o.p);
	client_free(p);
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
	client_proc *p = client_spawn(args, NULL, false);
	int rc = client_finish(p);
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
	client_free(p);
}

/* ---- get, list, cancel, resources -------------------------------------------------- */

static json_t *parse_stdout(const client_proc *p)
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
	const char *url = client_url_of(s);
	char dead[64];
	client_proc *p;
	json_t *body = json_pack("{s:s, s:s, s:[s, s]}", "id", "done", "resource", "gw", "workers",
				 "worker-A", "worker-B");
	json_decref(hs_create_workflow(s, body));
	json_decref(hs_wait_workflow(s, "done", "completed", WAIT_MS));
	submit_stuck(s, "stuck");
	json_decref(hs_wait_step(s, "stuck", 0, "retrying", WAIT_MS));

	/* get */
	const char *const get[] = {"--server", url, "get", "done", NULL};
	p = client_expect_exit(0, NULL, get);
	assert_non_null(strstr(p->o.p, "id        done\n"));
	assert_non_null(strstr(p->o.p, "completed, 2/2 steps completed"));
	assert_non_null(strstr(p->o.p, "worker-B"));
	client_free(p);
	const char *const get_json[] = {"--server", url, "--json", "get", "done", NULL};
	p = client_expect_exit(0, NULL, get_json);
	json_t *wf = parse_stdout(p);
	assert_string_equal(hs_str(wf, "id"), "done");
	assert_string_equal(hs_str(wf, "status"), "completed");
	json_decref(wf);
	client_free(p);
	const char *const get_404[] = {"--server", url, "get", "nope", NULL};
	p = client_expect_exit(1, NULL, get_404);
	assert_non_null(strstr(p->e.p, "404"));
	client_free(p);

	/* BATON_URL is used, and --server wins over it. */
	const char *const get_env[] = {"get", "done", NULL};
	p = client_expect_exit(0, url, get_env);
	client_free(p);
	snprintf(dead, sizeof dead, "http://127.0.0.1:%d", client_closed_port());
	p = client_expect_exit(0, dead, get);
	client_free(p);

	/* list */
	const char *const list[] = {"--server", url, "list", NULL};
	p = client_expect_exit(0, NULL, list);
	assert_non_null(strstr(p->o.p, "ID"));
	line_with(p->o.p, "done ", "completed");
	line_with(p->o.p, "stuck ", "running");
	client_free(p);
	const char *const list_json[] = {"--server", url,	  "--json", "list",
					 "--status", "completed", NULL};
	p = client_expect_exit(0, NULL, list_json);
	json_t *page = parse_stdout(p);
	assert_true(page_has(page, "done"));
	assert_false(page_has(page, "stuck"));
	json_decref(page);
	client_free(p);
	const char *const list_400[] = {"--server", url, "list", "--status", "bogus", NULL};
	p = client_expect_exit(1, NULL, list_400);
	assert_non_null(strstr(p->e.p, "400"));
	client_free(p);

	/* resources */
	const char *const res[] = {"--server", url, "resources", NULL};
	p = client_expect_exit(0, NULL, res);
	line_with(p->o.p, "gw", "");
	client_free(p);
	const char *const res_one[] = {"--server", url, "resources", "gw", NULL};
	p = client_expect_exit(0, NULL, res_one);
	assert_non_null(strstr(p->o.p, "name      gw\n"));
	client_free(p);
	const char *const res_json[] = {"--server", url, "--json", "resources", NULL};
	p = client_expect_exit(0, NULL, res_json);
	json_t *doc = parse_stdout(p);
	assert_string_equal(hs_str(json_array_get(json_object_get(doc, "resources"), 0), "name"),
			    "gw");
	json_decref(doc);
	client_free(p);
	const char *const res_404[] = {"--server", url, "resources", "nope", NULL};
	p = client_expect_exit(1, NULL, res_404);
	client_free(p);

	/* cancel */
	const char *const cancel[] = {"--server", url, "cancel", "stuck", NULL};
	p = client_expect_exit(0, NULL, cancel);
	assert_string_equal(p->o.p, "cancelled stuck\n");
	client_free(p);
	wf = hs_get_workflow(s, "stuck");
	assert_string_equal(hs_str(wf, "status"), "cancelled");
	json_decref(wf);
	const char *const cancel_409[] = {"--server", url, "cancel", "done", NULL};
	p = client_expect_exit(1, NULL, cancel_409);
	assert_non_null(strstr(p->e.p, "409"));
	client_free(p);
	const char *const cancel_404[] = {"--server", url, "cancel", "nope", NULL};
	p = client_expect_exit(1, NULL, cancel_404);
	client_free(p);
}

/* ---- options, alignment, exit statuses ---------------------------------------------- */

/* Global options work before and after the command; --json works for every command. */
static void test_options_before_or_after_command(void **state)
{
	hs_server *s = *state;
	const char *url = client_url_of(s);
	char dead[64];
	client_proc *p;
	snprintf(dead, sizeof dead, "http://127.0.0.1:%d", client_closed_port());
	json_t *body =
	    json_pack("{s:s, s:s, s:[s]}", "id", "opt", "resource", "gw", "workers", "worker-A");
	json_decref(hs_create_workflow(s, body));
	json_decref(hs_wait_workflow(s, "opt", "completed", WAIT_MS));

	/* --json and --server after the command and after its argument (BATON_URL is dead:
	 * the --server given after the command is the one used). */
	const char *const get_after[] = {"get", "opt", "--json", "--server", url, NULL};
	p = client_expect_exit(0, dead, get_after);
	json_t *wf = parse_stdout(p);
	assert_string_equal(hs_str(wf, "id"), "opt");
	json_decref(wf);
	client_free(p);
	const char *const get_eq[] = {"get", "--server=", NULL};
	client_free(client_expect_exit(2, dead, get_eq)); /* --server= is an empty value */
	const char *const list_after[] = {"list", "--json", "--status", "completed", NULL};
	p = client_expect_exit(0, url, list_after);
	json_t *page = parse_stdout(p);
	assert_true(page_has(page, "opt"));
	json_decref(page);
	client_free(p);
	const char *const res_after[] = {"resources", "gw", "--json", NULL};
	p = client_expect_exit(0, url, res_after);
	json_t *res = parse_stdout(p);
	assert_string_equal(hs_str(res, "name"), "gw");
	json_decref(res);
	client_free(p);

	/* health with --json before or after: the server's JSON, not nothing. */
	const char *const health[][3] = {{"--json", "health", NULL}, {"health", "--json", NULL}};
	for (size_t i = 0; i < 2; i++) {
		p = client_expect_exit(0, url, health[i]);
		json_t *doc = parse_stdout(p);
		assert_string_equal(hs_str(doc, "status"), "ok");
		json_decref(doc);
		client_free(p);
	}
	/* events and cancel too. */
	const char *const events[] = {"events", "opt", "--json", NULL};
	p = client_expect_exit(0, url, events);
	json_t *evs = parse_stdout(p);
	assert_true(json_array_size(json_object_get(evs, "events")) > 0);
	json_decref(evs);
	client_free(p);
	submit_stuck(s, "opt-stuck");
	const char *const cancel[] = {"cancel", "opt-stuck", "--json", NULL};
	p = client_expect_exit(0, url, cancel);
	json_t *c = parse_stdout(p);
	assert_string_equal(hs_str(c, "id"), "opt-stuck");
	json_decref(c);
	client_free(p);
	/* "--" ends the options: a worker may be named like one. */
	const char *const dashes[] = {"submit", "--id", "dash",	  "--resource", "gw",
				      "--json", "--",	"--json", NULL};
	p = client_expect_exit(0, url, dashes);
	wf = parse_stdout(p);
	assert_int_equal(hs_int(wf, "steps_total"), 1);
	json_decref(wf);
	client_free(p);
	wf = hs_get_workflow(s, "dash");
	assert_string_equal(hs_str(hs_step_at(wf, 0), "worker"), "--json");
	json_decref(wf);
}

/* The column where `word` starts in `line`, in terminal columns (UTF-8 aware for the
 * names of this test: every non-ASCII character in them is one column, except U+5DE5
 * and U+4EBA, two each, and U+0301, none). */
static int column_of(const char *line, const char *word)
{
	const char *at = strstr(line, word);
	int col = 0;
	assert_non_null(at);
	for (const unsigned char *p = (const unsigned char *)line; p < (const unsigned char *)at;) {
		if (p[0] < 0x80) {
			col++;
			p++;
		} else if (p[0] == 0xcc && p[1] == 0x81) {
			p += 2; /* combining acute accent */
		} else if (p[0] >= 0xe0) {
			col += 2; /* the CJK characters of the test, three bytes each */
			p += 3;
		} else {
			col++;
			p += 2;
		}
	}
	return col;
}

/* Tables align by display width: non-ASCII worker names (two bytes, three bytes and two
 * columns, a combining mark) keep the columns of `get` and `watch` straight. */
static void test_tables_align_by_display_width(void **state)
{
	hs_server *s = *state;
	const char *url = client_url_of(s);
	static const char *const names[] = {"plain-wk", "\xc3\xa4\xc3\xb6\xc3\xbc-wkrs",
					    "\xe5\xb7\xa5\xe4\xba\xba\xe5\xb7\xa5\xe4\xba\xba",
					    "e\xcc\x81tudes-w"};
	json_t *workers = json_array();
	for (size_t i = 0; i < 4; i++)
		json_array_append_new(workers,
				      json_pack("{s:s, s:i}", "name", names[i], "work_ms", 1));
	json_decref(hs_create_workflow(
	    s, json_pack("{s:s, s:s, s:o}", "id", "wide", "resource", "gw", "workers", workers)));
	json_decref(hs_wait_workflow(s, "wide", "completed", WAIT_MS));

	const char *const get[] = {"--server", url, "get", "wide", NULL};
	client_proc *p = client_expect_exit(0, NULL, get);
	int want = column_of(line_with(p->o.p, "WORKER", "STATUS"), "STATUS");
	for (size_t i = 0; i < 4; i++) {
		int col = column_of(line_with(p->o.p, names[i], "completed"), "completed");
		if (col != want)
			fail_msg("get: the status of %s is at column %d, not %d:\n%s", names[i],
				 col, want, p->o.p);
	}
	client_free(p);

	const char *const watch[] = {"--server", url, "watch", "wide", NULL};
	p = client_expect_exit(0, NULL, watch);
	want = column_of(line_with(p->o.p, "step_completed", names[0]), "attempt");
	for (size_t i = 1; i < 4; i++) {
		int col = column_of(line_with(p->o.p, "step_completed", names[i]), "attempt");
		if (col != want)
			fail_msg("watch: the attempt of %s is at column %d, not %d:\n%s", names[i],
				 col, want, p->o.p);
	}
	client_free(p);
}

/* A workflow that completes with a failed step under on_failure: continue gives watch
 * and get exit status 4; a clean one 0 (and a failed workflow 1, for watch). */
static void test_completed_with_failed_steps_exits_4(void **state)
{
	hs_server *s = *state;
	const char *url = client_url_of(s);
	json_t *body =
	    json_pack("{s:s, s:s, s:s, s:[s, {s:s, s:i}, s], s:{s:i}}", "id", "partial", "resource",
		      "gw", "on_failure", "continue", "workers", "worker-A", "name", "worker-F",
		      "fail_attempts", 1, "worker-C", "retry", "max_attempts", 1);
	json_decref(hs_create_workflow(s, body));
	const char *const watch[] = {"--server", url, "watch", "partial", NULL};
	client_proc *p = client_expect_exit(4, NULL, watch);
	line_with(p->o.p, "workflow_completed", "1 failed");
	client_free(p);
	json_t *wf = hs_get_workflow(s, "partial");
	assert_string_equal(hs_str(wf, "status"), "completed");
	assert_string_equal(hs_str(hs_step_at(wf, 1), "status"), "failed");
	json_decref(wf);

	const char *const watch_json[] = {"--server", url, "--json", "watch", "partial", NULL};
	client_free(client_expect_exit(4, NULL, watch_json));
	const char *const get[] = {"--server", url, "get", "partial", NULL};
	p = client_expect_exit(4, NULL, get);
	assert_non_null(strstr(p->o.p, "1 failed"));
	client_free(p);
	const char *const get_json[] = {"get", "partial", "--json", "--server", url, NULL};
	p = client_expect_exit(4, NULL, get_json);
	json_decref(parse_stdout(p));
	client_free(p);

	json_decref(hs_create_workflow(
	    s, json_pack("{s:s, s:s, s:[s]}", "id", "clean", "resource", "gw", "workers", "w")));
	const char *const watch_clean[] = {"--server", url, "watch", "clean", NULL};
	client_free(client_expect_exit(0, NULL, watch_clean));
	const char *const get_clean[] = {"--server", url, "get", "clean", NULL};
	client_free(client_expect_exit(0, NULL, get_clean));
	/* --help documents the status. */
	const char *const help[] = {"--help", NULL};
	p = client_expect_exit(0, NULL, help);
	assert_non_null(strstr(p->o.p, "  4  watch and get: the workflow completed, but some"));
	client_free(p);
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
	const char *url = client_url_of(s);
	client_proc *p = client_expect_exit(0, url, (const char *const[]){"health", NULL});
	assert_non_null(strstr(p->o.p, "ok"));
	client_free(p);
	p = client_expect_exit(1, url, (const char *const[]){"list", NULL});
	assert_non_null(strstr(p->e.p, "401"));
	client_free(p);
	client_free(
	    client_expect_exit(1, url, (const char *const[]){"--token", "wrong", "list", NULL}));
	client_free(client_expect_exit(
	    0, url, (const char *const[]){"--token", "s3cret-token", "list", NULL}));
	client_free(
	    client_expect_exit(0, url,
			       (const char *const[]){"--token", "s3cret-token", "submit", "--id",
						     "tok-1", "--resource", "r", "a", NULL}));
	client_free(client_expect_exit(
	    0, url, (const char *const[]){"--token", "s3cret-token", "watch", "tok-1", NULL}));
	/* $BATON_TOKEN, as a container would set it. */
	setenv("BATON_TOKEN", "s3cret-token", 1);
	p = client_spawn((const char *const[]){"list", NULL}, url, false);
	unsetenv("BATON_TOKEN");
	assert_int_equal(client_finish(p), 0);
	client_free(p);
	char closed[32];
	snprintf(closed, sizeof closed, "http://127.0.0.1:%d", client_closed_port());
	client_free(client_expect_exit(3, closed, (const char *const[]){"health", NULL}));
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_token_and_health, setup_token, teardown),
	    cmocka_unit_test_setup_teardown(test_watch_live_lines_and_exit_0, hs_setup, teardown),
	    cmocka_unit_test_setup_teardown(test_watch_failed_exits_1, hs_setup, teardown),
	    cmocka_unit_test_setup_teardown(test_watch_cancelled_exits_1, hs_setup, teardown),
	    cmocka_unit_test_setup_teardown(test_watch_unknown_workflow_exits_1, hs_setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_watch_json_lines, hs_setup, teardown),
	    cmocka_unit_test_teardown(test_unreachable_exits_3, teardown_no_server),
	    cmocka_unit_test_teardown(test_usage_errors_exit_2, teardown_no_server),
	    cmocka_unit_test_setup_teardown(test_watch_survives_restart, setup_fixed_port,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_watch_tty_progress_bar, hs_setup, teardown),
	    cmocka_unit_test_teardown(test_watch_parses_split_frames_and_resumes,
				      teardown_no_server),
	    cmocka_unit_test_setup_teardown(test_get_list_cancel_resources, hs_setup, teardown),
	    cmocka_unit_test_setup_teardown(test_options_before_or_after_command, hs_setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_tables_align_by_display_width, hs_setup, teardown),
	    cmocka_unit_test_setup_teardown(test_completed_with_failed_steps_exits_4, hs_setup,
					    teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
