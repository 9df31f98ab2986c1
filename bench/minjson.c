/*
 * minjson.c - the reference of the HTTP read benchmark: a minimal libmicrohttpd server
 * that answers every GET with a small JSON document built with jansson, in the same
 * threading mode as batond (MHD_USE_AUTO_INTERNAL_THREAD with a thread pool, suspend
 * and resume allowed, the same connection timeout). It does nothing else, so the
 * difference between its rate and batond's is what batond's own work costs.
 *
 *     minjson [--threads N] [--port P] [--commit PATH]
 *
 * Listens on 127.0.0.1 (port 0 by default: a free port), logs
 * "listening on http://127.0.0.1:PORT" and runs until SIGTERM or SIGINT.
 *
 * With --commit, it is also the reference of a request whose answer waits for a durable
 * commit: a POST (answered 201 with the same small document) or a DELETE (204) is
 * answered once one commit of the floor's shape is durable. PATH is a SQLite database
 * (floor.c's commit: BEGIN IMMEDIATE, one small INSERT, COMMIT; WAL, synchronous=FULL)
 * or a PostgreSQL URL (pg.c's: one single-row INSERT in autocommit, synchronous_commit
 * on, into the table bench_behind). The lock path's benchmark compares baton's lease
 * pair with such a pair: the same two commits and two requests, nothing in between.
 */
#include <microhttpd.h>
#include <jansson.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* --commit: the database and its statements, one commit at a time. */
static struct {
	pthread_mutex_t mu;
	int on;
	sqlite3 *db;
	sqlite3_stmt *begin, *ins, *commit;
	PGconn *pg;
} store = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* A row of about the size of one of batond's event rows, as the floors write. */
static const char row_data[] = "{\"step\":0,\"worker\":\"worker-A\",\"attempt\":1,"
			       "\"duration_ms\":0,\"result\":{\"workerId\":\"worker-A\"}}";

static int pg_ok(PGresult *r, const char *what)
{
	ExecStatusType st = PQresultStatus(r);
	PQclear(r);
	if (st == PGRES_COMMAND_OK)
		return 0;
	fprintf(stderr, "minjson: %s: %s", what, PQerrorMessage(store.pg));
	return -1;
}

static int pg_open(const char *url)
{
	store.pg = PQconnectdb(url);
	if (PQstatus(store.pg) != CONNECTION_OK) {
		fprintf(stderr, "minjson: %s", PQerrorMessage(store.pg));
		return -1;
	}
	if (pg_ok(PQexec(store.pg, "SET synchronous_commit = on"), "set") ||
	    pg_ok(PQexec(store.pg, "SET client_min_messages = warning"), "set") ||
	    pg_ok(PQexec(store.pg, "CREATE TABLE IF NOT EXISTS bench_behind (seq bigserial"
				   " PRIMARY KEY, ts bigint NOT NULL, data text NOT NULL)"),
		  "create") ||
	    pg_ok(PQprepare(store.pg, "ins", "INSERT INTO bench_behind (ts, data) VALUES ($1, $2)",
			    2, NULL),
		  "prepare"))
		return -1;
	store.on = 1;
	return 0;
}

static int pg_commit(long long ts)
{
	char t[32];
	snprintf(t, sizeof t, "%lld", ts);
	const char *values[2] = {t, row_data};
	return pg_ok(PQexecPrepared(store.pg, "ins", 2, values, NULL, NULL, 0), "insert");
}

static int exec(const char *sql)
{
	char *msg = NULL;
	if (sqlite3_exec(store.db, sql, NULL, NULL, &msg) == SQLITE_OK)
		return 0;
	fprintf(stderr, "minjson: %s: %s\n", sql, msg ? msg : "?");
	sqlite3_free(msg);
	return -1;
}

static int store_open(const char *path)
{
	if (strncmp(path, "postgresql://", 13) == 0 || strncmp(path, "postgres://", 11) == 0)
		return pg_open(path);
	store.on = 1;
	if (sqlite3_open_v2(path, &store.db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
		SQLITE_OK ||
	    exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;") ||
	    exec("CREATE TABLE IF NOT EXISTS t (seq INTEGER PRIMARY KEY, ts INTEGER NOT NULL,"
		 " data TEXT NOT NULL)") ||
	    sqlite3_prepare_v2(store.db, "BEGIN IMMEDIATE", -1, &store.begin, NULL) != SQLITE_OK ||
	    sqlite3_prepare_v2(store.db, "INSERT INTO t (ts, data) VALUES (?, ?)", -1, &store.ins,
			       NULL) != SQLITE_OK ||
	    sqlite3_prepare_v2(store.db, "COMMIT", -1, &store.commit, NULL) != SQLITE_OK) {
		fprintf(stderr, "minjson: %s: %s\n", path, sqlite3_errmsg(store.db));
		return -1;
	}
	return 0;
}

/* One durable commit of the floor's shape (floor.c); 0 once it is durable. */
static int store_commit(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	long long ms = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
	pthread_mutex_lock(&store.mu);
	if (store.pg) {
		int rc = pg_commit(ms);
		pthread_mutex_unlock(&store.mu);
		return rc;
	}
	sqlite3_bind_int64(store.ins, 1, ms);
	sqlite3_bind_text(store.ins, 2, row_data, -1, SQLITE_STATIC);
	int ok = sqlite3_step(store.begin) == SQLITE_DONE &&
		 sqlite3_step(store.ins) == SQLITE_DONE &&
		 sqlite3_step(store.commit) == SQLITE_DONE;
	sqlite3_reset(store.begin);
	sqlite3_reset(store.ins);
	sqlite3_reset(store.commit);
	if (!ok && !sqlite3_get_autocommit(store.db))
		sqlite3_exec(store.db, "ROLLBACK", NULL, NULL, NULL);
	pthread_mutex_unlock(&store.mu);
	return ok ? 0 : -1;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
				  const char *method, const char *version, const char *upload_data,
				  size_t *upload_size, void **con_cls)
{
	static int first_call_mark;
	(void)cls;
	(void)version;
	(void)upload_data;
	/* Answer on the second call, as batond does: an answer queued on the first call,
	 * before the request is known to be complete, makes libmicrohttpd close the
	 * connection after it (no keep-alive). */
	if (!*con_cls) {
		*con_cls = &first_call_mark;
		return MHD_YES;
	}
	int post = strcmp(method, "POST") == 0, del = strcmp(method, "DELETE") == 0;
	if (store.on && (post || del) && *upload_size) { /* the body: read and dropped */
		*upload_size = 0;
		return MHD_YES;
	}
	if (store.on && (post || del) && store_commit() != 0)
		return MHD_NO;
	if (store.on && del) {
		struct MHD_Response *none =
		    MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
		if (!none)
			return MHD_NO;
		enum MHD_Result ret = MHD_queue_response(conn, MHD_HTTP_NO_CONTENT, none);
		MHD_destroy_response(none);
		return ret;
	}
	if ((!post || !store.on) && strcmp(method, "GET") != 0)
		return MHD_NO;
	if (*upload_size)
		return MHD_NO;
	const char *id = strrchr(url, '/');
	json_t *doc = json_pack("{s:s, s:s, s:i}", "id", id ? id + 1 : url, "status", "completed",
				"steps_completed", 1);
	char *text = json_dumps(doc, JSON_COMPACT);
	json_decref(doc);
	if (!text)
		return MHD_NO;
	struct MHD_Response *resp =
	    MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
	if (!resp) {
		free(text);
		return MHD_NO;
	}
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
	enum MHD_Result ret = MHD_queue_response(conn, post ? MHD_HTTP_CREATED : MHD_HTTP_OK, resp);
	MHD_destroy_response(resp);
	return ret;
}

int main(int argc, char **argv)
{
	unsigned threads = 8, port = 0;
	const char *commit = NULL;
	int bad = argc % 2 == 0;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--threads") == 0)
			threads = (unsigned)atoi(argv[i + 1]);
		else if (strcmp(argv[i], "--port") == 0)
			port = (unsigned)atoi(argv[i + 1]);
		else if (strcmp(argv[i], "--commit") == 0)
			commit = argv[i + 1];
		else
			bad = 1;
	}
	if (bad || threads < 1 || threads > 256 || port > 65535) {
		fprintf(stderr, "usage: minjson [--threads 1..256] [--port P] [--commit PATH]\n");
		return 2;
	}
	if (commit && store_open(commit) != 0)
		return 1;
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
	struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	struct MHD_Daemon *d = MHD_start_daemon(
	    MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME, 0, NULL,
	    NULL, on_request, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
	    MHD_OPTION_THREAD_POOL_SIZE, threads, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60,
	    MHD_OPTION_END);
	if (!d) {
		fprintf(stderr, "minjson: cannot listen on 127.0.0.1:%u\n", port);
		return 1;
	}
	const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
	printf("minjson: %u threads, listening on http://127.0.0.1:%u\n", threads,
	       info ? info->port : port);
	fflush(stdout);
	int sig = 0;
	sigwait(&sigs, &sig);
	MHD_stop_daemon(d);
	sqlite3_finalize(store.begin);
	sqlite3_finalize(store.ins);
	sqlite3_finalize(store.commit);
	sqlite3_close(store.db);
	if (store.pg) /* a server of the user's (bench --pg URL) keeps nothing of this */
		PQclear(PQexec(store.pg, "DROP TABLE IF EXISTS bench_behind"));
	PQfinish(store.pg);
	return 0;
}
