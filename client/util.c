/*
 * util.c: JSON field access, output and time helpers shared by the commands and the demo.
 *
 * The server's documents are read leniently: a missing or mistyped field yields the
 * caller's default instead of a crash, so that a newer server never breaks an older client.
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client.h"

const char *jstr(const json_t *obj, const char *key, const char *dflt)
{
	const char *s = json_string_value(json_object_get(obj, key));

	return s ? s : dflt;
}

json_int_t jint(const json_t *obj, const char *key, json_int_t dflt)
{
	const json_t *v = json_object_get(obj, key);

	return json_is_integer(v) ? json_integer_value(v) : dflt;
}

int jhas(const json_t *obj, const char *key)
{
	const json_t *v = json_object_get(obj, key);

	return v && !json_is_null(v);
}

static int json_errors;

void set_json_errors(int on)
{
	json_errors = on;
}

/* Prints doc as one line on stderr. */
static void error_line(const json_t *doc)
{
	fflush(stdout);
	json_dumpf(doc, stderr, JSON_ENCODE_ANY);
	fputc('\n', stderr);
}

void print_error(const char *title, const char *fmt, ...)
{
	va_list ap;
	char *detail = NULL;

	va_start(ap, fmt);
	if (vasprintf(&detail, fmt, ap) < 0)
		detail = NULL;
	va_end(ap);
	if (!json_errors) {
		fprintf(stderr, "baton: %s\n", detail ? detail : title);
	} else {
		json_t *doc = json_pack("{s:s, s:s, s:s}", "type", "about:blank", "title", title,
					"detail", detail ? detail : title);
		error_line(doc);
		json_decref(doc);
	}
	free(detail);
}

/* "baton: GET /workflows/x: HTTP 404 Not found: no workflow with id "x"" */
void print_problem(const char *method, const char *path, long status, const json_t *problem)
{
	const char *title = jstr(problem, "title", NULL);
	const char *detail = jstr(problem, "detail", NULL);

	if (json_errors && json_is_object(problem)) {
		error_line(problem);
		return;
	}
	if (json_errors) {
		json_t *doc = json_pack("{s:s, s:s, s:i}", "type", "about:blank", "title",
					"HTTP error", "status", (int)status);
		json_object_set_new(doc, "detail",
				    json_sprintf("%s %s: HTTP %ld", method, path, status));
		error_line(doc);
		json_decref(doc);
		return;
	}
	fprintf(stderr, "baton: %s %s: HTTP %ld", method, path, status);
	if (title)
		fprintf(stderr, " %s", title);
	if (detail)
		fprintf(stderr, ": %s", detail);
	fputc('\n', stderr);
}

void print_json(FILE *out, const json_t *v)
{
	json_dumpf(v, out, JSON_ENCODE_ANY);
	fputc('\n', out);
}

static int plain_token(const char *s)
{
	if (!*s)
		return 0;
	for (; *s; s++) {
		if (!strchr("._:/@+-", *s) && !(*s >= 'a' && *s <= 'z') &&
		    !(*s >= 'A' && *s <= 'Z') && !(*s >= '0' && *s <= '9'))
			return 0;
	}
	return 1;
}

void print_token(FILE *out, const char *s)
{
	if (plain_token(s)) {
		fputs(s, out);
		return;
	}
	json_t *str = json_string(s);
	if (str)
		json_dumpf(str, out, JSON_ENCODE_ANY);
	else
		fputs("\"?\"", out); /* not UTF-8: jansson refuses it */
	json_decref(str);
}

/* Decodes the UTF-8 sequence at s (n > 0 bytes left) into *cp; returns its length, or 0
 * when it is not well formed. */
static size_t utf8_decode(const unsigned char *s, size_t n, unsigned long *cp)
{
	size_t len = s[0] < 0x80       ? 1
		     : s[0] >> 5 == 6  ? 2
		     : s[0] >> 4 == 14 ? 3
		     : s[0] >> 3 == 30 ? 4
				       : 0;

	if (len == 0 || len > n)
		return 0;
	*cp = len == 1 ? s[0] : s[0] & (0x7f >> len);
	for (size_t i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		*cp = (*cp << 6) | (s[i] & 0x3f);
	}
	return len;
}

struct range {
	unsigned long lo, hi;
};

static int in_ranges(unsigned long cp, const struct range *r, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (cp >= r[i].lo && cp <= r[i].hi)
			return 1;
	}
	return 0;
}

/* Columns of one code point: wcwidth's answer for the scripts names are written in,
 * without depending on the locale the client runs in. */
static int cp_width(unsigned long cp)
{
	static const struct range zero[] = {
	    {0x0300, 0x036f},	{0x0483, 0x0489}, {0x0591, 0x05bd}, {0x0610, 0x061a},
	    {0x064b, 0x065f},	{0x0e31, 0x0e31}, {0x0e34, 0x0e3a}, {0x1ab0, 0x1aff},
	    {0x1dc0, 0x1dff},	{0x200b, 0x200f}, {0x2028, 0x202e}, {0x2060, 0x2064},
	    {0x20d0, 0x20ff},	{0xfe00, 0xfe0f}, {0xfe20, 0xfe2f}, {0xfeff, 0xfeff},
	    {0xe0100, 0xe01ef},
	};
	static const struct range wide[] = {
	    {0x1100, 0x115f},	{0x2e80, 0x303e},   {0x3041, 0x33ff},	{0x3400, 0x4dbf},
	    {0x4e00, 0x9fff},	{0xa000, 0xa4cf},   {0xa960, 0xa97f},	{0xac00, 0xd7a3},
	    {0xf900, 0xfaff},	{0xfe10, 0xfe19},   {0xfe30, 0xfe6f},	{0xff00, 0xff60},
	    {0xffe0, 0xffe6},	{0x1f300, 0x1f64f}, {0x1f900, 0x1f9ff}, {0x20000, 0x2fffd},
	    {0x30000, 0x3fffd},
	};

	if (in_ranges(cp, zero, sizeof(zero) / sizeof(zero[0])))
		return 0;
	return in_ranges(cp, wide, sizeof(wide) / sizeof(wide[0])) ? 2 : 1;
}

size_t display_width(const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t cols = 0;

	while (n > 0) {
		unsigned long cp = 0;
		size_t len = utf8_decode(p, n, &cp);
		cols += len ? (size_t)cp_width(cp) : 1;
		len = len ? len : 1;
		p += len;
		n -= len;
	}
	return cols;
}

void print_padded(FILE *out, const char *s, int width)
{
	fputs(s, out);
	for (size_t w = display_width(s, strlen(s)); w < (size_t)width; w++)
		fputc(' ', out);
}

void format_secs(char *buf, size_t len, json_int_t ms)
{
	const char *sign = ms < 0 ? "-" : "";
	unsigned long long a = ms < 0 ? -(unsigned long long)ms : (unsigned long long)ms;
	unsigned long long frac = a % 1000;

	if (frac == 0) {
		snprintf(buf, len, "%s%llu", sign, a / 1000);
		return;
	}
	int digits = 3;
	while (frac % 10 == 0) {
		frac /= 10;
		digits--;
	}
	snprintf(buf, len, "%s%llu.%0*llu", sign, a / 1000, digits, frac);
}

int parse_duration(const char *s, long long max_ms, long long *ms)
{
	static const struct {
		const char *suffix;
		double ms;
	} units[] = {{"", 1000}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}};
	char *end;

	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || !(v >= 0)) /* also NaN */
		return -1;
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (strcmp(end, units[i].suffix) != 0)
			continue;
		/* compared as a double before the conversion: inf and 1e300 never reach it */
		if (v * units[i].ms > (double)max_ms)
			return -2;
		*ms = (long long)(v * units[i].ms);
		return 0;
	}
	return -1;
}

int job_can_stop(void)
{
	pid_t parent = getppid();
	return getsid(parent) == getsid(0) && getpgid(parent) != getpgrp();
}

int job_stop_with_keeper(struct cli *cli, void *state, size_t size,
			 int (*keep)(struct cli *kc, void *shared, void *arg), void *arg,
			 volatile sig_atomic_t *ending)
{
	void *shared = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct cli kc = *cli;
	kc.http = http_clone(cli->http);
	if (shared == MAP_FAILED || !kc.http) {
		if (shared != MAP_FAILED)
			munmap(shared, size);
		http_free(kc.http);
		return -1;
	}
	memcpy(shared, state, size);
	fflush(stdout);
	fflush(stderr);
	/* The ending signals stay blocked across the fork: one that reaches the keeper before
	 * it cleared its copy of *ending (a shell's `kill %1` right after the stop) must still
	 * end it, not be cleared with that copy. */
	sigset_t ends, old;
	sigemptyset(&ends);
	sigaddset(&ends, SIGINT);
	sigaddset(&ends, SIGTERM);
	sigaddset(&ends, SIGHUP);
	sigaddset(&ends, SIGQUIT);
	sigprocmask(SIG_BLOCK, &ends, &old);
	pid_t keeper = fork();
	if (keeper == 0) {
		*ending = 0;
		sigprocmask(SIG_SETMASK, &old, NULL);
		while (!*ending) { /* ended once its parent runs again */
			if (keep(&kc, shared, arg)) {
				kill(getppid(), SIGCONT);
				_exit(1);
			}
			sleep_ms(20);
		}
		_exit(0);
	}
	sigprocmask(SIG_SETMASK, &old, NULL);
	http_free(kc.http);
	int lost = -1;
	if (keeper > 0) {
		struct sigaction dfl = {.sa_handler = SIG_DFL}, was;
		sigemptyset(&dfl.sa_mask);
		sigaction(SIGTSTP, &dfl, &was);
		raise(SIGTSTP); /* returns once continued: `fg`, `bg`, `kill %1`, or the keeper */
		sigaction(SIGTSTP, &was, NULL);
		kill(keeper, SIGTERM);
		int ws = 0;
		while (waitpid(keeper, &ws, 0) < 0 && errno == EINTR)
			;
		lost = !(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
		memcpy(state, shared, size);
	}
	munmap(shared, size);
	return lost;
}

long long monotonic_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

	/* Bounded: each EINTR resumes with the time left, which only shrinks. */
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

int sbuf_add(struct sbuf *b, const char *s, size_t n, size_t max)
{
	if (b->len + n + 1 > max)
		return -1;
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		while (cap < b->len + n + 1)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p)
			return -1;
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
	return 0;
}

void sbuf_fini(struct sbuf *b)
{
	if (!b)
		return;
	free(b->p);
	b->p = NULL;
	b->len = b->cap = 0;
}
