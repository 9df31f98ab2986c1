/*
 * faulty.h - a batond whose database writes can be made to fail, for the fault tests.
 *
 * The server is started with BATON_TEST_FAULT_FILE naming `file` in a fresh directory
 * (lib/vfs.c): while that file exists every write fails, with a full disk when the
 * file says "full", else with an I/O error. The fixture functions are cmocka setup and
 * teardown functions: *state is an hs_faulty. The seam is a SQLite VFS: on PostgreSQL
 * (hs_store_is_pg) the setup starts nothing and leaves *state NULL, and the tests skip.
 */
#ifndef BATON_TEST_FAULTY_H
#define BATON_TEST_FAULTY_H

#include <limits.h>

#include "harness.h"

typedef struct hs_faulty {
	hs_server *s;
	char dir[PATH_MAX], file[PATH_MAX + 16];
} hs_faulty;

int hs_faulty_setup(void **state);
int hs_faulty_teardown(void **state); /* stops the server (checked as hs_close does) */

#endif
