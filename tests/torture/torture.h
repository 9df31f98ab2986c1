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

#include "../harness/fragile.h"
#include "../harness/harness.h"

#define NRES	    3 /* baton resources, one fragile instance each */
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
	int initial, max_delay, max_attempts;
	double backoff;
	char *body;
	int acked, unknown, posts; /* unknown: some POST of it got no answer */
	long status;		   /* the answer that settled the POST */
	/* read back after the run */
	char final[16];
	char step_status[MAX_STEPS][16];
	int attempts[MAX_STEPS];
	evt *ev;
	size_t nev;
} wf;

typedef struct run {
	uint64_t seed;
	int kills;
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
	int64_t t0;		    /* CLOCK_MONOTONIC ms at the start, as fragile's times */
	int64_t *killed_at, *up_at; /* per kill: SIGKILL sent, batond listening again */
	int64_t settle_max_ms;
} run;

const char *res_name(int i);

/* The checks (audit.c), on the acknowledged workflows once they are read back. */
void check_final(run *r, check *c);
void check_no_rerun(run *r, check *c, check *fencing);
void check_holds(run *r, check *c, int64_t last_token[NRES], int64_t grants[NRES]);
void check_retry_waits(run *r, check *c);
void check_resources(run *r, check *c);
/* After batond stopped: integrity_check (SQLite only), and the rows against the
 * acknowledgements and the history (last_token, grants: as check_holds counted them). */
void check_database(run *r, check *c, const int64_t last_token[NRES], const int64_t grants[NRES]);

#endif
