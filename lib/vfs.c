/*
 * vfs.c - baton's SQLite VFS: a thin layer over the default one with two jobs.
 *
 * Commits in one write. SQLite writes a commit's WAL frames with two system calls each
 * (a 24-byte frame header, then the page) and then syncs; on a virtual disk each call
 * costs several microseconds, so a step's commit of seven pages spent more time in
 * pwrite than a one-page commit spends in total, and a group commit of hundreds of pages
 * far more. Here the writes to a WAL file are gathered in memory while each continues
 * the previous one, and written with one pwrite before anything else touches the file:
 * a sync, a read, a truncate, a size, a write elsewhere. Nothing is durable before the
 * sync in either case, and nobody reads a frame before the commit's sync (other
 * connections learn of frames from the WAL index, which SQLite updates after writing
 * and syncing them), so what reaches the disk and when it is durable is unchanged.
 * This relies on a sync at every commit, that is synchronous=FULL, which store.c sets:
 * with NORMAL, SQLite would publish frames this layer still holds.
 *
 * One process. The layer sits on SQLite's "unix-excl" VFS: the first lock on the database
 * takes an exclusive POSIX lock for the whole process, held until the file is closed.
 * Connections of this process share the file as usual (its WAL index lives in heap
 * memory instead of the -shm file), but take their locks without a system call: a
 * transaction used to cost six fcntl calls. And another process, a second batond on
 * the same file above all, cannot open it while batond runs (store.c says so).
 *
 * Faults for tests. Opened with a control file (engine config fault_file; batond: the
 * environment variable BATON_TEST_FAULT_FILE), then while that file exists every xWrite,
 * xTruncate and xSync fails: with SQLITE_FULL when the file's first word is "full", else
 * with SQLITE_IOERR_WRITE (SQLITE_IOERR_FSYNC for xSync). Reads always work.
 */
#include "sqlite.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Gathered at most; a larger commit is written in several gatherings. */
#define GATHER_MAX (1 << 20)
/* Kept between commits at most: a rare large commit does not hold its buffer. */
#define GATHER_KEEP (256 << 10)
/* Written per call at most: SQLite's unix VFS takes at most 128 KiB - 1 per write. */
#define WRITE_MAX (124 << 10)

typedef struct baton_file {
	sqlite3_file base;
	sqlite3_file *real; /* lives right after this struct */
	int faults;	    /* opened through the fault-injecting VFS */
	int wal;	    /* a WAL file: writes are gathered */
	char *buf;	    /* gathered bytes, for the file at off */
	size_t len, cap;
	sqlite3_int64 off;
} baton_file;

static sqlite3_vfs *real_vfs;
static char control_path[4096];

/* 0 when writes may go through, else the SQLite code to fail them with. */
static int fault_code(const baton_file *bf, int io_code)
{
	if (!bf->faults)
		return 0;
	FILE *f = fopen(control_path, "r");
	if (!f)
		return 0;
	char word[8] = "";
	size_t n = fread(word, 1, sizeof word - 1, f);
	fclose(f);
	word[n] = 0;
	return strncmp(word, "full", 4) == 0 ? SQLITE_FULL : io_code;
}

#define BF(f)	((baton_file *)(f))
#define REAL(f) (BF(f)->real)

/* Writes what was gathered; on failure it is dropped (the commit fails with the code). */
static int flush(sqlite3_file *f)
{
	baton_file *bf = BF(f);
	if (!bf->len)
		return SQLITE_OK;
	int rc = fault_code(bf, SQLITE_IOERR_WRITE);
	for (size_t at = 0; !rc && at < bf->len; at += WRITE_MAX) {
		size_t n = bf->len - at < WRITE_MAX ? bf->len - at : WRITE_MAX;
		rc = REAL(f)->pMethods->xWrite(REAL(f), bf->buf + at, (int)n,
					       bf->off + (sqlite3_int64)at);
	}
	bf->len = 0;
	if (bf->cap > GATHER_KEEP) {
		free(bf->buf);
		bf->buf = NULL;
		bf->cap = 0;
	}
	return rc;
}

/* Appends to the gathered bytes; 0 when they do not continue them or do not fit. */
static int gather(baton_file *bf, const void *b, int n, sqlite3_int64 off)
{
	size_t need = bf->len + (size_t)n;
	if ((bf->len && off != bf->off + (sqlite3_int64)bf->len) || need > GATHER_MAX)
		return 0;
	if (need > bf->cap) {
		size_t cap = bf->cap ? bf->cap : 64 << 10;
		while (cap < need)
			cap *= 2;
		char *p = realloc(bf->buf, cap);
		if (!p)
			return 0; /* written directly instead */
		bf->buf = p;
		bf->cap = cap;
	}
	if (!bf->len)
		bf->off = off;
	memcpy(bf->buf + bf->len, b, (size_t)n);
	bf->len = need;
	return 1;
}

static int f_close(sqlite3_file *f)
{
	int rc = REAL(f)->pMethods ? flush(f) : SQLITE_OK;
	int rc2 = REAL(f)->pMethods ? REAL(f)->pMethods->xClose(REAL(f)) : SQLITE_OK;
	free(BF(f)->buf);
	BF(f)->buf = NULL;
	return rc ? rc : rc2;
}
static int f_read(sqlite3_file *f, void *b, int n, sqlite3_int64 off)
{
	int rc = flush(f);
	return rc ? rc : REAL(f)->pMethods->xRead(REAL(f), b, n, off);
}
static int f_write(sqlite3_file *f, const void *b, int n, sqlite3_int64 off)
{
	baton_file *bf = BF(f);
	int rc = fault_code(bf, SQLITE_IOERR_WRITE);
	if (rc)
		return rc;
	if (bf->wal) {
		if (gather(bf, b, n, off))
			return SQLITE_OK;
		if ((rc = flush(f)) || gather(bf, b, n, off))
			return rc;
	}
	return REAL(f)->pMethods->xWrite(REAL(f), b, n, off);
}
static int f_truncate(sqlite3_file *f, sqlite3_int64 size)
{
	int rc = flush(f);
	if (!rc)
		rc = fault_code(BF(f), SQLITE_IOERR_TRUNCATE);
	return rc ? rc : REAL(f)->pMethods->xTruncate(REAL(f), size);
}
static int f_sync(sqlite3_file *f, int flags)
{
	int rc = flush(f);
	if (!rc)
		rc = fault_code(BF(f), SQLITE_IOERR_FSYNC);
	return rc ? rc : REAL(f)->pMethods->xSync(REAL(f), flags);
}
static int f_size(sqlite3_file *f, sqlite3_int64 *size)
{
	int rc = flush(f);
	return rc ? rc : REAL(f)->pMethods->xFileSize(REAL(f), size);
}
static int f_lock(sqlite3_file *f, int l)
{
	return REAL(f)->pMethods->xLock(REAL(f), l);
}
static int f_unlock(sqlite3_file *f, int l)
{
	return REAL(f)->pMethods->xUnlock(REAL(f), l);
}
static int f_reserved(sqlite3_file *f, int *out)
{
	return REAL(f)->pMethods->xCheckReservedLock(REAL(f), out);
}
static int f_control(sqlite3_file *f, int op, void *arg)
{
	int rc = flush(f);
	return rc ? rc : REAL(f)->pMethods->xFileControl(REAL(f), op, arg);
}
static int f_sector(sqlite3_file *f)
{
	return REAL(f)->pMethods->xSectorSize(REAL(f));
}
static int f_device(sqlite3_file *f)
{
	return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f));
}
static int f_shm_map(sqlite3_file *f, int pg, int sz, int extend, void volatile **pp)
{
	return REAL(f)->pMethods->xShmMap(REAL(f), pg, sz, extend, pp);
}
static int f_shm_lock(sqlite3_file *f, int off, int n, int flags)
{
	return REAL(f)->pMethods->xShmLock(REAL(f), off, n, flags);
}
static void f_shm_barrier(sqlite3_file *f)
{
	REAL(f)->pMethods->xShmBarrier(REAL(f));
}
static int f_shm_unmap(sqlite3_file *f, int del)
{
	return REAL(f)->pMethods->xShmUnmap(REAL(f), del);
}
static int f_fetch(sqlite3_file *f, sqlite3_int64 off, int n, void **pp)
{
	return REAL(f)->pMethods->xFetch(REAL(f), off, n, pp);
}
static int f_unfetch(sqlite3_file *f, sqlite3_int64 off, void *p)
{
	return REAL(f)->pMethods->xUnfetch(REAL(f), off, p);
}

static const sqlite3_io_methods baton_methods = {
    3,		f_close,       f_read,	    f_write,   f_truncate, f_sync,   f_size,
    f_lock,	f_unlock,      f_reserved,  f_control, f_sector,   f_device, f_shm_map,
    f_shm_lock, f_shm_barrier, f_shm_unmap, f_fetch,   f_unfetch,
};

static int v_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *out)
{
	baton_file *bf = BF(f);
	*bf = (baton_file){.real = (sqlite3_file *)(bf + 1),
			   .faults = vfs->pAppData != NULL,
			   .wal = (flags & SQLITE_OPEN_WAL) != 0};
	int rc = real_vfs->xOpen(real_vfs, name, bf->real, flags, out);
	f->pMethods = rc == SQLITE_OK ? &baton_methods : NULL;
	return rc;
}
static int v_delete(sqlite3_vfs *v, const char *name, int sync)
{
	(void)v;
	return real_vfs->xDelete(real_vfs, name, sync);
}
static int v_access(sqlite3_vfs *v, const char *name, int flags, int *out)
{
	(void)v;
	return real_vfs->xAccess(real_vfs, name, flags, out);
}
static int v_full(sqlite3_vfs *v, const char *name, int n, char *out)
{
	(void)v;
	return real_vfs->xFullPathname(real_vfs, name, n, out);
}
static void *v_dlopen(sqlite3_vfs *v, const char *name)
{
	(void)v;
	return real_vfs->xDlOpen(real_vfs, name);
}
static void v_dlerror(sqlite3_vfs *v, int n, char *out)
{
	(void)v;
	real_vfs->xDlError(real_vfs, n, out);
}
static void (*v_dlsym(sqlite3_vfs *v, void *h, const char *sym))(void)
{
	(void)v;
	return real_vfs->xDlSym(real_vfs, h, sym);
}
static void v_dlclose(sqlite3_vfs *v, void *h)
{
	(void)v;
	real_vfs->xDlClose(real_vfs, h);
}
static int v_random(sqlite3_vfs *v, int n, char *out)
{
	(void)v;
	return real_vfs->xRandomness(real_vfs, n, out);
}
static int v_sleep(sqlite3_vfs *v, int us)
{
	(void)v;
	return real_vfs->xSleep(real_vfs, us);
}
static int v_time(sqlite3_vfs *v, double *out)
{
	(void)v;
	return real_vfs->xCurrentTime(real_vfs, out);
}
static int v_lasterr(sqlite3_vfs *v, int n, char *out)
{
	(void)v;
	return real_vfs->xGetLastError(real_vfs, n, out);
}
static int v_time64(sqlite3_vfs *v, sqlite3_int64 *out)
{
	(void)v;
	return real_vfs->xCurrentTimeInt64(real_vfs, out);
}

static sqlite3_vfs plain_vfs, fault_vfs;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init_vfs(void)
{
	real_vfs = sqlite3_vfs_find("unix-excl");
	plain_vfs = (sqlite3_vfs){
	    .iVersion = 2,
	    .szOsFile = (int)sizeof(baton_file) + real_vfs->szOsFile,
	    .mxPathname = real_vfs->mxPathname,
	    .zName = "baton",
	    .xOpen = v_open,
	    .xDelete = v_delete,
	    .xAccess = v_access,
	    .xFullPathname = v_full,
	    .xDlOpen = v_dlopen,
	    .xDlError = v_dlerror,
	    .xDlSym = v_dlsym,
	    .xDlClose = v_dlclose,
	    .xRandomness = v_random,
	    .xSleep = v_sleep,
	    .xCurrentTime = v_time,
	    .xGetLastError = v_lasterr,
	    .xCurrentTimeInt64 = v_time64,
	};
	fault_vfs = plain_vfs;
	fault_vfs.zName = "baton-fault";
	fault_vfs.pAppData = control_path;
	sqlite3_vfs_register(&plain_vfs, 0);
	sqlite3_vfs_register(&fault_vfs, 0);
}

const char *baton_vfs(const char *control)
{
	pthread_once(&once, init_vfs);
	if (!control)
		return plain_vfs.zName;
	snprintf(control_path, sizeof control_path, "%s", control);
	return fault_vfs.zName;
}
