/*
 * proc_cpu.h - the CPU time a process or thread has used, read from Linux's /proc, for
 * the programs around batond that measure it: the benchmarks (bench/) and the test
 * harness (tests/harness/), which each compile common/proc_cpu.c in.
 */
#ifndef BATON_COMMON_PROC_CPU_H
#define BATON_COMMON_PROC_CPU_H

#include <stddef.h>

/*
 * Reads a /proc stat file into buf (size bytes) and returns its fields from the third
 * (state) on, past the command name, which may hold spaces and parentheses; NULL when
 * it cannot be read. Thread-safe.
 */
const char *proc_stat_fields(const char *stat_path, char *buf, size_t size);

/*
 * utime + stime of a /proc stat file (/proc/PID/stat or /proc/PID/task/TID/stat), in
 * seconds; -1 when it cannot be read. Thread-safe.
 */
double proc_cpu_seconds(const char *stat_path);

#endif
