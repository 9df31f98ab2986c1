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
#include <unistd.h>

/* mkdir -p for the directory of a file (the database, the pid file); what it creates is
 * batond's user's only (0700). */
static int make_dirs(const char *file)
{
	char path[4096];
	size_t n = strlen(file);
	if (n >= sizeof path)
		return -1;
	memcpy(path, file, n + 1);
	char *dir = dirname(path);
	for (char *p = dir + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(dir, 0700) != 0 && errno != EEXIST)
			return -1;
		*p = '/';
	}
	return (mkdir(dir, 0700) != 0 && errno != EEXIST) ? -1 : 0;
}

/* 1 when batond may create files in the database's directory, else 0 and says so. */
static int writable_dir(const char *db)
{
	char path[4096];
	size_t n = strlen(db);
	if (n >= sizeof path)
		return 1; /* too long to check here: opening it says what is wrong */
	memcpy(path, db, n + 1);
	const char *dir = dirname(path);
	if (access(dir, W_OK | X_OK) == 0)
		return 1;
	srv_log(BATON_LOG_ERROR, "cannot write in the directory %s (for the database %s): %s", dir,
		db, strerror(errno));
	return 0;
}

/* A SQLite database made by this start, and its WAL files, removed. */
static void remove_database(const char *db)
{
	static const char *const tails[] = {"", "-wal", "-shm", "-journal"};
	for (size_t i = 0; i < sizeof tails / sizeof *tails; i++) {
		char path[4200];
		snprintf(path, sizeof path, "%s%s", db, tails[i]);
		unlink(path);
	}
}

/*
 * A SQLite database that other users may read: made so by hand or by a batond that did
 * not create it 0600. Its mode is the operator's to change, so batond only says so (its
 * -wal file takes the same mode).
 */
static void warn_if_readable(const char *file)
{
	struct stat st;
	if (stat(file, &st) != 0 || !(st.st_mode & 077))
		return;
	srv_log(BATON_LOG_WARN,
		"the database %s can be read by other users (mode %04o), and it holds calls'"
		" headers: chmod 600 %s",
		file, (unsigned)(st.st_mode & 07777), file);
}

/* The pid file, in a directory made as the database's is. 0, or -1 with err set. */
static int write_pid_file(const char *path, baton_error *err)
{
	if (make_dirs(path) != 0) {
		snprintf(err->msg, sizeof err->msg,
			 "cannot create the directory of the pid file %.400s: %s", path,
			 strerror(errno));
		return -1;
	}
	return srv_pid_file_write(path, err);
}

/* --retention for the start-up line: "retention 30d" in its largest whole unit, or off. */
static void retention_text(int64_t ms, char *buf, size_t len)
{
	static const struct {
		char unit;
		int64_t ms;
	} units[] = {{'d', 86400000}, {'h', 3600000}, {'m', 60000}, {'s', 1000}};
	if (ms <= 0) {
		snprintf(buf, len, "retention off (finished workflows are kept)");
		return;
	}
	for (size_t i = 0; i < sizeof units / sizeof *units; i++)
		if (ms % units[i].ms == 0) {
			snprintf(buf, len, "retention %lld%c", (long long)(ms / units[i].ms),
				 units[i].unit);
			return;
		}
	snprintf(buf, len, "retention %lld ms", (long long)ms);
}

static int is_loopback(const char *host)
{
	return strncmp(host, "127.", 4) == 0 || strcmp(host, "::1") == 0 ||
	       strcmp(host, "localhost") == 0;
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

	/* A SQLite file's directory is made; a PostgreSQL URL names a server. */
	const char *file = strncmp(cfg.db, "sqlite:", 7) == 0 ? cfg.db + 7 : cfg.db;
	if (!strstr(cfg.db, "://") && make_dirs(file) != 0) {
		srv_log(BATON_LOG_ERROR, "cannot create the directory of %s: %s", file,
			strerror(errno));
		return 1;
	}
	/* A start that fails leaves no database it created behind (a port in use, say). */
	int fresh = !strstr(cfg.db, "://") && access(file, F_OK) != 0;
	if (!strstr(cfg.db, "://") && !writable_dir(file))
		return 1;
	char shown[1024];
	baton_db_redact(cfg.db, shown, sizeof shown);
	/* Empty counts as unset, as for every BATON_* variable (config.c). */
	const char *fault_file = getenv("BATON_TEST_FAULT_FILE");
	if (fault_file && !*fault_file)
		fault_file = NULL;
	const char *hold_file = getenv("BATON_TEST_HOLD_FILE");
	baton_engine_config ecfg = {
	    .db_path = cfg.db,
	    .threads = cfg.threads,
	    .readers = cfg.http_threads,
	    .log = srv_engine_log,
	    .log_flush = srv_engine_log_flush,
	    .log_level = cfg.log_level,
	    .allow_call = cfg.allow_call,
	    .on_commit = srv_streams_notify,
	    .fault_file = fault_file, /* tests only */
	    .hold_file = hold_file,   /* tests only */
	    .retention_ms = cfg.retention_ms,
	    .idle_resources = cfg.idle_resources,
	    .cache_bytes = cfg.cache_bytes ? cfg.cache_bytes : -1,
	    .node_id = cfg.node_id[0] ? cfg.node_id : NULL,
	    .lease_ms = cfg.lease_ms,
	    .commit_timeout_ms = cfg.commit_timeout_ms,
	    .require_sync_replication = cfg.require_sync,
	    .advertise_url = cfg.advertise_url,
	    .accept_system_identifier = cfg.accept_sysid[0] ? cfg.accept_sysid : NULL,
	};
	srv s = {.cfg = &cfg,
		 .conn_mu = PTHREAD_MUTEX_INITIALIZER,
		 .wait_mu = PTHREAD_MUTEX_INITIALIZER,
		 .wait_cv = PTHREAD_COND_INITIALIZER};
	baton_error err = {0};
	if (baton_engine_open(&ecfg, &s.engine, &err)) {
		srv_log(BATON_LOG_ERROR, "cannot open %s: %s", shown, err.msg);
		if (fresh)
			remove_database(file);
		return 1;
	}
	if (srv_streams_start(strstr(cfg.db, "://") ? 250 : 0) != 0)
		snprintf(err.msg, sizeof err.msg, "cannot start the event-stream thread");
	else if (srv_start(&s, &err))
		srv_streams_close();
	else if (cfg.pid_file[0] && write_pid_file(cfg.pid_file, &err))
		srv_stop(&s);
	if (err.msg[0]) {
		srv_log(BATON_LOG_ERROR, "%s", err.msg);
		baton_engine_close(s.engine, 0);
		if (fresh)
			remove_database(file);
		srv_log_close();
		return 1;
	}
	if (!cfg.advertise_url[0]) { /* known now: --listen may have asked for any port */
		config_default_advertise_url(&cfg, s.port);
		baton_engine_advertise(s.engine, cfg.advertise_url);
	}
	char retention[64];
	retention_text(cfg.retention_ms, retention, sizeof retention);
	srv_log(BATON_LOG_INFO, "batond %s: database %s, %d step threads, %s", BATON_VERSION, shown,
		cfg.threads, retention);
	if (!strstr(cfg.db, "://"))
		warn_if_readable(file);
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
	sigwait(&sigs, &sig);
	srv_shutdown_announce(s.engine, sig, cfg.shutdown_timeout_ms);
	srv_shutdown_watch(&sigs);
	srv_stop(&s);
	baton_engine_close(s.engine, cfg.shutdown_timeout_ms);
	srv_pid_file_remove();
	srv_log_close();
	srv_log(BATON_LOG_INFO, "stopped");
	return 0;
}
