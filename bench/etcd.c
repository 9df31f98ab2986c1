/*
 * etcd.c - the etcd member that the lock path benchmark (lockpath.c) sets beside batond:
 * Debian's etcd-server (3.4), one member with its data in a temporary directory, its
 * client and peer URLs on 127.0.0.1 at ports chosen free by binding port 0 first, started
 * with PR_SET_PDEATHSIG (it dies with batonbench) and stopped by its pid.
 *
 * It is spoken to as any client without a gRPC library would: JSON over HTTP to etcd's
 * gateway (/v3/lease/grant, /v3/lock/lock, /v3/lock/unlock, /v3/lease/revoke), with
 * byte fields (lock names and keys) in base64, on this thread's keep-alive connection.
 */
#include "bench.h"

#include "../common/batond.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* The etcd binary: $ETCD, or Debian's. */
const char *etcd_path(void)
{
	const char *p = getenv("ETCD");
	return p && *p ? p : "/usr/bin/etcd";
}

/* Binds two sockets to 127.0.0.1:0 at once (so the ports differ) and closes them. */
static int free_ports(int *a, int *b)
{
	int fd[2] = {-1, -1}, port[2] = {0, 0}, rc = -1;
	for (int i = 0; i < 2; i++) {
		struct sockaddr_in sa = {.sin_family = AF_INET,
					 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
		socklen_t len = sizeof sa;
		fd[i] = socket(AF_INET, SOCK_STREAM, 0);
		if (fd[i] < 0 || bind(fd[i], (struct sockaddr *)&sa, sizeof sa) != 0 ||
		    getsockname(fd[i], (struct sockaddr *)&sa, &len) != 0)
			goto out;
		port[i] = ntohs(sa.sin_port);
	}
	*a = port[0];
	*b = port[1];
	rc = 0;
out:
	for (int i = 0; i < 2; i++)
		if (fd[i] >= 0)
			close(fd[i]);
	return rc;
}

static int healthy(int port)
{
	char *text = NULL;
	int ok =
	    http_do(port, "GET", "/health", NULL, &text) == 200 && text && strstr(text, "\"true\"");
	free(text);
	return ok;
}

/* One try on fresh ports: 0 once /health says true, -1 when etcd exited or timed out. */
static int etcd_try(etcd *e, double timeout_s)
{
	char client[64], peer[64], members[80], data[BENCH_PATH_MAX + 8];
	if (free_ports(&e->port, &e->peer_port) != 0)
		return -1;
	snprintf(client, sizeof client, "http://127.0.0.1:%d", e->port);
	snprintf(peer, sizeof peer, "http://127.0.0.1:%d", e->peer_port);
	snprintf(members, sizeof members, "bench=%s", peer);
	snprintf(data, sizeof data, "%s/data", e->dir);
	char *argv[] = {(char *)etcd_path(),
			"--name",
			"bench",
			"--data-dir",
			data,
			"--listen-client-urls",
			client,
			"--advertise-client-urls",
			client,
			"--listen-peer-urls",
			peer,
			"--initial-advertise-peer-urls",
			peer,
			"--initial-cluster",
			members,
			NULL};
	e->pid = batond_spawn(argv, e->log, NULL, NULL);
	if (e->pid <= 0)
		return -1;
	double until = now_s() + timeout_s;
	while (now_s() < until) {
		if (healthy(e->port))
			return 0;
		int status;
		if (waitpid(e->pid, &status, WNOHANG) == e->pid) {
			e->pid = 0;
			return -1;
		}
		sleep_ms(20);
	}
	etcd_stop(e);
	return -1;
}

int etcd_start(etcd *e, const char *dir)
{
	memset(e, 0, sizeof *e);
	snprintf(e->dir, sizeof e->dir, "%s", dir);
	snprintf(e->log, sizeof e->log, "%s/etcd.log", dir);
	if (access(etcd_path(), X_OK) != 0) {
		snprintf(e->why, sizeof e->why, "%s is not installed", etcd_path());
		return -1;
	}
	/* A port taken between our bind and etcd's is possible: try again on others. */
	for (int i = 0; i < 3; i++) {
		char data[BENCH_PATH_MAX + 8];
		snprintf(data, sizeof data, "%s/data", dir);
		tmpdir_remove(data);
		if (etcd_try(e, 20) == 0) {
			char *v = NULL;
			if (http_do(e->port, "GET", "/version", NULL, &v) == 200 && v)
				snprintf(e->version, sizeof e->version, "%.60s", v);
			free(v);
			return 0;
		}
	}
	snprintf(e->why, sizeof e->why, "etcd did not start (see %.200s)", e->log);
	return -1;
}

void etcd_stop(etcd *e)
{
	if (e->pid > 0)
		child_stop(e->pid);
	e->pid = 0;
}

/* ---- the lock API over the gateway ---- */

static void base64(const char *in, char *out, size_t outlen)
{
	static const char tab[] =
	    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t n = strlen(in), o = 0;
	for (size_t i = 0; i < n && o + 5 < outlen; i += 3) {
		unsigned v = (unsigned char)in[i] << 16;
		if (i + 1 < n)
			v |= (unsigned char)in[i + 1] << 8;
		if (i + 2 < n)
			v |= (unsigned char)in[i + 2];
		out[o++] = tab[(v >> 18) & 63];
		out[o++] = tab[(v >> 12) & 63];
		out[o++] = i + 1 < n ? tab[(v >> 6) & 63] : '=';
		out[o++] = i + 2 < n ? tab[v & 63] : '=';
	}
	out[o] = 0;
}

/* POST path with body; the answer's string field `field` copied to out. Returns the
 * HTTP status (200 with the field present), or -1. */
static int post_field(int port, const char *path, const char *body, const char *field, char *out,
		      size_t outlen)
{
	char *text = NULL;
	int st = http_do(port, "POST", path, body, &text);
	if (st == 200 && out) {
		json_t *j = text ? json_loads(text, 0, NULL) : NULL;
		const char *v = json_string_value(json_object_get(j, field));
		if (v)
			snprintf(out, outlen, "%s", v);
		else
			st = -1;
		json_decref(j);
	}
	free(text);
	return st;
}

int etcd_lease_grant(int port, int ttl_s, char *id, size_t idlen)
{
	char body[64];
	snprintf(body, sizeof body, "{\"TTL\":%d}", ttl_s);
	return post_field(port, "/v3/lease/grant", body, "ID", id, idlen);
}

int etcd_lease_revoke(int port, const char *id)
{
	char body[96];
	snprintf(body, sizeof body, "{\"ID\":\"%s\"}", id);
	return post_field(port, "/v3/lease/revoke", body, NULL, NULL, 0);
}

int etcd_lock(int port, const char *name, const char *lease, char *key, size_t keylen)
{
	char b64[256], body[512];
	base64(name, b64, sizeof b64);
	snprintf(body, sizeof body, "{\"name\":\"%s\",\"lease\":\"%s\"}", b64, lease);
	return post_field(port, "/v3/lock/lock", body, "key", key, keylen);
}

int etcd_unlock(int port, const char *key)
{
	char body[512];
	snprintf(body, sizeof body, "{\"key\":\"%s\"}", key);
	return post_field(port, "/v3/lock/unlock", body, NULL, NULL, 0);
}
