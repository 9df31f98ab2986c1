/*
 * batond.c - one way to start batond and read its port, for the test harness and the
 * benchmarks (see batond.h).
 */
#include "batond.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

pid_t batond_spawn(char *const argv[], const char *log, const char *env_name, const char *env_value)
{
	int log_fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
	if (log_fd < 0) {
		fprintf(stderr, "cannot create %s: %s\n", log, strerror(errno));
		return -1;
	}
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid < 0) {
		fprintf(stderr, "fork: %s\n", strerror(errno));
		close(log_fd);
		return -1;
	}
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127); /* the parent died before the line above */
		if (env_name)
			setenv(env_name, env_value, 1);
		int devnull = open("/dev/null", O_RDONLY);
		if (devnull >= 0)
			dup2(devnull, STDIN_FILENO);
		dup2(log_fd, STDOUT_FILENO);
		dup2(log_fd, STDERR_FILENO);
		execv(argv[0], argv);
		dprintf(STDERR_FILENO, "cannot exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	close(log_fd);
	return pid;
}

int batond_port_in_log(const char *log)
{
	const char *p = strstr(log, BATOND_LISTEN_MARK);
	if (!p)
		return 0;
	p += strlen(BATOND_LISTEN_MARK);
	const char *eol = strchr(p, '\n');
	if (!eol)
		return 0; /* the line is not complete yet */
	const char *colon = NULL;
	for (const char *q = p; q < eol && *q != ' ' && *q != '/'; q++)
		if (*q == ':')
			colon = q;
	if (!colon)
		return 0;
	char *end = NULL;
	long port = strtol(colon + 1, &end, 10);
	if (end == colon + 1 || port <= 0 || port > 65535)
		return 0;
	return (int)port;
}
