/*
 * log.c - batond's log lines: "TIME LEVEL [wf=ID] message" on stderr, each written whole
 * so that lines from different threads never interleave. The level is checked before a
 * line is formatted (srv_log). The engine thread's lines are held until the end of its
 * round (srv_engine_log_flush) and written together: a busy round logs hundreds of
 * lines, and a write per line cost more than formatting them.
 */
#include "server.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int srv_log_level = BATON_LOG_INFO;
int srv_log_json = 0;

static const char *const level_names[] = {"DEBUG", "INFO", "WARN", "ERROR"};

/*
 * Lines held by the engine thread (the one thread that calls srv_engine_log_flush): the
 * flag is per thread, the buffer is the engine's alone, allocated at its first flush.
 */
#define HELD_MAX (64 << 10)
static _Thread_local int holding;
static struct {
	size_t len;
	char *buf;
} held;

static void write_held(void)
{
	if (held.len)
		fwrite(held.buf, 1, held.len, stderr);
	held.len = 0;
}

void srv_engine_log_flush(void *ud)
{
	(void)ud;
	if (!holding && (held.buf = malloc(HELD_MAX)))
		holding = 1;
	write_held();
}

void srv_log_close(void)
{
	free(held.buf);
	held.buf = NULL;
}
static const char *const json_level[] = {"debug", "info", "warn", "error"};

int srv_parse_level(const char *s)
{
	static const char *const names[] = {"debug", "info", "warn", "error"};
	for (int i = 0; i < 4; i++)
		if (strcmp(s, names[i]) == 0)
			return i;
	return -1;
}

void srv_log_line(int level, const char *wf_id, const char *msg)
{
	/* The date and time to the second, formatted once a second per thread. */
	static _Thread_local time_t last_sec = -1;
	static _Thread_local char last_when[32];
	static _Thread_local size_t last_n;
	struct timespec ts;
	char when[40], line[1400];
	clock_gettime(CLOCK_REALTIME, &ts);
	if (ts.tv_sec != last_sec) {
		struct tm tm;
		gmtime_r(&ts.tv_sec, &tm);
		last_n = strftime(last_when, sizeof last_when, "%Y-%m-%dT%H:%M:%S", &tm);
		last_sec = ts.tv_sec;
	}
	memcpy(when, last_when, last_n);
	long ms = ts.tv_nsec / 1000000;
	when[last_n] = '.';
	when[last_n + 1] = (char)('0' + ms / 100);
	when[last_n + 2] = (char)('0' + ms / 10 % 10);
	when[last_n + 3] = (char)('0' + ms % 10);
	memcpy(when + last_n + 4, "Z", 2);
	if (level < 0 || level > 3)
		level = 3;
	int len;
	if (srv_log_json) {
		json_t *o = json_pack("{s:s, s:s, s:s}", "ts", when, "level", json_level[level],
				      "msg", msg);
		if (wf_id)
			json_object_set_new(o, "workflow_id", json_string(wf_id));
		char *text = json_dumps(o, JSON_COMPACT);
		json_decref(o);
		len = snprintf(line, sizeof line, "%s\n", text ? text : "{}");
		free(text);
	} else if (wf_id)
		len = snprintf(line, sizeof line, "%s %-5s wf=%s %s\n", when, level_names[level],
			       wf_id, msg);
	else
		len = snprintf(line, sizeof line, "%s %-5s %s\n", when, level_names[level], msg);
	if (len > (int)sizeof line - 1) {
		len = (int)sizeof line - 1;
		line[len - 1] = '\n';
	}
	if (!holding) {
		fwrite(line, 1, (size_t)len, stderr);
		return;
	}
	if (held.len + (size_t)len > HELD_MAX)
		write_held();
	memcpy(held.buf + held.len, line, (size_t)len);
	held.len += (size_t)len;
}

void srv_logf(int level, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	srv_log_line(level, NULL, msg);
}

void srv_engine_log(void *ud, int level, const char *wf_id, const char *msg)
{
	(void)ud;
	srv_log_line(level, wf_id, msg);
}
