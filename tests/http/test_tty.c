/*
 * test_tty.c - `baton lock` in a terminal, as a shell's foreground job: the command's
 * process group is the terminal's foreground while it runs, so it reads a line typed
 * there; Ctrl-C ends it (130) and the lease is released; Ctrl-Z stops it, baton lock
 * stops too (its shell gets its prompt back) while the lease stays held and renewed,
 * and `fg` resumes it; `kill %1` on the stopped job ends it (143). A real pseudo-terminal
 * is driven by tests/http/tty_drive.py (python3), which plays the shell: session
 * leader, baton lock in a group of its own given the terminal, keystrokes written to
 * the pty's master side; it prints what it saw as JSON. Without a terminal nothing
 * changed (test_lock). And `baton worker`, the terminal's foreground job itself (its
 * command reads the task, not the terminal): Ctrl-Z stops the command and the worker
 * while the claim is kept, and `fg` resumes both; Ctrl-\ reaches the command; `--once`
 * with no task waits at most --wait, then exits 75 without running anything.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../harness/client.h"

#define DRIVE_MS 90000 /* the driver bounds itself by 60 s */

static char dir[64];
static pid_t driver;
static json_t *driven; /* the driver's last answer: freed by teardown, also after a failure */

static int setup(void **state)
{
	snprintf(dir, sizeof dir, "/tmp/baton-tty-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	return hs_setup(state);
}

/* Kills what a failed test left: the driver, baton lock and the command, by pid. */
static void kill_leftovers(void)
{
	if (driver > 0) {
		kill(driver, SIGKILL);
		waitpid(driver, NULL, 0);
		driver = 0;
	}
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
	json_decref(driven);
	driven = NULL;
	kill_leftovers();
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	if (system(cmd) != 0)
		return -1;
	return hs_close(*state);
}

/* tests/http/tty_drive.py of the tree this file was compiled in. */
static void driver_path(char *out, size_t size)
{
	static const char self[] = "tests/http/test_tty.c";
	size_t len = strlen(__FILE__), tail = sizeof self - 1;
	size_t root = len >= tail && strcmp(__FILE__ + len - tail, self) == 0 ? len - tail : 0;
	snprintf(out, size, "%.*stests/http/tty_drive.py", (int)root, __FILE__);
}

/* Runs the driver in MODE against s (its own session: setsid) and returns its JSON
 * (borrowed: teardown frees it, so that a failed assertion leaks nothing). */
static json_t *drive(const hs_server *s, const char *mode)
{
	char script[512], url[64];
	driver_path(script, sizeof script);
	snprintf(url, sizeof url, "%s", client_url_of(s));
	const char *baton = getenv("BATON_CLIENT");
	assert_non_null(baton);
	int out[2];
	assert_int_equal(pipe(out), 0);
	driver = fork();
	assert_true(driver >= 0);
	if (driver == 0) {
		setsid();
		dup2(out[1], 1);
		close(out[0]);
		close(out[1]);
		execlp("python3", "python3", script, mode, baton, url, dir, (char *)NULL);
		_exit(127);
	}
	close(out[1]);
	char buf[65536];
	size_t n = 0;
	int64_t end = hs_mono_ms() + DRIVE_MS;
	for (;;) {
		int64_t left = end - hs_mono_ms();
		struct pollfd p = {.fd = out[0], .events = POLLIN};
		if (left <= 0 || poll(&p, 1, (int)left) < 0) {
			if (left <= 0 || errno != EINTR)
				break;
			continue;
		}
		ssize_t got = read(out[0], buf + n, sizeof buf - 1 - n);
		if (got <= 0)
			break;
		n += (size_t)got;
	}
	buf[n] = 0;
	close(out[0]);
	kill(driver, SIGKILL); /* at its end already, unless it overran */
	waitpid(driver, NULL, 0);
	driver = 0;
	json_error_t err;
	json_t *r = json_loads(buf, 0, &err);
	json_decref(driven);
	driven = r; /* borrowed by the test from here */
	if (!r)
		fail_msg("the driver said: %s", buf);
	printf("# %s: %s", mode, buf);
	if (json_object_get(r, "error"))
		fail_msg("%s: %s", mode, buf);
	return r;
}

static void assert_released(const hs_server *s, const json_t *r)
{
	assert_true(json_is_string(json_object_get(r, "held")));
	assert_true(json_is_null(json_object_get(r, "held_after")));
	json_t *res = hs_get_json(s, "/resources/db", 200);
	assert_true(json_is_null(json_object_get(res, "holder")));
	json_decref(res);
}

/* The old baton lock left the terminal to itself: the command, in a background group,
 * was stopped by SIGTTIN at its read, and baton lock renewed forever. */
static void test_command_reads_a_line_from_the_terminal(void **state)
{
	hs_server *s = *state;
	json_t *r = drive(s, "line");
	assert_int_equal(hs_int(r, "status"), 0);
	assert_non_null(strstr(hs_str(r, "output"), "got hello"));
	assert_released(s, r);
}

static void test_ctrl_c_ends_the_command_with_130(void **state)
{
	hs_server *s = *state;
	json_t *r = drive(s, "intr");
	assert_int_equal(hs_int(r, "status"), 130);
	assert_released(s, r);
}

/* Ctrl-Z: the command and baton lock stopped, the lease held for three ttls (renewed),
 * then `fg` resumes the command, which reads its line. */
static void test_ctrl_z_keeps_the_lease_until_fg(void **state)
{
	hs_server *s = *state;
	json_t *r = drive(s, "stop");
	assert_true(json_is_true(json_object_get(r, "baton_stopped")));
	assert_string_equal(hs_str(r, "cmd_state"), "T");
	assert_string_equal(hs_str(r, "held_while_stopped"), hs_str(r, "held"));
	assert_int_equal(hs_int(r, "status"), 0);
	assert_non_null(strstr(hs_str(r, "output"), "got hello"));
	assert_released(s, r);
}

/* `kill %1` on the stopped job: SIGTERM, then SIGCONT, to baton lock's group. */
static void test_sigterm_ends_a_stopped_command(void **state)
{
	hs_server *s = *state;
	json_t *r = drive(s, "kill");
	assert_int_equal(hs_int(r, "status"), 143);
	assert_released(s, r);
}

/* ---- baton worker ---- */

static void submit_external(const hs_server *s)
{
	json_decref(hs_create_workflow(s, json_pack("{s:s, s:s, s:[{s:s, s:b}], s:{s:i}}", "id",
						    "w1", "resource", "db", "workers", "name", "tw",
						    "external", 1, "retry", "max_attempts", 1)));
}

/* Ctrl-Z while the command runs: the command and the worker stopped, the claim kept for
 * three ttls (heartbeaten by the keeper), then `fg` resumes the command, which completes
 * the task in its first attempt. The old worker stopped alone: its command ran on
 * unwatched, the claim expired and the step failed. */
static void test_worker_ctrl_z_keeps_the_claim_until_fg(void **state)
{
	hs_server *s = *state;
	submit_external(s);
	json_t *r = drive(s, "wstop");
	assert_true(json_is_true(json_object_get(r, "worker_stopped")));
	assert_string_equal(hs_str(r, "cmd_state"), "T");
	json_t *st = json_object_get(r, "step_while_stopped");
	assert_string_equal(hs_str(st, "status"), "running");
	assert_int_equal(hs_int(st, "attempts"), 1);
	assert_int_equal(hs_int(r, "status"), 0);
	st = json_object_get(r, "step");
	assert_string_equal(hs_str(st, "status"), "completed");
	assert_int_equal(hs_int(st, "attempts"), 1);
	assert_string_equal(hs_str(st, "result"), "done");
}

/* Ctrl-\ goes to the worker, the terminal's foreground job, which passes it to the command:
 * the command ends (131), its failure is reported, and the worker exits 1 (--once). The
 * old worker died of the SIGQUIT and left its command running. */
static void test_worker_ctrl_backslash_reaches_the_command(void **state)
{
	hs_server *s = *state;
	submit_external(s);
	json_t *r = drive(s, "wquit");
	assert_int_equal(hs_int(r, "status"), 1);
	assert_true(json_is_false(json_object_get(r, "cmd_alive")));
	json_t *st = json_object_get(r, "step");
	assert_string_equal(hs_str(st, "status"), "failed");
	assert_non_null(strstr(hs_str(st, "error"), "exit status 131"));
}

/* The old worker waited forever for a task (and did not know --wait). */
static void test_worker_once_waits_at_most_wait(void **state)
{
	hs_server *s = *state;
	char ran[128];
	snprintf(ran, sizeof ran, "touch %s/ran", dir);
	const char *const args[] = {"worker", "--worker", "idle", "--once", "--wait", "2s",
				    "--",     "sh",	  "-c",	  ran,	    NULL};
	int64_t start = hs_mono_ms();
	client_proc *p = client_expect_exit(75, client_url_of(s), args);
	int64_t took = hs_mono_ms() - start;
	assert_true(took >= 1900);
	assert_true(took < 30000); /* a claim's long poll alone is 30 s */
	assert_non_null(strstr(p->e.p, "no task for idle within --wait"));
	client_free(p);
	snprintf(ran, sizeof ran, "%s/ran", dir);
	assert_int_equal(access(ran, F_OK), -1);
	const char *const bad[] = {"worker", "--worker", "idle", "--once", "--wait",
				   "soon",   "--",	 "true", NULL};
	client_free(client_expect_exit(2, client_url_of(s), bad));
	/* --wait bounds --once only: without it, a usage error, and nothing runs */
	char touch[160];
	snprintf(touch, sizeof touch, "touch %s", ran);
	const char *const endless[] = {"worker", "--worker", "idle", "--wait", "2s",
				       "--",	 "sh",	     "-c",   touch,    NULL};
	p = client_expect_exit(2, client_url_of(s), endless);
	assert_non_null(strstr(p->e.p, "--once"));
	client_free(p);
	assert_int_equal(access(ran, F_OK), -1);
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_command_reads_a_line_from_the_terminal, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_ctrl_c_ends_the_command_with_130, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_ctrl_z_keeps_the_lease_until_fg, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_sigterm_ends_a_stopped_command, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_worker_ctrl_z_keeps_the_claim_until_fg, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_worker_ctrl_backslash_reaches_the_command, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_worker_once_waits_at_most_wait, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
