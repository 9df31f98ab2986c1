/*
 * shutdown.c - what batond says while it stops. The first SIGTERM or SIGINT (taken by
 * main) is announced with what the shutdown waits for: how many steps run (the
 * resources' holders in the engine's metrics) and until when. A second one is taken by
 * a thread of its own, since main is then blocked in baton_engine_close: it says that
 * batond stops now, and exits 1 at once. Either way the log's last line says "stopped",
 * and the pid file (--pid-file), written once batond listens, is gone before it exits.
 */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Written by srv_pid_file_write; empty: none. Under pid_mu: main and the second signal's
 * thread may both come to remove it. */
static char pid_file[4096];
static pthread_mutex_t pid_mu = PTHREAD_MUTEX_INITIALIZER;

/* "SIGTERM", "SIGINT": the names operators type. */
static const char *signame(int sig)
{
	return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : strsignal(sig);
}

/* Steps running now: the resources' holders in the engine's metrics; -1 if unknown. */
static long running_steps(baton_engine *e)
{
	json_t *m = NULL, *res;
	baton_error err = {0};
	const char *name;
	long n = 0;
	if (baton_engine_metrics(e, &m, &err))
		return -1;
	json_object_foreach(json_object_get(m, "resources"), name, res)
	{
		n += (long)json_integer_value(json_object_get(res, "holders"));
	}
	json_decref(m);
	return n;
}

/* "2026-11-30T05:41:32.011Z", ms from now. */
static void time_after(char *buf, size_t len, int64_t ms)
{
	struct timespec now;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &now);
	int64_t at = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000 + ms;
	time_t secs = (time_t)(at / 1000);
	gmtime_r(&secs, &tm);
	size_t n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf + n, len - n, ".%03dZ", (int)(at % 1000));
}

void srv_shutdown_announce(baton_engine *e, int sig, int64_t timeout_ms)
{
	long running = running_steps(e);
	const char *steps = running == 1 ? "step" : "steps";
	char until[40], count[32] = "";
	time_after(until, sizeof until, timeout_ms);
	if (running > 0)
		snprintf(count, sizeof count, "%ld ", running);
	if (running == 0)
		srv_log(BATON_LOG_INFO,
			"%s: shutting down: no step is running; send SIGTERM or SIGINT again to"
			" stop at once",
			signame(sig));
	else if (timeout_ms == 0)
		srv_log(BATON_LOG_INFO,
			"%s: shutting down without waiting (--shutdown-timeout 0): %srunning %s"
			" will run again after a restart",
			signame(sig), count, steps);
	else
		srv_log(BATON_LOG_INFO,
			"%s: shutting down: waiting for %srunning %s, up to %lld s (until %s);"
			" a step cut off then runs again after a restart; send SIGTERM or SIGINT"
			" again to stop at once",
			signame(sig), count, steps, (long long)timeout_ms / 1000, until);
}

static int pid_file_error(const char *path, baton_error *err)
{
	snprintf(err->msg, sizeof err->msg, "cannot write the pid file %.400s: %s", path,
		 strerror(errno));
	return -1;
}

int srv_pid_file_write(const char *path, baton_error *err)
{
	char tmp[sizeof pid_file + 16], line[32];
	int n = snprintf(line, sizeof line, "%ld\n", (long)getpid());
	if (strlen(path) >= sizeof pid_file) {
		errno = ENAMETOOLONG;
		return pid_file_error(path, err);
	}
	/* A file of its own, made 0600 whatever the umask, and renamed over path: a reader
	 * never sees it half written, and a stale one (of a batond killed with SIGKILL,
	 * whatever its mode) is replaced. */
	snprintf(tmp, sizeof tmp, "%s.XXXXXX", path);
	int fd = mkstemp(tmp);
	if (fd < 0)
		return pid_file_error(path, err);
	int ok = write(fd, line, (size_t)n) == n;
	ok = close(fd) == 0 && ok;
	if (!ok || rename(tmp, path) != 0) {
		int saved = errno;
		unlink(tmp);
		errno = saved;
		return pid_file_error(path, err);
	}
	pthread_mutex_lock(&pid_mu);
	snprintf(pid_file, sizeof pid_file, "%s", path);
	pthread_mutex_unlock(&pid_mu);
	return 0;
}

void srv_pid_file_remove(void)
{
	char line[32] = "", mine[32];
	snprintf(mine, sizeof mine, "%ld\n", (long)getpid());
	pthread_mutex_lock(&pid_mu);
	int fd = pid_file[0] ? open(pid_file, O_RDONLY | O_CLOEXEC) : -1;
	if (fd >= 0) {
		ssize_t n = read(fd, line, sizeof line - 1);
		close(fd);
		line[n > 0 ? n : 0] = 0;
		/* Another batond may have been started on the same file since: leave its. */
		if (strcmp(line, mine) == 0)
			unlink(pid_file);
	}
	pid_file[0] = 0;
	pthread_mutex_unlock(&pid_mu);
}

static void *second_signal(void *arg)
{
	const sigset_t *sigs = arg;
	int sig = 0;
	if (sigwait(sigs, &sig) != 0)
		return NULL;
	srv_log(BATON_LOG_WARN,
		"%s again: stopping now, without waiting for running steps (they run again"
		" after a restart)",
		signame(sig));
	srv_pid_file_remove();
	srv_log(BATON_LOG_WARN, "stopped (exit 1)");
	_exit(1);
}

void srv_shutdown_watch(const sigset_t *sigs)
{
	static sigset_t watched;
	pthread_t t;
	watched = *sigs;
	if (pthread_create(&t, NULL, second_signal, &watched) == 0)
		pthread_detach(t);
}
