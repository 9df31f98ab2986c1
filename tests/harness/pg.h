/*
 * pg.h - the harness's PostgreSQL side (pg.c), for harness.c: the databases it creates
 * for each server on the server of BATON_TEST_PG, and its reads of them. The tests use
 * harness.h (hs_store_is_pg, hs_db_url, hs_pg_restart ...), not this.
 *
 * Every function connects anew (libpq, a 10 s connect timeout), prints what went wrong
 * to stderr, and may be called from any thread.
 */
#ifndef BATON_TEST_PG_H
#define BATON_TEST_PG_H

#include <stddef.h>

/*
 * Writes into out the URL `base` (a libpq URI, postgresql:// or postgres://) with its
 * database name replaced by `name`; its user, host, port and parameters are kept.
 * Returns 0, or -1 when base is not a URI or out is too small.
 */
int pg_url_with_db(const char *base, const char *name, char *out, size_t size);

/* Creates database `name` (a plain identifier) on the server of BATON_TEST_PG, dropping
 * first a leftover of that name (one of a crashed run by a process of the same pid).
 * 0 or -1. */
int pg_db_create(const char *name);

/* Drops database `name`, ending its connections (DROP DATABASE ... WITH (FORCE)); a
 * database that does not exist is no error. 0 or -1. */
int pg_db_drop(const char *name);

/* Runs `sql` on the database of `url` and returns the first column of its first row as
 * an integer; -1 when it failed, returned no row or a NULL. */
long long pg_db_count(const char *url, const char *sql);

/* Opens a session on the database of `url` and runs `sql` in a transaction it leaves open,
 * so that the locks it took stay held until pg_db_unhold rolls it back and closes the
 * session. The session, or NULL when it failed. */
void *pg_db_hold(const char *url, const char *sql);
void pg_db_unhold(void *session); /* accepts NULL */

#endif
