/*
 * client.h - the command-line client `baton` run as a child process by the tests: its
 * stdout and stderr are read incrementally through pipes (or stdout through a pty) from
 * the test's own thread, with poll and a deadline, so a test can act when a given line
 * has arrived and while the client still runs. The binary comes from $BATON_CLIENT;
 * $BATON_CLIENT_WRAPPER, when set, prefixes its command line (split at spaces), e.g.
 * "valgrind -q --leak-check=full --error-exitcode=99". At most four run at once; their
 * slots live outside the tests' stack frames, so that teardown can still kill, reap and
 * free what a test that failed an assertion started.
 */
#ifndef BATON_TEST_CLIENT_H
#define BATON_TEST_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "harness.h"

typedef struct client_text {
	char *p; /* NUL-terminated, "" when nothing arrived */
	size_t len, cap;
} client_text;

typedef struct client_proc {
	pid_t pid;    /* 0 once reaped */
	int out, err; /* read ends; -1 at end of file */
	client_text o, e;
	int status; /* exit code once reaped; 128 + signal; -1 before */
	bool used;
} client_proc;

const char *client_url_of(const hs_server *s); /* http://127.0.0.1:PORT (static buffer) */
int client_closed_port(void);		       /* a local port nothing listens on */
/* Starts the client with args (NULL-terminated) and BATON_URL (NULL: unset); stdout on a
 * pseudo-terminal when use_pty. */
client_proc *client_spawn(const char *const *args, const char *baton_url, bool use_pty);
/* Reads what arrives within timeout_ms; false once both streams have ended. */
bool client_pump(client_proc *p, int timeout_ms);
/* Reads stdout until it holds needle; fails the test at the deadline or at EOF. */
void client_read_until(client_proc *p, const char *needle);
bool client_running(client_proc *p); /* reaps it, recording its status, once it exited */
/* Reads everything and reaps the child: its exit code (128 + signal when killed). */
int client_finish(client_proc *p);
void client_free(client_proc *p); /* kills and reaps it if it still runs, frees its output */
void client_free_all(void);	  /* kills and reaps what still runs (teardown) */
/* Runs the client to its end and asserts its exit code; the output stays in the result
 * (client_free it). */
client_proc *client_expect_exit(int code, const char *baton_url, const char *const *args);

#endif
