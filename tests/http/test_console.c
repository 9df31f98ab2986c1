/*
 * test_console.c - how batond serves its console (/ui/), against the real binary: with
 * --token, the console's files and views answer without the token, with their content
 * type, an ETag (304 when the browser has that version), Cache-Control: no-cache and
 * Content-Security-Policy: default-src 'self', while the API still refuses without it;
 * GET / redirects to /ui/; a name the console has no file for is a 404, never a file
 * from elsewhere; settings.json says whether the console offers its actions
 * (--console-actions); --console-dir serves the files of a directory instead of those
 * built in. What a person sees in the console is tests/browser/console.mjs.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <curl/curl.h>

#include "../harness/harness.h"

typedef struct answer {
	long status;
	char type[128], etag[64], csp[128], cache[64], location[64];
	char *body;
	size_t len;
} answer;

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
	answer *a = ud;
	char *b = realloc(a->body, a->len + size * n + 1);
	assert_non_null(b);
	memcpy(b + a->len, p, size * n);
	a->len += size * n;
	b[a->len] = 0;
	a->body = b;
	return size * n;
}

/* Copies the value of header line `line` into out when its name is `name`. */
static void header_into(const char *line, size_t len, const char *name, char *out, size_t cap)
{
	char *v = hs_header_value(line, len, name);
	if (v) {
		snprintf(out, cap, "%s", v);
		free(v);
	}
}

static size_t on_header(char *p, size_t size, size_t n, void *ud)
{
	answer *a = ud;
	size_t len = size * n;
	header_into(p, len, "Content-Type", a->type, sizeof a->type);
	header_into(p, len, "ETag", a->etag, sizeof a->etag);
	header_into(p, len, "Content-Security-Policy", a->csp, sizeof a->csp);
	header_into(p, len, "Cache-Control", a->cache, sizeof a->cache);
	header_into(p, len, "Location", a->location, sizeof a->location);
	return len;
}

/* GET path without a token (with one header line, or none). */
static void get(const hs_server *s, const char *path, const char *header, answer *a)
{
	memset(a, 0, sizeof *a);
	char url[512];
	snprintf(url, sizeof url, "http://127.0.0.1:%d%s", hs_port(s), path);
	CURL *c = curl_easy_init();
	struct curl_slist *h = header ? curl_slist_append(NULL, header) : NULL;
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, a);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, a);
	curl_easy_setopt(c, CURLOPT_PATH_AS_IS, 1L);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
	assert_int_equal(curl_easy_perform(c), CURLE_OK);
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &a->status);
	curl_slist_free_all(h);
	curl_easy_cleanup(c);
}

static void answer_fini(answer *a)
{
	free(a->body);
	a->body = NULL;
}

static int setup_token(void **state)
{
	static const char *const args[] = {"--token", "s3cret", NULL};
	hs_server *s = hs_open(args);
	*state = s;
	return s ? 0 : -1;
}

/* A console file or view: 200 without the token, its type, an ETag and the policy. */
static void assert_console_file(const hs_server *s, const char *path, const char *type,
				const char *needle)
{
	answer a;
	get(s, path, NULL, &a);
	if (a.status != 200)
		fail_msg("GET %s without the token: %ld %s", path, a.status, a.body ? a.body : "");
	assert_true(strncmp(a.type, type, strlen(type)) == 0);
	assert_true(a.etag[0] == '"');
	assert_string_equal(a.csp, "default-src 'self'");
	assert_string_equal(a.cache, "no-cache");
	if (!a.body || !strstr(a.body, needle))
		fail_msg("GET %s: no \"%s\" in %.200s", path, needle, a.body ? a.body : "");
	answer_fini(&a);
}

static void test_console_files_need_no_token(void **state)
{
	hs_server *s = *state;
	static const char *const views[] = {"/ui/", "/ui/resources/printer", "/ui/workflows/w-1",
					    "/ui/workflows", "/ui/nodes"};
	for (size_t i = 0; i < sizeof views / sizeof views[0]; i++)
		assert_console_file(s, views[i], "text/html", "<script type=\"module\"");
	assert_console_file(s, "/ui/app.js", "text/javascript", "import");
	assert_console_file(s, "/ui/console.css", "text/css", "prefers-color-scheme: dark");
	assert_console_file(s, "/ui/icon.svg", "image/svg+xml", "<svg");
	assert_console_file(s, "/favicon.ico", "image/svg+xml", "<svg");

	answer a, b;
	get(s, "/ui/app.js", NULL, &a);
	char inm[128];
	snprintf(inm, sizeof inm, "If-None-Match: %s", a.etag);
	get(s, "/ui/app.js", inm, &b);
	assert_int_equal(b.status, 304);
	assert_int_equal(b.len, 0);
	answer_fini(&a);
	answer_fini(&b);

	get(s, "/", NULL, &a);
	assert_int_equal(a.status, 302);
	assert_string_equal(a.location, "/ui/");
	answer_fini(&a);

	get(s, "/ui/settings.json", NULL, &a);
	assert_int_equal(a.status, 200);
	assert_non_null(strstr(a.body, "\"actions\":false"));
	answer_fini(&a);

	static const char *const missing[] = {"/ui/nope.js",	  "/ui/.hidden.js",
					      "/ui/..%2Fbaton.h", "/ui/../lib/baton.h",
					      "/ui/resources",	  "/ui/app.exe"};
	for (size_t i = 0; i < sizeof missing / sizeof missing[0]; i++) {
		get(s, missing[i], NULL, &a);
		if (a.status != 404)
			fail_msg("GET %s: %ld, expected 404", missing[i], a.status);
		answer_fini(&a);
	}
	static const char *const api[] = {"/resources", "/nodes", "/workflows", "/metrics"};
	for (size_t i = 0; i < sizeof api / sizeof api[0]; i++) {
		get(s, api[i], NULL, &a);
		if (a.status != 401)
			fail_msg("GET %s without the token: %ld, expected 401", api[i], a.status);
		answer_fini(&a);
	}
}

/* --console-dir DIR: the files of DIR; --console-actions: settings.json says so. */
static void test_console_dir_and_actions(void **state)
{
	(void)state;
	char dir[] = "/tmp/baton-console-XXXXXX";
	assert_non_null(mkdtemp(dir));
	char path[128];
	snprintf(path, sizeof path, "%s/app.js", dir);
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs("// from the directory\n", f);
	fclose(f);
	const char *const args[] = {"--console-dir", dir, "--console-actions", NULL};
	hs_server *s = hs_open(args);
	assert_non_null(s);
	assert_console_file(s, "/ui/app.js", "text/javascript", "// from the directory");
	answer a;
	get(s, "/ui/console.css", NULL, &a);
	assert_int_equal(a.status, 404); /* not in the directory */
	answer_fini(&a);
	get(s, "/ui/settings.json", NULL, &a);
	assert_non_null(strstr(a.body, "\"actions\":true"));
	answer_fini(&a);
	hs_close(s);
	remove(path);
	rmdir(dir);
}

int main(void)
{
	hs_filters_from_env();
	curl_global_init(CURL_GLOBAL_DEFAULT);
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_console_files_need_no_token, setup_token,
					    hs_teardown),
	    cmocka_unit_test(test_console_dir_and_actions),
	};
	int rc = cmocka_run_group_tests(tests, NULL, NULL);
	curl_global_cleanup();
	return rc;
}
