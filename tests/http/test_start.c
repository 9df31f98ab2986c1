/*
 * test_start.c - what batond refuses at start, and what it leaves behind when it does:
 * a --db of a scheme baton has no store for is refused with a message (and no directory
 * named after the scheme appears), a start that fails after the database was made (the
 * port is in use) leaves no database behind (one that was there is kept), and
 * sqlite:PATH names a SQLite file.
 * These runs choose their own --db, so they run once, on the SQLite pass.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../harness/harness.h"

#define WAIT_MS 30000

/* A new empty directory for the run's files (removed by the test). */
static void temp_dir(char *out, size_t n)
{
	const char *tmp = getenv("TMPDIR");
	snprintf(out, n, "%s/baton-start-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	assert_non_null(mkdtemp(out));
}

static int exists(const char *dir, const char *name)
{
	char path[512];
	struct stat st;
	snprintf(path, sizeof path, "%s/%s", dir, name);
	return stat(path, &st) == 0;
}

/* Runs batond in dir (its working directory) with args; its exit status, output in out. */
static int run_in(const char *dir, const char *const *args, char *out, size_t n)
{
	char here[512];
	assert_non_null(getcwd(here, sizeof here));
	assert_int_equal(chdir(dir), 0);
	int st = hs_run_batond(args, NULL, NULL, WAIT_MS, out, n);
	assert_int_equal(chdir(here), 0);
	return st;
}

static void remove_dir(const char *dir)
{
	char cmd[600];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
}

/* mysql://, a misspelt postgress:// and the like: refused, nothing made. */
static void test_unsupported_scheme_refused(void **state)
{
	(void)state;
	if (hs_store_is_pg())
		skip(); /* nothing here depends on the store of the run */
	char dir[256], out[4096];
	temp_dir(dir, sizeof dir);
	const char *urls[] = {"mysql://u@127.0.0.1/baton", "postgress://u@127.0.0.1/baton",
			      "file:///tmp/x.db://y"};
	for (size_t i = 0; i < sizeof urls / sizeof *urls; i++) {
		const char *args[] = {"--listen", "127.0.0.1:0", "--db", urls[i], NULL};
		int st = run_in(dir, args, out, sizeof out);
		assert_true(WIFEXITED(st));
		assert_int_equal(WEXITSTATUS(st), 2);
		if (!strstr(out, "is not a store batond supports"))
			fail_msg("--db %s: %s", urls[i], out);
	}
	assert_false(exists(dir, "mysql:"));
	assert_false(exists(dir, "postgress:"));
	assert_false(exists(dir, "file:"));
	remove_dir(dir);
}

/* The port is taken: batond says so, exits 1, and the database it had made is gone. */
static void test_failed_start_leaves_no_database(void **state)
{
	(void)state;
	if (hs_store_is_pg())
		skip(); /* nothing here depends on the store of the run */
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t len = sizeof a;
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
	assert_int_equal(listen(fd, 1), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	char dir[256], db[300], listen_at[64], out[4096];
	temp_dir(dir, sizeof dir);
	snprintf(db, sizeof db, "%s/data/baton.db", dir);
	snprintf(listen_at, sizeof listen_at, "127.0.0.1:%d", ntohs(a.sin_port));
	const char *args[] = {"--listen", listen_at, "--db", db, NULL};
	int st = hs_run_batond(args, NULL, NULL, WAIT_MS, out, sizeof out);
	close(fd);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
	assert_non_null(strstr(out, "cannot listen"));
	assert_false(exists(dir, "data/baton.db"));
	assert_false(exists(dir, "data/baton.db-wal"));
	assert_false(exists(dir, "data/baton.db-shm"));
	/* A database that was there before is kept as it was. */
	const char *make[] = {"--listen", "127.0.0.1:0", "--db", db, NULL};
	hs_server *s = hs_open(make);
	assert_non_null(s);
	json_decref(hs_create_workflow(
	    s, json_pack("{s:s, s:s, s:[s]}", "id", "kept", "resource", "r", "workers", "w")));
	json_decref(hs_wait_workflow(s, "kept", "completed", WAIT_MS));
	assert_int_equal(hs_close(s), 0);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
	assert_int_equal(listen(fd, 1), 0);
	st = hs_run_batond(args, NULL, NULL, WAIT_MS, out, sizeof out);
	close(fd);
	assert_int_equal(WEXITSTATUS(st), 1);
	assert_true(exists(dir, "data/baton.db"));
	remove_dir(dir);
}

/*
 * What a test below started, stopped and removed by teardown_run whether the test passed
 * or failed: the server (by its pid, through hs_close) and the temporary directory.
 */
static struct {
	hs_server *s;
	char dir[256];
} run;

static int teardown_run(void **state)
{
	(void)state;
	int rc = hs_close(run.s);
	run.s = NULL;
	if (run.dir[0]) {
		char cmd[600];
		snprintf(cmd, sizeof cmd, "rm -rf '%s'", run.dir);
		if (system(cmd) != 0)
			rc = -1;
		run.dir[0] = 0;
	}
	return rc;
}

/* The mode of dir/name (permission bits), -1 when it does not exist. */
static int mode_of(const char *dir, const char *name)
{
	char path[512];
	struct stat st;
	snprintf(path, sizeof path, "%s/%s", dir, name);
	return stat(path, &st) == 0 ? (int)(st.st_mode & 07777) : -1;
}

static void assert_mode(const char *dir, const char *name, int want)
{
	int got = mode_of(dir, name);
	if (got != want)
		fail_msg("%s/%s: mode %04o, expected %04o", dir, name, (unsigned)got,
			 (unsigned)want);
}

/*
 * Under the usual umask 022, what batond makes is its own user's alone: the database
 * (calls' headers, Authorization among them, are stored in it) and its WAL 0600, the
 * directories it creates for it 0700.
 */
static void test_files_are_private_under_umask_022(void **state)
{
	(void)state;
	if (hs_store_is_pg())
		skip(); /* SQLite's files */
	char db[320];
	const char *dir = run.dir;
	temp_dir(run.dir, sizeof run.dir);
	snprintf(db, sizeof db, "%s/data/sub/baton.db", dir);
	const char *args[] = {"--db", db, NULL};
	mode_t old = umask(022);
	hs_server *s = run.s = hs_open(args);
	umask(old);
	assert_non_null(s);
	json_decref(hs_create_workflow(
	    s, json_pack("{s:s, s:s, s:[s]}", "id", "private", "resource", "r", "workers", "w")));
	json_decref(hs_wait_workflow(s, "private", "completed", WAIT_MS));
	assert_mode(dir, "data", 0700);
	assert_mode(dir, "data/sub", 0700);
	assert_mode(dir, "data/sub/baton.db", 0600);
	assert_mode(dir, "data/sub/baton.db-wal", 0600); /* there while batond runs */
	if (exists(dir, "data/sub/baton.db-shm"))
		assert_mode(dir, "data/sub/baton.db-shm", 0600);
}

/*
 * A database made before batond created it 0600 (0644, say) keeps its mode, and its WAL
 * takes the same: batond leaves the mode alone but says so at each start.
 */
static void test_database_others_can_read_is_warned_of(void **state)
{
	(void)state;
	if (hs_store_is_pg())
		skip(); /* SQLite's file */
	char db[320];
	temp_dir(run.dir, sizeof run.dir);
	snprintf(db, sizeof db, "%s/baton.db", run.dir);
	const char *args[] = {"--db", db, NULL};
	hs_server *s = run.s = hs_open(args);
	assert_non_null(s);
	assert_int_equal(hs_stop(s), 0);
	char *log = hs_log_text(s);
	bool warned = log && strstr(log, "other users");
	free(log);
	assert_false(warned); /* 0600: nothing to say */
	assert_int_equal(chmod(db, 0644), 0);
	assert_int_equal(hs_start(s), 0);
	log = hs_log_text(s);
	warned = log && strstr(log, "can be read by other users (mode 0644)") &&
		 strstr(log, "chmod 600");
	free(log);
	if (!warned) {
		hs_dump_log(s, 4000);
		fail_msg("no warning that the database is 0644");
	}
	assert_mode(run.dir, "baton.db", 0644); /* left as the operator has it */
}

/* The environment test_empty_variables_count_as_unset changed, restored by teardown_env. */
static struct {
	char name[48];
	char *old; /* NULL: it was not set */
} saved[40];
static int nsaved;

static int teardown_env(void **state)
{
	for (int i = 0; i < nsaved; i++) {
		if (saved[i].old)
			setenv(saved[i].name, saved[i].old, 1);
		else
			unsetenv(saved[i].name);
		free(saved[i].old);
	}
	nsaved = 0;
	return teardown_run(state);
}

/* Sets name to "" for the servers started next, remembering what it was. */
static void set_empty(const char *name)
{
	for (int i = 0; i < nsaved; i++)
		if (strcmp(saved[i].name, name) == 0)
			return;
	assert_true(nsaved < (int)(sizeof saved / sizeof *saved));
	snprintf(saved[nsaved].name, sizeof saved[nsaved].name, "%s", name);
	const char *old = getenv(name);
	saved[nsaved].old = old ? strdup(old) : NULL;
	nsaved++;
	assert_int_equal(setenv(name, "", 1), 0);
}

/*
 * A variable set to the empty string counts as unset, as for most daemons (an env file
 * or a compose file that passes BATON_THREADS= through): every BATON_* variable that
 * `batond --help` names, and the tests' BATON_TEST_FAULT_FILE, set empty, and batond
 * starts on its defaults (the flags the harness gives aside) and runs a workflow.
 */
static void test_empty_variables_count_as_unset(void **state)
{
	(void)state;
	if (hs_store_is_pg())
		skip(); /* nothing here depends on the store of the run */
	static char help[16384];
	const char *args[] = {"--help", NULL};
	int st = hs_run_batond(args, NULL, NULL, WAIT_MS, help, sizeof help);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	for (const char *p = strstr(help, "BATON_"); p; p = strstr(p + 1, "BATON_")) {
		char name[48];
		size_t n = strspn(p, "ABCDEFGHIJKLMNOPQRSTUVWXYZ_");
		assert_true(n < sizeof name);
		snprintf(name, sizeof name, "%.*s", (int)n, p);
		set_empty(name);
	}
	if (nsaved < 19)
		fail_msg("batond --help names %d BATON_* variables, expected at least 19", nsaved);
	set_empty("BATON_TEST_FAULT_FILE");
	run.s = hs_open(NULL);
	assert_non_null(run.s);
	json_decref(hs_create_workflow(
	    run.s, json_pack("{s:s, s:s, s:[s]}", "id", "empty", "resource", "r", "workers", "w")));
	json_decref(hs_wait_workflow(run.s, "empty", "completed", WAIT_MS));
	char *log = hs_log_text(run.s);
	bool threads = log && strstr(log, ", 4 step threads");
	free(log);
	if (!threads) {
		hs_dump_log(run.s, 4000);
		fail_msg("batond did not start with its default of 4 step threads");
	}
}

/* sqlite:PATH is the file PATH. */
static void test_sqlite_prefix_names_a_file(void **state)
{
	(void)state;
	if (hs_store_is_pg())
		skip(); /* nothing here depends on the store of the run */
	char dir[256], db[320];
	temp_dir(dir, sizeof dir);
	snprintf(db, sizeof db, "sqlite:%s/named.db", dir);
	const char *args[] = {"--db", db, NULL};
	hs_server *s = hs_open(args);
	assert_non_null(s);
	json_decref(hs_create_workflow(
	    s, json_pack("{s:s, s:s, s:[s]}", "id", "named", "resource", "r", "workers", "w")));
	assert_int_equal(hs_close(s), 0);
	assert_true(exists(dir, "named.db"));
	remove_dir(dir);
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_unsupported_scheme_refused),
	    cmocka_unit_test(test_failed_start_leaves_no_database),
	    cmocka_unit_test(test_sqlite_prefix_names_a_file),
	    cmocka_unit_test_teardown(test_files_are_private_under_umask_022, teardown_run),
	    cmocka_unit_test_teardown(test_empty_variables_count_as_unset, teardown_env),
	    cmocka_unit_test_teardown(test_database_others_can_read_is_warned_of, teardown_run),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
