/*
 * batond.h - starting batond as a child process and learning its port, for the test
 * harness (tests/harness/harness.c) and the benchmarks (bench/common.c), which both
 * compile common/batond.c in. batond binds the port it is given (0: any free one) and
 * logs "listening on http://HOST:PORT"; that line is how its starter learns the port.
 */
#ifndef BATON_COMMON_BATOND_H
#define BATON_COMMON_BATOND_H

#include <sys/types.h>

#define BATOND_LISTEN_MARK "listening on http://"

/*
 * Forks and execs argv (argv[0] the binary's path, NULL-terminated: batond, or a helper
 * such as the benchmarks' minjson) with stdin from
 * /dev/null, stdout and stderr appended to the file `log` (created, or truncated), and
 * the environment variable env_name set to env_value (env_name NULL: none). The child is
 * killed when the calling thread's process dies (PR_SET_PDEATHSIG). Returns the child's
 * pid, or -1 (after printing why to stderr) when the log cannot be created or fork fails.
 */
pid_t batond_spawn(char *const argv[], const char *log, const char *env_name,
		   const char *env_value);

/*
 * The port of the complete "listening on http://HOST:PORT" line in a log's text; 0 while
 * there is none (or it is not complete yet).
 */
int batond_port_in_log(const char *text);

#endif
