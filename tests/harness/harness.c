/*
 * harness.c - runs the real batond for the HTTP tests (see harness.h): starts, stops,
 * kills and signals it, gives it its database (a SQLite file, or a PostgreSQL database of
 * its own) and reads it; requests.c talks to it.
 *
 * The server's stdout and stderr go to DIR/batond.N.log, one file per start, so that the
 * "listening on" line looked for after a restart is the new process's own. The process
 * gets PR_SET_PDEATHSIG so that a test binary that dies never leaves a server behind.
 *
 * On PostgreSQL (BATON_TEST_PG) each server gets a database created for it through libpq,
 * named after the test process and a counter (baton_t<pid>_<n>), and dropped by hs_close,
 * so tests share the server but never each other's rows.
 */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <cmocka.h>
#include <curl/curl.h>
#include <sqlite3.h>

#include "../../common/batond.h"
#include "pg.h"
#include "../../common/proc_cpu.h"

#define MAX_EXTRA_ARGS 16
#define LISTEN_MARK    BATOND_LISTEN_MARK
#define PG_URL_MAX     (PATH_MAX + 256)

struct hs_server {
	char dir[PATH_MAX];
	char db[PG_URL_MAX];	 /* the --db value: DIR/baton.db, or a PostgreSQL URL */
	char pg_name[64];	 /* the PostgreSQL database created for it; "" on SQLite */
	char log[PATH_MAX + 32]; /* log of the current (last) start */
	char *extra[MAX_EXTRA_ARGS + 1];
	char *env_name, *env_value; /* set in the server's environment (hs_set_env) */
	pid_t pid;		    /* 0 when not running */
	int port;
	int starts;
	int shares_db; /* hs_open_node: the database is another server's, not dropped here */
};

/* ---- small utilities ------------------------------------------------------------- */

static pthread_once_t global_once = PTHREAD_ONCE_INIT;

static void global_init(void)
{
	/* libcurl's global state must exist before any thread sends a request. */
	curl_global_init(CURL_GLOBAL_DEFAULT);
	signal(SIGPIPE, SIG_IGN);
}

int64_t hs_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t hs_mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void hs_pause_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/* Reads a whole file; NULL when it cannot be read. The caller frees the result. */
static char *read_file(const char *path, size_t *len_out)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap);
	size_t n;
	while (buf && (n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
		len += n;
		if (cap - len - 1 == 0) {
			char *bigger = realloc(buf, cap * 2);
			if (!bigger) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = bigger;
			cap *= 2;
		}
	}
	fclose(f);
	if (buf)
		buf[len] = '\0';
	if (len_out)
		*len_out = len;
	return buf;
}

void hs_filters_from_env(void)
{
	const char *only = getenv("BATON_TEST_FILTER"), *skip_these = getenv("BATON_TEST_SKIP");
	if (only && *only)
		cmocka_set_test_filter(only);
	if (skip_these && *skip_these)
		cmocka_set_skip_filter(skip_these);
}

/* ---- lifecycle ------------------------------------------------------------------- */

int hs_port(const hs_server *s)
{
	return s->port;
}
bool hs_running(const hs_server *s)
{
	return s->pid > 0;
}
const char *hs_db_path(const hs_server *s)
{
	return s->pg_name[0] ? NULL : s->db;
}
const char *hs_db_url(const hs_server *s)
{
	return s->db;
}

bool hs_alive(hs_server *s)
{
	if (s->pid <= 0)
		return false;
	int status;
	if (waitpid(s->pid, &status, WNOHANG) == s->pid) {
		fprintf(stderr, "harness: batond died (wait status 0x%x)\n", (unsigned)status);
		s->pid = 0;
		return false;
	}
	return true;
}

void hs_dump_log(const hs_server *s, size_t max_bytes)
{
	size_t len = 0;
	char *text = read_file(s->log, &len);
	if (!text) {
		fprintf(stderr, "harness: no log at %s\n", s->log);
		return;
	}
	size_t from = len > max_bytes ? len - max_bytes : 0;
	fprintf(stderr, "---- tail of %s ----\n%s\n---- end of log ----\n", s->log, text + from);
	free(text);
}

char *hs_log_text(const hs_server *s)
{
	size_t cap = 1, len = 0;
	char *all = calloc(1, cap);
	for (int i = 1; all && i <= s->starts; i++) {
		char path[PATH_MAX + 32];
		size_t n = 0;
		snprintf(path, sizeof path, "%s/batond.%d.log", s->dir, i);
		char *text = read_file(path, &n);
		if (!text)
			continue;
		char *bigger = realloc(all, cap + n);
		if (bigger) {
			all = bigger;
			memcpy(all + len, text, n + 1);
			len += n;
			cap += n;
		}
		free(text);
	}
	return all;
}

bool hs_log_says(const hs_server *s, const char *what, const char *then)
{
	char *log = hs_log_text(s);
	const char *at = log ? strstr(log, what) : NULL;
	bool says = at && (!then || strstr(at, then));
	free(log);
	return says;
}

int hs_start(hs_server *s)
{
	const char *bin = getenv("BATOND");
	if (!bin || !*bin) {
		fprintf(stderr, "harness: set BATOND to the absolute path of batond\n");
		return -1;
	}
	if (s->pid > 0) {
		fprintf(stderr, "harness: batond already runs (pid %d)\n", (int)s->pid);
		return -1;
	}
	s->starts++;
	snprintf(s->log, sizeof s->log, "%s/batond.%d.log", s->dir, s->starts);
	char *argv[8 + MAX_EXTRA_ARGS];
	int n = 0;
	argv[n++] = (char *)bin;
	argv[n++] = "--listen";
	argv[n++] = "127.0.0.1:0";
	argv[n++] = "--db";
	argv[n++] = s->db;
	for (int i = 0; s->extra[i]; i++)
		argv[n++] = s->extra[i];
	argv[n] = NULL;
	pid_t pid = batond_spawn(argv, s->log, s->env_name, s->env_value);
	if (pid < 0) {
		fprintf(stderr, "harness: batond did not start\n");
		return -1;
	}
	s->pid = pid;
	s->port = 0;

	int64_t deadline = hs_mono_ms() + HS_START_TIMEOUT_MS;
	while (hs_mono_ms() < deadline) {
		char *text = read_file(s->log, NULL);
		int port = text ? batond_port_in_log(text) : 0;
		free(text);
		if (port > 0) {
			s->port = port;
			return 0;
		}
		int status;
		if (waitpid(pid, &status, WNOHANG) == pid) {
			s->pid = 0;
			fprintf(stderr, "harness: batond exited (status 0x%x) before listening\n",
				(unsigned)status);
			hs_dump_log(s, 4000);
			return -1;
		}
		hs_pause_ms(HS_POLL_MS);
	}
	fprintf(stderr, "harness: batond did not log \"" LISTEN_MARK "...\" within %d ms\n",
		HS_START_TIMEOUT_MS);
	hs_dump_log(s, 4000);
	hs_kill(s);
	return -1;
}

/* The server's database: DIR/baton.db, or a new database on the server of BATON_TEST_PG. */
static int open_store(hs_server *s)
{
	static atomic_int serial;
	if (!hs_store_is_pg()) {
		snprintf(s->db, sizeof s->db, "%s/baton.db", s->dir);
		return 0;
	}
	snprintf(s->pg_name, sizeof s->pg_name, "baton_t%d_%d", (int)getpid(),
		 atomic_fetch_add(&serial, 1) + 1);
	if (pg_url_with_db(getenv("BATON_TEST_PG"), s->pg_name, s->db, sizeof s->db) != 0) {
		fprintf(stderr, "harness: BATON_TEST_PG is not a postgresql:// URL: %s\n",
			getenv("BATON_TEST_PG"));
		s->pg_name[0] = '\0';
		return -1;
	}
	return pg_db_create(s->pg_name);
}

static hs_server *open_on(const hs_server *first, const char *const *extra_args, int start);

hs_server *hs_open(const char *const *extra_args)
{
	return open_on(NULL, extra_args, 1);
}

hs_server *hs_open_node(const hs_server *first, const char *const *extra_args)
{
	return first ? open_on(first, extra_args, 1) : NULL;
}

hs_server *hs_new(const hs_server *first, const char *const *extra_args)
{
	return open_on(first, extra_args, 0);
}

/* Where the port of a postgresql://[user@]host:port/... URL starts, or NULL. */
static const char *url_port(const char *url)
{
	const char *sep = strstr(url, "://");
	if (!sep)
		return NULL;
	const char *host = sep + 3, *end = host + strcspn(host, "/?");
	const char *colon = NULL;
	for (const char *q = host; q < end; q++)
		if (*q == ':')
			colon = q;
	return colon ? colon + 1 : NULL;
}

int hs_pg_port(void)
{
	const char *url = getenv("BATON_TEST_PG");
	const char *port = url ? url_port(url) : NULL;
	return port ? atoi(port) : -1;
}

int hs_route_db(hs_server *s, int port)
{
	const char *at = s->pg_name[0] ? url_port(s->db) : NULL;
	if (!at)
		return -1;
	char out[PG_URL_MAX];
	size_t head = (size_t)(at - s->db);
	int n = snprintf(out, sizeof out, "%.*s%d%s", (int)head, s->db, port,
			 at + strspn(at, "0123456789"));
	if (n < 0 || (size_t)n >= sizeof out)
		return -1;
	memcpy(s->db, out, (size_t)n + 1);
	return 0;
}

/* Where the host list of a postgresql://[user@]hosts/... URL starts, and its length. */
static const char *url_hosts(const char *url, size_t *len)
{
	const char *sep = strstr(url, "://");
	if (!sep)
		return NULL;
	const char *host = sep + 3;
	size_t end = strcspn(host, "/?");
	const char *at = memchr(host, '@', end);
	if (at) {
		end -= (size_t)(at + 1 - host);
		host = at + 1;
	}
	*len = end;
	return host;
}

int hs_pg_ports(int *ports, int max)
{
	const char *url = getenv("BATON_TEST_PG");
	size_t len;
	const char *h = url ? url_hosts(url, &len) : NULL;
	int n = 0;
	for (const char *end = h ? h + len : NULL; h && h < end && n < max;) {
		const char *comma = memchr(h, ',', (size_t)(end - h)), *stop = comma ? comma : end;
		const char *colon = memchr(h, ':', (size_t)(stop - h));
		if (colon)
			ports[n++] = atoi(colon + 1);
		h = comma ? comma + 1 : end;
	}
	return n;
}

int hs_route_db_hosts(hs_server *s, const int *ports, int n)
{
	size_t len;
	const char *h = s->pg_name[0] ? url_hosts(s->db, &len) : NULL;
	if (!h)
		return -1;
	char out[PG_URL_MAX];
	int k = snprintf(out, sizeof out, "%.*s", (int)(h - s->db), s->db);
	for (int i = 0; i < n && k > 0 && (size_t)k < sizeof out; i++)
		k += snprintf(out + k, sizeof out - (size_t)k, "%s127.0.0.1:%d", i ? "," : "",
			      ports[i]);
	if (k > 0 && (size_t)k < sizeof out)
		k += snprintf(out + k, sizeof out - (size_t)k, "%s", h + len);
	if (k < 0 || (size_t)k >= sizeof out)
		return -1;
	memcpy(s->db, out, (size_t)k + 1);
	return 0;
}

int hs_set_db(hs_server *s, const char *url)
{
	size_t n = strlen(url);
	if (n >= sizeof s->db)
		return -1;
	memcpy(s->db, url, n + 1);
	return 0;
}

static hs_server *open_on(const hs_server *first, const char *const *extra_args, int start)
{
	pthread_once(&global_once, global_init);
	hs_server *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	const char *tmp = getenv("TMPDIR");
	snprintf(s->dir, sizeof s->dir, "%s/baton-http-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(s->dir)) {
		fprintf(stderr, "harness: mkdtemp %s: %s\n", s->dir, strerror(errno));
		free(s);
		return NULL;
	}
	if (first) {
		snprintf(s->db, sizeof s->db, "%s", first->db);
		snprintf(s->pg_name, sizeof s->pg_name, "%s", first->pg_name);
		s->shares_db = 1;
	} else if (open_store(s) != 0) {
		hs_close(s);
		return NULL;
	}
	for (int i = 0; extra_args && extra_args[i]; i++) {
		if (i == MAX_EXTRA_ARGS) {
			fprintf(stderr, "harness: too many extra arguments\n");
			hs_close(s);
			return NULL;
		}
		s->extra[i] = strdup(extra_args[i]);
	}
	if (start && hs_start(s) != 0) {
		hs_close(s);
		return NULL;
	}
	return s;
}

int hs_run_batond(const char *const *args, const char *env_name, const char *env_value,
		  int timeout_ms, char *out, size_t size)
{
	const char *bin = getenv("BATOND");
	char log[] = "/tmp/baton-run-XXXXXX";
	int fd = bin && *bin ? mkstemp(log) : -1;
	if (fd < 0) {
		snprintf(out, size, "harness: BATOND not set or no temporary file");
		return -1;
	}
	const char *argv[2 + MAX_EXTRA_ARGS] = {bin};
	for (int i = 0; args && args[i] && i < MAX_EXTRA_ARGS; i++)
		argv[i + 1] = args[i];
	close(fd);
	pid_t pid = batond_spawn((char *const *)argv, log, env_name, env_value);
	int status = -1;
	int64_t deadline = hs_mono_ms() + timeout_ms;
	while (pid > 0 && waitpid(pid, &status, WNOHANG) == 0) {
		if (hs_mono_ms() >= deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			status = -1;
			break;
		}
		hs_pause_ms(HS_POLL_MS);
	}
	char *text = read_file(log, NULL);
	snprintf(out, size, "%s", text ? text : "");
	free(text);
	unlink(log);
	return pid > 0 ? status : -1;
}

int hs_setup(void **state)
{
	hs_server *s = hs_open(NULL);
	*state = s;
	return s ? 0 : -1;
}

int hs_teardown(void **state)
{
	return hs_close(*state);
}

int hs_set_args(hs_server *s, const char *const *extra_args)
{
	for (int i = 0; s->extra[i]; i++) {
		free(s->extra[i]);
		s->extra[i] = NULL;
	}
	for (int i = 0; extra_args && extra_args[i]; i++) {
		if (i == MAX_EXTRA_ARGS) {
			fprintf(stderr, "harness: too many extra arguments\n");
			return -1;
		}
		s->extra[i] = strdup(extra_args[i]);
	}
	return 0;
}

void hs_set_env(hs_server *s, const char *name, const char *value)
{
	free(s->env_name);
	free(s->env_value);
	s->env_name = name ? strdup(name) : NULL;
	s->env_value = name && value ? strdup(value) : NULL;
}

/* Waits (bounded) for the server process to exit; its wait status, or -1 on timeout. */
static int reap(hs_server *s, int timeout_ms)
{
	int64_t deadline = hs_mono_ms() + timeout_ms;
	for (;;) {
		int status = 0;
		pid_t got = waitpid(s->pid, &status, WNOHANG);
		if (got == s->pid || (got < 0 && errno == ECHILD)) {
			s->pid = 0;
			return status;
		}
		if (hs_mono_ms() >= deadline)
			return -1;
		hs_pause_ms(HS_POLL_MS);
	}
}

void hs_kill(hs_server *s)
{
	if (s->pid <= 0)
		return;
	kill(s->pid, SIGKILL);
	if (reap(s, HS_STOP_TIMEOUT_MS) == -1)
		fprintf(stderr, "harness: batond (pid %d) survived SIGKILL\n", (int)s->pid);
	s->pid = 0;
}

int hs_pid(const hs_server *s)
{
	return s->pid > 0 ? (int)s->pid : 0;
}

int64_t hs_cpu_ms(const hs_server *s)
{
	if (s->pid <= 0)
		return -1;
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)s->pid);
	double cpu = proc_cpu_seconds(path);
	return cpu < 0 ? -1 : (int64_t)(cpu * 1000);
}

int hs_signal(const hs_server *s, int sig)
{
	return s->pid > 0 ? kill(s->pid, sig) : -1;
}

int hs_wait_exit(hs_server *s, int timeout_ms)
{
	if (s->pid <= 0)
		return -1;
	int status = reap(s, timeout_ms);
	if (status == -1)
		return -1;
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	if (WIFSIGNALED(status))
		return 128 + WTERMSIG(status);
	return -1;
}

int hs_stop(hs_server *s)
{
	if (s->pid <= 0)
		return 0;
	kill(s->pid, SIGTERM);
	int status = hs_wait_exit(s, HS_STOP_TIMEOUT_MS);
	if (status == -1 && s->pid > 0) {
		fprintf(stderr, "harness: batond did not exit within %d ms of SIGTERM\n",
			HS_STOP_TIMEOUT_MS);
		hs_kill(s);
	}
	return status;
}

static int count_occurrences(const char *text, const char *needle)
{
	int n = 0;
	for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle))
		n++;
	return n;
}

/* Checks each start's log: one listening line, no sanitizer report. 0 or -1. */
static int check_logs(const hs_server *s)
{
	static const char *const reports[] = {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
					      "WARNING: ThreadSanitizer", "runtime error:"};
	int rc = 0;
	for (int i = 1; i <= s->starts; i++) {
		char path[PATH_MAX + 32];
		snprintf(path, sizeof path, "%s/batond.%d.log", s->dir, i);
		char *text = read_file(path, NULL);
		if (!text)
			continue;
		int listening = count_occurrences(text, "listening on http://");
		if (listening != 1) {
			fprintf(stderr, "harness: %s has %d \"listening on\" lines, expected 1\n",
				path, listening);
			rc = -1;
		}
		for (size_t r = 0; r < sizeof reports / sizeof reports[0]; r++) {
			if (strstr(text, reports[r])) {
				fprintf(stderr, "harness: %s holds a sanitizer report (%s)\n", path,
					reports[r]);
				rc = -1;
			}
		}
		free(text);
	}
	return rc;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(path);
}

int hs_close(hs_server *s)
{
	if (!s)
		return 0;
	int rc = 0;
	if (s->pid > 0) {
		int status = hs_stop(s);
		if (status > 128)
			fprintf(
			    stderr,
			    "harness: batond was ended by signal %d (the harness sent SIGTERM), "
			    "expected exit status 0\n",
			    status - 128);
		else if (status != 0)
			fprintf(stderr,
				"harness: batond exited with %d after SIGTERM, expected 0\n",
				status);
		if (status != 0)
			rc = -1;
	}
	if (s->starts > 0 && check_logs(s) != 0)
		rc = -1;
	if (rc != 0)
		hs_dump_log(s, 6000);
	if (getenv("BATON_TEST_KEEP")) {
		fprintf(stderr, "harness: kept %s%s%s\n", s->dir, s->pg_name[0] ? " and " : "",
			s->pg_name[0] ? s->db : "");
	} else {
		if (s->dir[0])
			nftw(s->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
		if (s->pg_name[0] && !s->shares_db && pg_db_drop(s->pg_name) != 0)
			rc = -1;
	}
	for (int i = 0; s->extra[i]; i++)
		free(s->extra[i]);
	free(s->env_name);
	free(s->env_value);
	free(s);
	return rc;
}

/* ---- the database ---------------------------------------------------------------- */

void *hs_db_hold(const hs_server *s, const char *sql)
{
	return s->pg_name[0] ? pg_db_hold(s->db, sql) : NULL;
}

void hs_db_unhold(void *session)
{
	pg_db_unhold(session);
}

long long hs_db_count(hs_server *s, const char *sql)
{
	/* PostgreSQL serves other connections while batond runs. */
	if (s->pg_name[0])
		return pg_db_count(s->db, sql);
	sqlite3 *db = NULL;
	sqlite3_stmt *st = NULL;
	long long value = -1;
	bool was_running = hs_running(s);
	if (was_running) {
		int status = hs_stop(s);
		if (status != 0) {
			fprintf(stderr, "harness: batond exited with %d when stopped to read %s\n",
				status, s->db);
			return -1;
		}
	}
	int rc = sqlite3_open_v2(s->db, &db, SQLITE_OPEN_READONLY, NULL);
	if (rc == SQLITE_OK) {
		sqlite3_busy_timeout(db, 5000);
		rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
	}
	if (rc == SQLITE_OK) {
		rc = sqlite3_step(st);
		if (rc == SQLITE_ROW) {
			value = sqlite3_column_int64(st, 0);
			rc = SQLITE_OK;
		}
	}
	if (rc != SQLITE_OK)
		fprintf(stderr, "harness: %s on %s: %s\n", sql, s->db,
			db ? sqlite3_errmsg(db) : "cannot open");
	sqlite3_finalize(st);
	sqlite3_close(db);
	if (was_running && hs_start(s) != 0) {
		fprintf(stderr, "harness: batond did not start again after reading %s\n", s->db);
		return -1;
	}
	return value;
}

const char *hs_faketime_lib(void)
{
#if defined(__SANITIZE_THREAD__)
	return NULL;
#endif
	static const char *const libs[] = {
	    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
	    "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
	    "/usr/lib/faketime/libfaketimeMT.so.1",
	};
	for (size_t i = 0; i < sizeof libs / sizeof *libs; i++)
		if (access(libs[i], R_OK) == 0)
			return libs[i];
	return NULL;
}

int hs_faketime_env(int on)
{
	static char *asan_was;
	static int saved;
	const char *lib = hs_faketime_lib();
	if (on && !lib)
		return -1;
	if (on) {
		const char *asan = getenv("ASAN_OPTIONS");
		if (!saved) {
			free(asan_was);
			asan_was = asan ? strdup(asan) : NULL;
			saved = 1;
		}
		char asan_now[512];
		snprintf(asan_now, sizeof asan_now, "%s%sverify_asan_link_order=0",
			 asan_was ? asan_was : "", asan_was && *asan_was ? ":" : "");
		setenv("ASAN_OPTIONS", asan_now, 1);
		setenv("LD_PRELOAD", lib, 1);
		setenv("FAKETIME_NO_CACHE", "1", 1);
		setenv("DONT_FAKE_MONOTONIC", "1", 1);
		return 0;
	}
	unsetenv("LD_PRELOAD");
	unsetenv("FAKETIME_NO_CACHE");
	unsetenv("DONT_FAKE_MONOTONIC");
	if (saved) {
		if (asan_was)
			setenv("ASAN_OPTIONS", asan_was, 1);
		else
			unsetenv("ASAN_OPTIONS");
		saved = 0;
	}
	return 0;
}
