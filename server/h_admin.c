/*
 * h_admin.c - the operator's handlers: GET /backup, a consistent copy of the SQLite
 * database taken while batond runs.
 *
 * The copy is written to a temporary file (in $TMPDIR, else /tmp) by the library's
 * online backup, which reads from a connection of its own and never holds the engine
 * up; the file is unlinked as soon as it is open, so that nothing is left behind
 * whatever happens to the transfer, and libmicrohttpd sends it from the descriptor.
 */
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int h_backup(srv *s, const request *r, const char *const *p, response *out)
{
	(void)r;
	(void)p;
	const char *dir = getenv("TMPDIR");
	char path[4096];
	snprintf(path, sizeof path, "%s/baton-backup-XXXXXX", dir && *dir ? dir : "/tmp");
	int fd = mkstemp(path);
	if (fd < 0)
		return reply_problem(out, 503, "cannot make a temporary file for the copy: %s",
				     strerror(errno));
	close(fd); /* SQLite writes it; an empty file is an empty database to it */
	baton_error err = {0};
	int rc = baton_engine_backup(s->engine, path, &err);
	fd = rc == BATON_OK ? open(path, O_RDONLY | O_CLOEXEC) : -1;
	int open_errno = errno;
	unlink(path);
	if (rc == BATON_ECONFLICT)
		return reply_problem(out, 501, "%s", err.msg);
	if (rc)
		return reply_error(out, &err);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0) {
		if (fd >= 0)
			close(fd);
		return reply_problem(out, 503, "cannot read the copy back: %s",
				     strerror(fd < 0 ? open_errno : errno));
	}
	out->stream = MHD_create_response_from_fd64((uint64_t)st.st_size, fd);
	if (!out->stream) {
		close(fd);
		return reply_problem(out, 500, "out of memory");
	}
	srv_log(BATON_LOG_INFO, "backup: a copy of %lld bytes is being sent",
		(long long)st.st_size);
	out->status = 200;
	out->content_type = "application/vnd.sqlite3";
	return 200;
}
