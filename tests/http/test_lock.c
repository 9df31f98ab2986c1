/*
 * test_lock.c - `baton lock RESOURCE -- COMMAND` with real processes against the real
 * batond: the command gets the token, lease id and resource in its environment and its
 * exit status comes back; two `baton lock` on one resource never overlap (each command
 * appends start and end lines to one file); a lease lost (the server refuses the
 * renewal) stops the command's whole process group and exits 76; a frozen server is
 * noticed by the client's own clock (76 while batond is still stopped); not granted
 * within --wait exits 75 without running anything; a --wait longer than one request
 * keeps its place in the queue; SIGTERM goes to the command first and the lease is
 * released after it; a background child the command leaves keeps the lease until it
 * ends, and after SIGINT it is ended before the release; the lease counts from the
 * acquire's send (a stub server, tests/harness/stub.h, holds the grant's answer back);
 * durations out of range are usage errors. And `baton worker`: an external worker's step
 * done by a command, completed with its stdout or failed with its exit status and
 * stderr, and stopped by the worker's own clock when no heartbeat succeeds.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../harness/client.h"
#include "../harness/stub.h"

#define WAIT_MS 60000

static char dir[64];
static stub *fake; /* a stand-in for batond, when a test needs one */

static int setup(void **state)
{
	snprintf(dir, sizeof dir, "/tmp/baton-lock-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	return hs_setup(state);
}

/* Kills what the commands of a failed test left running: every pid in DIR/ *.pid. */
static void kill_leftovers(void)
{
	char cmd[160];
	snprintf(cmd, sizeof cmd, "cat %s/*.pid 2>/dev/null", dir);
	FILE *f = popen(cmd, "r");
	long pid;
	while (f && fscanf(f, "%ld", &pid) == 1)
		if (pid > 1)
			kill((pid_t)pid, SIGKILL);
	if (f)
		pclose(f);
}

static int teardown(void **state)
{
	unsetenv("BATON_LOCK_REQUEST_WAIT_MS");
	client_free_all();
	kill_leftovers();
	stub_close(fake);
	fake = NULL;
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	if (system(cmd) != 0)
		return -1;
	return hs_close(*state);
}

static char *path_in(const char *name)
{
	static char p[8][128];
	static int k;
	k = (k + 1) % 8;
	snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
	return p[k];
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return NULL;
	char *buf = calloc(1, 65536);
	size_t n = fread(buf, 1, 65535, f);
	buf[n] = 0;
	fclose(f);
	return buf;
}

static bool file_exists(void *path)
{
	return access(path, F_OK) == 0;
}

static long read_pid(const char *path)
{
	char *t = slurp(path);
	assert_non_null(t);
	long pid = strtol(t, NULL, 10);
	free(t);
	assert_true(pid > 1);
	return pid;
}

static bool pid_gone(void *arg)
{
	pid_t pid = (pid_t)(intptr_t)arg;
	return kill(pid, 0) != 0 && errno == ESRCH;
}

static void assert_free(const hs_server *s)
{
	json_t *r = hs_get_json(s, "/resources/db", 200);
	assert_true(json_is_null(json_object_get(r, "holder")));
	json_decref(r);
}

static void test_token_env_and_exit_status(void **state)
{
	hs_server *s = *state;
	const char *const args[] = {
	    "lock",
	    "db",
	    "--",
	    "sh",
	    "-c",
	    "echo \"token=$BATON_FENCING_TOKEN res=$BATON_RESOURCE id=$BATON_LEASE_ID\"; exit 7",
	    NULL};
	client_proc *p = client_expect_exit(7, client_url_of(s), args);
	assert_non_null(strstr(p->o.p, "token=1 res=db id=lease-"));
	client_free(p);
	assert_free(s);
	const char *const ok[] = {"lock", "db", "--", "true", NULL};
	client_free(client_expect_exit(0, client_url_of(s), ok));
	json_t *r = hs_get_json(s, "/resources/db", 200);
	assert_int_equal(hs_int(r, "last_fencing_token"), 2);
	json_decref(r);
}

static void test_two_locks_never_overlap(void **state)
{
	hs_server *s = *state;
	char script[512];
	snprintf(script, sizeof script,
		 "for i in 1 2; do echo \"start $BATON_FENCING_TOKEN\" >> %s; sleep 0.2; "
		 "echo \"end $BATON_FENCING_TOKEN\" >> %s; done",
		 path_in("log"), path_in("log"));
	const char *const args[] = {"lock", "db", "--wait", "60s", "--", "sh", "-c", script, NULL};
	client_proc *p[3];
	for (int i = 0; i < 3; i++)
		p[i] = client_spawn(args, client_url_of(s), false);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(client_finish(p[i]), 0);
		client_free(p[i]);
	}
	char *log = slurp(path_in("log"));
	assert_non_null(log);
	/* start T, end T, start T, end T for each holder in turn; tokens increase */
	long prev = 0, cur = 0;
	int lines = 0, open = 0;
	for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n"), lines++) {
		long t;
		if (sscanf(line, "start %ld", &t) == 1) {
			if (open)
				fail_msg("overlap: \"%s\" while %ld held it", line, cur);
			if (t != cur) {
				assert_true(t > prev);
				prev = cur = t;
			}
			open = 1;
		} else if (sscanf(line, "end %ld", &t) == 1) {
			assert_true(open);
			assert_int_equal(t, cur);
			open = 0;
		} else {
			fail_msg("unexpected line \"%s\"", line);
		}
	}
	assert_int_equal(lines, 12);
	assert_false(open);
	free(log);
	assert_free(s);
}

/* The command: sh that leaves a child behind, both pids and the lease id in files. */
static void spawn_holder(const hs_server *s, const char *ttl, client_proc **p)
{
	static char script[512];
	snprintf(script, sizeof script,
		 "echo $$ > %s; sleep 60 & echo $! > %s; echo $BATON_LEASE_ID > %s.tmp; "
		 "mv %s.tmp %s; wait",
		 path_in("sh.pid"), path_in("child.pid"), path_in("id"), path_in("id"),
		 path_in("id"));
	const char *const args[] = {"lock", "db", "--ttl", ttl, "--", "sh", "-c", script, NULL};
	*p = client_spawn(args, client_url_of(s), false);
	if (!hs_wait_until(file_exists, path_in("id"), WAIT_MS))
		fail_msg("the command never ran");
}

static void assert_group_gone(void)
{
	long sh = read_pid(path_in("sh.pid")), child = read_pid(path_in("child.pid"));
	assert_true(hs_wait_until(pid_gone, (void *)(intptr_t)sh, WAIT_MS));
	assert_true(hs_wait_until(pid_gone, (void *)(intptr_t)child, WAIT_MS));
}

static void test_lost_lease_stops_the_group(void **state)
{
	hs_server *s = *state;
	client_proc *p;
	spawn_holder(s, "3s", &p);
	char *id = slurp(path_in("id"));
	id[strcspn(id, "\n")] = 0;
	char path[256];
	snprintf(path, sizeof path, "/leases/%s", id);
	hs_request del = {.method = "DELETE", .path = path};
	hs_response r;
	assert_int_equal(hs_send(s, &del, &r), 0); /* the server will refuse the renewal */
	assert_int_equal(r.status, 204);
	hs_response_fini(&r);
	free(id);
	assert_int_equal(client_finish(p), 76);
	assert_non_null(strstr(p->e.p, "renewal refused"));
	client_free(p);
	assert_group_gone();
}

static void test_frozen_server_noticed_by_own_clock(void **state)
{
	hs_server *s = *state;
	client_proc *p;
	spawn_holder(s, "2s", &p);
	assert_int_equal(hs_signal(s, SIGSTOP), 0);
	/* batond cannot answer anything: the client must decide by itself */
	int code = client_finish(p);
	assert_int_equal(hs_signal(s, SIGCONT), 0);
	assert_int_equal(code, 76);
	assert_non_null(strstr(p->e.p, "no successful renewal"));
	client_free(p);
	assert_group_gone();
}

static void test_not_acquired_runs_nothing(void **state)
{
	hs_server *s = *state;
	hs_response r;
	assert_int_equal(hs_post(s, "/resources/db/leases", "{\"holder\": \"other\"}", &r), 0);
	assert_int_equal(r.status, 201);
	hs_response_fini(&r);
	char script[256];
	snprintf(script, sizeof script, "touch %s", path_in("ran"));
	const char *const args[] = {"lock", "db", "--wait", "0", "--", "sh", "-c", script, NULL};
	client_proc *p = client_expect_exit(75, client_url_of(s), args);
	assert_non_null(strstr(p->e.p, "other"));
	client_free(p);
	assert_false(file_exists(path_in("ran")));
	const char *const waited[] = {"lock", "db", "--wait", "1s", "--", "sh", "-c", script, NULL};
	p = client_expect_exit(75, client_url_of(s), waited);
	/* in the words the user typed: --wait, not the API's wait_ms */
	assert_non_null(strstr(p->e.p, "not granted within --wait"));
	assert_null(strstr(p->e.p, "wait_ms"));
	client_free(p);
	assert_false(file_exists(path_in("ran")));
}

struct queue_watch {
	const hs_server *s;
	int want;
};

static bool queue_is(void *arg)
{
	const struct queue_watch *w = arg;
	json_t *r = hs_get_json(w->s, "/resources/db", 200);
	bool yes = (int)json_array_size(json_object_get(r, "waiters")) == w->want;
	json_decref(r);
	return yes;
}

/*
 * SIGINT or SIGTERM while baton lock waits in the queue: it leaves the queue at once
 * (nobody waits once it has exited), exits 130 or 143, and runs nothing. The old baton lock
 * ignored both until its --wait ran out (75).
 */
static void test_signal_while_queued_leaves_the_queue(void **state)
{
	hs_server *s = *state;
	hs_response r;
	assert_int_equal(
	    hs_post(s, "/resources/db/leases", "{\"holder\": \"other\", \"ttl_ms\": 60000}", &r),
	    0);
	assert_int_equal(r.status, 201);
	hs_response_fini(&r);
	char script[256];
	snprintf(script, sizeof script, "touch %s", path_in("ran"));
	const int sigs[] = {SIGINT, SIGTERM};
	for (int i = 0; i < 2; i++) {
		const char *const args[] = {"lock", "db", "--wait", "20s", "--",
					    "sh",   "-c", script,   NULL};
		client_proc *p = client_spawn(args, client_url_of(s), false);
		struct queue_watch queued = {s, 1}, empty = {s, 0};
		assert_true(hs_wait_until(queue_is, &queued, WAIT_MS));
		assert_int_equal(kill(p->pid, sigs[i]), 0);
		int code = client_finish(p);
		if (code != 128 + sigs[i])
			fail_msg("exit %d after signal %d, not %d\nstderr:\n%s", code, sigs[i],
				 128 + sigs[i], p->e.p);
		client_free(p);
		assert_true(queue_is(&empty)); /* left before it exited */
		assert_false(file_exists(path_in("ran")));
	}
}

/*
 * The grant's answer is on its way (the stub holds it back 30 s) when SIGTERM comes: baton
 * lock releases that lease at once (DELETE /leases/lease-<request_id>, sent while the answer
 * is still held back), exits 143 and runs nothing. The old one waited for the answer.
 */
static void test_signal_racing_the_grant_releases_it(void **state)
{
	(void)state;
	fake = stub_open();
	assert_non_null(fake);
	stub_route(fake,
		   (stub_rule){"POST", "/resources/", 201,
			       "{\"id\": \"lease-x\", \"state\": \"held\", \"fencing_token\": 1, "
			       "\"ttl_ms\": 15000, \"slot\": 0}",
			       30000});
	stub_route(fake, (stub_rule){"DELETE", "/leases/", 204, NULL, 0});
	char *url = stub_url(fake), script[256];
	snprintf(script, sizeof script, "touch %s", path_in("ran"));
	const char *const args[] = {"lock", "db", "--", "sh", "-c", script, NULL};
	client_proc *p = client_spawn(args, url, false);
	free(url);
	int64_t deadline = hs_mono_ms() + WAIT_MS;
	while (stub_count(fake, "POST", "/resources/db/leases") == 0) {
		assert_true(hs_mono_ms() < deadline);
		client_pump(p, HS_POLL_MS);
	}
	assert_int_equal(kill(p->pid, SIGTERM), 0);
	/* a bound well under the 30 s the answer is held back */
	deadline = hs_mono_ms() + 15000;
	while (client_running(p) && hs_mono_ms() < deadline)
		client_pump(p, HS_POLL_MS);
	if (client_running(p))
		fail_msg("baton lock still waits for the grant's answer after SIGTERM");
	assert_int_equal(client_finish(p), 143);
	client_free(p);
	char *body = stub_body(fake, "POST", "/resources/db/leases");
	assert_non_null(body);
	json_t *sent = json_loads(body, 0, NULL);
	free(body);
	assert_non_null(sent);
	char path[256];
	snprintf(path, sizeof path, "/leases/lease-%s", hs_str(sent, "request_id"));
	json_decref(sent);
	assert_int_equal(stub_count(fake, "DELETE", path), 1);
	assert_false(file_exists(path_in("ran")));
}

/* A lock that waited in the queue longer than two thirds of its ttl still runs its command
 * once granted: the server counts the ttl from the grant, so baton lock renews first and
 * counts from that renewal's send, instead of giving the lease up unused. */
static void test_lock_granted_after_a_long_wait_runs(void **state)
{
	hs_server *s = *state;
	hs_response r;
	assert_int_equal(hs_post(s, "/resources/db/leases", "{\"holder\": \"other\"}", &r), 0);
	assert_int_equal(r.status, 201);
	char path[128];
	snprintf(path, sizeof path, "/leases/%s", hs_str(r.json, "id"));
	hs_response_fini(&r);
	char script[256];
	snprintf(script, sizeof script, "touch %s", path_in("ran"));
	const char *const args[] = {"lock", "db", "--ttl", "3s",   "--wait", "60s",
				    "--",   "sh", "-c",	   script, NULL};
	client_proc *p = client_spawn(args, client_url_of(s), false);
	hs_pause_ms(3000); /* it waits longer than two thirds of its ttl */
	hs_request del = {.method = "DELETE", .path = path};
	assert_int_equal(hs_send(s, &del, &r), 0);
	assert_int_equal(r.status, 204);
	hs_response_fini(&r);
	assert_int_equal(client_finish(p), 0);
	assert_true(file_exists(path_in("ran")));
	client_free(p);
}

static void test_sigterm_goes_to_the_command_first(void **state)
{
	hs_server *s = *state;
	char script[512];
	snprintf(script, sizeof script,
		 "trap 'echo got-term; exit 3' TERM; touch %s; while :; do sleep 0.05; done",
		 path_in("ready"));
	const char *const args[] = {"lock", "db", "--", "sh", "-c", script, NULL};
	client_proc *p = client_spawn(args, client_url_of(s), false);
	assert_true(hs_wait_until(file_exists, path_in("ready"), WAIT_MS));
	assert_int_equal(kill(p->pid, SIGTERM), 0);
	assert_int_equal(client_finish(p), 3);
	assert_non_null(strstr(p->o.p, "got-term"));
	client_free(p);
	assert_free(s); /* released after the command ended */
}

/* The lease id the command wrote to DIR/id; the caller frees it. */
static char *lease_path(void)
{
	char *id = slurp(path_in("id")), *path = NULL;
	assert_non_null(id);
	id[strcspn(id, "\n")] = 0;
	assert_true(asprintf(&path, "/leases/%s", id) > 0);
	free(id);
	return path;
}

struct lease_watch {
	const hs_server *s;
	const char *path;
	char expires_at[64];
};

/* The lease has ended, or was renewed since w->expires_at was read. */
static bool lease_renewed_or_ended(void *arg)
{
	struct lease_watch *w = arg;
	json_t *l = hs_get_json(w->s, w->path, 200);
	bool yes = strcmp(hs_str(l, "state"), "held") != 0 ||
		   strcmp(hs_str(l, "expires_at"), w->expires_at) != 0;
	json_decref(l);
	return yes;
}

static bool lease_is(const hs_server *s, const char *path, const char *state)
{
	json_t *l = hs_get_json(s, path, 200);
	bool yes = strcmp(hs_str(l, "state"), state) == 0;
	json_decref(l);
	return yes;
}

/*
 * `sh -c 'CHILD & exit 5'`: sh exits at once, its background child runs on. baton lock
 * keeps the lease, renewed, until the child has ended too, then releases it and exits
 * with the command's own status (5). The old baton lock released the lease and exited
 * as soon as sh ended.
 */
static void test_background_child_keeps_the_lease(void **state)
{
	hs_server *s = *state;
	char script[768];
	snprintf(script, sizeof script,
		 "(while [ ! -e %s ]; do sleep 0.05; done) & echo $! > %s.tmp; mv %s.tmp %s; "
		 "echo $$ > %s; echo $BATON_LEASE_ID > %s.tmp; mv %s.tmp %s; exit 5",
		 path_in("go"), path_in("bg.pid"), path_in("bg.pid"), path_in("bg.pid"),
		 path_in("sh.pid"), path_in("id"), path_in("id"), path_in("id"));
	const char *const args[] = {"lock", "db", "--ttl", "3s", "--", "sh", "-c", script, NULL};
	client_proc *p = client_spawn(args, client_url_of(s), false);
	if (!hs_wait_until(file_exists, path_in("id"), WAIT_MS))
		fail_msg("the command never ran");
	long sh = read_pid(path_in("sh.pid")), bg = read_pid(path_in("bg.pid"));
	assert_true(hs_wait_until(pid_gone, (void *)(intptr_t)sh, WAIT_MS));
	char *path = lease_path();
	struct lease_watch w = {s, path, ""};
	json_t *l = hs_get_json(s, path, 200);
	if (strcmp(hs_str(l, "state"), "held") != 0)
		fail_msg("the lease ended when sh exited, while its background child ran");
	snprintf(w.expires_at, sizeof w.expires_at, "%s", hs_str(l, "expires_at"));
	json_decref(l);
	/* sh has ended: the lease must stay held, and be renewed, while its child runs */
	assert_true(hs_wait_until(lease_renewed_or_ended, &w, WAIT_MS));
	if (!lease_is(s, path, "held"))
		fail_msg("the lease ended while the command's background child still ran");
	assert_false(pid_gone((void *)(intptr_t)bg));
	assert_true(client_running(p));
	FILE *go = fopen(path_in("go"), "w");
	assert_non_null(go);
	fclose(go);
	assert_int_equal(client_finish(p), 5);
	client_free(p);
	assert_true(pid_gone((void *)(intptr_t)bg)); /* gone before baton lock exited */
	assert_true(lease_is(s, path, "released"));
	free(path);
}

/*
 * SIGINT to baton lock: sh dies of it, its background child ignores it (as sh makes
 * background jobs do). The child must be ended before the lease is released: at no
 * moment may the lease show released while the child still lives. The old baton lock
 * released the lease and left the child running.
 */
static void test_sigint_ends_the_background_child_before_release(void **state)
{
	hs_server *s = *state;
	client_proc *p;
	spawn_holder(s, "15s", &p);
	long child = read_pid(path_in("child.pid"));
	char *path = lease_path();
	assert_int_equal(kill(p->pid, SIGINT), 0);
	int64_t deadline = hs_mono_ms() + WAIT_MS;
	for (;;) {
		bool running = client_running(p);
		bool released = !lease_is(s, path, "held");
		if (released && !pid_gone((void *)(intptr_t)child))
			fail_msg("the lease was released while the command's child %ld ran", child);
		if (!running)
			break;
		client_pump(p, HS_POLL_MS);
		if (hs_mono_ms() > deadline)
			fail_msg("baton lock did not end after SIGINT\nstderr:\n%s", p->e.p);
	}
	assert_int_equal(client_finish(p), 130);
	client_free(p);
	assert_true(pid_gone((void *)(intptr_t)child));
	assert_true(lease_is(s, path, "released"));
	free(path);
}

static long waiters(const hs_server *s)
{
	json_t *r = hs_get_json(s, "/resources/db", 200);
	long n = (long)json_array_size(json_object_get(r, "waiters"));
	json_decref(r);
	return n;
}

static long read_token(const char *name)
{
	char *t = slurp(path_in(name));
	assert_non_null(t);
	long token = strtol(t, NULL, 10);
	free(t);
	return token;
}

/*
 * A --wait longer than one acquire request (made 1 s for A here through
 * BATON_LOCK_REQUEST_WAIT_MS; B waits in one request) keeps its place in the queue: A
 * queues first, B second, A's requests follow each other several times, and when the
 * holder leaves A is granted first. The old baton lock asked again with a new
 * request_id after each request, at the back of the queue, behind B.
 */
static void test_long_wait_keeps_its_place(void **state)
{
	hs_server *s = *state;
	hs_response r;
	assert_int_equal(
	    hs_post(s, "/resources/db/leases", "{\"holder\": \"first\", \"ttl_ms\": 120000}", &r),
	    0);
	assert_int_equal(r.status, 201);
	char del[256];
	snprintf(del, sizeof del, "/leases/%s", hs_str(r.json, "id"));
	hs_response_fini(&r);
	assert_int_equal(setenv("BATON_LOCK_REQUEST_WAIT_MS", "1000", 1), 0);
	client_proc *p[2];
	static const char *const names[] = {"a", "b"};
	for (int i = 0; i < 2; i++) {
		char script[256];
		snprintf(script, sizeof script, "echo $BATON_FENCING_TOKEN > %s/%s.tok", dir,
			 names[i]);
		const char *const args[] = {"lock", "db", "--holder", names[i], "--wait", "60s",
					    "--",   "sh", "-c",	      script,	NULL};
		if (i == 1)
			unsetenv("BATON_LOCK_REQUEST_WAIT_MS");
		p[i] = client_spawn(args, client_url_of(s), false);
		int64_t deadline = hs_mono_ms() + WAIT_MS;
		while (waiters(s) < i + 1) {
			assert_true(client_running(p[i]) && hs_mono_ms() < deadline);
			client_pump(p[i], HS_POLL_MS);
		}
	}
	/* A's third request at least: two seconds past its first request's wait */
	int64_t deadline = hs_mono_ms() + WAIT_MS;
	while (!strstr(p[0]->e.p, "after 2 s")) {
		if (!client_running(p[0]) || hs_mono_ms() > deadline)
			fail_msg("A did not wait on\nstderr:\n%s", p[0]->e.p);
		client_pump(p[0], 100);
	}
	hs_request rel = {.method = "DELETE", .path = del};
	assert_int_equal(hs_send(s, &rel, &r), 0);
	assert_int_equal(r.status, 204);
	hs_response_fini(&r);
	for (int i = 0; i < 2; i++) {
		int code = client_finish(p[i]);
		if (code != 0)
			fail_msg("%s: exit %d\nstderr:\n%s", names[i], code, p[i]->e.p);
		client_free(p[i]);
	}
	long a = read_token("a.tok"), b = read_token("b.tok");
	if (a > b)
		fail_msg("B (token %ld) was granted before A (token %ld), which queued first", b,
			 a);
}

/* A command that ignores SIGTERM (so only SIGKILL ends it), its pid in DIR/sh.pid. */
static const char *stubborn_script(void)
{
	static char script[512];
	snprintf(script, sizeof script,
		 "trap '' TERM; echo $$ > %s.tmp; mv %s.tmp %s; while :; do sleep 0.1; done",
		 path_in("sh.pid"), path_in("sh.pid"), path_in("sh.pid"));
	return script;
}

/*
 * The grant's answer arrives 1.5 s after the server received the acquire (and counted
 * the ttl from then), and no renewal succeeds: the command must be gone before the
 * server's ttl of 6 s has passed since it received the acquire. Counting the lease
 * from the answer's arrival, as baton lock once did, kills it 6.5 s after.
 */
static void test_lease_counts_from_the_acquire_send(void **state)
{
	(void)state;
	fake = stub_open();
	assert_non_null(fake);
	stub_route(fake, (stub_rule){"POST", "/resources/", 201,
				     "{\"id\": \"lease-slow\", \"state\": \"held\", "
				     "\"fencing_token\": 1, \"ttl_ms\": 6000}",
				     1500});
	stub_route(fake, (stub_rule){"POST", "/leases/", 503, "{\"title\": \"busy\"}", 0});
	stub_route(fake, (stub_rule){"DELETE", "/leases/", 204, NULL, 0});
	char *url = stub_url(fake);
	const char *const args[] = {"lock", "db", "--ttl",	     "6s", "--",
				    "sh",   "-c", stubborn_script(), NULL};
	client_proc *p = client_spawn(args, url, false);
	free(url);
	if (!hs_wait_until(file_exists, path_in("sh.pid"), WAIT_MS))
		fail_msg("the command never ran");
	long sh = read_pid(path_in("sh.pid"));
	assert_true(hs_wait_until(pid_gone, (void *)(intptr_t)sh, WAIT_MS));
	int64_t gone = hs_mono_ms(), received = stub_first_arrival(fake, "POST", "/resources/");
	assert_int_equal(client_finish(p), 76);
	client_free(p);
	assert_true(received > 0);
	if (gone - received >= 6000)
		fail_msg("the command ran until %lld ms after the server received the acquire; "
			 "the lease's ttl is 6000 ms",
			 (long long)(gone - received));
}

/*
 * Durations out of range are usage errors (exit 2, nothing sent or run): a --wait whose
 * deadline overflows the clock, a --ttl the server would refuse, values that are not
 * finite numbers; the same for baton worker's --ttl. The largest --ttl still works.
 */
static void test_durations_out_of_range_are_usage_errors(void **state)
{
	hs_server *s = *state;
	static const char *const lock_bad[][2] = {
	    {"--wait", "9223372036854s"},
	    {"--wait", "1e400"},
	    {"--wait", "inf"},
	    {"--ttl", "48h"},
	    {"--ttl", "nan"},
	    {"--ttl", "-1s"},
	};
	char script[256];
	snprintf(script, sizeof script, "touch %s", path_in("ran"));
	for (size_t i = 0; i < sizeof lock_bad / sizeof *lock_bad; i++) {
		const char *const args[] = {
		    "lock", "db", lock_bad[i][0], lock_bad[i][1], "--", "sh", "-c", script, NULL};
		client_proc *p = client_expect_exit(2, client_url_of(s), args);
		assert_non_null(strstr(p->e.p, lock_bad[i][0]));
		client_free(p);
		assert_false(file_exists(path_in("ran")));
	}
	const char *const worker[] = {"worker", "--worker", "w",    "--ttl", "100000000",
				      "--once", "--",	    "true", NULL};
	client_proc *p = client_expect_exit(2, client_url_of(s), worker);
	assert_non_null(strstr(p->e.p, "--ttl"));
	client_free(p);
	const char *const longest[] = {"lock", "db", "--ttl", "24h", "--", "true", NULL};
	client_free(client_expect_exit(0, client_url_of(s), longest));
}

/* ---- baton worker ---- */

static void submit_external(const hs_server *s, const char *worker)
{
	json_decref(hs_create_workflow(
	    s, json_pack("{s:s, s:s, s:[{s:s, s:b}], s:{s:i}}", "id", "w1", "resource", "db",
			 "workers", "name", worker, "external", 1, "retry", "max_attempts", 1)));
}

static void test_worker_completes_with_stdout(void **state)
{
	hs_server *s = *state;
	submit_external(s, "reindex");
	char script[256];
	snprintf(script, sizeof script,
		 "cat > %s; echo \"{\\\"token\\\": $BATON_FENCING_TOKEN, \\\"task\\\": "
		 "\\\"$BATON_TASK_ID\\\"}\"",
		 path_in("stdin"));
	const char *const args[] = {"worker", "--worker", "reindex", "--once", "--",
				    "sh",     "-c",	  script,    NULL};
	client_free(client_expect_exit(0, client_url_of(s), args));
	json_t *wf = hs_wait_workflow(s, "w1", "completed", WAIT_MS);
	const json_t *st = hs_step_at(wf, 0);
	const json_t *result = json_object_get(st, "result");
	assert_int_equal(hs_int(result, "token"), hs_int(st, "fencing_token"));
	assert_string_equal(hs_str(result, "task"), "w1.0.1");
	json_decref(wf);
	char *in = slurp(path_in("stdin"));
	assert_non_null(in);
	json_t *task = json_loads(in, 0, NULL);
	assert_non_null(task);
	assert_string_equal(hs_str(task, "id"), "w1.0.1");
	json_decref(task);
	free(in);
}

/* A task that arrives after the worker's claim has waited more than two thirds of its ttl
 * (a long poll) is still done: the claim's ttl starts when the server grants it, so the worker
 * heartbeats first and counts from that heartbeat's send instead of giving the task up. */
static void test_worker_runs_a_task_that_came_late(void **state)
{
	hs_server *s = *state;
	const char *const args[] = {"worker", "--worker", "late", "--ttl",   "3s", "--once",
				    "--",     "sh",	  "-c",	  "echo {}", NULL};
	client_proc *p = client_spawn(args, client_url_of(s), false);
	hs_pause_ms(3000); /* the claim waits longer than two thirds of its ttl */
	submit_external(s, "late");
	assert_int_equal(client_finish(p), 0);
	json_decref(hs_wait_workflow(s, "w1", "completed", WAIT_MS));
	client_free(p);
}

static void test_worker_fails_with_status_and_stderr(void **state)
{
	hs_server *s = *state;
	submit_external(s, "bad");
	const char *const args[] = {"worker", "--worker", "bad", "--once",
				    "--",     "sh",	  "-c",	 "echo broken >&2; exit 4",
				    NULL};
	client_free(client_expect_exit(1, client_url_of(s), args));
	json_t *wf = hs_wait_workflow(s, "w1", "failed", WAIT_MS);
	assert_non_null(strstr(hs_str(wf, "error"), "exit status 4: broken"));
	json_decref(wf);
	/* the server's log counts in English: one attempt, not "1 attempts" */
	assert_true(hs_log_says(s, "giving up after 1 attempt)", NULL));
}

/*
 * The server stops answering heartbeats (503) while the task's command runs: baton
 * worker must stop the command (which ignores SIGTERM) by its own clock, before the
 * claim's ttl of 3 s has passed since the server received the claim, and report nothing.
 * The old baton worker kept the command running, heartbeating in vain.
 */
static void test_worker_stops_the_command_by_its_own_clock(void **state)
{
	(void)state;
	fake = stub_open();
	assert_non_null(fake);
	stub_route(fake, (stub_rule){"POST", "/tasks/claim", 200,
				     "{\"id\": \"w1.0.1\", \"workflow_id\": \"w1\", \"step\": 0, "
				     "\"worker\": \"w\", \"attempt\": 1, \"fencing_token\": 1, "
				     "\"ttl_ms\": 3000, \"input\": {}}",
				     0});
	stub_route(fake, (stub_rule){"POST", "/tasks/", 503, "{\"title\": \"busy\"}", 0});
	char *url = stub_url(fake);
	const char *const args[] = {"worker", "--worker",	 "w", "--once", "--", "sh",
				    "-c",     stubborn_script(), NULL};
	client_proc *p = client_spawn(args, url, false);
	free(url);
	if (!hs_wait_until(file_exists, path_in("sh.pid"), WAIT_MS))
		fail_msg("the command never ran");
	long sh = read_pid(path_in("sh.pid"));
	int64_t received = stub_first_arrival(fake, "POST", "/tasks/claim");
	/* a bound well past the ttl, so that the old client fails here and not at WAIT_MS */
	if (!hs_wait_until(pid_gone, (void *)(intptr_t)sh, 10000))
		fail_msg(
		    "the command still runs %lld ms after the claim was received (ttl 3000 ms)",
		    (long long)(hs_mono_ms() - received));
	int64_t gone = hs_mono_ms();
	assert_int_equal(client_finish(p), 1);
	client_free(p);
	if (gone - received >= 3000)
		fail_msg("the command ran until %lld ms after the server received the claim; "
			 "the claim's ttl is 3000 ms",
			 (long long)(gone - received));
	assert_int_equal(stub_count(fake, "POST", "/tasks/w1.0.1/complete"), 0);
	assert_int_equal(stub_count(fake, "POST", "/tasks/w1.0.1/fail"), 0);
}

/* Ctrl-C (SIGINT) to an idle baton worker, its claim long-polling (the stub holds the
 * answer 30 s): it ends the poll at once and exits 0, having run nothing. The old worker
 * waited for the poll's answer. */
static void test_idle_worker_stops_at_once(void **state)
{
	(void)state;
	fake = stub_open();
	assert_non_null(fake);
	stub_route(fake, (stub_rule){"POST", "/tasks/claim", 204, NULL, 30000});
	char *url = stub_url(fake), script[256];
	snprintf(script, sizeof script, "touch %s", path_in("ran"));
	const char *const args[] = {"worker", "--worker", "idle", "--", "sh", "-c", script, NULL};
	client_proc *p = client_spawn(args, url, false);
	free(url);
	int64_t deadline = hs_mono_ms() + WAIT_MS;
	while (stub_count(fake, "POST", "/tasks/claim") == 0) {
		assert_true(hs_mono_ms() < deadline);
		client_pump(p, HS_POLL_MS);
	}
	assert_int_equal(kill(p->pid, SIGINT), 0);
	deadline = hs_mono_ms() + 15000; /* well under the 30 s the answer is held back */
	while (client_running(p) && hs_mono_ms() < deadline)
		client_pump(p, HS_POLL_MS);
	if (client_running(p))
		fail_msg("baton worker still waits for its claim's answer after SIGINT");
	assert_int_equal(client_finish(p), 0);
	client_free(p);
	assert_int_equal(stub_count(fake, "POST", "/tasks/claim"), 1);
	assert_false(file_exists(path_in("ran")));
}

/*
 * As above, but the command's leader dies of the SIGTERM while a child of its group ignores
 * it: the worker must wait for the whole group and send the SIGKILL due a sixth of the ttl
 * later, as baton lock does. The old worker stopped waiting when the leader died, so the
 * child ran on (and the worker hung on the child's end of its stdout).
 */
static void test_worker_kills_what_ignores_sigterm(void **state)
{
	(void)state;
	fake = stub_open();
	assert_non_null(fake);
	stub_route(fake, (stub_rule){"POST", "/tasks/claim", 200,
				     "{\"id\": \"w1.0.1\", \"workflow_id\": \"w1\", \"step\": 0, "
				     "\"worker\": \"w\", \"attempt\": 1, \"fencing_token\": 1, "
				     "\"ttl_ms\": 3000, \"input\": {}}",
				     0});
	stub_route(fake, (stub_rule){"POST", "/tasks/", 503, "{\"title\": \"busy\"}", 0});
	char script[768], *url = stub_url(fake);
	snprintf(script, sizeof script,
		 "sh -c 'trap \"\" TERM; echo $$ > %s.tmp; mv %s.tmp %s; "
		 "while :; do sleep 0.1; done' & while :; do sleep 0.1; done",
		 path_in("child.pid"), path_in("child.pid"), path_in("child.pid"));
	const char *const args[] = {"worker", "--worker", "w",	  "--once", "--",
				    "sh",     "-c",	  script, NULL};
	client_proc *p = client_spawn(args, url, false);
	free(url);
	if (!hs_wait_until(file_exists, path_in("child.pid"), WAIT_MS))
		fail_msg("the command never ran");
	long child = read_pid(path_in("child.pid"));
	/* TERM at 2 s, KILL at 2.5 s after the claim: a bound well past both */
	if (!hs_wait_until(pid_gone, (void *)(intptr_t)child, 10000))
		fail_msg("the child that ignores SIGTERM still runs");
	assert_int_equal(client_finish(p), 1);
	client_free(p);
	assert_int_equal(stub_count(fake, "POST", "/tasks/w1.0.1/complete"), 0);
	assert_int_equal(stub_count(fake, "POST", "/tasks/w1.0.1/fail"), 0);
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_token_env_and_exit_status, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_two_locks_never_overlap, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_lost_lease_stops_the_group, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_frozen_server_noticed_by_own_clock, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_not_acquired_runs_nothing, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_signal_while_queued_leaves_the_queue, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_signal_racing_the_grant_releases_it, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_lock_granted_after_a_long_wait_runs, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_sigterm_goes_to_the_command_first, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_lease_counts_from_the_acquire_send, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_background_child_keeps_the_lease, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_long_wait_keeps_its_place, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_sigint_ends_the_background_child_before_release,
					    setup, teardown),
	    cmocka_unit_test_setup_teardown(test_durations_out_of_range_are_usage_errors, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_worker_completes_with_stdout, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_worker_runs_a_task_that_came_late, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_worker_fails_with_status_and_stderr, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_idle_worker_stops_at_once, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_worker_kills_what_ignores_sigterm, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_worker_stops_the_command_by_its_own_clock, setup,
					    teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
