/*
 * test_readme.c - the curl examples of README.md, run as written against a real batond.
 *
 * Every ```sh block of the README is run with sh (under `timeout`, and killing what it
 * left running in the background), after pointing 127.0.0.1:8080 at the test server's
 * port, the ports 8081 and 9000 of the examples that start their own batond and web
 * server at free ports, and ./server/batond and ./client/baton at $BATOND and
 * $BATON_CLIENT. curl gets --fail-with-body, so an example that answers 4xx/5xx fails
 * the test, except in blocks that start with "# expect: NNN", whose output must be a
 * problem with that status. The output of the examples that say what they show is
 * checked: the event stream ends with the workflow's final event, HEAD answers headers,
 * the HTTP-call workflow fails on its 404 and `baton watch` says so with exit 1, the
 * workflow of the kill example completes with worker-C run twice. Afterwards the test
 * checks what the README promises: pay-1 completed its five steps in order without
 * overlap, pay-2 retried worker-C once, the contended resource showed a holder and a
 * waiter, and the waiter was cancelled.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../harness/harness.h"

#define WAIT_MS		30000
#define BLOCK_TIMEOUT_S 120 /* one README block, run by sh */

static char *read_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	rewind(f);
	char *buf = malloc((size_t)n + 1);
	size_t got = fread(buf, 1, (size_t)n, f);
	buf[got] = 0;
	fclose(f);
	return buf;
}

/* A port of 127.0.0.1 that nothing listens on right now. */
static int free_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof a;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	close(fd);
	return ntohs(a.sin_port);
}

/* What the README's addresses and paths become in the test. */
typedef struct target {
	char from[6][32];
	char to[6][4096];
	int n;
} target;

static void target_add(target *t, const char *from, const char *to)
{
	snprintf(t->from[t->n], sizeof t->from[t->n], "%s", from);
	snprintf(t->to[t->n], sizeof t->to[t->n], "%s", to);
	t->n++;
}

static void target_init(target *t, int port)
{
	char to[64];
	const char *batond = getenv("BATOND"), *client = getenv("BATON_CLIENT");
	if (!batond || !client)
		fail_msg("set BATOND and BATON_CLIENT to the absolute paths of batond and baton");
	t->n = 0;
	snprintf(to, sizeof to, "127.0.0.1:%d", port);
	target_add(t, "127.0.0.1:8080", to);
	snprintf(to, sizeof to, "127.0.0.1:%d", free_port());
	target_add(t, "127.0.0.1:8081", to);
	int web = free_port();
	snprintf(to, sizeof to, "127.0.0.1:%d", web);
	target_add(t, "127.0.0.1:9000", to);
	snprintf(to, sizeof to, "http.server %d", web);
	target_add(t, "http.server 9000", to);
	target_add(t, "./server/batond", batond);
	target_add(t, "./client/baton", client);
}

/* The block with every address and path of t replaced. */
static char *retarget(const char *block, const target *t)
{
	size_t cap = strlen(block) * 2 + 8192, n = 0;
	char *out = malloc(cap);
	for (const char *p = block; *p;) {
		int hit = -1;
		for (int i = 0; i < t->n && hit < 0; i++)
			if (strncmp(p, t->from[i], strlen(t->from[i])) == 0)
				hit = i;
		if (n + 4200 > cap)
			out = realloc(out, cap *= 2);
		if (hit >= 0) {
			n += (size_t)snprintf(out + n, cap - n, "%s", t->to[hit]);
			p += strlen(t->from[hit]);
		} else {
			out[n++] = *p++;
		}
	}
	out[n] = 0;
	return out;
}

/* Runs a shell script (TMPDIR a directory of its own, removed when it ends); returns its
 * exit status and its stdout (caller frees). */
static int run_sh(const char *script, char **output)
{
	char path[] = "/tmp/baton-readme-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	FILE *f = fdopen(fd, "w");
	fputs(script, f);
	fclose(f);
	/* The examples' mktemp -d directories go into one of the test's, removed after. */
	char tmp[] = "/tmp/baton-readme-tmp-XXXXXX", cmd[256];
	assert_non_null(mkdtemp(tmp));
	snprintf(cmd, sizeof cmd,
		 "TMPDIR=%s timeout -k 5 %d sh %s 2>&1; rc=$?; rm -rf %s; exit $rc", tmp,
		 BLOCK_TIMEOUT_S, path, tmp);
	FILE *p = popen(cmd, "r");
	assert_non_null(p);
	size_t cap = 4096, n = 0;
	char *out = malloc(cap);
	size_t got;
	while ((got = fread(out + n, 1, cap - n - 1, p)) > 0) {
		n += got;
		if (cap - n < 1024)
			out = realloc(out, cap *= 2);
	}
	out[n] = 0;
	int st = pclose(p);
	remove(path);
	*output = out;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Fails unless the output of a block holds `want`. */
static void expect_output(const char *block, const char *out, const char *want)
{
	if (!strstr(out, want))
		fail_msg("README block:\n%s\nshould print \"%s\"; it printed:\n%s", block, want,
			 out);
}

/* What the blocks that show something must print. */
static void check_output(const char *block, const char *out)
{
	if (strstr(block, "\"kill-me\"")) {
		expect_output(block, out, "status    completed, 4/4 steps completed");
		/* The step table of `baton get`: "  2  worker-C  completed  2  ..." */
		const char *c = strstr(out, "  2  worker-C  ");
		char status[16] = "";
		int attempts = 0;
		if (!c || sscanf(c, " 2 worker-C %15s %d", status, &attempts) != 2 ||
		    strcmp(status, "completed") != 0 || attempts != 2)
			fail_msg(
			    "kill example: worker-C did not complete on its second attempt:\n%s",
			    out);
	}
	if (strstr(block, "--allow-call")) {
		expect_output(block, out, "HTTP 404");
		expect_output(block, out, "workflow_failed");
		expect_output(block, out, "watch exited with 1");
		/* a clean first run: the web server listens before the first call */
		if (strstr(out, "Couldn't connect") || strstr(out, "; retry in"))
			fail_msg("README block:\n%s\nretried a call: it printed:\n%s", block, out);
	}
	if (strstr(block, "follow=true"))
		expect_output(block, out, "event: workflow_completed\n");
	if (strstr(block, "curl -sI")) {
		expect_output(block, out, "HTTP/1.1 200 OK");
		expect_output(block, out, "Content-Type: application/json");
	}
}

static int run_blocks(hs_server *s, const char *readme)
{
	int blocks = 0;
	target t;
	target_init(&t, hs_port(s));
	const char *p = readme;
	while ((p = strstr(p, "\n```sh\n"))) {
		p += strlen("\n```sh\n");
		const char *end = strstr(p, "\n```");
		assert_non_null(end);
		char *block = strndup(p, (size_t)(end - p));
		char *cmds = retarget(block, &t);
		int expect = 0;
		sscanf(cmds, "# expect: %d", &expect);
		size_t len = strlen(cmds) + 512;
		char *script = malloc(len);
		/* What a block starts in the background is stopped when it ends, even early. */
		snprintf(script, len,
			 "set -e\ncleanup() { kill $(jobs -p) 2>/dev/null || true; }\n"
			 "trap cleanup EXIT\ntrap 'exit 1' INT TERM\n%s%s\n",
			 expect ? "" : "curl() { command curl --fail-with-body \"$@\"; }\n", cmds);
		char *out;
		int rc = run_sh(script, &out);
		if (rc != 0)
			fail_msg("README block failed (exit %d):\n%s\noutput:\n%s", rc, block, out);
		check_output(block, out);
		if (expect) {
			char want[32];
			snprintf(want, sizeof want, "\"status\":%d", expect);
			if (!strstr(out, want) ||
			    !strstr(out, "\"type\":\"https://baton.dev/problems/"))
				fail_msg("README block expected a %d problem:\n%s\noutput:\n%s",
					 expect, block, out);
		}
		free(out);
		free(script);
		free(cmds);
		free(block);
		p = end + 4;
		blocks++;
	}
	return blocks;
}

static void check_promises(hs_server *s)
{
	json_t *wf = hs_wait_workflow(s, "pay-1", "completed", WAIT_MS);
	json_t *steps = json_object_get(wf, "steps");
	assert_int_equal(json_array_size(steps), 5);
	int64_t prev_end = 0;
	for (size_t i = 0; i < 5; i++) {
		json_t *st = json_array_get(steps, i);
		char want[16];
		snprintf(want, sizeof want, "worker-%c", (char)('A' + i));
		assert_string_equal(hs_str(st, "worker"), want);
		assert_int_equal(hs_int(st, "attempts"), 1);
		int64_t start = hs_time(st, "started_at"), end = hs_time(st, "finished_at");
		assert_true(start >= prev_end); /* in order, no overlap */
		assert_true(end >= start);
		prev_end = end;
	}
	json_decref(wf);
	wf = hs_wait_workflow(s, "pay-2", "completed", WAIT_MS);
	steps = json_object_get(wf, "steps");
	assert_int_equal(hs_int(json_array_get(steps, 2), "attempts"), 2);
	assert_int_equal(hs_int(json_array_get(steps, 1), "attempts"), 1);
	json_decref(wf);
	wf = hs_get_workflow(s, "audit");
	assert_string_equal(hs_str(wf, "status"), "cancelled");
	json_decref(wf);
	json_t *res = hs_get_json(s, "/resources/ledger-db", 200);
	json_t *holder = json_object_get(res, "holder");
	assert_string_equal(hs_str(holder, "workflow_id"), "nightly-import");
	assert_int_equal(json_array_size(json_object_get(res, "waiters")), 0);
	json_decref(res);
}

static void test_readme_curl_examples(void **state)
{
	hs_server *s = *state;
	const char *dir = getenv("BATON_SRCDIR");
	char path[4096];
	snprintf(path, sizeof path, "%s/README.md", dir ? dir : ".");
	char *readme = read_file(path);
	assert_non_null(readme);
	int blocks = run_blocks(s, readme);
	free(readme);
	assert_true(blocks >= 10); /* every endpoint has its example */
	check_promises(s);
}

static int setup(void **state)
{
	/* nightly-import holds its resource for 20 s: stop without waiting for it. */
	static const char *const args[] = {"--shutdown-timeout", "0", NULL};
	hs_server *s = hs_open(args);
	*state = s;
	return s ? 0 : -1;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_readme_curl_examples, setup, hs_teardown),
	};
	return cmocka_run_group_tests_name("readme", tests, NULL, NULL);
}
