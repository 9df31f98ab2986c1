/*
 * proc_cpu.c - see proc_cpu.h.
 */
#include "proc_cpu.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

double proc_cpu_seconds(const char *stat_path)
{
	char buf[1024];
	FILE *f = fopen(stat_path, "r");
	if (!f)
		return -1;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	/* Fields 14 and 15 (utime, stime, in clock ticks) follow the ")" that ends the
	 * command name, which may hold spaces. */
	const char *p = strrchr(buf, ')');
	unsigned long long ut = 0, st = 0;
	if (!p ||
	    sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
		return -1;
	long hz = sysconf(_SC_CLK_TCK);
	return (double)(ut + st) / (double)(hz > 0 ? hz : 100);
}
