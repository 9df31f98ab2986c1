/*
 * limit.c - `baton limit NAME [N]`: how many permits a resource has.
 *
 * Without N: GET /resources/{name}; with N: PUT /resources/{name} {"limit": N}, which the
 * server answers once the new limit is durable, with the resource as GET shows it. Either
 * way the resource's limit is printed, alone on its line, for scripts (--json: the whole
 * resource). Raising the limit grants the waiters that now fit at once; lowering it takes
 * nothing from the holders, so when more permits are in use than the new limit allows,
 * a note on stderr says that no new grant comes until they fit.
 *
 * A resource never used is not known to the server (GET answers 404): it has the default
 * limit, 1, which is printed (--json: {"name", "limit": 1, "permits_in_use": 0}).
 *
 * N is checked here only for being a whole number (a usage error, nothing sent); its
 * range (1 to 10000) is the server's to say: 400, exit 1, and nothing changes.
 */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

/* N as a whole number into *n: 0, or -1 when it is anything else. */
static int parse_limit(const char *s, long long *n)
{
	char *end;
	if (!*s || strspn(s, "0123456789") != strlen(s))
		return -1;
	errno = 0;
	*n = strtoll(s, &end, 10);
	return errno ? -1 : 0;
}

/* Returns a new path "/resources/NAME", the name percent-encoded. */
static char *resource_path(const char *name)
{
	char *esc = http_escape(name), *path = NULL;
	if (asprintf(&path, "/resources/%s", esc) < 0)
		path = NULL;
	free(esc);
	if (!path) {
		fprintf(stderr, "baton: out of memory\n");
		exit(EXIT_FAILED);
	}
	return path;
}

static void print_limit(const json_t *res, int set)
{
	json_int_t limit = jint(res, "limit", 1), used = jint(res, "permits_in_use", 0);
	printf("%" JSON_INTEGER_FORMAT "\n", limit);
	if (set && used > limit)
		fprintf(stderr,
			"baton: %s has %" JSON_INTEGER_FORMAT " permits in use: no new grant until"
			" they fit in %" JSON_INTEGER_FORMAT "\n",
			jstr(res, "name", "the resource"), used, limit);
}

/* GET path into *res (new reference) as http_call does, except that a 404 is a resource
 * never used, which has the default limit: *res is then the resource as it would be. */
static int get_resource(struct cli *cli, const char *path, const char *name, json_t **res)
{
	struct http_reply r;
	*res = NULL;
	int rc = http_request(cli->http, "GET", path, NULL, &r);
	if (rc != EXIT_OK)
		return rc;
	if (r.status == 404) {
		http_reply_fini(&r);
		*res = json_pack("{s:s, s:i, s:i}", "name", name, "limit", 1, "permits_in_use", 0);
		return *res ? EXIT_OK : EXIT_FAILED;
	}
	if (r.status != 200) {
		print_problem("GET", path, r.status, r.body);
		http_reply_fini(&r);
		return EXIT_FAILED;
	}
	*res = r.body; /* ownership moves to the caller */
	return EXIT_OK;
}

int cmd_limit(struct cli *cli, int argc, char **argv)
{
	long long n = 0;
	int rc = parse_no_options(argc, argv);

	if (rc >= 0)
		return rc;
	if (argc - optind < 1 || argc - optind > 2)
		return usage_error("limit: expects NAME, or NAME and N");
	const char *name = argv[optind], *value = argc - optind == 2 ? argv[optind + 1] : NULL;
	if (value && parse_limit(value, &n))
		return usage_error("limit: N must be a whole number: %s", value);

	char *path = resource_path(name);
	json_t *body = value ? json_pack("{s:I}", "limit", (json_int_t)n) : NULL, *res;
	if (value && !body) {
		free(path);
		fprintf(stderr, "baton: out of memory\n");
		return EXIT_FAILED;
	}
	rc = value ? http_call(cli->http, "PUT", path, body, &res, NULL)
		   : get_resource(cli, path, name, &res);
	json_decref(body);
	free(path);
	if (rc != EXIT_OK)
		return rc;
	if (!res) { /* 204 */
		print_error("Empty answer", "%s /resources/%s: no resource in the answer",
			    value ? "PUT" : "GET", name);
		return EXIT_FAILED;
	}
	if (cli->json)
		print_json(stdout, res);
	else
		print_limit(res, value != NULL);
	json_decref(res);
	return EXIT_OK;
}
