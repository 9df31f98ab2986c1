/*
 * client.c - the command-line client `baton` as a child process of a test (see client.h):
 * its stdout and stderr read incrementally through pipes (or stdout through a pty) from
 * the test's own thread, with poll and a deadline.
 */
#include "client.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#define WAIT_MS	  60000 /* a client run: generous for valgrind and loaded CI */
#define MAX_ARGS  32
#define MAX_PROCS 4

extern char **environ;

/*
 * The children, outside the tests' stack frames: a failed assertion leaves its test
 * with a longjmp, and teardown must still kill, reap and free what it started.
 */
static client_proc procs[MAX_PROCS];

static void text_add(client_text *t, const char *p, size_t n)
{
	/* Grown by doubling: a client that prints megabytes (test_answers) arrives 8 KiB at
	 * a time, and a realloc of each size copies all of it again, which ASan's realloc
	 * always does. */
	if (!t->p || t->len + n + 1 > t->cap) {
		size_t cap = t->cap ? t->cap : 8192;
		while (cap < t->len + n + 1)
			cap *= 2;
		char *b = realloc(t->p, cap);
		assert_non_null(b);
		t->p = b;
		t->cap = cap;
	}
	memcpy(t->p + t->len, p, n);
	t->len += n;
	t->p[t->len] = '\0';
}

/* "http://127.0.0.1:PORT" of the server (a static buffer). */
const char *client_url_of(const hs_server *s)
{
	static char url[64];
	snprintf(url, sizeof url, "http://127.0.0.1:%d", hs_port(s));
	return url;
}

/* A port of 127.0.0.1 on which nothing listens (bound, then closed). */
int client_closed_port(void)
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
client_proc *client_spawn(const char *const *args, const char *baton_url, bool use_pty)
{
	char *argv[MAX_ARGS];
	int out[2], err[2];
	client_proc *p = NULL;

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
bool client_pump(client_proc *p, int timeout_ms)
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
void client_read_until(client_proc *p, const char *needle)
{
	int64_t deadline = hs_mono_ms() + WAIT_MS;
	while (!strstr(p->o.p, needle)) {
		if (hs_mono_ms() > deadline || !client_pump(p, 100))
			fail_msg("the client's stdout has no \"%s\" (%s)\nstdout:\n%s\nstderr:\n%s",
				 needle, hs_mono_ms() > deadline ? "timeout" : "it ended", p->o.p,
				 p->e.p);
	}
}

/* Whether the child still runs (reaps it, recording its status, when it exited). */
bool client_running(client_proc *p)
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
int client_finish(client_proc *p)
{
	int64_t deadline = hs_mono_ms() + WAIT_MS;
	while (client_pump(p, 100) || client_running(p)) {
		if (hs_mono_ms() > deadline) {
			kill(p->pid, SIGKILL);
			fail_msg("the client did not exit within %d ms\nstdout:\n%s\nstderr:\n%s",
				 WAIT_MS, p->o.p, p->e.p);
		}
	}
	return p->status;
}

/* Releases a child: kills and reaps it if it still runs, frees its buffers. */
void client_free(client_proc *p)
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

void client_free_all(void)
{
	for (size_t i = 0; i < MAX_PROCS; i++) {
		if (procs[i].used)
			client_free(&procs[i]);
	}
}

/* Runs the client to its end and asserts its exit code; its output stays in the result. */
client_proc *client_expect_exit(int code, const char *baton_url, const char *const *args)
{
	client_proc *p = client_spawn(args, baton_url, false);
	int rc = client_finish(p);
	if (rc != code) {
		fprintf(stderr, "args:");
		for (size_t i = 0; args[i]; i++)
			fprintf(stderr, " %s", args[i]);
		fail_msg("exit %d, expected %d\nstdout:\n%s\nstderr:\n%s", rc, code, p->o.p,
			 p->e.p);
	}
	return p;
}
