/*
 * harness.c - runs the real batond for the HTTP tests and talks to it (see harness.h).
 *
 * The server's stdout and stderr go to DIR/batond.N.log, one file per start, so that the
 * "listening on" line looked for after a restart is the new process's own. The process
 * gets PR_SET_PDEATHSIG so that a test binary that dies never leaves a server behind.
 */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
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

#define MAX_EXTRA_ARGS 16
#define LISTEN_MARK    "listening on http://"

struct hs_server {
	char dir[PATH_MAX];
	char db[PATH_MAX + 16];
	char log[PATH_MAX + 32]; /* log of the current (last) start */
	char *extra[MAX_EXTRA_ARGS + 1];
	char *env_name, *env_value; /* set in the server's environment (hs_set_env) */
	pid_t pid;		    /* 0 when not running */
	int port;
	int starts;
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

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void pause_ms(int ms)
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

/* Parses the port of the "listening on http://127.0.0.1:PORT" line; 0 when absent. */
static int find_port(const char *log)
{
	const char *p = strstr(log, LISTEN_MARK);
	if (!p)
		return 0;
	p += strlen(LISTEN_MARK);
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

static void exec_server(const hs_server *s, int log_fd)
{
	const char *bin = getenv("BATOND");
	const char *argv[8 + MAX_EXTRA_ARGS];
	int n = 0;
	argv[n++] = bin;
	argv[n++] = "--listen";
	argv[n++] = "127.0.0.1:0";
	argv[n++] = "--db";
	argv[n++] = s->db;
	for (int i = 0; s->extra[i]; i++)
		argv[n++] = s->extra[i];
	argv[n] = NULL;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (s->env_name)
		setenv(s->env_name, s->env_value, 1);
	int devnull = open("/dev/null", O_RDONLY);
	if (devnull >= 0)
		dup2(devnull, STDIN_FILENO);
	dup2(log_fd, STDOUT_FILENO);
	dup2(log_fd, STDERR_FILENO);
	execv(bin, (char *const *)argv);
	dprintf(STDERR_FILENO, "harness: cannot exec %s: %s\n", bin, strerror(errno));
	_exit(127);
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
	int log_fd = open(s->log, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
	if (log_fd < 0) {
		fprintf(stderr, "harness: cannot create %s: %s\n", s->log, strerror(errno));
		return -1;
	}
	pid_t pid = fork();
	if (pid < 0) {
		fprintf(stderr, "harness: fork: %s\n", strerror(errno));
		close(log_fd);
		return -1;
	}
	if (pid == 0)
		exec_server(s, log_fd);
	close(log_fd);
	s->pid = pid;
	s->port = 0;

	int64_t deadline = mono_ms() + HS_START_TIMEOUT_MS;
	while (mono_ms() < deadline) {
		char *text = read_file(s->log, NULL);
		int port = text ? find_port(text) : 0;
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
		pause_ms(HS_POLL_MS);
	}
	fprintf(stderr, "harness: batond did not log \"" LISTEN_MARK "...\" within %d ms\n",
		HS_START_TIMEOUT_MS);
	hs_dump_log(s, 4000);
	hs_kill(s);
	return -1;
}

hs_server *hs_open(const char *const *extra_args)
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
	snprintf(s->db, sizeof s->db, "%s/baton.db", s->dir);
	for (int i = 0; extra_args && extra_args[i]; i++) {
		if (i == MAX_EXTRA_ARGS) {
			fprintf(stderr, "harness: too many extra arguments\n");
			hs_close(s);
			return NULL;
		}
		s->extra[i] = strdup(extra_args[i]);
	}
	if (hs_start(s) != 0) {
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
	pid_t pid = fork();
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(fd, STDOUT_FILENO);
		dup2(fd, STDERR_FILENO);
		if (env_name)
			setenv(env_name, env_value, 1);
		execv(bin, (char *const *)argv);
		_exit(127);
	}
	close(fd);
	int status = -1;
	int64_t deadline = mono_ms() + timeout_ms;
	while (pid > 0 && waitpid(pid, &status, WNOHANG) == 0) {
		if (mono_ms() >= deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			status = -1;
			break;
		}
		pause_ms(HS_POLL_MS);
	}
	char *text = read_file(log, NULL);
	snprintf(out, size, "%s", text ? text : "");
	free(text);
	unlink(log);
	return pid > 0 ? status : -1;
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
	int64_t deadline = mono_ms() + timeout_ms;
	for (;;) {
		int status = 0;
		pid_t got = waitpid(s->pid, &status, WNOHANG);
		if (got == s->pid || (got < 0 && errno == ECHILD)) {
			s->pid = 0;
			return status;
		}
		if (mono_ms() >= deadline)
			return -1;
		pause_ms(HS_POLL_MS);
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
	if (getenv("BATON_TEST_KEEP"))
		fprintf(stderr, "harness: kept %s\n", s->dir);
	else if (s->dir[0])
		nftw(s->dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
	for (int i = 0; s->extra[i]; i++)
		free(s->extra[i]);
	free(s->env_name);
	free(s->env_value);
	free(s);
	return rc;
}

/* ---- requests -------------------------------------------------------------------- */

typedef struct buffer {
	char *data;
	size_t len;
} buffer;

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *userdata)
{
	buffer *b = userdata;
	size_t n = size * nmemb;
	char *bigger = realloc(b->data, b->len + n + 1);
	if (!bigger)
		return 0;
	b->data = bigger;
	memcpy(b->data + b->len, ptr, n);
	b->len += n;
	b->data[b->len] = '\0';
	return n;
}

/* Stores the value of header line `line` when its name is `name`. */
static void keep_header(const char *line, size_t len, const char *name, char **slot)
{
	size_t nlen = strlen(name);
	if (len <= nlen || strncasecmp(line, name, nlen) != 0 || line[nlen] != ':')
		return;
	const char *v = line + nlen + 1;
	const char *end = line + len;
	while (v < end && (*v == ' ' || *v == '\t'))
		v++;
	while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' '))
		end--;
	free(*slot);
	*slot = strndup(v, (size_t)(end - v));
}

static size_t on_header(char *line, size_t size, size_t nmemb, void *userdata)
{
	hs_response *r = userdata;
	size_t len = size * nmemb;
	if (len >= 5 && strncmp(line, "HTTP/", 5) == 0) {
		/* A new response (after a 100 Continue, say): forget the previous headers. */
		free(r->content_type);
		free(r->location);
		free(r->allow);
		r->content_type = r->location = r->allow = NULL;
	}
	keep_header(line, len, "Content-Type", &r->content_type);
	keep_header(line, len, "Location", &r->location);
	keep_header(line, len, "Allow", &r->allow);
	return len;
}

typedef struct upload {
	const char *data;
	size_t len, off;
} upload;

static size_t on_read(char *buf, size_t size, size_t nitems, void *userdata)
{
	upload *u = userdata;
	size_t n = size * nitems;
	if (n > 64 * 1024)
		n = 64 * 1024; /* many chunks, not one */
	if (n > u->len - u->off)
		n = u->len - u->off;
	memcpy(buf, u->data + u->off, n);
	u->off += n;
	return n;
}

int hs_send(const hs_server *s, const hs_request *req, hs_response *r)
{
	memset(r, 0, sizeof *r);
	CURL *c = curl_easy_init();
	if (!c) {
		snprintf(r->error, sizeof r->error, "curl_easy_init failed");
		return -1;
	}
	char url[2048];
	snprintf(url, sizeof url, "http://127.0.0.1:%d%s", s->port, req->path);
	char ctype[256];
	struct curl_slist *headers =
	    curl_slist_append(NULL, req->expect_continue ? "Expect: 100-continue" : "Expect:");
	if (req->content_type) {
		snprintf(ctype, sizeof ctype, "Content-Type: %s", req->content_type);
		headers = curl_slist_append(headers, ctype);
	} else {
		headers = curl_slist_append(headers, "Content-Type:");
	}
	buffer body = {NULL, 0};
	upload up = {req->body, req->body_len, 0};
	char errbuf[CURL_ERROR_SIZE] = "";

	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
	curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)HS_REQUEST_TIMEOUT_MS);
	curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
	if (req->body && req->chunked) {
		headers = curl_slist_append(headers, "Transfer-Encoding: chunked");
		curl_easy_setopt(c, CURLOPT_POST, 1L);
		curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
		curl_easy_setopt(c, CURLOPT_READDATA, &up);
	} else if (req->body || strcmp(req->method, "POST") == 0) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, req->body ? req->body : "");
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE,
				 (curl_off_t)(req->body ? req->body_len : 0));
	}
	if (strcmp(req->method, "GET") != 0 && strcmp(req->method, "POST") != 0)
		curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req->method);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);

	CURLcode rc = curl_easy_perform(c);
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
	curl_slist_free_all(headers);
	curl_easy_cleanup(c);

	r->body = body.data;
	r->body_len = body.len;
	if (r->body) {
		json_error_t jerr;
		r->json = json_loadb(r->body, r->body_len, 0, &jerr);
	}
	if (rc != CURLE_OK && r->status == 0) {
		snprintf(r->error, sizeof r->error, "%.16s %.100s: %.120s", req->method, req->path,
			 errbuf[0] ? errbuf : curl_easy_strerror(rc));
		return -1;
	}
	return r->status > 0 ? 0 : -1;
}

int hs_get(const hs_server *s, const char *path, hs_response *r)
{
	hs_request req = {.method = "GET", .path = path};
	return hs_send(s, &req, r);
}

int hs_post(const hs_server *s, const char *path, const char *body, hs_response *r)
{
	hs_request req = {.method = "POST",
			  .path = path,
			  .content_type = body ? "application/json" : NULL,
			  .body = body,
			  .body_len = body ? strlen(body) : 0};
	return hs_send(s, &req, r);
}

char *hs_url_escape(const char *text)
{
	char *escaped = curl_easy_escape(NULL, text, 0);
	char *out = strdup(escaped ? escaped : "");
	curl_free(escaped);
	return out;
}

void hs_response_fini(hs_response *r)
{
	if (!r)
		return;
	free(r->content_type);
	free(r->location);
	free(r->allow);
	free(r->body);
	json_decref(r->json);
	memset(r, 0, sizeof *r);
}

/* ---- checks ---------------------------------------------------------------------- */

/* Fails the test with the response's details. */
static void fail_response(const hs_server *s, const char *what, const hs_response *r)
{
	if (s)
		hs_dump_log(s, 3000);
	fail_msg("%s: status %ld, error \"%s\", body %.1000s", what, r->status, r->error,
		 r->body ? r->body : "(none)");
}

static bool is_json_type(const char *ctype, const char *want)
{
	size_t n = strlen(want);
	return ctype && strncasecmp(ctype, want, n) == 0 && (ctype[n] == '\0' || ctype[n] == ';');
}

json_t *hs_get_json(const hs_server *s, const char *path, long status)
{
	hs_response r;
	hs_get(s, path, &r);
	if (r.status != status || !r.json) {
		char what[512];
		snprintf(what, sizeof what, "GET %s: expected %ld with JSON", path, status);
		fail_response(s, what, &r);
	}
	if (status < 400 && !is_json_type(r.content_type, "application/json"))
		fail_msg("GET %s: Content-Type %s, expected application/json", path,
			 r.content_type ? r.content_type : "(none)");
	json_t *out = json_incref(r.json);
	hs_response_fini(&r);
	return out;
}

json_t *hs_get_workflow(const hs_server *s, const char *id)
{
	char path[512];
	snprintf(path, sizeof path, "/workflows/%s", id);
	json_t *wf = hs_get_json(s, path, 200);
	assert_string_equal(hs_str(wf, "id"), id);
	return wf;
}

json_t *hs_get_events(const hs_server *s, const char *id)
{
	char path[512];
	snprintf(path, sizeof path, "/workflows/%s/events", id);
	json_t *doc = hs_get_json(s, path, 200);
	assert_string_equal(hs_str(doc, "workflow_id"), id);
	json_t *events = json_object_get(doc, "events");
	assert_true(json_is_array(events));
	json_int_t prev = 0;
	size_t i;
	json_t *ev;
	json_array_foreach(events, i, ev)
	{
		json_int_t seq = hs_int(ev, "seq");
		if (i > 0 && seq <= prev)
			fail_msg("events of %s: seq %lld after %lld, not strictly increasing", id,
				 (long long)seq, (long long)prev);
		prev = seq;
		hs_time(ev, "ts");
		hs_str(ev, "type");
		assert_string_equal(hs_str(ev, "workflow_id"), id);
	}
	json_incref(events);
	json_decref(doc);
	return events;
}

json_t *hs_create_workflow(const hs_server *s, json_t *body)
{
	char *text = json_dumps(body, JSON_COMPACT);
	json_decref(body);
	assert_non_null(text);
	hs_response r;
	hs_post(s, "/workflows", text, &r);
	if (r.status != 201 || !json_is_object(r.json)) {
		char what[256];
		snprintf(what, sizeof what, "POST /workflows %.150s: expected 201", text);
		free(text);
		fail_response(s, what, &r);
	}
	free(text);
	if (!is_json_type(r.content_type, "application/json"))
		fail_msg("POST /workflows: Content-Type %s", r.content_type ? r.content_type : "-");
	const char *id = hs_str(r.json, "id");
	char want[512];
	snprintf(want, sizeof want, "/workflows/%s", id);
	if (!r.location || strcmp(r.location, want) != 0)
		fail_msg("POST /workflows: Location %s, expected %s",
			 r.location ? r.location : "(none)", want);
	json_t *wf = json_incref(r.json);
	hs_response_fini(&r);
	return wf;
}

const char *hs_str(const json_t *obj, const char *key)
{
	json_t *v = json_object_get(obj, key);
	if (!json_is_string(v)) {
		char *dump = json_dumps(obj, JSON_COMPACT);
		fail_msg("\"%s\" is not a string in %.1500s", key, dump ? dump : "?");
	}
	return json_string_value(v);
}

json_int_t hs_int(const json_t *obj, const char *key)
{
	json_t *v = json_object_get(obj, key);
	if (!json_is_integer(v)) {
		char *dump = json_dumps(obj, JSON_COMPACT);
		fail_msg("\"%s\" is not an integer in %.1500s", key, dump ? dump : "?");
	}
	return json_integer_value(v);
}

static bool all_digits(const char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] < '0' || p[i] > '9')
			return false;
	return true;
}

int hs_parse_time(const char *t, int64_t *ms)
{
	/* 2026-11-30T05:40:00.123Z: exactly 24 characters. */
	if (!t || strlen(t) != 24 || t[4] != '-' || t[7] != '-' || t[10] != 'T' || t[13] != ':' ||
	    t[16] != ':' || t[19] != '.' || t[23] != 'Z')
		return -1;
	if (!all_digits(t, 4) || !all_digits(t + 5, 2) || !all_digits(t + 8, 2) ||
	    !all_digits(t + 11, 2) || !all_digits(t + 14, 2) || !all_digits(t + 17, 2) ||
	    !all_digits(t + 20, 3))
		return -1;
	struct tm tm = {0};
	tm.tm_year = atoi(t) - 1900;
	tm.tm_mon = atoi(t + 5) - 1;
	tm.tm_mday = atoi(t + 8);
	tm.tm_hour = atoi(t + 11);
	tm.tm_min = atoi(t + 14);
	tm.tm_sec = atoi(t + 17);
	if (tm.tm_mon > 11 || tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 ||
	    tm.tm_min > 59 || tm.tm_sec > 60)
		return -1;
	time_t secs = timegm(&tm);
	*ms = (int64_t)secs * 1000 + atoi(t + 20);
	return 0;
}

int64_t hs_time_or_null(const json_t *obj, const char *key)
{
	json_t *v = json_object_get(obj, key);
	if (json_is_null(v))
		return HS_NO_TIME;
	int64_t ms = 0;
	if (!json_is_string(v) || hs_parse_time(json_string_value(v), &ms) != 0) {
		char *dump = json_dumps(obj, JSON_COMPACT);
		fail_msg("\"%s\" is not an RFC 3339 UTC time with ms in %.1500s", key,
			 dump ? dump : "?");
	}
	return ms;
}

int64_t hs_time(const json_t *obj, const char *key)
{
	int64_t ms = hs_time_or_null(obj, key);
	if (ms == HS_NO_TIME) {
		char *dump = json_dumps(obj, JSON_COMPACT);
		fail_msg("\"%s\" is null in %.1500s", key, dump ? dump : "?");
	}
	return ms;
}

static bool in_set(const char *v, const char *const *set)
{
	for (; *set; set++)
		if (strcmp(v, *set) == 0)
			return true;
	return false;
}

/* Fails unless obj[key] has JSON type `type`, or is null when `nullable`. */
static void want_type(const json_t *obj, const char *key, json_type type, bool nullable)
{
	json_t *v = json_object_get(obj, key);
	bool ok = v && (json_typeof(v) == type || (nullable && json_is_null(v)) ||
			(type == JSON_REAL && json_is_integer(v)) ||
			(type == JSON_TRUE && json_is_boolean(v)));
	if (!ok) {
		char *dump = json_dumps(obj, JSON_COMPACT);
		fail_msg("member \"%s\" missing or of the wrong type in %.2000s", key,
			 dump ? dump : "?");
	}
}

static void assert_step_shape(const json_t *st, size_t index)
{
	static const char *const statuses[] = {"pending",   "waiting", "running",   "retrying",
					       "completed", "failed",  "cancelled", NULL};
	if (hs_int(st, "index") != (json_int_t)index)
		fail_msg("step %zu has index %lld", index, (long long)hs_int(st, "index"));
	hs_str(st, "worker");
	hs_int(st, "work_ms");
	hs_int(st, "fail_attempts");
	hs_int(st, "attempts");
	if (!in_set(hs_str(st, "status"), statuses))
		fail_msg("step %zu: unknown status %s", index, hs_str(st, "status"));
	want_type(st, "fencing_token", JSON_INTEGER, true);
	want_type(st, "queue_position", JSON_INTEGER, true);
	hs_time_or_null(st, "waiting_since");
	hs_time_or_null(st, "started_at");
	hs_time_or_null(st, "finished_at");
	want_type(st, "duration_ms", JSON_INTEGER, true);
	hs_time_or_null(st, "next_attempt_at");
	want_type(st, "error", JSON_STRING, true);
	want_type(st, "result", JSON_OBJECT, true);
}

void hs_assert_workflow_shape(const json_t *wf)
{
	static const char *const statuses[] = {"pending", "running",   "completed",
					       "failed",  "cancelled", NULL};
	assert_true(json_is_object(wf));
	hs_str(wf, "id");
	hs_str(wf, "resource");
	if (!in_set(hs_str(wf, "status"), statuses))
		fail_msg("workflow status %s is not documented", hs_str(wf, "status"));
	hs_time(wf, "created_at");
	hs_time_or_null(wf, "started_at");
	hs_time_or_null(wf, "finished_at");
	want_type(wf, "cancel_requested", JSON_TRUE, false);
	json_t *retry = json_object_get(wf, "retry");
	want_type(wf, "retry", JSON_OBJECT, false);
	hs_int(retry, "max_attempts");
	hs_int(retry, "initial_delay_ms");
	want_type(retry, "backoff", JSON_REAL, false);
	hs_int(retry, "max_delay_ms");
	const char *on_failure = hs_str(wf, "on_failure");
	if (strcmp(on_failure, "fail") != 0 && strcmp(on_failure, "continue") != 0)
		fail_msg("on_failure is %s", on_failure);
	want_type(wf, "steps", JSON_ARRAY, false);
	want_type(wf, "result", JSON_OBJECT, true);
	want_type(wf, "error", JSON_STRING, true);
	json_t *steps = json_object_get(wf, "steps");
	json_int_t completed = 0;
	size_t i;
	json_t *st;
	json_array_foreach(steps, i, st)
	{
		assert_step_shape(st, i);
		completed += strcmp(hs_str(st, "status"), "completed") == 0;
	}
	if (hs_int(wf, "steps_total") != (json_int_t)json_array_size(steps))
		fail_msg("steps_total %lld but %zu steps", (long long)hs_int(wf, "steps_total"),
			 json_array_size(steps));
	if (hs_int(wf, "steps_completed") != completed)
		fail_msg("steps_completed %lld but %lld steps completed",
			 (long long)hs_int(wf, "steps_completed"), (long long)completed);
}

void hs_assert_problem(const hs_response *r, long status, const char *slug, const char *what)
{
	if (r->status != status)
		fail_msg("%s: status %ld, expected %ld; body %.600s (%s)", what, r->status, status,
			 r->body ? r->body : "(none)", r->error);
	if (!is_json_type(r->content_type, "application/problem+json"))
		fail_msg("%s: Content-Type %s, expected application/problem+json", what,
			 r->content_type ? r->content_type : "(none)");
	if (!json_is_object(r->json))
		fail_msg("%s: body is not a JSON object: %.600s", what, r->body ? r->body : "");
	char type[256];
	snprintf(type, sizeof type, "https://baton.dev/problems/%s", slug);
	json_t *j = r->json;
	const char *got_type = json_string_value(json_object_get(j, "type"));
	if (!got_type || strcmp(got_type, type) != 0)
		fail_msg("%s: problem type %s, expected %s", what, got_type ? got_type : "(none)",
			 type);
	const char *title = json_string_value(json_object_get(j, "title"));
	const char *detail = json_string_value(json_object_get(j, "detail"));
	json_t *st = json_object_get(j, "status");
	if (!title || !*title || !detail || !*detail || !json_is_integer(st) ||
	    json_integer_value(st) != status)
		fail_msg("%s: problem needs title, detail and status %ld: %.600s", what, status,
			 r->body);
}

/* Whether the comma-separated token list `list` holds `tok`. */
static bool list_has(const char *list, const char *tok, size_t toklen)
{
	const char *p = list;
	while (*p) {
		while (*p == ' ' || *p == ',')
			p++;
		size_t n = strcspn(p, ", ");
		if (n == toklen && strncmp(p, tok, n) == 0)
			return true;
		p += n;
	}
	return false;
}

static size_t list_len(const char *list)
{
	size_t count = 0;
	const char *p = list;
	while (*p) {
		while (*p == ' ' || *p == ',')
			p++;
		size_t n = strcspn(p, ", ");
		if (n > 0)
			count++;
		p += n;
	}
	return count;
}

void hs_assert_allow(const hs_response *r, const char *methods)
{
	if (!r->allow)
		fail_msg("405 without an Allow header (expected \"%s\")", methods);
	const char *p = methods;
	while (*p) {
		while (*p == ' ' || *p == ',')
			p++;
		size_t n = strcspn(p, ", ");
		if (n > 0 && !list_has(r->allow, p, n))
			fail_msg("Allow: %s lacks %.*s", r->allow, (int)n, p);
		p += n;
	}
	if (list_len(r->allow) != list_len(methods))
		fail_msg("Allow: %s, expected exactly %s", r->allow, methods);
}

/* ---- waits ----------------------------------------------------------------------- */

bool hs_wait_until(hs_pred pred, void *arg, int timeout_ms)
{
	int64_t deadline = mono_ms() + timeout_ms;
	for (;;) {
		if (pred(arg))
			return true;
		if (mono_ms() >= deadline)
			return false;
		pause_ms(HS_POLL_MS);
	}
}

static bool is_final(const char *status)
{
	return strcmp(status, "completed") == 0 || strcmp(status, "failed") == 0 ||
	       strcmp(status, "cancelled") == 0;
}

/* Shared loop of the two waits: step < 0 waits on the workflow's own status. */
static json_t *wait_status(const hs_server *s, const char *id, long step, const char *status,
			   int timeout_ms)
{
	int64_t deadline = mono_ms() + timeout_ms;
	char last[64] = "";
	for (;;) {
		json_t *wf = hs_get_workflow(s, id);
		const char *wf_status = hs_str(wf, "status");
		const char *got = wf_status;
		if (step >= 0) {
			json_t *st = json_array_get(json_object_get(wf, "steps"), (size_t)step);
			if (!st)
				fail_msg("workflow %s has no step %ld", id, step);
			got = hs_str(st, "status");
		}
		if (strcmp(got, status) == 0)
			return wf;
		snprintf(last, sizeof last, "%s", got);
		bool hopeless = is_final(wf_status) && (step >= 0 || is_final(got));
		json_decref(wf);
		if (hopeless || mono_ms() >= deadline) {
			hs_dump_log(s, 3000);
			if (step >= 0)
				fail_msg(
				    "workflow %s step %ld: status %s (workflow %s), waited for %s",
				    id, step, last, hopeless ? "finished" : "running", status);
			fail_msg("workflow %s: status %s, waited %s for %s", id, last,
				 hopeless ? "(final)" : "in vain", status);
		}
		pause_ms(HS_POLL_MS);
	}
}

json_t *hs_wait_workflow(const hs_server *s, const char *id, const char *status, int timeout_ms)
{
	return wait_status(s, id, -1, status, timeout_ms);
}

json_t *hs_wait_step(const hs_server *s, const char *id, size_t step, const char *status,
		     int timeout_ms)
{
	return wait_status(s, id, (long)step, status, timeout_ms);
}

/* ---- the database file ----------------------------------------------------------- */

long long hs_db_count(hs_server *s, const char *sql)
{
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

/* ---- baton specifics ------------------------------------------------------------- */

int hs_default_work_ms(const char *worker)
{
	uint32_t h = 2166136261u;
	for (const unsigned char *p = (const unsigned char *)worker; *p; p++) {
		h ^= *p;
		h *= 16777619u;
	}
	return 100 + (int)(h % 100);
}

static bool event_matches(const json_t *ev, const char *type, int step, int attempt)
{
	const char *t = json_string_value(json_object_get(ev, "type"));
	if (!t || strcmp(t, type) != 0)
		return false;
	if (step >= 0 && json_integer_value(json_object_get(ev, "step")) != step)
		return false;
	if (attempt >= 0 && json_integer_value(json_object_get(ev, "attempt")) != attempt)
		return false;
	return true;
}

json_t *hs_event_find(const json_t *events, const char *type, int step, int attempt)
{
	size_t i;
	json_t *ev;
	json_array_foreach(events, i, ev)
	{
		if (event_matches(ev, type, step, attempt))
			return ev;
	}
	return NULL;
}

size_t hs_event_count(const json_t *events, const char *type, int step, int attempt)
{
	size_t n = 0, i;
	json_t *ev;
	json_array_foreach(events, i, ev)
	{
		if (event_matches(ev, type, step, attempt))
			n++;
	}
	return n;
}
