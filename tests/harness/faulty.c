/* faulty.c - see faulty.h. */
#include "faulty.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int hs_faulty_setup(void **state)
{
	*state = NULL;
	if (hs_store_is_pg())
		return 0; /* no VFS to fail there: the test skips */
	hs_faulty *f = calloc(1, sizeof *f);
	const char *tmp = getenv("TMPDIR");
	if (!f)
		return -1;
	snprintf(f->dir, sizeof f->dir, "%s/baton-fault-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(f->dir)) {
		free(f);
		return -1;
	}
	snprintf(f->file, sizeof f->file, "%s/fail-writes", f->dir);
	setenv("BATON_TEST_FAULT_FILE", f->file, 1);
	f->s = hs_open(NULL);
	unsetenv("BATON_TEST_FAULT_FILE");
	if (!f->s) {
		rmdir(f->dir);
		free(f);
		return -1;
	}
	*state = f;
	return 0;
}

int hs_faulty_teardown(void **state)
{
	hs_faulty *f = *state;
	if (!f)
		return 0;
	int rc = hs_close(f->s);
	unlink(f->file);
	rmdir(f->dir);
	free(f);
	return rc;
}
