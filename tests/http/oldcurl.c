/*
 * oldcurl.c - a stand-in libcurl.so.4 for test_call_policy: it has every function batond
 * loads, but refuses CURLOPT_PROTOCOLS_STR as a libcurl older than 7.85.0 does
 * (CURLE_UNKNOWN_OPTION), so batond must refuse --allow-call at start. Nothing in it makes
 * a request: batond must never get that far.
 */
#define CURL_DISABLE_TYPECHECK /* its macros would rename the functions defined here */
#include <curl/curl.h>
#include <stdarg.h>
#include <stdlib.h>

static char handle;

CURLcode curl_global_init(long flags)
{
	(void)flags;
	return CURLE_OK;
}

CURL *curl_easy_init(void)
{
	return &handle;
}

CURLcode curl_easy_setopt(CURL *c, CURLoption opt, ...)
{
	(void)c;
	return opt == CURLOPT_PROTOCOLS_STR ? CURLE_UNKNOWN_OPTION : CURLE_OK;
}

CURLcode curl_easy_perform(CURL *c)
{
	(void)c;
	abort();
}

CURLcode curl_easy_getinfo(CURL *c, CURLINFO info, ...)
{
	(void)c, (void)info;
	return CURLE_UNKNOWN_OPTION;
}

const char *curl_easy_strerror(CURLcode rc)
{
	return rc == CURLE_UNKNOWN_OPTION ? "An unknown option was passed in to libcurl" : "?";
}

void curl_easy_cleanup(CURL *c)
{
	(void)c;
}

struct curl_slist *curl_slist_append(struct curl_slist *l, const char *s)
{
	(void)s;
	return l;
}

void curl_slist_free_all(struct curl_slist *l)
{
	(void)l;
}

time_t curl_getdate(const char *s, const time_t *unused)
{
	(void)s, (void)unused;
	return -1;
}

char *curl_version(void)
{
	return "libcurl/7.84.0 OpenSSL/1.1.1";
}
