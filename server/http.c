/*
 * http.c - the libmicrohttpd daemon: per-request state, body accumulation with a hard
 * cap, JSON and problem+json responses.
 *
 * Flow of one request (libmicrohttpd's largepost.c): the first callback allocates the
 * request state and rejects an announced body over the cap (413) before reading it;
 * later callbacks append the body, dropping it once it exceeds the cap; the final call
 * routes the request and queues the answer; the NOTIFY_COMPLETED callback frees the
 * state.
 */
#include "server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define DISCARD_MAX (16u * 1024 * 1024)

static const char problem_base[] = "https://baton.dev/problems/";

static const struct {
	int status;
	const char *slug, *title;
} problems[] = {
    {400, "invalid-request", "Invalid request"},
    {401, "unauthorized", "Unauthorized"},
    {404, "not-found", "Not found"},
    {405, "method-not-allowed", "Method not allowed"},
    {409, "conflict", "Conflict"},
    {410, "gone", "Gone"},
    {413, "payload-too-large", "Payload too large"},
    {415, "unsupported-media-type", "Unsupported media type"},
    {500, "internal", "Internal server error"},
    {501, "not-implemented", "Not implemented"},
    {503, "unavailable", "Service unavailable"},
};

int reply_json(response *out, int status, json_t *body)
{
	json_decref(out->body);
	out->status = status;
	out->body = body;
	out->content_type = "application/json";
	return status;
}

int reply_problem(response *out, int status, const char *fmt, ...)
{
	char detail[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(detail, sizeof detail, fmt, ap);
	va_end(ap);
	const char *slug = "internal", *title = "Error";
	for (size_t i = 0; i < sizeof problems / sizeof problems[0]; i++)
		if (problems[i].status == status) {
			slug = problems[i].slug;
			title = problems[i].title;
		}
	char type[128];
	snprintf(type, sizeof type, "%s%s", problem_base, slug);
	reply_json(out, status,
		   json_pack("{s:s, s:s, s:i, s:s}", "type", type, "title", title, "status", status,
			     "detail", detail));
	out->content_type = "application/problem+json";
	return status;
}

/* One table from library codes to HTTP statuses. */
int reply_error(response *out, const baton_error *err)
{
	static const int status_of[] = {
	    [BATON_OK] = 200,	     [BATON_EINVAL] = 400,    [BATON_ENOTFOUND] = 404,
	    [BATON_ECONFLICT] = 409, [BATON_EBUSY] = 503,     [BATON_EIO] = 503,
	    [BATON_ECORRUPT] = 500,  [BATON_EINTERNAL] = 500, [BATON_ETOOLARGE] = 413,
	    [BATON_EGONE] = 410,
	};
	int status = 500;
	if (err->code >= 0 && (size_t)err->code < sizeof status_of / sizeof status_of[0])
		status = status_of[err->code];
	if (status >= 500)
		srv_log(BATON_LOG_WARN, "answering %d: %s", status, err->msg);
	reply_problem(out, status, "%s", err->msg);
	if (status == 503)
		out->retry_after = 1;
	return status;
}

const char *query_arg(const request *r, const char *name)
{
	return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, name);
}

int srv_parse_int(const char *text, long long lo, long long hi, long long *v)
{
	char *end;
	errno = 0;
	long long n = strtoll(text, &end, 10);
	if (!*text || *end || errno || n < lo || n > hi)
		return -1;
	*v = n;
	return 0;
}

/* Every numeric query parameter (limit, after, ...) is read here. */
int query_int(const request *r, const char *name, long long lo, long long hi, long long *v,
	      response *out)
{
	const char *a = query_arg(r, name);
	if (!a || srv_parse_int(a, lo, hi, v) == 0)
		return 0;
	if (hi == LLONG_MAX)
		reply_problem(out, 400, "%s: must be a whole number >= %lld", name, lo);
	else
		reply_problem(out, 400, "%s: must be between %lld and %lld", name, lo, hi);
	return -1;
}

/* The body as text: the plain text when set, else the JSON and a newline. */
static char *body_text(response *out)
{
	if (out->text) {
		char *t = out->text;
		out->text = NULL;
		return t;
	}
	return out->body ? baton_json_text(out->body, '\n', NULL) : NULL;
}

static enum MHD_Result send_response(struct MHD_Connection *conn, request *r, response *out)
{
	struct MHD_Response *resp = out->stream;
	r->route = out->route;
	r->status = out->status;
	r->streaming = resp != NULL;
	if (!resp) {
		char *text = body_text(out);
		resp = MHD_create_response_from_buffer(
		    text ? strlen(text) : 0, text ? text : (void *)"",
		    text ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
		if (!resp) {
			free(text);
			json_decref(out->body);
			out->body = NULL;
			return MHD_NO;
		}
	}
	if (out->content_type)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, out->content_type);
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL,
				out->console_file ? "no-cache" : "no-store");
	if (out->etag[0])
		MHD_add_response_header(resp, MHD_HTTP_HEADER_ETAG, out->etag);
	if (out->console_file) {
		MHD_add_response_header(resp, "Content-Security-Policy", "default-src 'self'");
		MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
		MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
	}
	if (out->location[0])
		MHD_add_response_header(resp, MHD_HTTP_HEADER_LOCATION, out->location);
	if (out->allow[0])
		MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, out->allow);
	if (out->retry_after) {
		char ra[16];
		snprintf(ra, sizeof ra, "%d", out->retry_after);
		MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, ra);
	}
	if (out->www_authenticate)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
					out->www_authenticate);
	enum MHD_Result ret = MHD_queue_response(conn, (unsigned)out->status, resp);
	MHD_destroy_response(resp);
	json_decref(out->body);
	out->body = NULL;
	return ret;
}

/* Compares in time that depends only on the length of the expected token. */
static int token_matches(const char *given, const char *want)
{
	size_t gl = strlen(given), wl = strlen(want);
	volatile unsigned char diff = (unsigned char)(gl != wl);
	for (size_t i = 0; i < wl; i++)
		diff |= (unsigned char)(want[i] ^ (i < gl ? given[i] : 0));
	return diff == 0;
}

/* With --token, every path but the health checks and the console's files (which hold no
 * data: the console asks the API for it, with the token) needs "Authorization: Bearer
 * TOKEN". */
static int authorized(const srv *s, struct MHD_Connection *conn, const char *url)
{
	if (!s->cfg->token[0] || strcmp(url, "/healthz") == 0 || strcmp(url, "/readyz") == 0 ||
	    srv_ui_path(url))
		return 1;
	const char *h =
	    MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
	static const char scheme[] = "Bearer ";
	if (!h || strncasecmp(h, scheme, sizeof scheme - 1) != 0)
		return 0;
	return token_matches(h + sizeof scheme - 1, s->cfg->token);
}

/* Past 90% of the connection limit, answer 503 at once instead of queueing work. */
static int overloaded(srv *s)
{
	pthread_mutex_lock(&s->conn_mu);
	int over = s->connections * 10 > s->cfg->max_connections * 9;
	pthread_mutex_unlock(&s->conn_mu);
	return over;
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_ctx,
			  enum MHD_ConnectionNotificationCode toe)
{
	srv *s = cls;
	(void)conn;
	(void)socket_ctx;
	pthread_mutex_lock(&s->conn_mu);
	s->connections += toe == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1;
	pthread_mutex_unlock(&s->conn_mu);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
				  const char *method, const char *version, const char *upload_data,
				  size_t *upload_size, void **con_cls)
{
	srv *s = cls;
	request *r = *con_cls;
	(void)version;
	if (!r) {
		r = calloc(1, sizeof *r);
		if (!r)
			return MHD_NO;
		r->conn = conn;
		r->method = method;
		r->path = url;
		r->fd = srv_conn_fd(conn);
		r->forwarded_by =
		    MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Baton-Forwarded");
		r->authorization = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
							       MHD_HTTP_HEADER_AUTHORIZATION);
		clock_gettime(CLOCK_MONOTONIC, &r->started);
		*con_cls = r;
		if (overloaded(s) && strcmp(url, "/healthz") != 0) {
			response out = {0};
			reply_problem(&out, 503, "too many connections; try again shortly");
			out.retry_after = 1;
			return send_response(conn, r, &out);
		}
		if (!authorized(s, conn, url)) {
			response out = {0};
			reply_problem(&out, 401,
				      "this server requires Authorization: Bearer <token>");
			out.www_authenticate = "Bearer realm=\"baton\"";
			return send_response(conn, r, &out);
		}
		const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
							     MHD_HTTP_HEADER_CONTENT_LENGTH);
		unsigned long long announced = cl ? strtoull(cl, NULL, 10) : 0;
		if (announced > s->cfg->max_body)
			r->too_large = 1;
		/* A body up to DISCARD_MAX is read and dropped before the 413, so that the
		 * client, still sending, sees the answer instead of a broken pipe; a larger one
		 * is refused before a byte of it is read. */
		if (r->too_large && announced > DISCARD_MAX) {
			response out = {0};
			reply_problem(&out, 413, "the body is larger than %zu bytes",
				      s->cfg->max_body);
			return send_response(conn, r, &out);
		}
		return MHD_YES;
	}
	if (*upload_size) {
		if (!r->too_large && r->body_len + *upload_size > s->cfg->max_body) {
			r->too_large = 1;
			free(r->body);
			r->body = NULL;
			r->body_len = r->body_cap = 0;
		}
		if (!r->too_large) {
			if (r->body_len + *upload_size + 1 > r->body_cap) {
				size_t cap = (r->body_len + *upload_size + 1) * 2;
				if (cap > s->cfg->max_body + 1)
					cap = s->cfg->max_body + 1;
				char *b = realloc(r->body, cap);
				if (!b)
					return MHD_NO;
				r->body = b;
				r->body_cap = cap;
			}
			memcpy(r->body + r->body_len, upload_data, *upload_size);
			r->body_len += *upload_size;
		}
		*upload_size = 0;
		return MHD_YES;
	}
	response out = {0};
	if (srv_wait_answered(s, r)) /* resumed: the engine has answered */
		srv_wait_finish(s, r, &out);
	else if (r->too_large)
		reply_problem(&out, 413, "the body is larger than %zu bytes", s->cfg->max_body);
	else
		route(s, r, &out);
	if (out.pending)
		return MHD_YES; /* suspended; called again once resumed */
	if (!out.status)
		reply_problem(&out, 500, "no response");
	return send_response(conn, r, &out);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	(void)conn;
	request *r = *con_cls;
	if (r) {
		if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) {
			srv_lease_unsent(cls, r);
			srv_task_unsent(cls, r);
		}
		srv_wait_abandoned(cls, r);
		struct timespec now;
		clock_gettime(CLOCK_MONOTONIC, &now);
		double secs = (double)(now.tv_sec - r->started.tv_sec) +
			      (double)(now.tv_nsec - r->started.tv_nsec) / 1e9;
		if (r->status)
			srv_metrics_request(r->route ? r->route : "unmatched", r->method, r->status,
					    secs, r->streaming);
		free(r->body);
		free(r);
		*con_cls = NULL;
	}
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
	char msg[512];
	(void)cls;
	vsnprintf(msg, sizeof msg, fmt, ap);
	size_t n = strlen(msg);
	while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
		msg[--n] = 0;
	srv_log(BATON_LOG_DEBUG, "http: %s", msg);
}

/* Starts the daemon on addr, or with addr NULL on every interface at the configured port
 * (libmicrohttpd binds the wildcard address itself). */
static struct MHD_Daemon *start_daemon(srv *s, unsigned flags, const struct sockaddr *addr)
{
	return MHD_start_daemon(flags, addr ? 0 : (uint16_t)s->cfg->port, NULL, NULL, on_request, s,
				MHD_OPTION_SOCK_ADDR, addr, MHD_OPTION_THREAD_POOL_SIZE,
				(unsigned)s->cfg->http_threads, MHD_OPTION_NOTIFY_COMPLETED,
				on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
				MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)s->cfg->conn_timeout_s,
				MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->cfg->max_connections,
				MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->cfg->max_per_ip,
				MHD_OPTION_CONNECTION_MEMORY_LIMIT, s->cfg->conn_memory,
				MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s, MHD_OPTION_END);
}

/* --listen HOST:PORT: the first address HOST resolves to. */
static int start_at_host(srv *s, unsigned flags, baton_error *err)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC,
				 .ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_PASSIVE},
			*ai = NULL;
	char port[16];
	snprintf(port, sizeof port, "%d", s->cfg->port);
	int rc = getaddrinfo(s->cfg->host, port, &hints, &ai);
	if (rc != 0) {
		snprintf(err->msg, sizeof err->msg, "cannot resolve \"%s\": %s", s->cfg->host,
			 gai_strerror(rc));
		return -1;
	}
	s->daemon =
	    start_daemon(s, flags | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0), ai->ai_addr);
	freeaddrinfo(ai);
	return 0;
}

int srv_start(srv *s, baton_error *err)
{
	unsigned flags =
	    MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME;
	if (s->cfg->host[0]) {
		if (start_at_host(s, flags, err))
			return -1;
	} else {
		/* --listen :PORT: IPv6 and IPv4 on one socket, or IPv4 alone on a machine
		 * without IPv6. */
		s->daemon = start_daemon(s, flags | MHD_USE_DUAL_STACK, NULL);
		s->dual_stack = s->daemon != NULL;
		if (!s->daemon)
			s->daemon = start_daemon(s, flags, NULL);
	}
	if (!s->daemon) {
		snprintf(err->msg, sizeof err->msg,
			 "cannot listen on %s (in use, or not an address of this machine?)",
			 s->cfg->listen);
		return -1;
	}
	const union MHD_DaemonInfo *info =
	    MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
	s->port = info ? info->port : s->cfg->port;
	return 0;
}

void srv_stop(srv *s)
{
	/* Suspended connections must be resumed before the daemon stops: the requests with
	 * the engine are answered first (the engine still runs), then the streams. */
	srv_leases_stop(s);
	srv_forwards_stop();
	srv_waits_drain(s);
	srv_streams_close();
	if (s->daemon)
		MHD_stop_daemon(s->daemon);
	s->daemon = NULL;
}
