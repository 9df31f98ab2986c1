/*
 * faultvfs.c - a SQLite VFS that wraps the default one and fails writes on demand: the
 * seam through which tests prove what baton does when its disk fails.
 *
 * While the control file named at registration exists, every xWrite, xTruncate and
 * xSync fails: with SQLITE_FULL when the file's first word is "full", else with
 * SQLITE_IOERR_WRITE (SQLITE_IOERR_FSYNC for xSync). Reads always work. The store uses
 * this VFS only when the engine is opened with a fault_file (batond: the environment
 * variable BATON_TEST_FAULT_FILE); otherwise nothing here runs.
 */
#include "internal.h"

#include <sqlite3.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef struct fault_file {
	sqlite3_file base;
	sqlite3_file *real; /* lives right after this struct */
} fault_file;

static sqlite3_vfs *real_vfs;
static char control_path[4096];

/* 0 when writes may go through, else the SQLite code to fail them with. */
static int fault_code(int io_code)
{
	FILE *f = fopen(control_path, "r");
	if (!f)
		return 0;
	char word[8] = "";
	size_t n = fread(word, 1, sizeof word - 1, f);
	fclose(f);
	word[n] = 0;
	return strncmp(word, "full", 4) == 0 ? SQLITE_FULL : io_code;
}

#define REAL(f) (((fault_file *)(f))->real)

static int f_close(sqlite3_file *f)
{
	return REAL(f)->pMethods ? REAL(f)->pMethods->xClose(REAL(f)) : SQLITE_OK;
}
static int f_read(sqlite3_file *f, void *b, int n, sqlite3_int64 off)
{
	return REAL(f)->pMethods->xRead(REAL(f), b, n, off);
}
static int f_write(sqlite3_file *f, const void *b, int n, sqlite3_int64 off)
{
	int rc = fault_code(SQLITE_IOERR_WRITE);
	return rc ? rc : REAL(f)->pMethods->xWrite(REAL(f), b, n, off);
}
static int f_truncate(sqlite3_file *f, sqlite3_int64 size)
{
	int rc = fault_code(SQLITE_IOERR_TRUNCATE);
	return rc ? rc : REAL(f)->pMethods->xTruncate(REAL(f), size);
}
static int f_sync(sqlite3_file *f, int flags)
{
	int rc = fault_code(SQLITE_IOERR_FSYNC);
	return rc ? rc : REAL(f)->pMethods->xSync(REAL(f), flags);
}
static int f_size(sqlite3_file *f, sqlite3_int64 *size)
{
	return REAL(f)->pMethods->xFileSize(REAL(f), size);
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
	return REAL(f)->pMethods->xFileControl(REAL(f), op, arg);
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

static const sqlite3_io_methods fault_methods = {
    3,		f_close,       f_read,	    f_write,   f_truncate, f_sync,   f_size,
    f_lock,	f_unlock,      f_reserved,  f_control, f_sector,   f_device, f_shm_map,
    f_shm_lock, f_shm_barrier, f_shm_unmap, f_fetch,   f_unfetch,
};

static int v_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *out)
{
	fault_file *ff = (fault_file *)f;
	(void)vfs;
	ff->real = (sqlite3_file *)(ff + 1);
	int rc = real_vfs->xOpen(real_vfs, name, ff->real, flags, out);
	f->pMethods = rc == SQLITE_OK ? &fault_methods : NULL;
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

static sqlite3_vfs fault_vfs;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init_vfs(void)
{
	real_vfs = sqlite3_vfs_find(NULL);
	fault_vfs = (sqlite3_vfs){
	    .iVersion = 2,
	    .szOsFile = (int)sizeof(fault_file) + real_vfs->szOsFile,
	    .mxPathname = real_vfs->mxPathname,
	    .zName = "baton-fault",
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
	sqlite3_vfs_register(&fault_vfs, 0);
}

const char *faultvfs_register(const char *control)
{
	snprintf(control_path, sizeof control_path, "%s", control);
	pthread_once(&once, init_vfs);
	return fault_vfs.zName;
}
