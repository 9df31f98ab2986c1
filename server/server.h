/*
 * server.h - what the files of batond share: configuration, logging, the HTTP layer's
 * request/response types, and the route handlers.
 */
#ifndef BATOND_SERVER_H
#define BATOND_SERVER_H

#include "baton.h"

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* ---- config.c ---- */
#define MAX_ALLOW_CALL 32
typedef struct config {
	char listen[300]; /* HOST:PORT as given */
	char host[256];
	int port;
	char db[4096];
	int threads; /* steps running at once */
	int http_threads;
	int log_level;
	int64_t shutdown_timeout_ms;
	int64_t retention_ms; /* 0: finished workflows are kept for ever */
	size_t max_body;
	/* --allow-call prefixes, NULL-terminated; point into allow_buf or argv */
	const char *allow_call[MAX_ALLOW_CALL + 1];
	int n_allow_call;
	char allow_buf[4096];
	int max_connections;
	int conn_timeout_s;
	int max_per_ip; /* 0: no limit */
	size_t conn_memory;
	char token[512]; /* empty: no access control */
	int log_json;
	int idle_resources;	   /* free resources kept in memory */
	char node_id[65];	   /* default: the host name and a suffix from listen */
	int64_t lease_ms;	   /* a cluster node's lease */
	int64_t commit_timeout_ms; /* a request's wait for its commit */
	int require_sync;	   /* --require-sync-replication */
	long long cache_bytes;	   /* finished workflows' text in memory; 0: no cache */
	long long stream_buffer;   /* bytes one event stream buffers at most */
	char pid_file[4096];	   /* empty: none */
	char advertise_url[256];   /* how the other nodes reach this one; empty: they cannot */
	int console_actions;	   /* the console offers its actions (ui.c) */
	char console_dir[4096];	   /* the console's files from here (empty: those built in) */
	char accept_sysid[24];	   /* a PostgreSQL system_identifier to accept; empty: none */
} config;

/* 0: run; 1: done (--help, --version printed); -1: invalid, message printed. */
int config_load(config *c, int argc, char **argv);
/* Without --advertise-url: http:// and the host of --listen with the port it listens on,
 * the host name in place of an address of every interface (:PORT, 0.0.0.0, ::). */
void config_default_advertise_url(config *c, int port);

/* ---- log.c ---- */
extern int srv_log_level;
extern int srv_log_json;
void srv_log_line(int level, const char *wf_id, const char *msg);
void srv_logf(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define srv_log(level, ...)                                                                        \
	do {                                                                                       \
		if ((level) >= srv_log_level)                                                      \
			srv_logf((level), __VA_ARGS__);                                            \
	} while (0)
/* baton_log_fn for the engine. */
void srv_engine_log(void *ud, int level, const char *wf_id, const char *msg);
void srv_engine_log_flush(void *ud);
void srv_log_close(void);	    /* after the engine is closed */
int srv_parse_level(const char *s); /* -1 when unknown */

/* ---- http.c ---- */
typedef struct srv {
	const config *cfg;
	baton_engine *engine;
	struct MHD_Daemon *daemon;
	int port;	 /* the bound port */
	int dual_stack;	 /* --listen :PORT bound IPv6 and IPv4 (else IPv4 only) */
	int connections; /* open now, under conn_mu */
	pthread_mutex_t conn_mu;
	/* Requests waiting for the engine (wait.c), under wait_mu: srv_stop waits for them,
	 * since their connections are suspended until the engine answers. */
	pthread_mutex_t wait_mu;
	pthread_cond_t wait_cv;
	int waiting, closing;
} srv;

struct request;
struct response;
/* Builds the answer of a request that waited, from its data (wait.c); returns the status. */
typedef int (*wait_finish_fn)(srv *s, struct request *r, void *data, struct response *out);
typedef void (*wait_discard_fn)(srv *s, void *data);
enum { WAIT_NONE, WAIT_ENGINE, WAIT_ANSWERED };
/* A request's wait for the engine (wait.c; state and suspended under srv.wait_mu). */
typedef struct srv_wait {
	srv *srv;
	int state; /* WAIT_NONE, WAIT_ENGINE (its connection suspended), WAIT_ANSWERED */
	int suspended;
	void *data; /* malloc'd by the handler, filled by the engine's callback, freed here */
	wait_finish_fn finish;
	wait_discard_fn discard; /* the engine's answer dropped unsent (NULL: nothing to do) */
	const char *route;	 /* the matched pattern, for the answer's metrics */
} srv_wait;

#define MAX_FORWARD_URL 256 /* a node's --advertise-url (forward.c) */

typedef struct request {
	struct MHD_Connection *conn;
	const char *method;
	const char *path;
	const char *route; /* the matched pattern, for metrics */
	int status;	   /* the answer, for metrics */
	int streaming;
	struct timespec started;
	char *body;
	size_t body_len, body_cap;
	int too_large;
	srv_wait wait;			  /* while the engine has it (wait.c) */
	int fd;				  /* the client's socket */
	const char *forwarded_by;	  /* Baton-Forwarded: passed on by that node (forward.c) */
	const char *authorization;	  /* as the client sent it, to pass on */
	char lease_granted[48];		  /* a lease granted in this answer (h_leases.c) */
	char granted_by[MAX_FORWARD_URL]; /* the node that granted it, when passed on */
	int64_t granted_attempt;	  /* the attempt of it that this answer tells */
	char task_claimed[200];		  /* a task claimed in this answer (h_tasks.c) */
	int64_t claim_attempt;		  /* and the claim attempt it tells */
	char claimed_by[MAX_FORWARD_URL]; /* the node that answered the claim, when passed on */
} request;

void srv_forward_counts(unsigned long long *total, unsigned long long *failed);

typedef struct response {
	int status;
	json_t *body;		     /* stolen when the response is sent */
	char *text;		     /* malloc'd plain body, used instead of body when set */
	struct MHD_Response *stream; /* a streaming response, used instead of both */
	const char *route;
	const char *content_type;
	char location[300];
	char allow[64];
	const char *www_authenticate;
	int retry_after; /* seconds, 0: no Retry-After */
	int pending;	 /* the connection is suspended; the answer comes later */
	/* A console file (ui.c): cached while its ETag holds, under the console's
	 * Content-Security-Policy. */
	char etag[48];
	int console_file;
} response;

/* ---- forward.c: requests passed on to the node that drives their resource ---- */
typedef struct srv_forward {
	long status; /* the owner's answer; 0: none came (why) */
	char *body;
	size_t body_len;
	char content_type[128];
	char location[300];
	int retry_after;
	char why[256];
	char node[130];		   /* the owner */
	char url[MAX_FORWARD_URL]; /* and its --advertise-url */
	char auth[600];		   /* "Authorization: ..." as the client sent it */
} srv_forward;

/* Passes r on to the node `node` at url in the background, for up to timeout_ms; when
 * waits, a client that goes away meanwhile cuts the exchange. Once f holds the answer
 * (or why none came), srv_wait_done(r). 0 when started; -1 when r may not or cannot be
 * passed on (it was passed on to this node already, no url, too many at once). */
int srv_forward_start(srv *s, request *r, srv_forward *f, const char *node, const char *url,
		      int64_t timeout_ms, int waits);
/* When the engine's answer (rc, its JSON) refuses r because another node drives the
 * resource, passes r on to that node (srv_forward_start, for the request's own wait_ms
 * and FORWARD_SLACK_MS more) and returns 1: r is answered by forward.c. *forwarded is set
 * before the exchange starts (its answer may be built before this returns), and left 1
 * only then. */
int srv_forward_refused(request *r, int rc, const json_t *answer, srv_forward *f, int64_t wait_ms,
			int waits, int *forwarded);
/* The answer to relay (f->status 0: 503 naming the owner). */
int srv_forward_reply(const srv_forward *f, response *out);
void srv_forward_fini(srv_forward *f);
/* DELETE /leases/{id}?attempt=N at the node at url: a lease it granted for a client that
 * has gone, given back naming the attempt it answered. 0 when released (or found ended, or
 * kept by a later attempt). Blocks for up to 5 s. */
int srv_forward_give_back(srv *s, const char *url, const char *authorization, const char *id,
			  int64_t attempt);
/* POST /tasks/{id}/give-back {"claim_attempt": N} at the node at url: a claim it answered
 * for a worker that has gone, given back naming its claim_attempt. 0 as above. */
int srv_forward_claim_give_back(srv *s, const char *url, const char *authorization, const char *id,
				int64_t claim_attempt);
/* Cuts every exchange under way and waits for their threads; none starts after. */
void srv_forwards_stop(void);
/* The Authorization value that f passes on, NULL when none. */
const char *srv_forward_auth(const srv_forward *f);
/* Whether the engine's answer (rc, its JSON) refuses because another node drives the
 * resource and says where that node is: the request is then passed on to it. */
int srv_forwardable(int rc, const json_t *answer);
/* In a 503 answer, "driven_by": {"node", "url"} from such a refusal. */
void srv_driven_by(int rc, json_t *answer, response *out);
/* How much longer than the request's own wait an exchange may take. */
#define FORWARD_SLACK_MS 15000

int srv_start(srv *s, baton_error *err);
void srv_stop(srv *s);

/* Fills out with a problem+json body (RFC 9457); returns status. */
int reply_problem(response *out, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Maps a library error to its HTTP problem. */
int reply_error(response *out, const baton_error *err);
int reply_json(response *out, int status, json_t *body /* stolen */);
const char *query_arg(const request *r, const char *name);
/* text as a whole number from lo to hi into *v: 0, or -1 (then *v is untouched). */
int srv_parse_int(const char *text, long long lo, long long hi, long long *v);
/*
 * ?name=N as a whole number from lo to hi: *v is left as it is (the default) when the
 * parameter is absent; -1 with a 400 in out when it is malformed or out of range.
 */
int query_int(const request *r, const char *name, long long lo, long long hi, long long *v,
	      response *out);

/* ---- wait.c: handlers that wait for the engine without holding a thread ---- */
/* Counts r as waiting for the engine, which will fill `data` (malloc'd; owned by r from
 * now on, freed after `finish` or when r ends); -1 with a 503 in out when the server is
 * closing (data is freed). */
int srv_wait_begin(srv *s, request *r, void *data, wait_finish_fn finish, response *out);
/* The engine refused r's work synchronously: r no longer waits. */
void srv_wait_cancel(srv *s, request *r);
/* The handler's return after handing r to the engine: suspends the connection (answer
 * pending), or, when the engine already answered, finishes at once. */
int srv_wait_suspend(srv *s, request *r, response *out);
/* From the engine's callback, once data is filled: resumes the connection. Any thread. */
void srv_wait_done(request *r);
/* In http.c's final call: whether the engine has answered r (it was resumed for it). */
int srv_wait_answered(srv *s, request *r);
/* Builds the answer with the handler's finish function. */
int srv_wait_finish(srv *s, request *r, response *out);
/* NOTIFY_COMPLETED: a request that ends with an answer it never sent. */
void srv_wait_abandoned(srv *s, request *r);
/* What srv_wait_abandoned calls on data that the engine answered into when the connection
 * closed before finish ran: to release what the answer holds. */
void srv_wait_on_discard(request *r, wait_discard_fn discard);
/* Stops taking waiting requests and waits until every one with the engine is answered. */
void srv_waits_drain(srv *s);

/* ---- routes.c ---- */
#define MAX_PARAMS 2
typedef int (*handler_fn)(srv *s, const request *r, const char *const *params, response *out);
#define MAX_SEGMENT 256
typedef struct route_def {
	const char *method;
	const char *pattern;
	handler_fn handler;
} route_def;
/* The route for method and path, its "{x}" segments copied into caps; NULL when none
 * matches, with allow listing the methods the path has (empty: unknown path). */
const route_def *route_lookup(const char *method, const char *path,
			      char caps[MAX_PARAMS][MAX_SEGMENT], char *allow, size_t allow_len);
void route(srv *s, const request *r, response *out);

/* ---- handlers ---- */
#define MAX_EVENT_LIMIT	    10000 /* ?limit of the event lists */
#define DEFAULT_EVENT_LIMIT 1000  /* without ?limit */
#define MAX_STEP_LIMIT	    1000  /* ?limit of GET /workflows/{id}/steps */
#define DEFAULT_STEP_LIMIT  100
#define MAX_LIST_LIMIT	    1000 /* ?limit of GET /workflows */
int h_workflows_create(srv *s, const request *r, const char *const *p, response *out);
int h_workflows_list(srv *s, const request *r, const char *const *p, response *out);
int h_workflow_get(srv *s, const request *r, const char *const *p, response *out);
int h_workflow_events(srv *s, const request *r, const char *const *p, response *out);
int h_workflow_steps(srv *s, const request *r, const char *const *p, response *out);
int h_workflow_cancel(srv *s, const request *r, const char *const *p, response *out);
int h_workflow_delete(srv *s, const request *r, const char *const *p, response *out);
int h_backup(srv *s, const request *r, const char *const *p, response *out);
int h_resources_list(srv *s, const request *r, const char *const *p, response *out);
int h_resource_get(srv *s, const request *r, const char *const *p, response *out);
int h_resource_put(srv *s, const request *r, const char *const *p, response *out);
int h_healthz(srv *s, const request *r, const char *const *p, response *out);
int h_readyz(srv *s, const request *r, const char *const *p, response *out);
int h_nodes(srv *s, const request *r, const char *const *p, response *out);
int h_resource_events(srv *s, const request *r, const char *const *p, response *out);
int h_metrics(srv *s, const request *r, const char *const *p, response *out);
int h_lease_acquire(srv *s, const request *r, const char *const *p, response *out);
int h_lease_get(srv *s, const request *r, const char *const *p, response *out);
int h_lease_release(srv *s, const request *r, const char *const *p, response *out);
int h_lease_renew(srv *s, const request *r, const char *const *p, response *out);
/* Parses the request body as JSON (h_workflows.c); on failure fills out, returns status. */
int read_json_body(const request *r, response *out, json_t **body);

/* ---- h_leases.c ---- */
/* A request whose answer granted a lease ended without sending it: the lease is released. */
void srv_lease_unsent(srv *s, request *r);
/* Before the waits drain: waiting acquisitions are answered, the socket watch stops. */
void srv_leases_stop(srv *s);
/* 1 when the peer of socket fd has closed its side; the socket of a connection. */
int srv_peer_gone(int fd);
int srv_conn_fd(struct MHD_Connection *c);
/* Small JSON body readers: 0, or the 400 status with out filled. An absent member leaves
 * *v as it is. optional_body: an empty body is {}. */
int body_field_int(const json_t *body, const char *key, long long lo, long long hi, int64_t *v,
		   response *out);
int body_field_str(const json_t *body, const char *key, const char **v, response *out);
int body_field_bool(const json_t *body, const char *key, int *v, response *out);
int body_only_fields(const json_t *body, const char *const *keys, response *out);
int body_optional_body(const request *r, response *out, json_t **body);

/* ---- h_tasks.c ---- */
int h_task_claim(srv *s, const request *r, const char *const *p, response *out);
int h_task_heartbeat(srv *s, const request *r, const char *const *p, response *out);
int h_task_complete(srv *s, const request *r, const char *const *p, response *out);
int h_task_fail(srv *s, const request *r, const char *const *p, response *out);
int h_task_give_back(srv *s, const request *r, const char *const *p, response *out);
/* A request whose answer gave out a task ended without sending it: the task is offered again. */
void srv_task_unsent(srv *s, request *r);

/* ---- sse.c ---- */
void srv_streams_notify(void *ud, const baton_change *changes, size_t n); /* baton_commit_fn */
/* poll_ms: streams also look at the store this often (0: only after this node's commits). */
int srv_streams_start(int poll_ms);
void srv_streams_close(void);
int srv_streams_count(void);
int srv_wants_stream(const request *r);
int srv_stream_start(srv *s, const request *r, int is_resource, const char *key, int64_t after,
		     response *out);

/* ---- ui.c: the console, its files served at /ui/ without the token ---- */
int h_ui_file(srv *s, const request *r, const char *const *p, response *out);
int h_ui_redirect(srv *s, const request *r, const char *const *p, response *out);
/* 1 when path is one of the console's (its files hold no data: no token needed). */
int srv_ui_path(const char *path);

/* ---- shutdown.c ---- */
/* Logs what the shutdown after signal sig waits for (running steps, until when). */
void srv_shutdown_announce(baton_engine *e, int sig, int64_t timeout_ms);
/* Starts the thread that takes the next of sigs (blocked in every thread): it logs that
 * batond stops now and exits 1 at once, without waiting for running steps. */
void srv_shutdown_watch(const sigset_t *sigs);
/* Writes this process's id to path (0600: a temporary file beside it, renamed over it)
 * and remembers path for srv_pid_file_remove. 0, or -1 with the reason in err. */
int srv_pid_file_write(const char *path, baton_error *err);
/* Removes the file srv_pid_file_write wrote if it still holds this process's id. */
void srv_pid_file_remove(void);

/* ---- metrics.c ---- */
void srv_metrics_request(const char *route, const char *method, int status, double seconds,
			 int streaming);

#endif
