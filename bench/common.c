/*
 * common.c - clocks, statistics, temporary directories, the processes under test
 * (batond and bench/minjson) and a blocking HTTP client for set-up and polling.
 *
 * Processes are started with PR_SET_PDEATHSIG, so a benchmark that dies never leaves a
 * server behind, and they log to DIR/NAME.N.log, one file per start, so that the
 * "listening on" line looked for after a restart is the new process's own.
 */
#include "../common/batond.h"
#include "../common/curl_req.h"
#include "../common/proc_cpu.h"
#include "../common/rfc3339.h"
#include "bench.h"

#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- clocks and statistics ---- */

double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

double percentile(double *v, size_t n, double p)
{
	if (n == 0)
		return 0;
	qsort(v, n, sizeof *v, cmp_double);
	double rank = p / 100.0 * (double)(n - 1);
	size_t lo = (size_t)floor(rank), hi = (size_t)ceil(rank);
	return v[lo] + (v[hi] - v[lo]) * (rank - (double)lo);
}

double median(double *v, size_t n)
{
	return percentile(v, n, 50);
}

int64_t rfc3339_ms(const char *s)
{
	int64_t ms;
	return rfc3339_parse_ms(s, &ms) ? -1 : ms;
}

void dvec_push(dvec *d, double x)
{
	if (d->n == d->cap) {
		d->cap = d->cap ? d->cap * 2 : 1024;
		d->v = realloc(d->v, d->cap * sizeof *d->v);
		if (!d->v)
			abort();
	}
	d->v[d->n++] = x;
}

void dvec_free(dvec *d)
{
	free(d->v);
	*d = (dvec){0};
}

/* ---- temporary directories ---- */

int tmpdir_new(char *dir, size_t len)
{
	snprintf(dir, len, "%s/baton-bench.XXXXXX", opt.parent);
	if (!mkdtemp(dir)) {
		fprintf(stderr, "bench: cannot create a directory under %s: %s\n", opt.parent,
			strerror(errno));
		return -1;
	}
	return 0;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(path);
}

void tmpdir_remove(const char *dir)
{
	if (!dir[0])
		return;
	if (opt.keep) {
		fprintf(stderr, "bench: kept %s\n", dir);
		return;
	}
	nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- processes ---- */

/* The port in the log's "listening on http://HOST:PORT" line; 0 while absent. */
static int port_in_log(const char *log)
{
	FILE *f = fopen(log, "r");
	if (!f)
		return 0;
	char *text = NULL;
	size_t len = 0, cap = 0, n;
	do {
		if (len + 4096 + 1 > cap) {
			char *b = realloc(text, cap = cap * 2 + 8192);
			if (!b)
				break;
			text = b;
		}
		len += n = fread(text + len, 1, cap - len - 1, f);
	} while (n > 0);
	fclose(f);
	int port = 0;
	if (text) {
		text[len] = 0;
		port = batond_port_in_log(text);
	}
	free(text);
	return port;
}

static int child_gone(pid_t pid)
{
	int status;
	return waitpid(pid, &status, WNOHANG) == pid;
}

int server_spawn(server *s, const char *const *extra)
{
	char *argv[32];
	int n = 0;
	argv[n++] = (char *)opt.batond;
	argv[n++] = "--listen";
	argv[n++] = "127.0.0.1:0";
	argv[n++] = "--db";
	argv[n++] = s->db;
	argv[n++] = "--shutdown-timeout";
	argv[n++] = "1";
	char threads[16], http_threads[16];
	if (opt.threads > 0) {
		snprintf(threads, sizeof threads, "%d", opt.threads);
		argv[n++] = "--threads";
		argv[n++] = threads;
	}
	if (opt.http_threads > 0) {
		snprintf(http_threads, sizeof http_threads, "%d", opt.http_threads);
		argv[n++] = "--http-threads";
		argv[n++] = http_threads;
	}
	for (int i = 0; extra && extra[i] && n < 31; i++)
		argv[n++] = (char *)extra[i];
	argv[n] = NULL;
	s->starts++;
	snprintf(s->log, sizeof s->log, "%s/batond.%d.log", s->dir, s->starts);
	s->port = 0;
	unlink(s->log); /* a log of an earlier start must not be read as this one's */
	s->started_at = now_s();
	s->pid = batond_spawn(argv, s->log, NULL, NULL);
	return s->pid > 0 ? 0 : -1;
}

int server_wait_listening(server *s, double timeout_s)
{
	double until = now_s() + timeout_s;
	while (now_s() < until) {
		if ((s->port = port_in_log(s->log)) > 0)
			return 0;
		if (child_gone(s->pid)) {
			fprintf(stderr, "bench: batond exited at start; see %s\n", s->log);
			s->pid = 0;
			return -1;
		}
		sleep_ms(2);
	}
	fprintf(stderr, "bench: batond did not say where it listens within %.0f s\n", timeout_s);
	return -1;
}

int server_setup(const char *what, char *dir, size_t dlen, server *s)
{
	if (tmpdir_new(dir, dlen) != 0) {
		table_fail(what, "no temporary directory");
		return -1;
	}
	if (server_start(s, dir, NULL) != 0) {
		table_fail(what, "could not start batond");
		tmpdir_remove(dir);
		return -1;
	}
	return 0;
}

int server_start(server *s, const char *dir, const char *const *extra)
{
	char d[BENCH_PATH_MAX];
	snprintf(d, sizeof d, "%s", dir); /* dir may be s->dir */
	memset(s, 0, sizeof *s);
	snprintf(s->dir, sizeof s->dir, "%s", d);
	s->extra = extra;
	if (opt.store == STORE_POSTGRES) {
		if (pg_db_new(s->db, sizeof s->db) != 0)
			return -1;
	} else {
		snprintf(s->db, sizeof s->db, "%s/baton.db", d);
	}
	/* The default log level (info): every step logs its lines, as in production. */
	if (server_spawn(s, extra) || server_wait_listening(s, 30)) {
		server_stop(s);
		return -1;
	}
	return 0;
}

/* Sends sig, then waits up to wait_s for the process to exit; SIGKILL after that. */
static void stop_pid(pid_t pid, int sig, double wait_s)
{
	if (pid <= 0)
		return;
	kill(pid, sig);
	double until = now_s() + wait_s;
	while (now_s() < until) {
		if (child_gone(pid))
			return;
		sleep_ms(5);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
}

void server_stop(server *s)
{
	int was_running = s->pid > 0;
	stop_pid(s->pid, SIGTERM, 10);
	s->pid = 0;
	if (was_running && opt.store == STORE_POSTGRES)
		pg_wait_idle(s->db, 10);
}

void servers_stop(server *v, int n)
{
	for (int i = 0; i < n; i++)
		if (v[i].pid > 0)
			kill(v[i].pid, SIGTERM);
	double until = now_s() + 10;
	for (int i = 0; i < n; i++) {
		if (v[i].pid <= 0)
			continue;
		int gone;
		while (!(gone = child_gone(v[i].pid)) && now_s() < until)
			sleep_ms(5);
		if (!gone) {
			kill(v[i].pid, SIGKILL);
			waitpid(v[i].pid, NULL, 0);
		}
	}
	int any = 0;
	for (int i = 0; i < n; i++) {
		any |= v[i].pid > 0;
		v[i].pid = 0;
	}
	if (any && n > 0 && opt.store == STORE_POSTGRES)
		pg_wait_idle(v[0].db, 10);
}

void server_kill9(server *s)
{
	stop_pid(s->pid, SIGKILL, 10);
	s->pid = 0;
}

void child_stop(pid_t pid)
{
	stop_pid(pid, SIGTERM, 5);
}

long proc_rss_kib(pid_t pid, long *anon_kib)
{
	char path[64], line[256];
	long kib = -1;
	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof line, f)) {
		sscanf(line, "VmRSS: %ld kB", &kib);
		if (anon_kib)
			sscanf(line, "RssAnon: %ld kB", anon_kib);
	}
	fclose(f);
	return kib;
}

void cpu_take(pid_t pid, cpu_snap *out)
{
	char path[128];
	memset(out, 0, sizeof *out);
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	out->total_s = proc_cpu_seconds(path);
	snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
	DIR *d = opendir(path);
	struct dirent *de;
	while (d && (de = readdir(d)) && out->n < CPU_MAX_THREADS) {
		if (de->d_name[0] == '.')
			continue;
		char tpath[300];
		snprintf(tpath, sizeof tpath, "/proc/%d/task/%s/stat", (int)pid, de->d_name);
		out->tid[out->n] = atoi(de->d_name);
		out->s[out->n++] = proc_cpu_seconds(tpath);
	}
	if (d)
		closedir(d);
}

double cpu_delta(const cpu_snap *a, const cpu_snap *b, double *busiest)
{
	*busiest = 0;
	for (int i = 0; i < b->n; i++) {
		double before = 0;
		for (int j = 0; j < a->n; j++)
			if (a->tid[j] == b->tid[i])
				before = a->s[j];
		if (b->s[i] - before > *busiest)
			*busiest = b->s[i] - before;
	}
	return b->total_s - a->total_s;
}

int minjson_start(const char *dir, const char *commit_db, pid_t *pid, int *port)
{
	char log[BENCH_PATH_MAX + 32], threads[16];
	snprintf(log, sizeof log, "%s/minjson%s.log", dir, commit_db ? "-commit" : "");
	snprintf(threads, sizeof threads, "%d", opt.http_threads > 0 ? opt.http_threads : 8);
	char *argv[] = {(char *)opt.minjson,	       "--threads",	  threads,
			commit_db ? "--commit" : NULL, (char *)commit_db, NULL};
	unlink(log);
	*pid = batond_spawn(argv, log, NULL, NULL);
	if (*pid <= 0)
		return -1;
	double until = now_s() + 10;
	while (now_s() < until) {
		if ((*port = port_in_log(log)) > 0)
			return 0;
		if (child_gone(*pid))
			break;
		sleep_ms(2);
	}
	fprintf(stderr, "bench: minjson did not start; see %s\n", log);
	child_stop(*pid);
	return -1;
}

/* ---- blocking HTTP ---- */

static _Thread_local CURL *tl_curl;

int http_do(int port, const char *method, const char *path, const char *body, char **resp)
{
	if (!tl_curl && !(tl_curl = curl_easy_init()))
		return -1;
	CURL *c = tl_curl;
	char url[512];
	curl_body b = {0};
	struct curl_slist *hdr = NULL;
	snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
	if (body) {
		hdr = curl_slist_append(hdr, "Content-Type: application/json");
		hdr = curl_slist_append(hdr, "Expect:");
	}
	curl_req req = {.method = method,
			.url = url,
			.body = body,
			.body_len = body ? strlen(body) : 0,
			.headers = hdr,
			.connect_timeout_ms = 1000,
			.timeout_ms = 120000};
	curl_easy_reset(c);
	CURLcode rc;
	long status = curl_req_perform(c, &req, &b, &rc);
	if (rc != CURLE_OK)
		status = -1;
	curl_slist_free_all(hdr);
	if (resp)
		*resp = b.data;
	else
		curl_body_fini(&b);
	return (int)status;
}

void http_thread_done(void)
{
	if (tl_curl)
		curl_easy_cleanup(tl_curl);
	tl_curl = NULL;
}

double metric_value(const char *text, const char *series)
{
	size_t n = strlen(series);
	for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
		if (strncmp(p, series, n) == 0 && p[n] == ' ')
			return strtod(p + n + 1, NULL);
	return -1;
}

double server_metric(int port, const char *series)
{
	char *text = NULL;
	double v = -1;
	if (http_do(port, "GET", "/metrics", NULL, &text) == 200 && text)
		v = metric_value(text, series);
	free(text);
	return v;
}

long server_count(int port, const char *status)
{
	char series[96];
	snprintf(series, sizeof series, "baton_workflows{status=\"%s\"}", status);
	return (long)server_metric(port, series);
}

int wait_finished(int port, long want, double timeout_s)
{
	double until = now_s() + timeout_s;
	int pause = 5;
	while (now_s() < until) {
		char *text = NULL;
		long done = -1;
		if (http_do(port, "GET", "/metrics", NULL, &text) == 200 && text)
			done = (long)(metric_value(text, "baton_workflows{status=\"completed\"}") +
				      metric_value(text, "baton_workflows{status=\"failed\"}") +
				      metric_value(text, "baton_workflows{status=\"cancelled\"}"));
		free(text);
		if (done >= want)
			return 0;
		sleep_ms(pause);
		if (pause < 200)
			pause *= 2;
	}
	fprintf(stderr, "bench: workflows not finished after %.0f s\n", timeout_s);
	return -1;
}

json_t *get_workflow(int port, const char *id)
{
	char path[256], *text = NULL;
	json_t *wf = NULL;
	snprintf(path, sizeof path, "/workflows/%s", id);
	if (http_do(port, "GET", path, NULL, &text) == 200 && text)
		wf = json_loads(text, 0, NULL);
	free(text);
	return wf;
}

int workflow_span(int port, const char *id, int steps, const char *what, int64_t *first,
		  int64_t *last)
{
	json_t *wf = get_workflow(port, id);
	json_t *list = json_object_get(wf, "steps");
	size_t n = json_array_size(list);
	*first = n ? rfc3339_ms(
			 json_string_value(json_object_get(json_array_get(list, 0), "started_at")))
		   : -1;
	*last = n ? rfc3339_ms(json_string_value(
			json_object_get(json_array_get(list, n - 1), "finished_at")))
		  : -1;
	const char *status = json_string_value(json_object_get(wf, "status"));
	int ok = n == (size_t)steps && *first >= 0 && *last >= *first && status &&
		 strcmp(status, "completed") == 0;
	json_decref(wf);
	if (!ok)
		fprintf(stderr, "bench: %s: workflow %s did not complete as expected\n", what, id);
	return ok ? 0 : -1;
}

/* ---- the table ---- */

#define MAX_ROWS 64
static row rows[MAX_ROWS];
static int nrows, nerrors;

void table_add(const row *in)
{
	row copy = *in, *r = &copy;
	if (!r->store[0])
		snprintf(r->store, sizeof r->store, "%s",
			 opt.store == STORE_POSTGRES ? "PostgreSQL" : "SQLite");
	if (nrows < MAX_ROWS)
		rows[nrows++] = *r;
	const char *v = r->verdict == V_PASS ? "PASS" : r->verdict == V_MISS ? "MISS" : "";
	printf("  -> %s %-22s %-24s floor %-22s ratio %-8s target %-20s %s%s%s\n", r->store,
	       r->what, r->figure, r->floor, r->ratio, r->target, v, r->note[0] ? "  " : "",
	       r->note);
	fflush(stdout);
}

void table_fail(const char *what, const char *why)
{
	row r = {.verdict = V_MISS};
	nerrors++;
	snprintf(r.what, sizeof r.what, "%s", what);
	snprintf(r.figure, sizeof r.figure, "did not run");
	snprintf(r.note, sizeof r.note, "%s", why);
	table_add(&r);
}

void table_print(void)
{
	printf("\n| store | what | figure | floor (same run) | ratio | target | result |\n");
	printf("|---|---|---|---|---|---|---|\n");
	for (int i = 0; i < nrows; i++) {
		const row *r = &rows[i];
		const char *v = r->verdict == V_PASS   ? "PASS"
				: r->verdict == V_MISS ? (opt.smoke ? "miss (smoke)" : "MISS")
						       : "info";
		printf("| %s | %s | %s | %s | %s | %s | %s |\n", r->store, r->what, r->figure,
		       r->floor, r->ratio, r->target, v);
	}
	int notes = 0;
	for (int i = 0; i < nrows; i++)
		if (rows[i].note[0])
			printf("%s- %s, %s: %s\n", notes++ ? "" : "\n", rows[i].store, rows[i].what,
			       rows[i].note);
	fflush(stdout);
}

int table_misses(void)
{
	int n = 0;
	for (int i = 0; i < nrows; i++)
		n += rows[i].verdict == V_MISS;
	return n;
}

int table_errors(void)
{
	return nerrors;
}
