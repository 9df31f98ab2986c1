/*
 * pg_load.c - loads libpq when a PostgreSQL store is opened (pg.h says why), the way
 * call.c loads libcurl: dlopen once, every function looked up by name, a failure said.
 */
#include "pg.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

struct pg_api pg_api;
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
static int loaded; /* under load_mu; pg_api is written once, before it becomes 1 */

int pg_load_libpq(char *why, size_t n)
{
	pthread_mutex_lock(&load_mu);
	if (loaded) {
		pthread_mutex_unlock(&load_mu);
		return 0;
	}
	why[0] = 0;
	void *lib = dlopen("libpq.so.5", RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		snprintf(why, n, "PostgreSQL needs libpq (libpq5): %s", dlerror());
		/* dlsym's void * to function pointers: POSIX guarantees the conversion. */
#define PG_FUNC_LOAD(name)                                                                         \
	if (lib && !why[0] && !(*(void **)&pg_api.name##_ = dlsym(lib, #name)))                    \
		snprintf(why, n, "libpq has no %s: %s", #name, dlerror());
	PG_FUNCS(PG_FUNC_LOAD)
	if (lib && why[0])
		dlclose(lib);
	loaded = !why[0];
	pthread_mutex_unlock(&load_mu);
	return loaded ? 0 : -1;
}
