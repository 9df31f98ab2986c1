/*
 * proxy.c - the cuttable TCP proxy of proxy.h.
 *
 * Design. One thread polls a control pipe, the listening socket (while not cut) and both
 * sockets of every piped connection. Bytes read from one side are written to the other
 * with blocking writes: on loopback, to PostgreSQL or to batond, both of which read what
 * they are sent, a write finishes at once. A request (cut, heal, stop) is a field set
 * under the mutex and a byte on the pipe; the caller waits on the condition variable until
 * the thread has carried it out (done == asked).
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
#include <unistd.h>

#define MAX_PIPES 64

enum { REQ_NONE, REQ_CUT, REQ_HEAL, REQ_STOP, REQ_HOLD, REQ_RELEASE, REQ_COUNT };

struct hs_proxy {
	int target_port, port;
	int lfd;    /* listening socket, -1 while cut */
	int ctl[2]; /* the control pipe */
	int pairs[MAX_PIPES][2];
	int held[MAX_PIPES]; /* what PostgreSQL sends on pairs[i] is not read meanwhile */
	int npairs;
	int holding;	  /* new pairs start held */
	int release_port; /* REQ_RELEASE's port, 0: all */
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int req, asked, done, heal_rc, released;
	long held_bytes; /* REQ_COUNT's answer */
};

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

static void drop_pair(hs_proxy *p, int i)
{
	for (int k = 0; k < 2; k++) {
		shutdown(p->pairs[i][k], SHUT_RDWR);
		close(p->pairs[i][k]);
	}
	p->pairs[i][0] = p->pairs[p->npairs - 1][0];
	p->pairs[i][1] = p->pairs[p->npairs - 1][1];
	p->held[i] = p->held[p->npairs - 1];
	p->npairs--;
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
	p->pairs[p->npairs][0] = c;
	p->pairs[p->npairs][1] = t;
	p->held[p->npairs] = p->holding;
	p->npairs++;
}

/* The local port of socket fd, 0 if unknown. */
static int local_port(int fd)
{
	struct sockaddr_in a;
	socklen_t len = sizeof a;
	return getsockname(fd, (struct sockaddr *)&a, &len) == 0 ? ntohs(a.sin_port) : 0;
}

/* Moves what one side has to the other; 0, or -1 when the pair is over. */
static int pump(int from, int to)
{
	char buf[16384];
	ssize_t n = read(from, buf, sizeof buf);
	if (n <= 0)
		return -1;
	for (ssize_t off = 0; off < n;) {
		ssize_t w = write(to, buf + off, (size_t)(n - off));
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		off += w;
	}
	return 0;
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
			drop_pair(p, 0);
		if (p->lfd >= 0)
			close(p->lfd);
		p->lfd = -1;
	} else if (req == REQ_HEAL && p->lfd < 0) {
		p->lfd = listen_on(p->port);
		p->heal_rc = p->lfd < 0 ? -1 : 0;
	} else if (req == REQ_HOLD) {
		p->holding = 1;
		for (int i = 0; i < p->npairs; i++)
			p->held[i] = 1;
	} else if (req == REQ_RELEASE) {
		p->released = 0;
		if (!p->release_port)
			p->holding = 0;
		for (int i = 0; i < p->npairs; i++)
			if (p->held[i] &&
			    (!p->release_port || local_port(p->pairs[i][1]) == p->release_port)) {
				p->held[i] = 0;
				p->released = 1;
			}
	} else if (req == REQ_COUNT) {
		p->held_bytes = 0;
		for (int i = 0; i < p->npairs; i++) {
			int n = 0;
			if (p->held[i] && ioctl(p->pairs[i][1], FIONREAD, &n) == 0)
				p->held_bytes += n;
		}
	}
	p->done = p->asked;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	return req == REQ_STOP;
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
			fds[n++] = (struct pollfd){.fd = p->pairs[i][0], .events = POLLIN};
			/* a negative fd is not polled: what PostgreSQL sent waits in the socket */
			fds[n++] = (struct pollfd){.fd = p->held[i] ? -1 : p->pairs[i][1],
						   .events = POLLIN};
		}
		if (poll(fds, (nfds_t)n, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (fds[0].revents && serve_request(p))
			break;
		if (fds[0].revents)
			continue; /* the sockets polled may have been closed */
		for (int i = p->npairs - 1; i >= 0; i--) {
			short a = fds[2 + 2 * i].revents, b = fds[3 + 2 * i].revents;
			if ((a && pump(p->pairs[i][0], p->pairs[i][1]) != 0) ||
			    (b && pump(p->pairs[i][1], p->pairs[i][0]) != 0))
				drop_pair(p, i);
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
	p->lfd = listen_on(0);
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
