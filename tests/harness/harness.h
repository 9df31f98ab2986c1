/*
 * harness.h - runs the real batond for the HTTP tests and talks to it over HTTP.
 *
 * Each test gets its own batond process and temporary directory (mkdtemp), as
 * libmicrohttpd's src/testcurl and redis's start_server do: the server binds
 * 127.0.0.1:0 and says in its log which port it bound; the harness polls the log
 * for that line with a deadline. Durability is proven by killing the process with
 * SIGKILL and starting it again on the same database file (beanstalkd's testserv.c).
 *
 * Three kinds of functions live here:
 *  - lifecycle (hs_open .. hs_close) returns error codes and prints what went wrong,
 *    so it can run in cmocka setup and teardown;
 *  - requests (hs_send, hs_get, hs_post ...) use one libcurl easy handle per call and
 *    may be called from any thread once hs_open has run;
 *  - checks and waits (hs_get_json, hs_wait_*, hs_assert_* ...) fail the running
 *    cmocka test when their expectation is not met, so they must only be called from
 *    the test's own thread. Every wait is bounded by a deadline; none sleeps a fixed
 *    time to let something happen.
 *
 * The store: by default each server's database is DIR/baton.db (SQLite). With
 * BATON_TEST_PG set to the URL of a PostgreSQL server on which the harness may create
 * databases (postgresql://postgres@127.0.0.1:PORT/postgres, as scripts/pg.sh prints it),
 * each hs_open creates a database of its own there (baton_t<pid>_<n>), batond gets its URL
 * as --db, and hs_close drops it. The same tests run on both; one that only makes sense
 * on SQLite (its file, its lock, its VFS) calls cmocka's skip() when hs_store_is_pg().
 *
 * Environment: BATOND (absolute path of the server binary, required),
 * BATON_TEST_PG (see above), BATON_TEST_PG_DIR (the directory of that server for
 * scripts/pg.sh, for hs_pg_stop/start/restart), BATON_PG_SCRIPT (scripts/pg.sh; by
 * default the one of the tree the harness was built in),
 * BATON_TEST_KEEP (set: keep the temporary directories and databases for inspection),
 * BATON_TEST_FILTER / BATON_TEST_SKIP (cmocka patterns such as "test_cancel*": run only
 * the matching tests / skip them; see hs_filters_from_env).
 */
#ifndef BATON_TEST_HARNESS_H
#define BATON_TEST_HARNESS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Deadlines, generous on purpose: 2 cores, sanitizer builds, a loaded CI machine. */
#define HS_START_TIMEOUT_MS   20000
#define HS_STOP_TIMEOUT_MS    15000
#define HS_REQUEST_TIMEOUT_MS 15000
#define HS_POLL_MS	      10

/* Returned by the time helpers for a JSON null. */
#define HS_NO_TIME INT64_MIN

typedef struct hs_server hs_server;

/* Applies BATON_TEST_FILTER and BATON_TEST_SKIP to the cmocka run; call first in main. */
void hs_filters_from_env(void);

/* ---- lifecycle ------------------------------------------------------------------ */

/*
 * Creates a fresh temporary directory and starts $BATOND in it with
 * `--listen 127.0.0.1:0 --db DB` followed by `extra_args` (NULL-terminated, may be NULL;
 * copied), DB being DIR/baton.db or, on PostgreSQL, the URL of a database created for
 * this server (see hs_db_url). Returns NULL, after printing why, when the database could
 * not be created, or the server could not be started or did not report its port within
 * HS_START_TIMEOUT_MS.
 */
hs_server *hs_open(const char *const *extra_args);
/* Like hs_open, but the new server uses the database of `first` (a cluster node on
 * PostgreSQL; on SQLite the second batond on one file, which batond refuses). Its own
 * directory, log and port; hs_close leaves the database to `first`'s hs_close, so close
 * the nodes before `first`. NULL on failure. */
hs_server *hs_open_node(const hs_server *first, const char *const *extra_args);

/* Like hs_open (first NULL) or hs_open_node, but nothing is started yet: set what the server
 * needs (hs_set_env, hs_route_db), then hs_start it. NULL after printing why. */
hs_server *hs_new(const hs_server *first, const char *const *extra_args);
/* For the next starts: the PostgreSQL URL batond gets reaches the server through `port` on
 * 127.0.0.1 (a proxy in front of it, proxy.h). 0, or -1 on SQLite. */
int hs_route_db(hs_server *s, int port);
/* For the next starts: batond gets `url` as its --db (a database of a server the test runs
 * itself, such as a multi-host URL over a primary and its standby). 0, or -1 when too long. */
int hs_set_db(hs_server *s, const char *url);
/* For the next starts: batond's PostgreSQL URL names the hosts 127.0.0.1:ports[0] ...
 * ports[n-1] (a libpq multi-host URL: proxies in front of a primary and its standby), its
 * user, database and parameters kept. 0, or -1 on SQLite or when too long. */
int hs_route_db_hosts(hs_server *s, const int *ports, int n);
/* libfaketime's multi-threaded library (Debian's faketime package), or NULL when missing, or
 * in a ThreadSanitizer build: libfaketime wraps pthread_cond_timedwait, which hides batond's
 * mutex hand-offs from TSan, and TSan then reports races and double locks that are not
 * there. The clock tests run in the plain, ASan and valgrind builds. */
const char *hs_faketime_lib(void);
/* Sets (on) or removes (off) in the test process's environment what a batond started from now
 * on needs to run under libfaketime, reading its offset from the file named by
 * FAKETIME_TIMESTAMP_FILE (set by the caller): LD_PRELOAD, FAKETIME_NO_CACHE,
 * DONT_FAKE_MONOTONIC (a real clock step moves CLOCK_REALTIME only), and ASan's leave to
 * find its runtime after libfaketime. Returns -1 when libfaketime is missing. Processes
 * other than batond (clients, PostgreSQL) must be started with it off. */
int hs_faketime_env(int on);
/* The port of the PostgreSQL server of BATON_TEST_PG, or -1 without one. */
int hs_pg_port(void);
/* The ports of every host BATON_TEST_PG names (a multi-host URL names several), at most max
 * of them, into ports: how many; 0 without a server. */
int hs_pg_ports(int *ports, int max);

/* cmocka fixtures for the common case: state is an hs_server from hs_open(NULL). */
int hs_setup(void **state);
int hs_teardown(void **state);

/* Starts the server again on the same database (after hs_stop or hs_kill). 0 or -1. */
int hs_start(hs_server *s);

/*
 * Runs $BATOND with args (NULL-terminated, after argv[0]) and, when env_name is not NULL,
 * that environment variable set, until it exits: for the ways it refuses to start.
 * Returns its wait status, or -1 when it still ran after timeout_ms (it is then killed);
 * what it wrote to stdout and stderr is in out (NUL-terminated, truncated to size).
 */
int hs_run_batond(const char *const *args, const char *env_name, const char *env_value,
		  int timeout_ms, char *out, size_t size);

/* For the next starts: other extra arguments (NULL-terminated, may be NULL; copied; 0 or
 * -1), and one environment variable set for the server (name NULL: none; copied). */
int hs_set_args(hs_server *s, const char *const *extra_args);
void hs_set_env(hs_server *s, const char *name, const char *value);

/*
 * Sends SIGTERM and waits for the process to exit. Returns its exit status (0..255),
 * 128 + signal when a signal ended it, or -1 when it did not exit within
 * HS_STOP_TIMEOUT_MS (it is then killed with SIGKILL).
 */
int hs_stop(hs_server *s);

/* Kills the server with SIGKILL and reaps it. */
void hs_kill(hs_server *s);

/* Sends signal sig to the running server: 0, or -1 when it does not run. */
int hs_signal(const hs_server *s, int sig);

/* Waits up to timeout_ms for the server to exit by itself and reaps it: its exit status
 * as hs_stop returns it, or -1 (it is then still running). */
int hs_wait_exit(hs_server *s, int timeout_ms);

/*
 * Stops the server if it runs (SIGTERM), checks that it exited with status 0 and that
 * no log holds a sanitizer report or more or less than one "listening on" line, removes
 * the temporary directory, drops the server's PostgreSQL database (ending whatever
 * connections it still has) and frees `s`. Returns 0, or -1 (after printing the log tail
 * or the error) when one of those checks or the drop failed. Accepts NULL.
 */
int hs_close(hs_server *s);

int hs_port(const hs_server *s);
/* The server's process id, or 0 when it does not run. */
int hs_pid(const hs_server *s);
/* CPU time (user + system, ms) the running server has used so far, from /proc; -1 when
 * it does not run or /proc cannot be read. */
int64_t hs_cpu_ms(const hs_server *s);
/* Whether the server process was started and has not been stopped or killed by us. */
bool hs_running(const hs_server *s);
/* Whether the process still lives (reaps it, and returns false, when it died). */
bool hs_alive(hs_server *s);
/* The SQLite database file (borrowed); NULL on PostgreSQL, where there is none. */
const char *hs_db_path(const hs_server *s);
/* The --db value batond is started with: the file, or the PostgreSQL URL (borrowed). */
const char *hs_db_url(const hs_server *s);

/* The concatenated logs of every start of the server; the caller frees it. */
char *hs_log_text(const hs_server *s);
/* Whether the logs of every start of the server have `what`, and `then` after it when
 * then is not NULL. */
bool hs_log_says(const hs_server *s, const char *what, const char *then);

/* Prints the last `max_bytes` of the current log to stderr (for failure messages). */
void hs_dump_log(const hs_server *s, size_t max_bytes);

/* ---- requests ------------------------------------------------------------------- */

typedef struct hs_request {
	const char *method;	  /* "GET", "POST", "PUT", "DELETE", ... */
	const char *path;	  /* "/workflows?limit=2", sent as given */
	const char *content_type; /* NULL: the request carries no Content-Type header */
	const char *body;	  /* NULL: no body */
	size_t body_len;
	bool chunked;	      /* send the body with Transfer-Encoding: chunked */
	bool expect_continue; /* send Expect: 100-continue (by default no Expect) */
	const char *header;   /* one more header line, "Name: value"; NULL: none */
} hs_request;

typedef struct hs_response {
	long status; /* 0 when no response arrived (see error) */
	char *content_type, *location, *allow, *retry_after; /* header values, NULL when absent */
	char *body;					     /* NUL-terminated; NULL when empty */
	size_t body_len;
	json_t *json; /* the parsed body, NULL when empty or not JSON */
	char error[256];
} hs_response;

/*
 * Sends one request to the server and fills `r` (which the caller then releases with
 * hs_response_fini). Returns 0 when a response arrived, -1 otherwise (r->error says
 * why). Thread-safe.
 */
int hs_send(const hs_server *s, const hs_request *req, hs_response *r);
int hs_get(const hs_server *s, const char *path, hs_response *r);
/* POST with Content-Type application/json; `body` is a NUL-terminated string or NULL. */
int hs_post(const hs_server *s, const char *path, const char *body, hs_response *r);
/* POSTs a JSON body over a raw socket with "Connection: close", then shuts its own side down
 * for writing (a half-close, as `nc -N` does) and reads the whole answer. Returns the status
 * (0 when none could be read); *out gets the JSON body (new reference) or NULL. */
long hs_post_half_closed(const hs_server *s, const char *path, const char *body, json_t **out);
void hs_response_fini(hs_response *r);
/* For the harness's own libcurl requests: the value of header line `line` when its name
 * is `name` (case-insensitive; a new string, or NULL). */
char *hs_header_value(const char *line, size_t len, const char *name);

/* `text` percent-encoded for a query string; the caller frees it. */
char *hs_url_escape(const char *text);

/* ---- checks (cmocka, test thread only) ------------------------------------------ */

/* GET `path`, asserts `status` and a JSON body; returns the body (new reference). */
json_t *hs_get_json(const hs_server *s, const char *path, long status);

/* GET /workflows/{id}, asserted 200. New reference. */
json_t *hs_get_workflow(const hs_server *s, const char *id);

/* Step i of a workflow document (borrowed); fails the test when it has none. */
json_t *hs_step_at(const json_t *wf, size_t i);

/*
 * GET /workflows/{id}/events, page after page as next_after says, each asserted 200
 * with the documented envelope, every event with seq, ts, type and workflow_id, seq
 * strictly increasing. Returns all the events in one array (new reference).
 */
json_t *hs_get_events(const hs_server *s, const char *id);

/*
 * POSTs `body` (stolen) to /workflows, asserts 201, a Location of /workflows/{id} and a
 * JSON workflow. Returns it (new reference).
 */
json_t *hs_create_workflow(const hs_server *s, json_t *body);

/* The asserted-present string member `key` of `obj` (borrowed). */
const char *hs_str(const json_t *obj, const char *key);
/* The asserted-present integer member `key` of `obj`. */
json_int_t hs_int(const json_t *obj, const char *key);

/* RFC 3339 times as batond writes them: rfc3339_parse_ms (common/rfc3339.h). */
#include "../../common/curl_req.h"
#include "../../common/rfc3339.h"

/* Member `key` of `obj` as a time in ms; asserts it is present and well formed. */
int64_t hs_time(const json_t *obj, const char *key);
/* The same, but a JSON null gives HS_NO_TIME. */
int64_t hs_time_or_null(const json_t *obj, const char *key);

/*
 * Asserts that `wf` has every member GET /workflows/{id} documents, each with its type
 * (times well formed), steps indexed 0..n-1, steps_total and steps_completed consistent.
 */
void hs_assert_workflow_shape(const json_t *wf);

/* Asserts an application/problem+json answer with `status` and problem type `slug`. */
void hs_assert_problem(const hs_response *r, long status, const char *slug, const char *what);

/* Asserts that Allow lists exactly the comma-separated methods of `methods`. */
void hs_assert_allow(const hs_response *r, const char *methods);

/* ---- waits ---------------------------------------------------------------------- */

int64_t hs_now_ms(void);
int64_t hs_mono_ms(void); /* CLOCK_MONOTONIC, for deadlines */
void hs_pause_ms(int ms); /* sleeps (EINTR resumed); only between polls */

typedef bool (*hs_pred)(void *arg);

/* Polls `pred` every HS_POLL_MS until it is true (returns true) or timeout (false). */
bool hs_wait_until(hs_pred pred, void *arg, int timeout_ms);

/*
 * Polls GET /workflows/{id} until its status is `status` and returns that state (new
 * reference). Fails the test on timeout, or at once when the workflow reaches another
 * final status.
 */
json_t *hs_wait_workflow(const hs_server *s, const char *id, const char *status, int timeout_ms);

/* The same for steps[step].status; returns the whole workflow. */
json_t *hs_wait_step(const hs_server *s, const char *id, size_t step, const char *status,
		     int timeout_ms);

/* ---- the store ------------------------------------------------------------------- */

/* Whether the servers run on PostgreSQL (BATON_TEST_PG is set and not empty). */
int hs_store_is_pg(void);

/*
 * Runs a one-integer query (such as "SELECT count(*) FROM workflows", the same SQL on
 * both stores) on the server's database. On SQLite, through a read-only connection:
 * batond holds its database exclusively while it runs, so a running server is stopped
 * (SIGTERM, exit 0 expected) for the query and started again on the same database (on a
 * new port). On PostgreSQL, through libpq, with batond left running. Returns the value,
 * or -1 after printing what went wrong.
 */
long long hs_db_count(hs_server *s, const char *sql);
/* PostgreSQL: runs `sql` (a LOCK, say) on a session of its own in a transaction left open,
 * its locks held until hs_db_unhold rolls it back. The session, or NULL after printing why. */
void *hs_db_hold(const hs_server *s, const char *sql);
void hs_db_unhold(void *session); /* accepts NULL */

/*
 * For the tests of a PostgreSQL server going away under batond: scripts/pg.sh stop,
 * start or restart (stop, then start on the same port and data) on $BATON_TEST_PG_DIR,
 * each waited for (bounded; start and restart return once the server accepts
 * connections). They affect every database of that server. Return 0, or -1 after
 * printing why (also on SQLite, or without BATON_TEST_PG_DIR: such a test skips first).
 * Test thread only.
 */
int hs_pg_restart(void);
int hs_pg_stop(void);
int hs_pg_start(void);

/* ---- baton specifics ------------------------------------------------------------ */

/* The default work_ms of a worker: 100 + FNV-1a 32-bit hash of the name % 100. */
int hs_default_work_ms(const char *worker);

/*
 * The first event of `events` with `type` whose "step" is `step` (any when -1) and whose
 * "attempt" is `attempt` (any when -1); borrowed, NULL when there is none.
 */
json_t *hs_event_find(const json_t *events, const char *type, int step, int attempt);

/* How many events of `events` match, with the same filters as hs_event_find. */
size_t hs_event_count(const json_t *events, const char *type, int step, int attempt);

#endif
