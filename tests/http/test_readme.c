/*
 * test_readme.c - the curl examples of README.md, run as written against a real batond.
 *
 * Every ```sh block of the README is run with sh, after pointing 127.0.0.1:8080 at the
 * test server's port. curl gets --fail-with-body, so an example that answers 4xx/5xx
 * fails the test, except in blocks that start with "# expect: NNN", whose output must
 * be a problem with that status. Afterwards the test checks what the README promises:
 * pay-1 completed its five steps in order without overlap, pay-2 retried worker-C once,
 * the contended resource showed a holder and a waiter, and the waiter was cancelled.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "../harness/harness.h"

#define WAIT_MS 30000

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

/* Replaces every "127.0.0.1:8080" with the test server's address. */
static char *retarget(const char *block, int port)
{
	static const char from[] = "127.0.0.1:8080";
	char to[32];
	snprintf(to, sizeof to, "127.0.0.1:%d", port);
	size_t cap = strlen(block) * 2 + 64, n = 0;
	char *out = malloc(cap);
	for (const char *p = block; *p;) {
		if (strncmp(p, from, sizeof from - 1) == 0) {
			n += (size_t)snprintf(out + n, cap - n, "%s", to);
			p += sizeof from - 1;
		} else {
			out[n++] = *p++;
		}
	}
	out[n] = 0;
	return out;
}

/* Runs a shell script; returns its exit status and its stdout (caller frees). */
static int run_sh(const char *script, char **output)
{
	char path[] = "/tmp/baton-readme-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	FILE *f = fdopen(fd, "w");
	fputs(script, f);
	fclose(f);
	char cmd[128];
	snprintf(cmd, sizeof cmd, "sh %s 2>&1", path);
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

static int run_blocks(hs_server *s, const char *readme)
{
	int blocks = 0;
	const char *p = readme;
	while ((p = strstr(p, "\n```sh\n"))) {
		p += strlen("\n```sh\n");
		const char *end = strstr(p, "\n```");
		assert_non_null(end);
		char *block = strndup(p, (size_t)(end - p));
		char *cmds = retarget(block, hs_port(s));
		int expect = 0;
		sscanf(cmds, "# expect: %d", &expect);
		size_t len = strlen(cmds) + 256;
		char *script = malloc(len);
		snprintf(script, len, "set -e\n%s%s\n",
			 expect ? "" : "curl() { command curl --fail-with-body \"$@\"; }\n", cmds);
		char *out;
		int rc = run_sh(script, &out);
		if (rc != 0)
			fail_msg("README block failed (exit %d):\n%s\noutput:\n%s", rc, block, out);
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
