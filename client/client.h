/*
 * client.h: internals shared by the files of `baton`, the command-line client of batond.
 *
 * The client is a thin layer over the REST API of batond (openapi.yaml):
 *   main.c      global options (before or after the command), usage, the command table,
 *               exit codes
 *   http.c      one libcurl handle: GET/POST that return the status and the parsed JSON body
 *   commands.c  submit, get, list, cancel, events, resources (human output or --json)
 *   limit.c     `baton limit NAME [N]`: a resource's permits, shown or set
 *   admin.c     delete, backup: the operator's commands
 *   demo.c      `baton demo [--crash]`: the origin's distributed-mutex demo, rendered live
 *   watch.c     `baton watch ID`: a workflow followed live over its event stream (SSE)
 *   lock.c      `baton lock RESOURCE -- COMMAND`: a command run under a lease
 *   worker.c    `baton worker --worker NAME -- COMMAND`: an external worker's steps
 *   group.c     a command's process group: signalled whole, ended (TERM, KILL), reaped
 *   sse.c       an incremental parser of Server-Sent Events, for watch
 *   util.c      JSON field access, small formatting helpers, a growable buffer
 *
 * Every command returns the process exit status, so errors travel as plain ints:
 * a function that fails has already told the user why on stderr.
 */
#ifndef BATON_CLIENT_H
#define BATON_CLIENT_H

#include <stdio.h>

#include <jansson.h>
#include <signal.h>
#include <sys/types.h>

#include "../common/sse_lines.h"

/* Process exit statuses (contract: "Exit codes"). Never change their meaning. */
enum {
	EXIT_OK = 0,	      /* success; for demo: the workflow completed */
	EXIT_FAILED = 1,      /* the server answered with an error, or the workflow failed */
	EXIT_USAGE = 2,	      /* bad command line; usage went to stderr */
	EXIT_UNREACHABLE = 3, /* no HTTP answer from the server */
	EXIT_PARTIAL = 4,     /* watch, get: the workflow completed, but some steps failed */
	/* lock: the lease was not granted within --wait; worker --once: no task came
	 * within --wait. Either way the command was not run. */
	EXIT_NOT_ACQUIRED = 75,
	/* lock: the lease was lost while the command ran; the command was stopped */
	EXIT_LEASE_LOST = 76,
};

#define BATON_CLIENT_VERSION "0.1.0"
#define DEFAULT_SERVER	     "http://127.0.0.1:8080"

/* ---- http.c ---------------------------------------------------------------------------- */

typedef struct http http;

/* One HTTP answer. body is a new reference (NULL when the answer had no body). */
struct http_reply {
	long status;
	json_t *body;
};

/*
 * Returns a new connection to the server at base_url ("http://host:port", an optional
 * trailing slash is ignored), or to several: "URL,URL,..." (at most 16), tried in turn
 * as http.c's opening comment says. NULL after printing why. The handle keeps the
 * connection alive between requests; it is not thread-safe. Free with http_free (accepts
 * NULL).
 */
http *http_new(const char *base_url);
/* A new handle to the same servers, with h's settings but its own connection (for a
 * second request in flight at once, on another thread); NULL after printing why. */
http *http_clone(const http *h);
/* How many servers h has; moves to the next one and returns its base URL (borrowed). */
size_t http_server_count(const http *h);
const char *http_next_server(http *h);
/* on: POSTs may be sent again to the next server after an unknown outcome (a timeout or
 * a cut connection after sending): the caller's POSTs are harmless twice. Default off. */
void http_set_resend(http *h, int on);
/* on: a request that no server answered prints nothing, nor does a move to the next server
 * (the caller reports it, with http_why_unreachable). Default off: "server unreachable at
 * URL: why", and "URL why; trying URL" for each move. */
void http_set_quiet(http *h, int on);
/* The time each server gets to accept a connection, in ms (0: the default, 5 s). */
void http_set_connect_timeout(http *h, long ms);
/* flag (borrowed, NULL: none): once it is nonzero, the request in flight ends within about a
 * second, unanswered (EXIT_UNREACHABLE, nothing printed, no next server); a signal handler
 * sets it to stop a long poll. The handle stays usable. */
void http_set_abort(http *h, volatile sig_atomic_t *flag);
/* 1 once some server answered some request of h (any HTTP status), else 0. */
int http_answered(const http *h);
/* Writes "URL why; URL why..." into buf: each server of h and why its last request got
 * no usable answer ("refused the connection", "did not answer within 5 s", "answered 503
 * (n2 at URL drives it)"). */
void http_why_unreachable(const http *h, char *buf, size_t len);
void http_free(http *h);

/*
 * The bearer token sent with every request (--token, else $BATON_TOKEN), borrowed; NULL:
 * none. http_auth applies it to a libcurl easy handle.
 */
void http_set_token(const char *token);
void http_auth(void *curl_easy);

/* The base URL of the server of the next request, without trailing slash (borrowed). */
const char *http_base(const http *h);

/*
 * Sends METHOD base_url+path. body (borrowed, may be NULL) is sent as application/json
 * by a POST or a PUT (other methods send none); a POST without body is sent empty. On EXIT_OK,
 * *reply holds the status and the parsed body (caller frees with http_reply_fini), whatever the
 * status. Otherwise returns EXIT_UNREACHABLE (no answer) or EXIT_FAILED (an answer that is not
 * JSON), after printing why on stderr; *reply is then empty.
 */
int http_request(http *h, const char *method, const char *path, const json_t *body,
		 struct http_reply *reply);
void http_reply_fini(struct http_reply *reply);
/* The whole time one request may take on each server it tries, in ms (0: the default,
 * 30 s). */
void http_set_timeout(http *h, long ms);

/*
 * http_request, plus the error statuses: returns EXIT_OK with *out a new reference to the
 * JSON body of a 2xx answer (and *status, when status is not NULL, the HTTP status);
 * for 4xx/5xx prints the problem document and returns EXIT_FAILED.
 */
int http_call(http *h, const char *method, const char *path, const json_t *body, json_t **out,
	      long *status);

/*
 * GET path into `file`, written as file.part and renamed once complete, so that `file`
 * is either the whole answer or untouched. EXIT_OK on 200; otherwise the problem is
 * printed and file.part removed (EXIT_FAILED, or EXIT_UNREACHABLE without an answer).
 */
int http_download(http *h, const char *path, const char *file);

/* Returns a new string: s percent-encoded for a path segment or query value (free()).
 * Out of memory is fatal here, as in the path builders of commands.c: exits with 1. */
char *http_escape(const char *s);

/* ---- util.c ---------------------------------------------------------------------------- */

/* Borrowed string field of obj, or dflt when absent, null or not a string. */
const char *jstr(const json_t *obj, const char *key, const char *dflt);
/* Integer field of obj, or dflt when absent, null or not an integer. */
json_int_t jint(const json_t *obj, const char *key, json_int_t dflt);
/* 1 when obj has key with a non-null value. */
int jhas(const json_t *obj, const char *key);

/*
 * --json (main.c sets it): errors are then printed as one line of JSON on stderr, a
 * problem document (RFC 9457): the server's as it sent it, or one of the client's own,
 * {"type": "about:blank", "title": ..., "detail": ...}. Without it, "baton: ..." text.
 */
void set_json_errors(int on);
/* Reports an error the client found (no answer, a bad answer) on stderr: "baton: DETAIL",
 * or with --json {"type": "about:blank", "title": title, "detail": DETAIL}. */
void print_error(const char *title, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Reports the server's error answer: with --json the problem document as one line (a
 * body that is not an object: one made of status and text); else text. */
void print_problem(const char *method, const char *path, long status, const json_t *problem);

/* Prints v on one line ({"a": 1, "b": [2, 3]}), keys in server order, then a newline:
 * every --json answer is one line, for line-oriented tools. */
void print_json(FILE *out, const json_t *v);
/* Prints s as-is when it is a plain token ([A-Za-z0-9._:/@+-]), else as a JSON string. */
void print_token(FILE *out, const char *s);

/*
 * Terminal columns that the UTF-8 text s (n bytes) takes: 2 for East Asian wide and
 * fullwidth characters, 0 for combining marks and zero-width characters, 1 for the rest
 * (a byte that is not UTF-8 counts as one column). What aligns a table whose names are
 * not ASCII: printf pads by bytes.
 */
size_t display_width(const char *s, size_t n);
/* Prints s, then spaces up to width columns (none when s is wider). */
void print_padded(FILE *out, const char *s, int width);

/* Formats ms as seconds the way JavaScript prints ms / 1000 ("2", "1.5", "0.25"). */
void format_secs(char *buf, size_t len, json_int_t ms);

/*
 * Parses a duration: a number (a fraction allowed) followed by "ms", "s", "m", "h" or
 * nothing (seconds), into *ms. Returns 0; -1 when s is not such a duration (negative,
 * not finite, another unit); -2 when it is longer than max_ms. *ms is set only on 0.
 */
int parse_duration(const char *s, long long max_ms, long long *ms);
/* The longest durations the commands take: the server's ttl limit, a week of waiting. */
#define MAX_TTL_MS  86400000LL
#define MAX_WAIT_MS 604800000LL

/* Monotonic clock in milliseconds; sleep for ms milliseconds. */
long long monotonic_ms(void);
void sleep_ms(long ms);

/* A growable byte buffer; {0} is an empty one. p is NUL-terminated once anything was
 * added (NULL before). */
struct sbuf {
	char *p;
	size_t len, cap;
};

/* Appends n bytes of s. Returns 0, or -1 (b unchanged) when b would exceed max bytes or
 * memory ran out. */
int sbuf_add(struct sbuf *b, const char *s, size_t n, size_t max);
/* Frees the bytes and empties b, which can be used again (accepts NULL). */
void sbuf_fini(struct sbuf *b);

/* ---- group.c: a command's process group, until nothing of it is left ---------------------- */

struct group {
	pid_t pgid;	/* the command's pid, and its group's id */
	int ws, exited; /* the command's wait status, once it exited */
	int stopped;	/* the command was stopped (Ctrl-Z, SIGTTIN) and not continued since */
	int ending;	/* 0; 1 SIGTERM sent, SIGKILL due at kill_at; 2 SIGKILL sent */
	long long kill_at;
	int untraced; /* set by the caller: note the command's stops and continues */
	int cont;     /* set by the caller: follow each signal but SIGKILL with SIGCONT, or a
		       * stopped group would not get it before it is continued */
};

/* Reaps the children that ended: the command (g->exited, g->ws), or what it left behind,
 * which the runner, the group's subreaper, inherits. */
void group_reap(struct group *g);
/* 1 while some process of the group is left (the command, or what it left behind). */
int group_left(const struct group *g);
/* Sends sig to the whole group (then SIGCONT, with g->cont). */
void group_signal(const struct group *g, int sig);
/* Ends the whole group: SIGTERM now, SIGKILL once `grace` ms have passed (group_tick);
 * once only. now: monotonic ms. */
void group_end(struct group *g, long long now, long long grace);
/* Sends the SIGKILL that group_end made due, when due at `now`. */
void group_tick(struct group *g, long long now);
/* The command's exit status: its own, 128 + N when signal N ended it. */
int group_status(const struct group *g);

/* ---- sse.c ----------------------------------------------------------------------------- */

/*
 * Receives one frame of an event stream: its id and event fields ("" when absent) and
 * its data lines joined by '\n' (len bytes, NUL-terminated). All are borrowed for the
 * duration of the call.
 */
typedef void (*sse_handler)(void *userdata, const char *id, const char *event, const char *data,
			    size_t len);

/* The state of one event stream being parsed. */
struct sse {
	sse_lines lines;  /* the bytes, split into fields (common/sse_lines.c) */
	struct sbuf data; /* the frame's data lines, each followed by '\n' */
	char event[64];	  /* its event: field */
	char id[32];	  /* its id: field */
	int has_data;
	size_t max; /* bytes a line or a frame's data may reach */
	sse_handler on_frame;
	void *userdata;
};

/* Starts a parser that calls on_frame(userdata, ...) for each complete frame. */
void sse_init(struct sse *s, size_t max_frame, sse_handler on_frame, void *userdata);
/* Forgets a partial line or frame: the stream starts again (a new connection). */
void sse_reset(struct sse *s);
/*
 * Parses n more bytes of the stream, cut anywhere; calls the handler for each frame they
 * complete. Returns 0, or -1 when a line or a frame exceeds max_frame bytes or memory
 * ran out (the stream cannot be followed further).
 */
int sse_feed(struct sse *s, const char *p, size_t n);
/* Frees the parser's buffers (accepts NULL). */
void sse_fini(struct sse *s);

/* ---- commands.c / demo.c / watch.c ----------------------------------------------------- */

/* What every command gets: the connection and the global options. */
struct cli {
	http *http;
	int json; /* --json: print the server's JSON instead of human output */
};

/* Whether a SIGTSTP would stop this process: not when its process group is orphaned (no
 * parent in another group of its session, a shell, to continue it), which the kernel then
 * spares the stop. */
int job_can_stop(void);
/*
 * Stops this process as Ctrl-Z stops a job (SIGTSTP at its default action) until something
 * continues it, while a keeper, a child in its process group with a connection of its own
 * (a clone of cli's), calls keep(kc, shared, arg) every 20 ms: a renewal or a heartbeat that
 * the stopped process cannot send. shared is a copy of state (size bytes) in memory both
 * see, copied back into state at the end. The keeper ends when this process runs again, or
 * when keep returns nonzero (what was kept is lost, and keep has acted on it), and then
 * continues this process. *ending: this process's flag of an ending signal (SIGINT,
 * SIGTERM, SIGHUP, SIGQUIT), which the keeper clears in its copy and watches. Returns 1
 * when keep gave up, 0 when continued otherwise, -1 when no keeper could be started
 * (nothing stopped).
 */
int job_stop_with_keeper(struct cli *cli, void *state, size_t size,
			 int (*keep)(struct cli *kc, void *shared, void *arg), void *arg,
			 volatile sig_atomic_t *ending);

/*
 * watch.c: appends the line that `watch` and `events` print for the event ev of type
 * `type` (without newline), "05:40:00.220  step_completed      worker-A    attempt 1  117ms":
 * its UTC time of day, its type, the step's worker and attempt, then what the type has
 * to say. Text from the server has its control characters replaced.
 */
void format_event_line(struct sbuf *b, const json_t *ev, const char *type);

/* Commands: argv[0] is the command name; each returns an exit status. */
int cmd_submit(struct cli *cli, int argc, char **argv);
int cmd_get(struct cli *cli, int argc, char **argv);
int cmd_list(struct cli *cli, int argc, char **argv);
int cmd_cancel(struct cli *cli, int argc, char **argv);
int cmd_events(struct cli *cli, int argc, char **argv);
int cmd_resources(struct cli *cli, int argc, char **argv);
int cmd_demo(struct cli *cli, int argc, char **argv);
int cmd_watch(struct cli *cli, int argc, char **argv);
int cmd_health(struct cli *cli, int argc, char **argv);
int cmd_delete(struct cli *cli, int argc, char **argv); /* admin.c */
int cmd_backup(struct cli *cli, int argc, char **argv); /* admin.c */
int cmd_lock(struct cli *cli, int argc, char **argv);	/* lock.c */
int cmd_limit(struct cli *cli, int argc, char **argv);	/* limit.c */
int cmd_worker(struct cli *cli, int argc, char **argv); /* worker.c */

/* Parses the options of a command that has none but --help (commands.c): -1 with optind
 * at its first operand, else the exit status the command must return (0 after --help,
 * EXIT_USAGE for an unknown option). */
int parse_no_options(int argc, char **argv);
/* Parses "CMD [-h] ARG" (commands.c); `what` names ARG in the usage error. Returns -1
 * with *arg set (borrowed from argv), else the exit status the command must return: 0
 * after --help, EXIT_USAGE. parse_workflow_id: ARG is a workflow ID. */
int parse_operand(int argc, char **argv, const char *what, const char **arg);
int parse_workflow_id(int argc, char **argv, const char **id);

/* main.c: prints the usage to out (stdout for --help, stderr for a usage error). */
void usage(FILE *out);
/* Prints "baton: <message>" and a hint to --help on stderr; returns EXIT_USAGE. */
int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* usage_error for the argument getopt_long just rejected (argv[optind - 1]). */
int bad_option(const char *cmd, char **argv);

#endif
