/*
 * config.c - batond's configuration: one struct, defaults in one place, environment
 * variables (BATON_*, for containers; one set to the empty string counts as unset, as
 * for most daemons) overridden by flags, everything validated at start-up with a message
 * that says what to change.
 */
#include "server.h"

#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <ctype.h>
#include <string.h>
#include <stdint.h>
#include <unistd.h>

static const config defaults = {
    .listen = "127.0.0.1:8080",
    .db = "./data/baton.db",
    .threads = 4,
    .http_threads = 8,
    .log_level = BATON_LOG_INFO,
    .shutdown_timeout_ms = 30000,
    .max_body = 1024 * 1024,
    .max_connections = 1000,
    .conn_timeout_s = 30,
    .max_per_ip = 0,
    .conn_memory = 64 * 1024,
    .idle_resources = 1024,
    .lease_ms = 3000,
    .commit_timeout_ms = 5000,
    .cache_bytes = 64 * 1024 * 1024,
    .stream_buffer = 16 * 1024 * 1024,
};

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: batond [options]\n"
	    "\n"
	    "baton serializes access to a shared resource: workflows of workers, one step\n"
	    "at a time, each step checkpointed in its store (SQLite or PostgreSQL) before the\n"
	    "next begins.\n"
	    "\n"
	    "options (each but --pid-file also an environment variable, which counts as\n"
	    "unset when it is empty; flags win):\n"
	    "  --listen HOST:PORT       address to serve HTTP on; :PORT for every interface,\n"
	    "                           port 0 picks a free port (BATON_LISTEN, default %s)\n"
	    "  --db PATH|URL            the store: a SQLite file (PATH or sqlite:PATH; made\n"
	    "                           0600, its directory 0700 when created) or a\n"
	    "                           PostgreSQL URL (postgresql://USER@HOST:PORT/DBNAME,\n"
	    "                           any libpq URL) (BATON_DB, default %s)\n"
	    "  --threads N              steps running at once (BATON_THREADS, default %d)\n"
	    "  --http-threads N         HTTP threads (BATON_HTTP_THREADS, default %d)\n"
	    "  --log-level LEVEL        debug, info, warn or error (BATON_LOG_LEVEL, default "
	    "info)\n"
	    "  --shutdown-timeout SECS  how long SIGTERM waits for running steps\n"
	    "                           (BATON_SHUTDOWN_TIMEOUT, default %lld)\n"
	    "  --retention DURATION     delete finished workflows (with their events) this\n"
	    "                           long after they finished: N with s, m, h or d\n"
	    "                           (30d, 12h); 0 or forever keeps them\n"
	    "                           (BATON_RETENTION, default forever)\n"
	    "  --allow-call PREFIX      let HTTP steps call URLs under PREFIX, which names at\n"
	    "                           least a host (http[s]://HOST[:PORT][/PATH]);\n"
	    "                           repeatable (BATON_ALLOW_CALL, comma-separated;\n"
	    "                           default: none)\n"
	    "  --token TOKEN            require Authorization: Bearer TOKEN on every path but\n"
	    "                           /healthz, /readyz and the console's files (/ui/,\n"
	    "                           which hold no data) (BATON_TOKEN; default: none)\n"
	    "  --token-file PATH        read the token from a file (BATON_TOKEN_FILE)\n"
	    "  --log-format FORMAT      text or json (BATON_LOG_FORMAT, default text)\n"
	    "  --max-connections N      open connections at most; past 90%% new requests get\n"
	    "                           503 (BATON_MAX_CONNECTIONS, default %d)\n"
	    "  --conn-timeout SECS      idle connections are closed (BATON_CONN_TIMEOUT,\n"
	    "                           default %d)\n"
	    "  --max-per-ip N           connections per client address, 0 = no limit\n"
	    "                           (BATON_MAX_PER_IP, default 0)\n"
	    "  --idle-resources N       free resources kept in memory, the most recently\n"
	    "                           used; others are read back from the store when\n"
	    "                           needed (BATON_IDLE_RESOURCES, default %d)\n"
	    "  --cache-bytes N          memory for finished workflows' answers, 0 = none\n"
	    "                           (BATON_CACHE_BYTES, default %lld)\n"
	    "  --stream-buffer N        bytes an event stream buffers at most; past it the\n"
	    "                           stream ends with an error event and the client\n"
	    "                           resumes (BATON_STREAM_BUFFER, default %lld)\n"
	    "  --node-id ID             this node's name in a cluster on PostgreSQL, unique\n"
	    "                           among its nodes (BATON_NODE_ID, default: the host\n"
	    "                           name and a suffix made from --listen)\n"
	    "  --lease-ms MS            how long a node's ownership lasts without renewal;\n"
	    "                           its work moves to the others that long after it\n"
	    "                           dies (BATON_LEASE_MS, default %lld)\n"
	    "  --commit-timeout-ms MS   how long a request waits for its commit (PostgreSQL:\n"
	    "                           a synchronous standby that does not confirm it);\n"
	    "                           then it is answered 503, never success, and the same\n"
	    "                           id or request_id, asked again, gets the outcome;\n"
	    "                           every other commit (ids, node leases, start-up) is\n"
	    "                           given up after it too\n"
	    "                           (BATON_COMMIT_TIMEOUT_MS, default %lld)\n"
	    "  --require-sync-replication\n"
	    "                           PostgreSQL: commit nothing (answer 503) while the\n"
	    "                           server's synchronous_standby_names is empty, checked\n"
	    "                           in every transaction (BATON_REQUIRE_SYNC_REPLICATION=1;\n"
	    "                           default: commit either way)\n"
	    "  --advertise-url URL      http://HOST:PORT at which the other nodes of a cluster\n"
	    "                           reach this one: they pass it the lease and task\n"
	    "                           requests of the resources it drives\n"
	    "                           (BATON_ADVERTISE_URL, default: http:// and --listen,\n"
	    "                           with the host name for an address of every interface)\n"
	    "  --console-actions        the console at /ui/ offers to cancel workflows,\n"
	    "                           release leases and change limits (through the API,\n"
	    "                           with the token) (BATON_CONSOLE_ACTIONS=1; default:\n"
	    "                           it only shows)\n"
	    "  --console-dir DIR        serve the console's files from DIR instead of those\n"
	    "                           built in, for working on them (BATON_CONSOLE_DIR)\n"
	    "  --accept-system-identifier ID\n"
	    "                           run on a PostgreSQL database whose system_identifier\n"
	    "                           is ID although baton recorded another one there (a\n"
	    "                           restore from a dump, pg_upgrade): tokens continue\n"
	    "                           above every stored one (BATON_ACCEPT_SYSTEM_IDENTIFIER,\n"
	    "                           default: none, such a database is refused)\n"
	    "  --pid-file PATH          write batond's process id to PATH once it listens\n"
	    "                           (0600; its directory created 0700) and remove it\n"
	    "                           when batond stops (a flag only; default: none)\n"
	    "  --help                   print this help\n"
	    "  --version                print the version\n",
	    defaults.listen, defaults.db, defaults.threads, defaults.http_threads,
	    (long long)defaults.shutdown_timeout_ms / 1000, defaults.max_connections,
	    defaults.conn_timeout_s, defaults.idle_resources, defaults.cache_bytes,
	    defaults.stream_buffer, (long long)defaults.lease_ms,
	    (long long)defaults.commit_timeout_ms);
}

static int valid_node_id(const char *v)
{
	size_t n = strlen(v);
	if (n < 1 || n > 64)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)v[i]) && !strchr("._-", v[i]))
			return 0;
	return 1;
}

/*
 * The default --node-id: the host name and four hex digits of a hash of the host name and
 * --listen. It is the same each time this batond starts, so that a node restarted after a
 * crash takes back its own partitions at once (a new name would wait for the old one's
 * lease to run out), and differs between nodes that share a host on different addresses.
 */
static void default_node_id(config *c)
{
	char host[48] = "";
	if (gethostname(host, sizeof host) != 0)
		host[0] = 0;
	host[sizeof host - 1] = 0;
	size_t k = 0;
	for (size_t i = 0; host[i]; i++)
		if (isalnum((unsigned char)host[i]) || strchr("._-", host[i]))
			host[k++] = host[i];
	host[k] = 0;
	uint32_t h = 2166136261u; /* FNV-1a */
	for (const char *p = host; *p; p++)
		h = (h ^ (unsigned char)*p) * 16777619u;
	for (const char *p = c->listen; *p; p++)
		h = (h ^ (unsigned char)*p) * 16777619u;
	snprintf(c->node_id, sizeof c->node_id, "%s-%04x", host[0] ? host : "node",
		 (unsigned)(h & 0xffff));
}

void config_default_advertise_url(config *c, int port)
{
	char host[256] = "";
	int any = !c->host[0] || strcmp(c->host, "0.0.0.0") == 0 || strcmp(c->host, "::") == 0;
	if (c->advertise_url[0] || port <= 0 || (any && gethostname(host, sizeof host) != 0))
		return;
	host[sizeof host - 1] = 0;
	const char *h = any ? host : c->host;
	int v6 = strchr(h, ':') != NULL;
	snprintf(c->advertise_url, sizeof c->advertise_url, "http://%s%.200s%s:%d", v6 ? "[" : "",
		 h, v6 ? "]" : "", port);
}

static int parse_int(const char *what, const char *s, long lo, long hi, long *out)
{
	char *end;
	long v = strtol(s, &end, 10);
	if (!*s || *end || v < lo || v > hi) {
		fprintf(stderr, "batond: %s must be a whole number from %ld to %ld, not \"%s\"\n",
			what, lo, hi, s);
		return -1;
	}
	*out = v;
	return 0;
}

/* N followed by s, m, h or d (a bare N is seconds), or "forever" (0). */
static int parse_duration(config *c, const char *s)
{
	static const struct {
		char unit;
		int64_t ms;
	} units[] = {{'s', 1000}, {'m', 60000}, {'h', 3600000}, {'d', 86400000}};
	if (strcmp(s, "forever") == 0) {
		c->retention_ms = 0;
		return 0;
	}
	char *end;
	long long n = strtoll(s, &end, 10);
	int64_t unit = *end ? 0 : 1000;
	for (size_t i = 0; *end && i < sizeof units / sizeof units[0]; i++)
		if (end[0] == units[i].unit && end[1] == 0)
			unit = units[i].ms;
	if (end == s || *s == '-' || !unit || n > 36500LL * 86400000 / unit) {
		fprintf(stderr,
			"batond: --retention wants a duration such as 45s, 90m, 12h or 30d (at most"
			" 100 years), or forever, not \"%s\"\n",
			s);
		return -1;
	}
	c->retention_ms = (int64_t)n * unit;
	return 0;
}

/* HOST:PORT, [V6HOST]:PORT, or :PORT for every interface (host left empty). */
static int parse_listen(config *c, const char *s)
{
	const char *colon = strrchr(s, ':');
	long port;
	if (!colon) {
		fprintf(stderr, "batond: --listen wants HOST:PORT or :PORT, not \"%s\"\n", s);
		return -1;
	}
	if (parse_int("the port of --listen", colon + 1, 0, 65535, &port))
		return -1;
	if (colon == s) {
		c->host[0] = 0;
		c->port = (int)port;
		snprintf(c->listen, sizeof c->listen, "%s", s);
		return 0;
	}
	const char *h = s;
	size_t n = (size_t)(colon - s);
	if (h[0] == '[' && n >= 2 && h[n - 1] == ']') {
		h++;
		n -= 2;
	}
	if (n == 0 || n >= sizeof c->host) {
		fprintf(stderr, "batond: --listen has no usable host in \"%s\"\n", s);
		return -1;
	}
	memcpy(c->host, h, n);
	c->host[n] = 0;
	c->port = (int)port;
	snprintf(c->listen, sizeof c->listen, "%s", s);
	return 0;
}

/* The port of a prefix: 1-65535, digits only (s..end). */
static int valid_port(const char *s, const char *end)
{
	long v = 0;
	if (s == end || end - s > 5)
		return 0;
	for (; s < end; s++) {
		if (*s < '0' || *s > '9')
			return 0;
		v = v * 10 + (*s - '0');
	}
	return v >= 1 && v <= 65535;
}

/*
 * A prefix names at least a host: http[s]://HOST[:PORT], then "/..." or nothing. HOST is
 * a name, an IPv4 address or a bracketed IPv6 address; no user info, no query or
 * fragment in it, no spaces, controls or backslashes anywhere. "http://" alone would let
 * steps call every URL: baton has no flag for that on purpose (list the hosts instead).
 */
static int valid_prefix(const char *p)
{
	const char *auth = strncmp(p, "https://", 8) == 0 ? p + 8 : p + 7;
	const char *end = auth + strcspn(auth, "/");
	for (const char *q = p; *q; q++)
		if ((unsigned char)*q <= 0x20 || *q == 0x7f || *q == '\\')
			return 0;
	if (memchr(auth, '@', (size_t)(end - auth)) || memchr(auth, '?', (size_t)(end - auth)) ||
	    memchr(auth, '#', (size_t)(end - auth)))
		return 0;
	const char *host_end;
	if (*auth == '[') {
		host_end = memchr(auth, ']', (size_t)(end - auth));
		if (!host_end || host_end == auth + 1)
			return 0;
		host_end++;
	} else {
		host_end = memchr(auth, ':', (size_t)(end - auth));
		host_end = host_end ? host_end : end;
		if (host_end == auth)
			return 0;
	}
	if (host_end == end)
		return 1;
	return *host_end == ':' && valid_port(host_end + 1, end);
}

static int add_allow_call(config *c, const char *prefix)
{
	if (strncmp(prefix, "http://", 7) != 0 && strncmp(prefix, "https://", 8) != 0) {
		fprintf(stderr,
			"batond: --allow-call wants an http:// or https:// prefix, not \"%s\"\n",
			prefix);
		return -1;
	}
	if (!valid_prefix(prefix)) {
		fprintf(stderr,
			"batond: --allow-call wants a prefix that names a host,"
			" http[s]://HOST[:PORT][/PATH], not \"%s\"\n",
			prefix);
		return -1;
	}
	if (c->n_allow_call == MAX_ALLOW_CALL) {
		fprintf(stderr, "batond: at most %d --allow-call prefixes\n", MAX_ALLOW_CALL);
		return -1;
	}
	c->allow_call[c->n_allow_call++] = prefix;
	c->allow_call[c->n_allow_call] = NULL;
	return 0;
}

/* BATON_ALLOW_CALL: prefixes separated by commas or spaces. */
static int allow_call_list(config *c, const char *list)
{
	if (strlen(list) >= sizeof c->allow_buf) {
		fprintf(stderr, "batond: BATON_ALLOW_CALL is too long\n");
		return -1;
	}
	snprintf(c->allow_buf, sizeof c->allow_buf, "%s", list);
	char *save = NULL;
	for (char *p = strtok_r(c->allow_buf, ", \t", &save); p; p = strtok_r(NULL, ", \t", &save))
		if (add_allow_call(c, p))
			return -1;
	return 0;
}

static int read_token_file(config *c, const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "batond: cannot read the token file %s\n", path);
		return -1;
	}
	size_t n = fread(c->token, 1, sizeof c->token - 1, f);
	fclose(f);
	c->token[n] = 0;
	while (n && (c->token[n - 1] == '\n' || c->token[n - 1] == '\r' || c->token[n - 1] == ' '))
		c->token[--n] = 0;
	if (!n) {
		fprintf(stderr, "batond: the token file %s is empty\n", path);
		return -1;
	}
	return 0;
}

/* Applies one setting by name, from a flag or the environment. */
static int set_option(config *c, const char *name, const char *v)
{
	long n;
	if (strcmp(name, "listen") == 0)
		return parse_listen(c, v);
	if (strcmp(name, "db") == 0) {
		const char *scheme = strstr(v, "://");
		if (!*v || strlen(v) >= sizeof c->db) {
			fprintf(stderr,
				"batond: --db must be a file path or a postgresql:// URL\n");
			return -1;
		}
		if (scheme && strncmp(v, "postgresql://", 13) != 0 &&
		    strncmp(v, "postgres://", 11) != 0 && strncmp(v, "sqlite:", 7) != 0) {
			fprintf(stderr,
				"batond: --db: \"%.*s://\" is not a store batond supports; use"
				" postgresql://USER@HOST:PORT/DBNAME, sqlite:PATH or a file path\n",
				(int)(scheme - v > 32 ? 32 : scheme - v), v);
			return -1;
		}
		snprintf(c->db, sizeof c->db, "%s", v);
		return 0;
	}
	if (strcmp(name, "retention") == 0)
		return parse_duration(c, v);
	if (strcmp(name, "threads") == 0) {
		if (parse_int("--threads", v, 1, 1024, &n))
			return -1;
		c->threads = (int)n;
		return 0;
	}
	if (strcmp(name, "node-id") == 0) {
		if (!valid_node_id(v)) {
			fprintf(
			    stderr,
			    "batond: --node-id must be 1 to 64 letters, digits, '.', '_' or '-',"
			    " not \"%s\"\n",
			    v);
			return -1;
		}
		snprintf(c->node_id, sizeof c->node_id, "%s", v);
		return 0;
	}
	if (strcmp(name, "advertise-url") == 0) {
		size_t len = strlen(v);
		if (strncmp(v, "http://", 7) != 0 || len <= 7 || len >= sizeof c->advertise_url ||
		    strpbrk(v, " \t\r\n?#")) {
			fprintf(stderr,
				"batond: --advertise-url wants http://HOST:PORT (under %zu bytes),"
				" not \"%s\"\n",
				sizeof c->advertise_url, v);
			return -1;
		}
		snprintf(c->advertise_url, sizeof c->advertise_url, "%.*s",
			 (int)len - (v[len - 1] == '/'), v);
		return 0;
	}
	if (strcmp(name, "accept-system-identifier") == 0) {
		size_t len = strlen(v);
		if (len < 1 || len >= sizeof c->accept_sysid || strspn(v, "0123456789") != len) {
			fprintf(stderr,
				"batond: --accept-system-identifier wants the database's"
				" system_identifier (digits, as batond's refusal names it), not "
				"\"%s\"\n",
				v);
			return -1;
		}
		snprintf(c->accept_sysid, sizeof c->accept_sysid, "%s", v);
		return 0;
	}
	if (strcmp(name, "lease-ms") == 0) {
		if (parse_int("--lease-ms", v, 500, 600000, &n))
			return -1;
		c->lease_ms = n;
		return 0;
	}
	if (strcmp(name, "commit-timeout-ms") == 0) {
		if (parse_int("--commit-timeout-ms", v, 100, 600000, &n))
			return -1;
		c->commit_timeout_ms = n;
		return 0;
	}
	if (strcmp(name, "idle-resources") == 0) {
		if (parse_int("--idle-resources", v, 1, 10000000, &n))
			return -1;
		c->idle_resources = (int)n;
		return 0;
	}
	if (strcmp(name, "http-threads") == 0) {
		if (parse_int("--http-threads", v, 1, 256, &n))
			return -1;
		c->http_threads = (int)n;
		return 0;
	}
	if (strcmp(name, "log-level") == 0) {
		if ((c->log_level = srv_parse_level(v)) < 0) {
			fprintf(stderr, "batond: --log-level must be debug, info, warn or error\n");
			return -1;
		}
		return 0;
	}
	if (strcmp(name, "shutdown-timeout") == 0) {
		if (parse_int("--shutdown-timeout", v, 0, 86400, &n))
			return -1;
		c->shutdown_timeout_ms = n * 1000;
		return 0;
	}
	if (strcmp(name, "allow-call") == 0)
		return allow_call_list(c, v);
	if (strcmp(name, "token") == 0) {
		if (!*v || strlen(v) >= sizeof c->token || strpbrk(v, " \t\r\n")) {
			fprintf(stderr, "batond: --token must be 1-%zu characters without spaces\n",
				sizeof c->token - 1);
			return -1;
		}
		snprintf(c->token, sizeof c->token, "%s", v);
		return 0;
	}
	if (strcmp(name, "max-connections") == 0) {
		if (parse_int("--max-connections", v, 16, 100000, &n))
			return -1;
		c->max_connections = (int)n;
		return 0;
	}
	if (strcmp(name, "conn-timeout") == 0) {
		if (parse_int("--conn-timeout", v, 1, 3600, &n))
			return -1;
		c->conn_timeout_s = (int)n;
		return 0;
	}
	if (strcmp(name, "cache-bytes") == 0) {
		if (parse_int("--cache-bytes", v, 0, 1L << 40, &n))
			return -1;
		c->cache_bytes = n;
		return 0;
	}
	if (strcmp(name, "stream-buffer") == 0) {
		if (parse_int("--stream-buffer", v, 1024, 1L << 32, &n))
			return -1;
		c->stream_buffer = n;
		return 0;
	}
	if (strcmp(name, "max-per-ip") == 0) {
		if (parse_int("--max-per-ip", v, 0, 100000, &n))
			return -1;
		c->max_per_ip = (int)n;
		return 0;
	}
	if (strcmp(name, "token-file") == 0)
		return read_token_file(c, v);
	if (strcmp(name, "pid-file") == 0) {
		if (!*v || strlen(v) >= sizeof c->pid_file) {
			fprintf(stderr, "batond: --pid-file wants a file path\n");
			return -1;
		}
		snprintf(c->pid_file, sizeof c->pid_file, "%s", v);
		return 0;
	}
	if (strcmp(name, "console-actions") == 0) {
		if (strcmp(v, "1") != 0 && strcmp(v, "0") != 0) {
			fprintf(stderr, "batond: BATON_CONSOLE_ACTIONS must be 1 or 0\n");
			return -1;
		}
		c->console_actions = strcmp(v, "1") == 0;
		return 0;
	}
	if (strcmp(name, "require-sync-replication") == 0) {
		if (strcmp(v, "1") != 0 && strcmp(v, "0") != 0) {
			fprintf(stderr, "batond: BATON_REQUIRE_SYNC_REPLICATION must be 1 or 0\n");
			return -1;
		}
		c->require_sync = strcmp(v, "1") == 0;
		return 0;
	}
	if (strcmp(name, "console-dir") == 0) {
		if (!*v || strlen(v) >= sizeof c->console_dir) {
			fprintf(stderr, "batond: --console-dir wants a directory\n");
			return -1;
		}
		snprintf(c->console_dir, sizeof c->console_dir, "%s", v);
		return 0;
	}
	if (strcmp(name, "log-format") == 0) {
		if (strcmp(v, "text") != 0 && strcmp(v, "json") != 0) {
			fprintf(stderr, "batond: --log-format must be text or json\n");
			return -1;
		}
		c->log_json = strcmp(v, "json") == 0;
		return 0;
	}
	return -1;
}

static const char *const env_names[][2] = {
    {"listen", "BATON_LISTEN"},
    {"db", "BATON_DB"},
    {"threads", "BATON_THREADS"},
    {"http-threads", "BATON_HTTP_THREADS"},
    {"log-level", "BATON_LOG_LEVEL"},
    {"shutdown-timeout", "BATON_SHUTDOWN_TIMEOUT"},
    {"retention", "BATON_RETENTION"},
    {"allow-call", "BATON_ALLOW_CALL"},
    {"token", "BATON_TOKEN"},
    {"token-file", "BATON_TOKEN_FILE"},
    {"log-format", "BATON_LOG_FORMAT"},
    {"max-connections", "BATON_MAX_CONNECTIONS"},
    {"conn-timeout", "BATON_CONN_TIMEOUT"},
    {"max-per-ip", "BATON_MAX_PER_IP"},
    {"idle-resources", "BATON_IDLE_RESOURCES"},
    {"cache-bytes", "BATON_CACHE_BYTES"},
    {"stream-buffer", "BATON_STREAM_BUFFER"},
    {"node-id", "BATON_NODE_ID"},
    {"lease-ms", "BATON_LEASE_MS"},
    {"commit-timeout-ms", "BATON_COMMIT_TIMEOUT_MS"},
    {"require-sync-replication", "BATON_REQUIRE_SYNC_REPLICATION"},
    {"advertise-url", "BATON_ADVERTISE_URL"},
    {"console-actions", "BATON_CONSOLE_ACTIONS"},
    {"console-dir", "BATON_CONSOLE_DIR"},
    {"accept-system-identifier", "BATON_ACCEPT_SYSTEM_IDENTIFIER"},
};

int config_load(config *c, int argc, char **argv)
{
	static const struct option opts[] = {
	    {"listen", required_argument, NULL, 0},
	    {"db", required_argument, NULL, 0},
	    {"threads", required_argument, NULL, 0},
	    {"http-threads", required_argument, NULL, 0},
	    {"log-level", required_argument, NULL, 0},
	    {"shutdown-timeout", required_argument, NULL, 0},
	    {"retention", required_argument, NULL, 0},
	    {"allow-call", required_argument, NULL, 0},
	    {"token", required_argument, NULL, 0},
	    {"token-file", required_argument, NULL, 0},
	    {"log-format", required_argument, NULL, 0},
	    {"max-connections", required_argument, NULL, 0},
	    {"conn-timeout", required_argument, NULL, 0},
	    {"max-per-ip", required_argument, NULL, 0},
	    {"idle-resources", required_argument, NULL, 0},
	    {"cache-bytes", required_argument, NULL, 0},
	    {"stream-buffer", required_argument, NULL, 0},
	    {"node-id", required_argument, NULL, 0},
	    {"lease-ms", required_argument, NULL, 0},
	    {"commit-timeout-ms", required_argument, NULL, 0},
	    {"require-sync-replication", no_argument, NULL, 0},
	    {"advertise-url", required_argument, NULL, 0},
	    {"accept-system-identifier", required_argument, NULL, 0},
	    {"pid-file", required_argument, NULL, 0},
	    {"console-actions", no_argument, NULL, 0},
	    {"console-dir", required_argument, NULL, 0},
	    {"help", no_argument, NULL, 'h'},
	    {"version", no_argument, NULL, 'V'},
	    {NULL, 0, NULL, 0},
	};
	*c = defaults;
	if (parse_listen(c, defaults.listen))
		return -1;
	for (size_t i = 0; i < sizeof env_names / sizeof env_names[0]; i++) {
		const char *v = getenv(env_names[i][1]);
		if (v && *v && set_option(c, env_names[i][0], v)) {
			fprintf(stderr, "batond: (from %s)\n", env_names[i][1]);
			return -1;
		}
	}
	int ch, idx, flag_allow_seen = 0;
	opterr = 0;
	optind = 1;
	while ((ch = getopt_long(argc, argv, "", opts, &idx)) != -1) {
		if (ch == 'h') {
			usage(stdout);
			return 1;
		}
		if (ch == 'V') {
			printf("batond %s\n", BATON_VERSION);
			return 1;
		}
		if (ch != 0) {
			fprintf(stderr, "batond: unknown or incomplete option \"%s\"\n",
				argv[optind - 1]);
			usage(stderr);
			return -1;
		}
		if (strcmp(opts[idx].name, "allow-call") == 0 && !flag_allow_seen) {
			/* Flags replace the environment's list instead of adding to it. */
			c->n_allow_call = 0;
			c->allow_call[0] = NULL;
			flag_allow_seen = 1;
		}
		if (strcmp(opts[idx].name, "allow-call") == 0
			? add_allow_call(c, optarg)
			: set_option(c, opts[idx].name, optarg ? optarg : "1"))
			return -1;
	}
	if (optind < argc) {
		fprintf(stderr, "batond: unexpected argument \"%s\"\n", argv[optind]);
		return -1;
	}
	if (!c->node_id[0])
		default_node_id(c);
	return 0;
}
