/*
 * stub.c - a stand-in for batond whose answers the test decides (see stub.h).
 */
#include "stub.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <microhttpd.h>

#define MAX_ROUTES  16
#define MAX_ARRIVED 1024

typedef struct arrival {
	char method[8], path[120];
	char body[512]; /* its first bytes, NUL-terminated */
	int64_t at_ms;
} arrival;

/* One request on its way in: where its arrival is recorded. */
typedef struct incoming {
	size_t idx; /* in arrived; MAX_ARRIVED when it was not recorded */
	size_t len;
} incoming;

struct stub {
	struct MHD_Daemon *daemon;
	int port;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stopping;
	stub_rule routes[MAX_ROUTES];
	size_t n_routes;
	arrival arrived[MAX_ARRIVED];
	size_t n_arrived;
};

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static char *dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

static bool matches(const char *method, const char *path, const char *want_method,
		    const char *prefix)
{
	return (!want_method || strcmp(method, want_method) == 0) &&
	       (!prefix || strncmp(path, prefix, strlen(prefix)) == 0);
}

/* Waits delay_ms, or less when the stub is being closed. Under s->mu. */
static void delay_locked(stub *s, int delay_ms)
{
	int64_t until = mono_ms() + delay_ms;
	while (!s->stopping && mono_ms() < until) {
		int64_t left = until - mono_ms();
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += left / 1000;
		ts.tv_nsec += (left % 1000) * 1000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&s->cv, &s->mu, &ts);
	}
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
				  const char *method, const char *version, const char *upload,
				  size_t *upload_size, void **con_cls)
{
	stub *s = cls;
	(void)version;
	incoming *in = *con_cls;
	if (!in) { /* the headers: the request has arrived */
		if (!(in = calloc(1, sizeof *in)))
			return MHD_NO;
		*con_cls = in;
		pthread_mutex_lock(&s->mu);
		in->idx = s->n_arrived < MAX_ARRIVED ? s->n_arrived++ : MAX_ARRIVED;
		if (in->idx < MAX_ARRIVED) {
			arrival *a = &s->arrived[in->idx];
			snprintf(a->method, sizeof a->method, "%s", method);
			snprintf(a->path, sizeof a->path, "%s", url);
			a->at_ms = mono_ms();
		}
		pthread_mutex_unlock(&s->mu);
		return MHD_YES;
	}
	if (*upload_size) { /* the body: its first bytes are kept */
		pthread_mutex_lock(&s->mu);
		if (in->idx < MAX_ARRIVED) {
			arrival *a = &s->arrived[in->idx];
			size_t n = *upload_size;
			if (n > sizeof a->body - 1 - in->len)
				n = sizeof a->body - 1 - in->len;
			memcpy(a->body + in->len, upload, n);
			in->len += n;
			a->body[in->len] = '\0';
		}
		pthread_mutex_unlock(&s->mu);
		*upload_size = 0;
		return MHD_YES;
	}
	pthread_mutex_lock(&s->mu);
	stub_rule r = {.status = 404, .body = "{\"title\": \"no route in the stub\"}"};
	for (size_t i = 0; i < s->n_routes; i++)
		if (matches(method, url, s->routes[i].method, s->routes[i].prefix)) {
			r = s->routes[i];
			break;
		}
	char *body = dup_or_null(r.body);
	delay_locked(s, r.delay_ms);
	pthread_mutex_unlock(&s->mu);
	struct MHD_Response *resp = MHD_create_response_from_buffer(
	    body ? strlen(body) : 0, body ? body : (char *)"", MHD_RESPMEM_MUST_COPY);
	free(body);
	if (!resp)
		return MHD_NO;
	if (r.body)
		MHD_add_response_header(resp, "Content-Type", "application/json");
	enum MHD_Result ret = MHD_queue_response(c, (unsigned)r.status, resp);
	MHD_destroy_response(resp);
	return ret;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	(void)cls;
	(void)c;
	(void)toe;
	free(*con_cls);
	*con_cls = NULL;
}

stub *stub_open(void)
{
	stub *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->cv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&s->mu, NULL);
	struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = 0};
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	s->daemon = MHD_start_daemon(
	    MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL,
	    on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
	    MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_END);
	const union MHD_DaemonInfo *info =
	    s->daemon ? MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT) : NULL;
	if (!info || info->port == 0) {
		fprintf(stderr, "stub: cannot listen on 127.0.0.1\n");
		stub_close(s);
		return NULL;
	}
	s->port = info->port;
	return s;
}

void stub_close(stub *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	s->stopping = true;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	if (s->daemon)
		MHD_stop_daemon(s->daemon); /* joins every connection thread */
	for (size_t i = 0; i < s->n_routes; i++) {
		free((char *)s->routes[i].method);
		free((char *)s->routes[i].prefix);
		free((char *)s->routes[i].body);
	}
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
	free(s);
}

char *stub_url(const stub *s)
{
	char *url;
	if (asprintf(&url, "http://127.0.0.1:%d", s->port) < 0)
		return NULL;
	return url;
}

void stub_route(stub *s, stub_rule r)
{
	pthread_mutex_lock(&s->mu);
	if (s->n_routes < MAX_ROUTES) {
		r.method = dup_or_null(r.method);
		r.prefix = dup_or_null(r.prefix);
		r.body = dup_or_null(r.body);
		s->routes[s->n_routes++] = r;
	}
	pthread_mutex_unlock(&s->mu);
}

size_t stub_count(stub *s, const char *method, const char *prefix)
{
	size_t n = 0;
	pthread_mutex_lock(&s->mu);
	for (size_t i = 0; i < s->n_arrived; i++)
		n += matches(s->arrived[i].method, s->arrived[i].path, method, prefix);
	pthread_mutex_unlock(&s->mu);
	return n;
}

int64_t stub_first_arrival(stub *s, const char *method, const char *prefix)
{
	int64_t at = -1;
	pthread_mutex_lock(&s->mu);
	for (size_t i = 0; i < s->n_arrived && at < 0; i++)
		if (matches(s->arrived[i].method, s->arrived[i].path, method, prefix))
			at = s->arrived[i].at_ms;
	pthread_mutex_unlock(&s->mu);
	return at;
}

char *stub_body(stub *s, const char *method, const char *prefix)
{
	char *body = NULL;
	pthread_mutex_lock(&s->mu);
	for (size_t i = 0; i < s->n_arrived && !body; i++)
		if (matches(s->arrived[i].method, s->arrived[i].path, method, prefix))
			body = strdup(s->arrived[i].body);
	pthread_mutex_unlock(&s->mu);
	return body;
}
