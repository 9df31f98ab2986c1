/*
 * proc_cpu.c - see proc_cpu.h.
 */
#include "proc_cpu.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

const char *proc_stat_fields(const char *stat_path, char *buf, size_t size)
{
	FILE *f = fopen(stat_path, "r");
	if (!f)
		return NULL;
	size_t n = fread(buf, 1, size - 1, f);
	fclose(f);
	buf[n] = 0;
	/* The command name ends at the last ")". */
	const char *p = strrchr(buf, ')');
	return p && p[1] == ' ' ? p + 2 : NULL;
}

double proc_cpu_seconds(const char *stat_path)
{
	char buf[1024];
	const char *p = proc_stat_fields(stat_path, buf, sizeof buf);
	/* Fields 14 and 15: utime and stime, in clock ticks. */
	unsigned long long ut = 0, st = 0;
	if (!p || sscanf(p, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
		return -1;
	long hz = sysconf(_SC_CLK_TCK);
	return (double)(ut + st) / (double)(hz > 0 ? hz : 100);
}
