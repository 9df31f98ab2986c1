/*
 * pgpair.h - PostgreSQL failing over under the tests, on servers a test starts and stops
 * itself: a primary (scripts/pg.sh) and a streaming standby copied from it with
 * `pg_basebackup -R -X stream -c fast`, both on loopback in directories of their own under
 * /tmp. The tests crash a server (`pg_ctl stop -m immediate`), promote one (`pg_ctl
 * promote`), and read either through libpq, as PostgreSQL's own src/test/recovery does.
 *
 * Used by tests/http/test_failover.c and tests/http/test_lockfaults.c. The functions that
 * assert (node_crash, node_promote, wait_caught_up) fail the running cmocka test; the
 * others return 0 or -1 after printing why. Test thread only.
 */
#ifndef BATON_TEST_PGPAIR_H
#define BATON_TEST_PGPAIR_H

#include <stddef.h>

#include "harness.h"

typedef struct pg_node {
	char dir[128]; /* pg.sh's directory: data/, port, postgres.log */
	int port;
} pg_node;

typedef struct pair {
	pg_node n[2];	     /* n[0] starts as the primary, n[1] as its standby */
	hs_server *s, *node; /* batond, and a second node of its cluster */
} pair;

/* The PostgreSQL binaries (PG_BIN, else Debian's PostgreSQL 15). */
const char *pg_bin(void);
/* As root, the prefix that runs a command as the servers' user (pg.sh's choice); else "". */
const char *as_owner(void);
/* That user's name. */
const char *owner_name(void);
/* Runs a shell command (bounded by timeout(1), its output on stderr); 0 when it exited 0. */
int shell(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* scripts/pg.sh, or BATON_PG_SCRIPT. */
const char *pg_script(void);

/* pg.sh start on n->dir (a new cluster when it has no data/, else the data there, on the
 * port it had); sets n->port. 0 or -1. */
int node_start(pg_node *n);
/* pg.sh stop on n->dir (fast, then SIGKILL); nothing when n has no directory. */
void node_stop(pg_node *n);
/* A crash: no shutdown checkpoint, nothing more sent to the standby. */
void node_crash(pg_node *n);
/* pg_ctl promote, waited for. */
void node_promote(pg_node *n);
/* postgresql://postgres@127.0.0.1:PORT/baton */
void node_url(const pg_node *n, char *out, size_t size);
/* The first value of sql on the database baton of n, as an integer; -1 on failure. */
long long node_value(const pg_node *n, const char *sql);
/* Runs sql (no transaction block: ALTER SYSTEM) as the superuser on the database baton of
 * n. 0 or -1. */
int node_sql(const pg_node *n, const char *sql);
/* Waits until the standby n[1] has replayed everything the primary n[0] wrote so far. */
void wait_caught_up(const pair *p);
/* A new directory /tmp/baton-fo-XXXXXX for n. 0 or -1. */
int make_dir(pg_node *n);
/* Appends a line to n's postgresql.conf. 0 or -1. */
int append_conf(const pg_node *n, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Starts the primary n[0] with a database "baton", and the standby n[1] streaming from it.
 * 0, or -1 (what was started is left to pair_teardown). */
int start_servers(pair *p);
/* cmocka fixtures: *state a new pair, its servers started on PostgreSQL (on SQLite none);
 * teardown closes p->node and p->s, stops both servers and removes their directories
 * (kept under BATON_TEST_KEEP). */
int pair_setup(void **state);
int pair_teardown(void **state);

#endif
