/*
 * proxy.c - the cuttable TCP proxy of proxy.h.
 *
 * Design. One thread polls a control pipe, the listening socket (while not cut) and both
 * sockets of every piped connection. Bytes read from one side are written to the other
 * with blocking writes: on loopback, to PostgreSQL, to batond or to an HTTP client, each of
 * which reads what it is sent, a write finishes at once. A request (cut, heal, stop ...) is
 * a field set under the mutex and a byte on the pipe; the caller waits on the condition
 * variable until the thread has carried it out (done == asked).
 *
 * Client faults. Each connection is IDLE, in a REQUEST (the client's bytes since the last
 * answer began) or in an ANSWER (the node's bytes since). The first bytes of a request
 * draw its fault; a fault that acts later (a held request's delivery, a reset before the
 * answer) sets the connection's timer, which bounds the poll.
 */
#include "proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_PIPES 64

enum {
	REQ_NONE,
	REQ_CUT,
	REQ_HEAL,
	REQ_STOP,
	REQ_HOLD,
	REQ_RELEASE,
	REQ_RETARGET,
	REQ_STRIKE,
	REQ_COUNT
};
enum phase { IDLE, REQUEST, ANSWER };
enum outcome { GO_ON, CLOSE, RESET }; /* what becomes of a connection after an event */

typedef struct pair {
	int fd[2]; /* [0] the client's side (the node, or an HTTP client), [1] the target's */
	int held;  /* what the target sends is not read meanwhile (hs_proxy_hold) */
	enum phase phase;
	int fault;    /* the current request's enum hs_fault, -1 for none */
	int half;     /* HS_RESET_REQUEST: half the request, then the reset */
	long long at; /* the fault's timer (monotonic ms), 0 for none */
	char *buf;    /* HS_HOLD_REQUEST: the bytes held back */
	size_t len, cap;
} pair;

struct hs_proxy {
	int target_port, port;
	int lfd;    /* listening socket, -1 while cut */
	int ctl[2]; /* the control pipe */
	pair pairs[MAX_PIPES];
	int npairs;
	int holding;		   /* new pairs start held */
	int release_port;	   /* REQ_RELEASE's port, 0: all */
	int new_target;		   /* REQ_RETARGET's port */
	unsigned kinds, new_kinds; /* the faults that strike (REQ_STRIKE sets them) */
	int percent, new_percent;
	unsigned rnd, new_seed;
	int struck[HS_FAULTS]; /* under mu */
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int req, asked, done, heal_rc, released;
	long held_bytes; /* REQ_COUNT's answer */
};

static long long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int listen_on(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 64) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Listens on a port that nobody else takes while the proxy is cut: one of 10000-19999,
 * below the kernel's ephemeral range (ip_local_port_range, 32768 and up by default), from
 * which every outgoing connection takes its own port, and below the ports scripts/pg.sh
 * picks (20000 and up). With port 0 the kernel picked one in the ephemeral range, and
 * while a cut had closed it, a client's connection could take it, so that heal could not
 * listen again (seen in a 20-minute run of the lock's fault suite). */
static int listen_on_own_port(void)
{
	unsigned seed = (unsigned)now_ms() ^ (unsigned)getpid();
	for (int tries = 0; tries < 1000; tries++) {
		int fd = listen_on(10000 + (int)(rand_r(&seed) % 10000));
		if (fd >= 0)
			return fd;
	}
	return listen_on(0);
}

static int connect_to(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
		close(fd);
		return -1;
	}
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	return fd;
}

/* Closes both sides of pair i; with `reset`, as a reset (SO_LINGER 0: each side sees
 * ECONNRESET, not an orderly end). */
static void drop_pair(hs_proxy *p, int i, int reset)
{
	pair *c = &p->pairs[i];
	for (int k = 0; k < 2; k++) {
		if (reset) {
			struct linger l = {.l_onoff = 1, .l_linger = 0};
			setsockopt(c->fd[k], SOL_SOCKET, SO_LINGER, &l, sizeof l);
		} else {
			shutdown(c->fd[k], SHUT_RDWR);
		}
		close(c->fd[k]);
	}
	free(c->buf);
	*c = p->pairs[--p->npairs];
}

static void accept_one(hs_proxy *p)
{
	int c = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC);
	if (c < 0)
		return;
	int t = p->npairs < MAX_PIPES ? connect_to(p->target_port) : -1;
	if (t < 0) {
		close(c);
		return;
	}
	int one = 1;
	setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	p->pairs[p->npairs++] = (pair){.fd = {c, t}, .held = p->holding, .fault = -1};
}

/* The local port of socket fd, 0 if unknown. */
static int local_port(int fd)
{
	struct sockaddr_in a;
	socklen_t len = sizeof a;
	return getsockname(fd, (struct sockaddr *)&a, &len) == 0 ? ntohs(a.sin_port) : 0;
}

/* Writes n bytes to fd; 0, or -1 when the other side is gone. */
static int send_all(int fd, const char *buf, size_t n)
{
	for (size_t off = 0; off < n;) {
		ssize_t w = send(fd, buf + off, n - off, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		off += (size_t)w;
	}
	return 0;
}

/* A request starts on c: draws whether a fault strikes it, and which. */
static void begin_request(hs_proxy *p, pair *c)
{
	c->phase = REQUEST;
	c->fault = -1;
	c->at = 0;
	if (!p->kinds || p->percent <= 0 || (int)(rand_r(&p->rnd) % 100) >= p->percent)
		return;
	int kinds[HS_FAULTS], n = 0;
	for (int f = 0; f < HS_FAULTS; f++)
		if (p->kinds >> f & 1)
			kinds[n++] = f;
	c->fault = kinds[rand_r(&p->rnd) % (unsigned)n];
	if (c->fault == HS_RESET_REQUEST) {
		c->half = rand_r(&p->rnd) % 2;
		if (!c->half)
			c->at = now_ms() + rand_r(&p->rnd) % 1500;
	} else if (c->fault == HS_HOLD_REQUEST) {
		c->at = now_ms() + 200 + rand_r(&p->rnd) % 2800;
	}
	pthread_mutex_lock(&p->mu);
	p->struck[c->fault]++;
	pthread_mutex_unlock(&p->mu);
}

/* Keeps n more bytes of a held request; CLOSE when out of memory. */
static enum outcome hold_back(pair *c, const char *buf, size_t n)
{
	if (c->len + n > c->cap) {
		size_t cap = (c->len + n) * 2;
		char *b = realloc(c->buf, cap);
		if (!b)
			return CLOSE;
		c->buf = b;
		c->cap = cap;
	}
	memcpy(c->buf + c->len, buf, n);
	c->len += n;
	return GO_ON;
}

/* The client sent something: the start of a request, or more of one. */
static enum outcome from_client(hs_proxy *p, pair *c)
{
	char buf[16384];
	ssize_t n = read(c->fd[0], buf, sizeof buf);
	if (n <= 0)
		return CLOSE; /* the client is gone: so is its connection to the target */
	if (c->phase != REQUEST)
		begin_request(p, c);
	if (c->fault == HS_HOLD_REQUEST && c->at)
		return hold_back(c, buf, (size_t)n);
	if (c->fault == HS_RESET_REQUEST && c->half) {
		send_all(c->fd[1], buf, (size_t)n / 2);
		return RESET;
	}
	return send_all(c->fd[1], buf, (size_t)n) ? CLOSE : GO_ON;
}

/* The target sent something: the start of an answer, or more of one. */
static enum outcome from_target(pair *c)
{
	char buf[16384];
	ssize_t n = read(c->fd[1], buf, sizeof buf);
	if (n <= 0)
		return CLOSE;
	if (c->phase == REQUEST) {
		c->phase = ANSWER;
		c->at = 0;
		if (c->fault == HS_DROP_ANSWER || c->fault == HS_RESET_REQUEST)
			return RESET; /* the answer goes down with the connection */
		if (c->fault == HS_RESET_ANSWER) {
			send_all(c->fd[0], buf, (size_t)n / 2);
			return RESET;
		}
	}
	return send_all(c->fd[0], buf, (size_t)n) ? CLOSE : GO_ON;
}

/* c's timer ran out: a held request goes on its way, a reset before the answer comes. */
static enum outcome on_timer(pair *c)
{
	c->at = 0;
	if (c->fault == HS_RESET_REQUEST)
		return RESET;
	int rc = send_all(c->fd[1], c->buf, c->len);
	free(c->buf);
	c->buf = NULL;
	c->len = c->cap = 0;
	return rc ? CLOSE : GO_ON;
}

/* Carries out a request from the pipe; returns 1 to stop. */
static int serve_request(hs_proxy *p)
{
	char b;
	if (read(p->ctl[0], &b, 1) != 1)
		return 0;
	pthread_mutex_lock(&p->mu);
	int req = p->req;
	if (req == REQ_CUT || req == REQ_STOP) {
		while (p->npairs)
			drop_pair(p, 0, 0);
		if (p->lfd >= 0)
			close(p->lfd);
		p->lfd = -1;
	} else if (req == REQ_HEAL && p->lfd < 0) {
		p->lfd = listen_on(p->port);
		p->heal_rc = p->lfd < 0 ? -1 : 0;
	} else if (req == REQ_HOLD) {
		p->holding = 1;
		for (int i = 0; i < p->npairs; i++)
			p->pairs[i].held = 1;
	} else if (req == REQ_RELEASE) {
		p->released = 0;
		if (!p->release_port)
			p->holding = 0;
		for (int i = 0; i < p->npairs; i++)
			if (p->pairs[i].held &&
			    (!p->release_port ||
			     local_port(p->pairs[i].fd[1]) == p->release_port)) {
				p->pairs[i].held = 0;
				p->released = 1;
			}
	} else if (req == REQ_RETARGET) {
		p->target_port = p->new_target;
	} else if (req == REQ_STRIKE) {
		p->kinds = p->new_kinds;
		p->percent = p->new_percent;
		p->rnd = p->new_seed;
	} else if (req == REQ_COUNT) {
		p->held_bytes = 0;
		for (int i = 0; i < p->npairs; i++) {
			int n = 0;
			if (p->pairs[i].held && ioctl(p->pairs[i].fd[1], FIONREAD, &n) == 0)
				p->held_bytes += n;
		}
	}
	p->done = p->asked;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	return req == REQ_STOP;
}

/* The poll's timeout: until the nearest timer of a connection, -1 for none. */
static int next_timeout(const hs_proxy *p)
{
	long long now = now_ms(), first = -1;
	for (int i = 0; i < p->npairs; i++)
		if (p->pairs[i].at && (first < 0 || p->pairs[i].at < first))
			first = p->pairs[i].at;
	return first < 0 ? -1 : first <= now ? 0 : (int)(first - now);
}

static void *proxy_main(void *arg)
{
	hs_proxy *p = arg;
	for (;;) {
		struct pollfd fds[2 + 2 * MAX_PIPES];
		int n = 0;
		fds[n++] = (struct pollfd){.fd = p->ctl[0], .events = POLLIN};
		fds[n++] = (struct pollfd){.fd = p->lfd, .events = POLLIN};
		for (int i = 0; i < p->npairs; i++) {
			fds[n++] = (struct pollfd){.fd = p->pairs[i].fd[0], .events = POLLIN};
			/* a negative fd is not polled: what PostgreSQL sent waits in the socket */
			fds[n++] = (struct pollfd){.fd = p->pairs[i].held ? -1 : p->pairs[i].fd[1],
						   .events = POLLIN};
		}
		if (poll(fds, (nfds_t)n, next_timeout(p)) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (fds[0].revents && serve_request(p))
			break;
		if (fds[0].revents)
			continue; /* the sockets polled may have been closed */
		long long now = now_ms();
		/* from the last: dropping pair i moves the last one, already seen, into i */
		for (int i = p->npairs - 1; i >= 0; i--) {
			pair *c = &p->pairs[i];
			enum outcome o = GO_ON;
			if (fds[2 + 2 * i].revents)
				o = from_client(p, c);
			if (o == GO_ON && fds[3 + 2 * i].revents)
				o = from_target(c);
			if (o == GO_ON && c->at && now >= c->at)
				o = on_timer(c);
			if (o != GO_ON)
				drop_pair(p, i, o == RESET);
		}
		if (p->lfd >= 0 && fds[1].revents)
			accept_one(p);
	}
	return NULL;
}

hs_proxy *hs_proxy_open(int target_port)
{
	hs_proxy *p = calloc(1, sizeof *p);
	if (!p)
		return NULL;
	p->target_port = target_port;
	p->lfd = listen_on_own_port();
	struct sockaddr_in a;
	socklen_t len = sizeof a;
	if (p->lfd < 0 || getsockname(p->lfd, (struct sockaddr *)&a, &len) != 0 ||
	    pipe2(p->ctl, O_CLOEXEC) != 0) {
		fprintf(stderr, "proxy: cannot listen on 127.0.0.1: %s\n", strerror(errno));
		if (p->lfd >= 0)
			close(p->lfd);
		free(p);
		return NULL;
	}
	p->port = ntohs(a.sin_port);
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	if (pthread_create(&p->thread, NULL, proxy_main, p) != 0) {
		fprintf(stderr, "proxy: cannot start its thread\n");
		close(p->lfd);
		close(p->ctl[0]);
		close(p->ctl[1]);
		free(p);
		return NULL;
	}
	return p;
}

int hs_proxy_port(const hs_proxy *p)
{
	return p->port;
}

/* Asks the thread to carry out req and waits until it has. */
static void ask(hs_proxy *p, int req)
{
	pthread_mutex_lock(&p->mu);
	p->req = req;
	int mine = ++p->asked;
	pthread_mutex_unlock(&p->mu);
	char b = 1;
	while (write(p->ctl[1], &b, 1) < 0 && errno == EINTR)
		;
	pthread_mutex_lock(&p->mu);
	while (p->done < mine)
		pthread_cond_wait(&p->cv, &p->mu);
	pthread_mutex_unlock(&p->mu);
}

void hs_proxy_cut(hs_proxy *p)
{
	ask(p, REQ_CUT);
}

int hs_proxy_heal(hs_proxy *p)
{
	ask(p, REQ_HEAL);
	return p->heal_rc;
}

void hs_proxy_retarget(hs_proxy *p, int target_port)
{
	pthread_mutex_lock(&p->mu);
	p->new_target = target_port;
	pthread_mutex_unlock(&p->mu);
	ask(p, REQ_RETARGET);
}

void hs_proxy_strike(hs_proxy *p, unsigned kinds, int percent, unsigned seed)
{
	pthread_mutex_lock(&p->mu);
	p->new_kinds = kinds & ((1u << HS_FAULTS) - 1);
	p->new_percent = percent;
	p->new_seed = seed;
	pthread_mutex_unlock(&p->mu);
	ask(p, REQ_STRIKE);
}

int hs_proxy_struck(hs_proxy *p, enum hs_fault f)
{
	pthread_mutex_lock(&p->mu);
	int n = f >= 0 && f < HS_FAULTS ? p->struck[f] : 0;
	pthread_mutex_unlock(&p->mu);
	return n;
}

void hs_proxy_hold(hs_proxy *p)
{
	ask(p, REQ_HOLD);
}

int hs_proxy_release(hs_proxy *p, int port)
{
	pthread_mutex_lock(&p->mu);
	p->release_port = port;
	pthread_mutex_unlock(&p->mu);
	ask(p, REQ_RELEASE);
	pthread_mutex_lock(&p->mu);
	int released = p->released;
	pthread_mutex_unlock(&p->mu);
	return released;
}

long hs_proxy_held_bytes(hs_proxy *p)
{
	ask(p, REQ_COUNT);
	pthread_mutex_lock(&p->mu);
	long n = p->held_bytes;
	pthread_mutex_unlock(&p->mu);
	return n;
}

void hs_proxy_close(hs_proxy *p)
{
	if (!p)
		return;
	ask(p, REQ_STOP);
	pthread_join(p->thread, NULL);
	close(p->ctl[0]);
	close(p->ctl[1]);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv);
	free(p);
}
