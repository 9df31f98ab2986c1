/*
 * main.c - batond: start-up order, signals, shutdown.
 *
 * Start-up: configuration, the database directory, the engine (which recovers every
 * unfinished workflow before anything else happens), then the HTTP listener. Signals
 * are blocked in every thread and taken by sigwait here: the first SIGTERM or SIGINT
 * stops the listener, lets running steps finish (--shutdown-timeout) and closes the
 * database; a second one, taken by a thread of its own, exits at once. Each stage says so
 * in the log, which ends with "stopped". SIGKILL at any moment is survivable by design.
 */
#include "server.h"

#include <errno.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* mkdir -p for the database's directory. */
static int make_dirs(const char *db)
{
	char path[4096];
	snprintf(path, sizeof path, "%s", db);
	char *dir = dirname(path);
	for (char *p = dir + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(dir, 0755) != 0 && errno != EEXIST)
			return -1;
		*p = '/';
	}
	return (mkdir(dir, 0755) != 0 && errno != EEXIST) ? -1 : 0;
}

static int is_loopback(const char *host)
{
	return strncmp(host, "127.", 4) == 0 || strcmp(host, "::1") == 0 ||
	       strcmp(host, "localhost") == 0;
}

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

/* The first signal's line: what shutting down waits for, and until when. The words
 * "steps still running" are the engine's, when it gives up on them at the deadline. */
static void log_shutdown(baton_engine *e, int sig, int64_t timeout_ms)
{
	long running = running_steps(e);
	const char *steps = running == 1 ? "step" : "steps";
	char until[40];
	time_after(until, sizeof until, timeout_ms);
	if (running == 0)
		srv_log(BATON_LOG_INFO,
			"%s: shutting down: no step is running; send SIGTERM or SIGINT again to"
			" stop at once",
			signame(sig));
	else if (timeout_ms == 0)
		srv_log(BATON_LOG_INFO,
			"%s: shutting down without waiting (--shutdown-timeout 0): %ld running %s"
			" will run again after a restart",
			signame(sig), running, steps);
	else
		srv_log(BATON_LOG_INFO,
			"%s: shutting down: waiting for %ld running %s, up to %lld s (until %s);"
			" a step cut off then runs again after a restart; send SIGTERM or SIGINT"
			" again to stop at once",
			signame(sig), running, steps, (long long)timeout_ms / 1000, until);
}

/* Takes the second SIGTERM or SIGINT, while main waits for the steps: stop now. */
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
	srv_log(BATON_LOG_WARN, "stopped (exit 1)");
	_exit(1);
}

int main(int argc, char **argv)
{
	config cfg;
	int rc = config_load(&cfg, argc, argv);
	if (rc)
		return rc > 0 ? 0 : 2;
	srv_log_level = cfg.log_level;
	srv_log_json = cfg.log_json;

	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	if (make_dirs(cfg.db) != 0) {
		srv_log(BATON_LOG_ERROR, "cannot create the directory of %s: %s", cfg.db,
			strerror(errno));
		return 1;
	}
	baton_engine_config ecfg = {
	    .db_path = cfg.db,
	    .threads = cfg.threads,
	    .readers = cfg.http_threads,
	    .log = srv_engine_log,
	    .log_flush = srv_engine_log_flush,
	    .log_level = cfg.log_level,
	    .allow_call = cfg.allow_call,
	    .on_commit = srv_streams_notify,
	    .fault_file = getenv("BATON_TEST_FAULT_FILE"), /* tests only */
	};
	srv s = {.cfg = &cfg,
		 .conn_mu = PTHREAD_MUTEX_INITIALIZER,
		 .post_mu = PTHREAD_MUTEX_INITIALIZER,
		 .post_cv = PTHREAD_COND_INITIALIZER};
	baton_error err = {0};
	if (baton_engine_open(&ecfg, &s.engine, &err)) {
		srv_log(BATON_LOG_ERROR, "cannot open %s: %s", cfg.db, err.msg);
		return 1;
	}
	if (srv_streams_start() != 0)
		snprintf(err.msg, sizeof err.msg, "cannot start the event-stream thread");
	else if (srv_start(&s, &err))
		srv_streams_close();
	if (err.msg[0]) {
		srv_log(BATON_LOG_ERROR, "%s", err.msg);
		baton_engine_close(s.engine, 0);
		srv_log_close();
		return 1;
	}
	srv_log(BATON_LOG_INFO, "batond %s: database %s, %d step threads", BATON_VERSION, cfg.db,
		cfg.threads);
	if (!cfg.token[0] && !is_loopback(cfg.host))
		srv_log(BATON_LOG_WARN,
			"listening on %s without --token: anyone who reaches this address can"
			" submit and cancel workflows",
			cfg.host[0] ? cfg.host : "every interface");
	for (int i = 0; i < cfg.n_allow_call; i++)
		srv_log(BATON_LOG_INFO, "HTTP steps may call %s", cfg.allow_call[i]);
	const char *host = cfg.host[0] ? cfg.host : s.dual_stack ? "::" : "0.0.0.0";
	srv_log(BATON_LOG_INFO, "listening on http://%s%s%s:%d%s", strchr(host, ':') ? "[" : "",
		host, strchr(host, ':') ? "]" : "", s.port,
		cfg.host[0] ? "" : " (every interface)");

	int sig = 0;
	pthread_t second;
	sigwait(&sigs, &sig);
	log_shutdown(s.engine, sig, cfg.shutdown_timeout_ms);
	if (pthread_create(&second, NULL, second_signal, &sigs) == 0)
		pthread_detach(second);
	srv_stop(&s);
	baton_engine_close(s.engine, cfg.shutdown_timeout_ms);
	srv_log_close();
	srv_log(BATON_LOG_INFO, "stopped");
	return 0;
}
