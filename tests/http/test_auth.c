/*
 * test_auth.c - bearer-token access control over HTTP, against the real binary: the token
 * given by flag, by environment and by file, a flag winning over the environment, and for
 * each the same checks on every protected route (an event stream, sse.h, among them):
 * refusals with a 401 problem and WWW-Authenticate, nothing created by a refused POST,
 * and /healthz and /readyz open to all.
 *
 * Each test starts its own batond on a fresh temporary database (harness.h).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <curl/curl.h>

#include "../harness/harness.h"
#include "../harness/sse.h"

#define WAIT_MS 30000

/* ---- fixtures ---------------------------------------------------------------------- */

static int open_with(void **state, const char *const *args)
{
	hs_server *s = hs_open(args);
	*state = s;
	return s ? 0 : -1;
}

static int setup_token(void **state)
{
	static const char *const args[] = {"--token", "s3cret", NULL};
	return open_with(state, args);
}

/* BATON_TOKEN in the environment: batond inherits the test's environment at fork. */
static int setup_env_token(void **state)
{
	setenv("BATON_TOKEN", "envtok", 1);
	int rc = open_with(state, NULL);
	unsetenv("BATON_TOKEN");
	return rc;
}

static int setup_env_and_flag_token(void **state)
{
	static const char *const args[] = {"--token", "flagtok", NULL};
	setenv("BATON_TOKEN", "envtok", 1);
	int rc = open_with(state, args);
	unsetenv("BATON_TOKEN");
	return rc;
}

/* --token-file: the file (token and a newline) lives only until batond has read it. */
static int setup_token_file(void **state)
{
	const char *tmp = getenv("TMPDIR");
	char dir[PATH_MAX], path[PATH_MAX + 16];
	snprintf(dir, sizeof dir, "%s/baton-tok-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dir))
		return -1;
	snprintf(path, sizeof path, "%s/token", dir);
	FILE *f = fopen(path, "w");
	int rc = -1;
	if (f) {
		fputs("filetok\n", f);
		fclose(f);
		const char *const args[] = {"--token-file", path, NULL};
		rc = open_with(state, args);
	}
	unlink(path);
	rmdir(dir);
	return rc;
}

/* ---- access control ------------------------------------------------------------------ */

/* A request with Authorization `auth` (NULL: none) must be refused with 401. */
static void assert_refused(const hs_server *s, const char *method, const char *path,
			   const char *auth, const char *body, const char *token)
{
	const char *h[3];
	size_t k = 0;
	if (strstr(path, "/events"))
		h[k++] = SSE_ACCEPT; /* a stream is refused like the rest */
	if (auth)
		h[k++] = auth;
	h[k] = NULL;
	sse_reply x;
	sse_call(s, method, path, h, body, &x);
	char what[256];
	snprintf(what, sizeof what, "%s %s with %s", method, path,
		 auth ? auth : "no Authorization");
	hs_assert_problem(&x.r, 401, "unauthorized", what);
	if (!x.www_authenticate || strncasecmp(x.www_authenticate, "Bearer", 6) != 0)
		fail_msg("%s: WWW-Authenticate is %s, expected Bearer ...", what,
			 x.www_authenticate ? x.www_authenticate : "(none)");
	if (strstr(x.r.body, token))
		fail_msg("%s: the 401 body reveals the token: %s", what, x.r.body);
	sse_reply_fini(&x);
}

static void assert_status(const hs_server *s, const char *method, const char *path,
			  const char *auth, const char *body, long want)
{
	const char *const h[] = {auth, NULL};
	sse_reply x;
	sse_call(s, method, path, auth ? h : NULL, body, &x);
	if (x.r.status != want)
		fail_msg("%s %s with %s: status %ld, expected %ld; body %.300s", method, path,
			 auth ? auth : "no Authorization", x.r.status, want,
			 x.r.body ? x.r.body : "");
	sse_reply_fini(&x);
}

/*
 * The checks shared by the token tests: every protected route refuses a missing token,
 * a wrong one of the same length, longer and shorter ones, an empty one and other
 * schemes, with a 401 problem and WWW-Authenticate: Bearer; a refused POST creates
 * nothing; the right token opens GET, POST, /metrics, /backup and an event stream;
 * /healthz and /readyz need no token.
 */
static void check_token(const hs_server *s, const char *token)
{
	size_t n = strlen(token);
	char same_len[64], longer[64], shorter[64], good[64], lower[64], basic[64], digest[64];
	snprintf(same_len, sizeof same_len, "Authorization: Bearer %.*s%c", (int)n - 1, token,
		 token[n - 1] == 'x' ? 'y' : 'x');
	snprintf(longer, sizeof longer, "Authorization: Bearer %s0", token);
	snprintf(shorter, sizeof shorter, "Authorization: Bearer %.*s", (int)n - 1, token);
	snprintf(good, sizeof good, "Authorization: Bearer %s", token);
	snprintf(lower, sizeof lower, "Authorization: bearer %s", token);
	snprintf(basic, sizeof basic, "Authorization: Basic %s", token);
	snprintf(digest, sizeof digest, "Authorization: Digest %s", token); /* 6 letters too */
	const char *const wrong[] = {NULL,
				     same_len,
				     longer,
				     shorter,
				     "Authorization: Bearer ",
				     "Authorization: Bearer wrong-token",
				     basic,
				     digest,
				     "Authorization: Basic czNjcmV0",
				     "Authorization: Token s3cret",
				     "Authorization: s3cret",
				     "Authorization: Bearers3cret"};
	static const char body[] = "{\"id\":\"denied\",\"resource\":\"gate\",\"workers\":[{"
				   "\"name\":\"a\",\"work_ms\":0}]}";
	static const struct {
		const char *method, *path;
		bool post;
	} routes[] = {{"GET", "/workflows", false},
		      {"POST", "/workflows", true},
		      {"GET", "/workflows/denied", false},
		      {"GET", "/resources", false},
		      {"GET", "/metrics", false},
		      {"GET", "/backup", false},
		      {"DELETE", "/workflows/denied", false},
		      {"GET", "/workflows/denied/events", false},
		      {"GET", "/resources/gate/events", false}};
	for (size_t r = 0; r < sizeof routes / sizeof routes[0]; r++)
		for (size_t w = 0; w < sizeof wrong / sizeof wrong[0]; w++)
			assert_refused(s, routes[r].method, routes[r].path, wrong[w],
				       routes[r].post ? body : NULL, token);

	assert_status(s, "GET", "/workflows/denied", good, NULL, 404);
	assert_status(s, "GET", "/workflows", good, NULL, 200);
	assert_status(s, "POST", "/workflows", good,
		      "{\"id\":\"allowed\",\"resource\":\"gate\",\"workers\":[{\"name\":\"a\","
		      "\"work_ms\":0}]}",
		      201);
	assert_status(s, "GET", "/workflows/allowed", lower, NULL, 200);
	assert_status(s, "GET", "/metrics", good, NULL, 200);
	assert_status(s, "GET", "/resources", good, NULL, 200);
	assert_status(s, "GET", "/backup", good, NULL, hs_store_is_pg() ? 501 : 200);

	CURLM *m = curl_multi_init();
	const char *const h[] = {SSE_ACCEPT, good, NULL};
	sse *st = sse_open(m, s, "/workflows/allowed/events", h);
	if (!sse_pump_until(m, sse_is_done, st, WAIT_MS))
		fail_msg("the stream of a completed workflow did not end (with the token)");
	sse_assert_ok(st, "stream with the token");
	assert_true(sse_find(st, "workflow_completed", -1, NULL) >= 0);
	sse_close(m, st);
	curl_multi_cleanup(m);

	const char *const open_auth[] = {NULL, "Authorization: Bearer wrong-token", good};
	for (size_t i = 0; i < 3; i++) {
		assert_status(s, "GET", "/healthz", open_auth[i], NULL, 200);
		assert_status(s, "GET", "/readyz", open_auth[i], NULL, 200);
	}
}

/* --token s3cret. */
static void test_auth_token_flag(void **state)
{
	check_token(*state, "s3cret");
}

/* BATON_TOKEN in the environment. */
static void test_auth_token_env(void **state)
{
	check_token(*state, "envtok");
}

/* A flag wins over the environment: --token flagtok with BATON_TOKEN=envtok. */
static void test_auth_flag_overrides_env(void **state)
{
	hs_server *s = *state;
	assert_refused(s, "GET", "/workflows", "Authorization: Bearer envtok", NULL, "flagtok");
	assert_status(s, "GET", "/workflows", "Authorization: Bearer flagtok", NULL, 200);
}

/* --token-file: the token is the file's first line, without its newline. */
static void test_auth_token_file(void **state)
{
	hs_server *s = *state;
	check_token(s, "filetok");
}

int main(void)
{
	hs_filters_from_env();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_auth_token_flag, setup_token, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_auth_token_env, setup_env_token, hs_teardown),
	    cmocka_unit_test_setup_teardown(test_auth_flag_overrides_env, setup_env_and_flag_token,
					    hs_teardown),
	    cmocka_unit_test_setup_teardown(test_auth_token_file, setup_token_file, hs_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
