/*
 * torture.h - what the crash torture's driver (torture.c) and its audit (audit.c) share:
 * the workflows it submitted, what the API said of them afterwards, and the checks.
 */
#ifndef BATON_TEST_TORTURE_H
#define BATON_TEST_TORTURE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "../harness/fragile.h"
#include "../harness/harness.h"

#define NRES	    6 /* baton resources at most, one fragile instance each */
#define NNODES	    3 /* batond nodes of the cluster torture (cluster.c) */
#define MAX_STEPS   6
#define SHOWN	    5 /* violations printed per check */
#define TS_SLACK_MS 5 /* event timestamps are ms, taken a little after the engine's `now` */

/* A check: its violations, the first few of them kept for the report. */
typedef struct check {
	const char *name;
	size_t violations, examined;
	char shown[SHOWN][320];
	char note[256];
} check;

void violation(check *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints the check as "[pass] name (note)" or "[FAIL] ..." with its first violations;
 * returns whether it passed. */
int report(const check *c);

enum kind { K_CALL, K_SIM, K_FAIL }; /* HTTP calls, simulated, fails for good */
enum ev_type { E_ACQ, E_REL, E_DONE, E_FAIL, E_INT, E_OTHER };

/* One event of a workflow's history, the fields the checks use. */
typedef struct evt {
	int64_t seq, ts;
	int type, step, attempt;
	int64_t token;	  /* lock_acquired, lock_released */
	int64_t retry_in; /* step_failed: -1 when null */
	int64_t next_at;  /* step_failed: -1 when null */
} evt;

typedef struct wf {
	char id[64];
	int res, kind, n, fail_step, cont; /* fail_step -1: none; cont: on_failure continue */
	int is_call[MAX_STEPS];
	int first_retry, max_delay, max_attempts;
	double backoff;
	char *body;
	int acked, unknown, posts; /* unknown: some POST of it got no answer */
	long status;		   /* the answer that settled the POST */
	/* read back after the run */
	char final[16];
	char step_status[MAX_STEPS][16];
	int attempts[MAX_STEPS];
	char node[MAX_STEPS][32]; /* the node of the step's latest attempt ("" when null) */
	evt *ev;
	size_t nev;
} wf;

typedef struct run {
	uint64_t seed;
	int kills;
	int nres; /* resources: 3 on one node, 6 on the cluster (more partitions, more owners) */
	fragile *res[NRES];
	char *op_url[NRES];
	hs_server *srv;
	atomic_int port; /* 0 while batond is down */
	atomic_bool stop;
	pthread_mutex_t mu; /* guards wfs and n while the submitter runs */
	wf **wfs;
	size_t n, cap;
	/* submission figures (submitter thread, read after join) */
	size_t posts, no_answer, busy, reposted_200, reposted_201;
	check submit;
	/* kill figures */
	int kills_done, restarts_failed, settle_waits, settle_timeouts;
	int db_restarts;	    /* PostgreSQL restarted under the running batond */
	int64_t t0;		    /* CLOCK_MONOTONIC ms at the start, as fragile's times */
	int64_t real_offset;	    /* cluster: CLOCK_REALTIME - CLOCK_MONOTONIC, ms */
	int64_t *killed_at, *up_at; /* per kill: SIGKILL sent, batond listening again */
	int64_t settle_max_ms;
	/* The cluster torture (cluster.c): nodes > 0. srv is node[0], whose database the
	 * others share; port is unused, each node's own is in node_port (0 while it is
	 * down or stopped). */
	int nodes, rounds;
	hs_server *node[NNODES];
	atomic_int node_port[NNODES];
	char node_id[NNODES][32];
	int faults[3];		  /* rounds done: SIGKILL, SIGSTOP past the lease, SIGTERM */
	unsigned fault_mask;	  /* the kinds drawn (TORTURE_FAULTS), a bit each as above */
	int term_bad;		  /* SIGTERMs that did not end in exit status 0 */
	int stop_waits_timed_out; /* SIGSTOPs after which the lease did not visibly expire */
	int64_t stop_max_ms;	  /* longest SIGSTOP */
	char (*fault_what)[32];	  /* per round: "SIGKILL of n1" ... (killed_at, up_at: its times) */
} run;

/* ---- shared by the single-node torture (torture.c) and the cluster's (cluster.c) ---- */

typedef struct client {
	void *c;  /* CURL *, kept between requests: one connection per node while it lives */
	int next; /* cluster: the node the next request goes to (round robin over live ones) */
} client;

uint64_t splitmix(uint64_t *s);
int rnd(uint64_t *s, int lo, int hi); /* uniform in [lo, hi] */
int64_t mono_ms(void);
void sleep_ms(int ms);
/* One request to batond (a live node, round robin, in the cluster). 0 when an answer
 * arrived (*status, *json: new reference or NULL), -1 when none did. */
int api(run *r, client *cl, const char *method, const char *path, const char *body, long *status,
	json_t **json);
void client_fini(client *cl);
/* The resources' script, the submitter thread, the wait for the acknowledged workflows
 * to finish (-1 on timeout) and the read-back of each (torture.c). */
void script_resource(fragile *f, uint64_t *rng, int timeouts);
void *submitter(void *arg);
int64_t drain(run *r, client *cl);
int collect(run *r, client *cl, wf *w);
/* Opens and scripts the resources, then batond (single node: r->nodes 0); 0, or -1
 * after printing why. */
int setup(run *r, int timeouts);
/* Closes the resources and frees the workflows (not the servers). */
void run_free(run *r);
/* Opens one batond with --allow-call for the resources and `more` arguments (NULL, or
 * NULL-terminated); on `first`'s database when first is not NULL. */
hs_server *open_batond(run *r, const hs_server *first, const char *const *more);

/* The cluster torture on PostgreSQL (cluster.c): adds its checks' counts to *passed and
 * *failed. */
void cluster_torture(uint64_t seed, int rounds, int *passed, int *failed);

const char *res_name(int i);

/* The checks (audit.c), on the acknowledged workflows once they are read back. */
void check_final(run *r, check *c);
void check_no_rerun(run *r, check *c, check *fencing);
void check_holds(run *r, check *c, int64_t last_token[NRES], int64_t grants[NRES]);
void check_retry_waits(run *r, check *c);
void check_resources(run *r, check *c);
/* The cluster's own (cluster.c, after collect and before the nodes stop): the attempts
 * log of the database against the history, and each step's node. */
void check_nodes(run *r, check *c);
/* After batond stopped: integrity_check (SQLite only), and the rows against the
 * acknowledgements and the history (last_token, grants: as check_holds counted them). */
void check_database(run *r, check *c, const int64_t last_token[NRES], const int64_t grants[NRES]);

#endif
