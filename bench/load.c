/*
 * load.c - a closed-loop HTTP/1.1 load generator: `conns` keep-alive connections to
 * 127.0.0.1, each sending its next request as soon as the previous answer is in.
 *
 * Design. One thread, non-blocking sockets and epoll, requests written by hand and
 * answers read by Content-Length (libmicrohttpd sends one for every buffer response).
 * The generator shares two cores with the server under test, so it must cost far less
 * per request than the server: libcurl's multi interface, tried first, capped a minimal
 * libmicrohttpd handler at about half of what wrk reaches, which would have flattered
 * batond in the read ratio; this loop is within reach of wrk. Latency is measured from
 * writing a request to reading its last byte, on the client's clock.
 */
#include "bench.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define REQ_MAX		  (64 * 1024)
#define REQUEST_TIMEOUT_S 60.0

typedef struct conn {
	int fd;
	int busy;
	char *out;
	size_t out_len, out_off;
	char *in;
	size_t in_len, in_cap;
	double sent_at;
} conn;

static int connect_to(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static int watch(int ep, conn *c, uint32_t events, int op)
{
	struct epoll_event ev = {.events = events, .data.ptr = c};
	return epoll_ctl(ep, op, c->fd, &ev);
}

/* (Re)opens the connection of c. */
static int reopen(int ep, conn *c, int port)
{
	if (c->fd >= 0)
		close(c->fd); /* also leaves the epoll set */
	c->fd = connect_to(port);
	c->in_len = 0;
	if (c->fd < 0 || watch(ep, c, EPOLLIN, EPOLL_CTL_ADD) != 0)
		return -1;
	return 0;
}

/* Writes what is left of the request; asks for EPOLLOUT when the socket is full. */
static int flush_out(int ep, conn *c)
{
	while (c->out_off < c->out_len) {
		ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n > 0) {
			c->out_off += (size_t)n;
			continue;
		}
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return watch(ep, c, EPOLLIN | EPOLLOUT, EPOLL_CTL_MOD);
		if (n < 0 && errno == EINTR)
			continue;
		return -1;
	}
	return watch(ep, c, EPOLLIN, EPOLL_CTL_MOD);
}

/* Asks for the next request and sends it; 1 when there is none, -1 on failure. */
static int issue(int ep, conn *c, int port, long n, load_next_fn next, void *ctx)
{
	const char *method = "GET", *body = NULL;
	char path[1024];
	if (next(ctx, n, &method, path, sizeof path, &body) != 0)
		return 1;
	size_t blen = body ? strlen(body) : 0;
	size_t need = strlen(method) + strlen(path) + blen + 256;
	if (need > REQ_MAX && !(c->out = realloc(c->out, need)))
		abort();
	size_t cap = need > REQ_MAX ? need : REQ_MAX;
	int h = body ? snprintf(c->out, cap,
				"%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
				"Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
				method, path, port, blen)
		     : snprintf(c->out, cap, "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n", method,
				path, port);
	if (body)
		memcpy(c->out + h, body, blen);
	c->out_len = (size_t)h + blen;
	c->out_off = 0;
	c->busy = 1;
	c->sent_at = now_s();
	return flush_out(ep, c) == 0 ? 0 : -1;
}

/* Looks for one whole answer in c->in: 1 (status and whether the server closes), 0 when
 * more bytes are needed, -1 when it cannot be parsed. */
static int parse_answer(conn *c, int *status, int *closes)
{
	char *end = memmem(c->in, c->in_len, "\r\n\r\n", 4);
	if (!end)
		return 0;
	size_t head = (size_t)(end - c->in) + 4;
	long clen = -1;
	*closes = 0;
	if (sscanf(c->in, "HTTP/1.%*d %d", status) != 1)
		return -1;
	for (char *p = memchr(c->in, '\n', head); p && p < end;
	     p = memchr(p, '\n', (size_t)(end - p))) {
		p++;
		if (strncasecmp(p, "Content-Length:", 15) == 0)
			clen = strtol(p + 15, NULL, 10);
		else if (strncasecmp(p, "Connection: close", 17) == 0)
			*closes = 1;
	}
	if (clen < 0)
		return -1;
	if (c->in_len < head + (size_t)clen)
		return 0;
	c->in_len = 0; /* closed loop: nothing can follow the answer */
	return 1;
}

static void count(load_result *out, conn *c, int status)
{
	c->busy = 0;
	if (status >= 200 && status < 300) {
		out->ok++;
		dvec_push(&out->lat_ms, (now_s() - c->sent_at) * 1000.0);
		return;
	}
	if (!out->failed)
		out->first_status = status;
	out->failed++;
}

/* Reads what arrived on c; returns 1 when its answer is complete, -1 on failure. */
static int on_readable(conn *c, load_result *out, int *closes)
{
	for (;;) {
		if (c->in_cap - c->in_len < 16384) {
			c->in_cap = c->in_cap ? c->in_cap * 2 : 65536;
			if (!(c->in = realloc(c->in, c->in_cap)))
				abort();
		}
		ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len - 1, MSG_DONTWAIT);
		if (n > 0) {
			c->in_len += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		return -1; /* closed or failed */
	}
	c->in[c->in_len] = 0;
	int status = 0, r = parse_answer(c, &status, closes);
	if (r == 1)
		count(out, c, status);
	return r;
}

/* Sends request number *sent on c; returns 1 when the run must stop. */
static int start_next(int ep, conn *c, int port, long *sent, load_next_fn next, void *ctx,
		      load_result *out)
{
	int r = issue(ep, c, port, *sent, next, ctx);
	if (r == 0) {
		(*sent)++;
		return 0;
	}
	if (r < 0)
		count(out, c, -1);
	return 1;
}

int load_run(int port, int nconns, long max_requests, double max_seconds, load_next_fn next,
	     void *ctx, load_result *out)
{
	memset(out, 0, sizeof *out);
	int ep = epoll_create1(EPOLL_CLOEXEC);
	conn *conns = calloc((size_t)nconns, sizeof *conns);
	if (ep < 0 || !conns)
		abort();
	long sent = 0;
	int stop = 0;
	double t0 = now_s(), deadline = t0 + max_seconds, last_done = t0;
	for (int i = 0; i < nconns; i++) {
		conns[i].fd = -1;
		if (!(conns[i].out = malloc(REQ_MAX)) || reopen(ep, &conns[i], port) != 0) {
			fprintf(stderr, "bench: cannot connect to 127.0.0.1:%d\n", port);
			out->failed++;
			stop = 1;
			break;
		}
	}
	for (int i = 0; i < nconns && !stop && sent < max_requests; i++)
		stop = start_next(ep, &conns[i], port, &sent, next, ctx, out);
	for (;;) {
		int busy = 0;
		double oldest = now_s();
		for (int i = 0; i < nconns; i++)
			if (conns[i].busy) {
				busy++;
				if (conns[i].sent_at < oldest)
					oldest = conns[i].sent_at;
			}
		if (!busy)
			break;
		if (now_s() - oldest > REQUEST_TIMEOUT_S) {
			fprintf(stderr, "bench: an answer took over %.0f s; giving up\n",
				REQUEST_TIMEOUT_S);
			out->failed += busy;
			break;
		}
		struct epoll_event evs[64];
		int n = epoll_wait(ep, evs, 64, 100);
		for (int k = 0; k < n; k++) {
			conn *c = evs[k].data.ptr;
			int closes = 0, r = 0;
			if (evs[k].events & EPOLLOUT)
				r = flush_out(ep, c);
			if (r == 0 && (evs[k].events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
				r = on_readable(c, out, &closes);
			if (r < 0) {
				if (c->busy)
					count(out, c, -1);
				closes = 1;
			}
			if (r == 0)
				continue;
			last_done = now_s();
			if (closes && reopen(ep, c, port) != 0) {
				stop = 1;
				continue;
			}
			if (stop || sent >= max_requests || last_done >= deadline)
				continue;
			stop = start_next(ep, c, port, &sent, next, ctx, out);
		}
	}
	out->seconds = last_done - t0;
	for (int i = 0; i < nconns; i++) {
		if (conns[i].fd >= 0)
			close(conns[i].fd);
		free(conns[i].out);
		free(conns[i].in);
	}
	free(conns);
	close(ep);
	return 0;
}

void load_result_free(load_result *r)
{
	dvec_free(&r->lat_ms);
}
