/*
 * rfc3339.c - the one parser of batond's times for the client, the benchmarks and the
 * test harness (see rfc3339.h). Strict on purpose: a time batond wrote in any other
 * form is a bug the tests must see, not a value to guess at.
 */
#include "rfc3339.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static int all_digits(const char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] < '0' || p[i] > '9')
			return 0;
	return 1;
}

int rfc3339_parse_ms(const char *t, int64_t *ms)
{
	/* 2026-11-30T05:40:00.123Z: exactly 24 characters. */
	if (!t || strlen(t) != 24 || t[4] != '-' || t[7] != '-' || t[10] != 'T' || t[13] != ':' ||
	    t[16] != ':' || t[19] != '.' || t[23] != 'Z')
		return -1;
	if (!all_digits(t, 4) || !all_digits(t + 5, 2) || !all_digits(t + 8, 2) ||
	    !all_digits(t + 11, 2) || !all_digits(t + 14, 2) || !all_digits(t + 17, 2) ||
	    !all_digits(t + 20, 3))
		return -1;
	struct tm tm = {0};
	tm.tm_year = atoi(t) - 1900;
	tm.tm_mon = atoi(t + 5) - 1;
	tm.tm_mday = atoi(t + 8);
	tm.tm_hour = atoi(t + 11);
	tm.tm_min = atoi(t + 14);
	tm.tm_sec = atoi(t + 17);
	if (tm.tm_mon > 11 || tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 ||
	    tm.tm_min > 59 || tm.tm_sec > 60)
		return -1;
	time_t secs = timegm(&tm);
	if (secs == (time_t)-1)
		return -1;
	*ms = (int64_t)secs * 1000 + atoi(t + 20);
	return 0;
}
