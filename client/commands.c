/*
 * commands.c: the everyday commands of `baton`: submit, get, list, cancel, events, resources.
 *
 * Each command parses its arguments, makes its request(s) through http_call and prints
 * either the server's JSON (--json) or a concise human rendering. Human output is for
 * people: columns are aligned, absent values print as "-", and nothing is printed that a
 * later command could not explain.
 */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

enum {
	MAX_EVENT_PAGES = 100000, /* bounds `events` should the server page its answers */
	MAX_NAME_COLUMN = 32,	  /* wider names overflow their column instead of padding it */
	MAX_ID_COLUMN = 64,	  /* the same for workflow ids: lease ids (38) and UUIDs fit */
};

/* ---- argument helpers ------------------------------------------------------------------ */

int parse_no_options(int argc, char **argv)
{
	static const struct option opts[] = {{"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
	int c;

	optind = 0;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		if (c != 'h')
			return bad_option(argv[0], argv);
		usage(stdout);
		return EXIT_OK;
	}
	return -1;
}

int parse_operand(int argc, char **argv, const char *what, const char **arg)
{
	*arg = NULL;
	int rc = parse_no_options(argc, argv);
	if (rc >= 0)
		return rc;
	if (argc - optind != 1)
		return usage_error("%s: expects exactly one %s", argv[0], what);
	*arg = argv[optind];
	return -1;
}

int parse_workflow_id(int argc, char **argv, const char **id)
{
	return parse_operand(argc, argv, "workflow ID", id);
}

/* Returns a new path "/workflows/ID" + suffix, the id percent-encoded. */
static char *workflow_path(const char *id, const char *suffix)
{
	char *esc = http_escape(id);
	char *path = NULL;

	if (asprintf(&path, "/workflows/%s%s", esc, suffix) < 0)
		path = NULL;
	free(esc);
	if (!path) {
		fprintf(stderr, "baton: out of memory\n");
		exit(EXIT_FAILED);
	}
	return path;
}

/* Appends "?key=value" or "&key=value" to the path *p (value percent-encoded). */
static void query_add(char **p, const char *key, const char *value)
{
	char *esc = http_escape(value);
	char *next = NULL;

	if (asprintf(&next, "%s%c%s=%s", *p, strchr(*p, '?') ? '&' : '?', key, esc) < 0)
		next = NULL;
	free(esc);
	if (!next) {
		fprintf(stderr, "baton: out of memory\n");
		exit(EXIT_FAILED);
	}
	free(*p);
	*p = next;
}

/* ---- printing helpers ------------------------------------------------------------------ */

/* Display width of the widest string field key among the objects of arr, at least min
 * and at most max. */
static int column_width(const json_t *arr, const char *key, int min, int max)
{
	size_t i;
	const json_t *v;
	int w = min;

	json_array_foreach(arr, i, v)
	{
		const char *s = jstr(v, key, "-");
		int n = (int)display_width(s, strlen(s));
		if (n > w)
			w = n < max ? n : max;
	}
	return w;
}

/* Whether some object of arr has key with a non-null value. */
static int any_has(const json_t *arr, const char *key)
{
	size_t i;
	const json_t *v;

	json_array_foreach(arr, i, v)
	{
		if (jhas(v, key))
			return 1;
	}
	return 0;
}

/* Formats an integer field as "117ms", or "-" when it is absent or null. */
static const char *ms_or_dash(char *buf, size_t len, const json_t *obj, const char *key)
{
	if (!json_is_integer(json_object_get(obj, key)))
		return "-";
	snprintf(buf, len, "%" JSON_INTEGER_FORMAT "ms", jint(obj, key, 0));
	return buf;
}

/* Formats an integer field, or "-" when it is absent or null. */
static const char *int_or_dash(char *buf, size_t len, const json_t *obj, const char *key)
{
	if (!json_is_integer(json_object_get(obj, key)))
		return "-";
	snprintf(buf, len, "%" JSON_INTEGER_FORMAT, jint(obj, key, 0));
	return buf;
}

/* ---- submit ---------------------------------------------------------------------------- */

/* Returns a new body {"resource", "workers": [...]} for `submit --resource R W...`. */
static json_t *body_from_args(const char *resource, int n, char **workers)
{
	json_t *list = json_array();

	for (int i = 0; i < n; i++)
		json_array_append_new(list, json_string(workers[i]));
	return json_pack("{s:s, s:o}", "resource", resource, "workers", list);
}

/* Returns a new body read from path ("-": stdin), or NULL after printing why. */
static json_t *body_from_file(const char *path)
{
	json_error_t err;
	json_t *body =
	    strcmp(path, "-") == 0 ? json_loadf(stdin, 0, &err) : json_load_file(path, 0, &err);

	const char *name = strcmp(path, "-") ? path : "<stdin>";

	if (!body && err.line > 0) {
		fprintf(stderr, "baton: %s:%d:%d: %s\n", name, err.line, err.column, err.text);
		return NULL;
	}
	if (!body) {
		fprintf(stderr, "baton: %s\n", err.text); /* names the file already */
		return NULL;
	}
	if (!json_is_object(body)) {
		fprintf(stderr, "baton: %s: a workflow must be a JSON object\n", name);
		json_decref(body);
		return NULL;
	}
	return body;
}

static int parse_submit(int argc, char **argv, const char **id, const char **resource)
{
	static const struct option opts[] = {
	    {"id", required_argument, NULL, 'i'},
	    {"resource", required_argument, NULL, 'r'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	int c;

	optind = 0;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'i':
			*id = optarg;
			break;
		case 'r':
			*resource = optarg;
			break;
		case 'h':
			usage(stdout);
			return EXIT_OK;
		default:
			return bad_option(argv[0], argv);
		}
	}
	if (*resource && optind == argc)
		return usage_error("submit: give at least one WORKER");
	if (!*resource && argc - optind != 1)
		return usage_error("submit: give --resource NAME WORKER..., or one FILE");
	return -1;
}

int cmd_submit(struct cli *cli, int argc, char **argv)
{
	const char *id = NULL, *resource = NULL;
	json_t *body, *wf;
	long status = 0;
	int rc = parse_submit(argc, argv, &id, &resource);

	if (rc >= 0)
		return rc;
	body = resource ? body_from_args(resource, argc - optind, argv + optind)
			: body_from_file(argv[optind]);
	if (!body)
		return EXIT_FAILED;
	if (id)
		json_object_set_new(body, "id", json_string(id));
	rc = http_call(cli->http, "POST", "/workflows", body, &wf, &status);
	json_decref(body);
	if (rc != EXIT_OK)
		return rc;
	if (cli->json) {
		print_json(stdout, wf);
	} else {
		json_int_t steps = jint(wf, "steps_total", 0);
		printf("%s %s: %" JSON_INTEGER_FORMAT " step%s on %s, %s\n",
		       status == 201 ? "created" : "exists", jstr(wf, "id", "?"), steps,
		       steps == 1 ? "" : "s", jstr(wf, "resource", "?"), jstr(wf, "status", "?"));
	}
	json_decref(wf);
	return EXIT_OK;
}

/* ---- get ------------------------------------------------------------------------------- */

/* nw: the width of the NODE column, 0 when no step has a node (a lone batond). */
static void print_step(const json_t *step, int iw, int ww, int nw)
{
	char dur[32], tok[32];
	const char *status = jstr(step, "status", "?");

	printf("  %*" JSON_INTEGER_FORMAT "  ", iw, jint(step, "index", 0));
	print_padded(stdout, jstr(step, "worker", "?"), ww);
	printf("  %-9s  %8" JSON_INTEGER_FORMAT "  %8s  %5s", status, jint(step, "attempts", 0),
	       ms_or_dash(dur, sizeof(dur), step, "duration_ms"),
	       int_or_dash(tok, sizeof(tok), step, "fencing_token"));
	if (nw > 0) {
		fputs("  ", stdout);
		print_padded(stdout, jstr(step, "node", "-"), nw);
	}
	if (jhas(step, "queue_position"))
		printf("  queue position %" JSON_INTEGER_FORMAT, jint(step, "queue_position", 0));
	if (jhas(step, "next_attempt_at"))
		printf("  next attempt %s", jstr(step, "next_attempt_at", "?"));
	if (jhas(step, "error"))
		printf("  error: %s", jstr(step, "error", "?"));
	putchar('\n');
}

static void print_steps(const json_t *steps)
{
	size_t i;
	const json_t *step;
	int iw = snprintf(NULL, 0, "%zu", json_array_size(steps));
	int ww = column_width(steps, "worker", 6, MAX_NAME_COLUMN);
	int nw = any_has(steps, "node") ? column_width(steps, "node", 4, MAX_NAME_COLUMN) : 0;

	printf("\n  %*s  %-*s  %-9s  %8s  %8s  %5s", iw, "#", ww, "WORKER", "STATUS", "ATTEMPTS",
	       "DURATION", "TOKEN");
	if (nw > 0)
		printf("  %-*s", nw, "NODE");
	putchar('\n');
	json_array_foreach(steps, i, step)
	{
		print_step(step, iw, ww, nw);
	}
}

static void print_workflow(const json_t *wf)
{
	const json_t *result = json_object_get(wf, "result");
	const char *status = jstr(wf, "status", "?");
	int stopping = json_is_true(json_object_get(wf, "cancel_requested")) &&
		       (!strcmp(status, "pending") || !strcmp(status, "running"));

	printf("id        %s\n", jstr(wf, "id", "?"));
	printf("resource  %s\n", jstr(wf, "resource", "?"));
	printf("status    %s, %" JSON_INTEGER_FORMAT "/%" JSON_INTEGER_FORMAT
	       " steps completed%s\n",
	       status, jint(wf, "steps_completed", 0), jint(wf, "steps_total", 0),
	       stopping ? ", cancel requested" : "");
	printf("created   %s\n", jstr(wf, "created_at", "-"));
	printf("started   %s\n", jstr(wf, "started_at", "-"));
	printf("finished  %s\n", jstr(wf, "finished_at", "-"));
	if (json_is_object(result)) {
		printf("result    %" JSON_INTEGER_FORMAT " processed in %" JSON_INTEGER_FORMAT "ms",
		       jint(result, "workersProcessed", 0), jint(result, "totalMs", 0));
		if (json_array_size(json_object_get(result, "failed")) > 0)
			printf(", %zu failed", json_array_size(json_object_get(result, "failed")));
		putchar('\n');
	}
	if (jhas(wf, "error"))
		printf("error     %s\n", jstr(wf, "error", "?"));
	print_steps(json_object_get(wf, "steps"));
}

/* A workflow that completed although some of its steps failed (on_failure: continue). */
static int completed_with_failures(const json_t *wf)
{
	const json_t *result = json_object_get(wf, "result");
	const json_t *step;
	size_t i;

	if (strcmp(jstr(wf, "status", ""), "completed") != 0)
		return 0;
	if (json_array_size(json_object_get(result, "failed")) > 0)
		return 1;
	json_array_foreach(json_object_get(wf, "steps"), i, step)
	{
		if (strcmp(jstr(step, "status", ""), "failed") == 0)
			return 1;
	}
	return 0;
}

/* `baton get ID`: exit 0, or EXIT_PARTIAL for a workflow that completed with failed steps,
 * so that a script sees it without parsing the output. */
int cmd_get(struct cli *cli, int argc, char **argv)
{
	const char *id;
	json_t *wf;
	int rc = parse_workflow_id(argc, argv, &id);

	if (rc >= 0)
		return rc;
	char *path = workflow_path(id, "");
	rc = http_call(cli->http, "GET", path, NULL, &wf, NULL);
	free(path);
	if (rc != EXIT_OK)
		return rc;
	if (cli->json)
		print_json(stdout, wf);
	else
		print_workflow(wf);
	rc = completed_with_failures(wf) ? EXIT_PARTIAL : EXIT_OK;
	json_decref(wf);
	return rc;
}

/* ---- list ------------------------------------------------------------------------------ */

/* Returns a new path "/workflows?..." from list's options, or NULL with *rc set. */
static char *parse_list(int argc, char **argv, int *rc)
{
	static const struct option opts[] = {
	    {"status", required_argument, NULL, 's'}, {"resource", required_argument, NULL, 'r'},
	    {"limit", required_argument, NULL, 'l'},  {"cursor", required_argument, NULL, 'c'},
	    {"help", no_argument, NULL, 'h'},	      {NULL, 0, NULL, 0},
	};
	static const char *const keys[] = {
	    ['s'] = "status", ['r'] = "resource", ['l'] = "limit", ['c'] = "cursor"};
	char *path = strdup("/workflows");
	int c;

	optind = 0;
	while (path && (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		if (c == 's' || c == 'r' || c == 'l' || c == 'c') {
			query_add(&path, keys[c], optarg);
			continue;
		}
		free(path);
		if (c == 'h')
			usage(stdout);
		*rc = c == 'h' ? EXIT_OK : bad_option(argv[0], argv);
		return NULL;
	}
	if (path && optind < argc) {
		free(path);
		*rc = usage_error("list: unexpected argument \"%s\"", argv[optind]);
		return NULL;
	}
	*rc = path ? EXIT_OK : EXIT_FAILED;
	return path;
}

static void print_workflows(const json_t *page)
{
	const json_t *list = json_object_get(page, "workflows");
	const json_t *wf;
	size_t i;
	int idw = column_width(list, "id", 2, MAX_ID_COLUMN);
	int rw = column_width(list, "resource", 8, MAX_NAME_COLUMN);

	if (json_array_size(list) == 0) {
		printf("no workflows\n");
		return;
	}
	printf("%-*s  %-9s  %-*s  %11s  %s\n", idw, "ID", "STATUS", rw, "RESOURCE", "STEPS",
	       "CREATED");
	json_array_foreach(list, i, wf)
	{
		char steps[48];
		snprintf(steps, sizeof(steps), "%" JSON_INTEGER_FORMAT "/%" JSON_INTEGER_FORMAT,
			 jint(wf, "steps_completed", 0), jint(wf, "steps_total", 0));
		printf("%-*s  %-9s  %-*s  %11s  %s\n", idw, jstr(wf, "id", "?"),
		       jstr(wf, "status", "?"), rw, jstr(wf, "resource", "?"), steps,
		       jstr(wf, "created_at", "-"));
	}
	if (jhas(page, "next_cursor"))
		printf("(more: repeat with --cursor %s)\n", jstr(page, "next_cursor", "?"));
}

int cmd_list(struct cli *cli, int argc, char **argv)
{
	int rc;
	json_t *page;
	char *path = parse_list(argc, argv, &rc);

	if (!path)
		return rc;
	rc = http_call(cli->http, "GET", path, NULL, &page, NULL);
	free(path);
	if (rc != EXIT_OK)
		return rc;
	if (cli->json)
		print_json(stdout, page);
	else
		print_workflows(page);
	json_decref(page);
	return EXIT_OK;
}

/* ---- cancel ---------------------------------------------------------------------------- */

int cmd_cancel(struct cli *cli, int argc, char **argv)
{
	const char *id;
	json_t *wf;
	int rc = parse_workflow_id(argc, argv, &id);

	if (rc >= 0)
		return rc;
	char *path = workflow_path(id, "/cancel");
	rc = http_call(cli->http, "POST", path, NULL, &wf, NULL);
	free(path);
	if (rc != EXIT_OK)
		return rc;
	if (cli->json)
		print_json(stdout, wf);
	else if (strcmp(jstr(wf, "status", ""), "cancelled") == 0)
		printf("cancelled %s\n", jstr(wf, "id", id));
	else
		printf("cancel requested for %s (%s): it stops when its current step ends\n",
		       jstr(wf, "id", id), jstr(wf, "status", "?"));
	json_decref(wf);
	return EXIT_OK;
}

/* ---- events ---------------------------------------------------------------------------- */

/* Prints one event as `watch` does. */
static void print_event(const json_t *ev)
{
	struct sbuf b = {0};

	format_event_line(&b, ev, jstr(ev, "type", "?"));
	if (b.p)
		puts(b.p);
	sbuf_fini(&b);
}

/*
 * Appends the workflow's events after seq *after to all, page by page, until the server
 * has no more. Returns an exit status.
 */
static int fetch_events(http *h, const char *id, json_t *all)
{
	json_int_t after = -1;

	for (int page = 0; page < MAX_EVENT_PAGES; page++) {
		char suffix[64];
		json_t *reply, *events;
		if (after < 0)
			snprintf(suffix, sizeof(suffix), "/events");
		else
			snprintf(suffix, sizeof(suffix), "/events?after=%" JSON_INTEGER_FORMAT,
				 after);
		char *path = workflow_path(id, suffix);
		int rc = http_call(h, "GET", path, NULL, &reply, NULL);
		free(path);
		if (rc != EXIT_OK)
			return rc;
		events = json_object_get(reply, "events");
		size_t n = json_array_size(events);
		int last = json_is_null(json_object_get(reply, "next_after"));
		if (n > 0) {
			json_array_extend(all, events);
			after = jint(json_array_get(events, n - 1), "seq", after);
		}
		json_decref(reply);
		if (n == 0 || last)
			return EXIT_OK;
	}
	fprintf(stderr, "baton: events: gave up after %d pages\n", MAX_EVENT_PAGES);
	return EXIT_FAILED;
}

int cmd_events(struct cli *cli, int argc, char **argv)
{
	const char *id;
	json_t *all = json_array();
	int rc = parse_workflow_id(argc, argv, &id);

	if (rc < 0)
		rc = fetch_events(cli->http, id, all);
	if (rc == EXIT_OK && cli->json) {
		json_t *doc = json_pack("{s:s, s:O}", "workflow_id", id, "events", all);
		print_json(stdout, doc);
		json_decref(doc);
	} else if (rc == EXIT_OK) {
		size_t i;
		const json_t *ev;
		json_array_foreach(all, i, ev)
		{
			print_event(ev);
		}
	}
	json_decref(all);
	return rc;
}

/* ---- resources ------------------------------------------------------------------------- */

/* "worker-C (workflow 9f86..., step 2, token 7, since T)" or "-". */
static void print_holder(const json_t *holder)
{
	if (!json_is_object(holder)) {
		fputs("-", stdout);
		return;
	}
	printf("%s (workflow %s, step %" JSON_INTEGER_FORMAT ", token %" JSON_INTEGER_FORMAT,
	       jstr(holder, "worker", "?"), jstr(holder, "workflow_id", "?"),
	       jint(holder, "step", 0), jint(holder, "fencing_token", 0));
	if (jhas(holder, "since"))
		printf(", since %s", jstr(holder, "since", "?"));
	putchar(')');
}

/*
 * Whether resource r is shown with its permits: a limit over 1, or more holders than one
 * (a limit lowered under them). A mutex (limit 1, the default) is shown as it always was.
 */
static int has_permits(const json_t *r)
{
	return jint(r, "limit", 1) > 1 || jint(r, "permits_in_use", 0) > 1 ||
	       json_array_size(json_object_get(r, "holders")) > 1;
}

/* "2/3": permits in use out of the limit, for the list; "-" for a mutex. */
static const char *permits_cell(char *buf, size_t len, const json_t *r)
{
	if (!has_permits(r))
		return "-";
	snprintf(buf, len, "%" JSON_INTEGER_FORMAT "/%" JSON_INTEGER_FORMAT,
		 jint(r, "permits_in_use", 0), jint(r, "limit", 1));
	return buf;
}

/*
 * The first holder of a list's item, and how many more hold it: a page of the list names
 * the first only (a resource may have thousands), but its permits in use count each plain
 * holder once, and an exclusive holder holds alone.
 */
static void print_list_holders(const json_t *r)
{
	const json_t *first = json_object_get(r, "holder");
	json_int_t n = jint(r, "permits_in_use", 1);
	if (json_is_array(json_object_get(r, "holders"))) /* a server that lists them all */
		n = (json_int_t)json_array_size(json_object_get(r, "holders"));
	else if (json_is_true(json_object_get(first, "exclusive")))
		n = 1;
	print_holder(first);
	if (json_is_object(first) && n > 1)
		printf(" and %" JSON_INTEGER_FORMAT " more", n - 1);
}

static void print_resources(const json_t *doc)
{
	const json_t *list = json_object_get(doc, "resources");
	const json_t *r;
	size_t i;
	int nw = column_width(list, "name", 4, MAX_NAME_COLUMN);

	if (json_array_size(list) == 0) {
		printf("no resources\n");
		return;
	}
	/* GET /resources gives no node today; a server that does gets a column for it. */
	int dw = any_has(list, "node") ? column_width(list, "node", 4, MAX_NAME_COLUMN) : 0;
	int permits = 0; /* a PERMITS column ("2/3") once a resource has more than one */
	json_array_foreach(list, i, r)
	{
		permits |= has_permits(r);
	}
	printf("%-*s  %5s  ", nw, "NAME", "QUEUE");
	if (permits)
		printf("%-11s  ", "PERMITS");
	if (dw > 0)
		printf("%-*s  ", dw, "NODE");
	printf("HOLDER\n");
	json_array_foreach(list, i, r)
	{
		char cell[48];
		printf("%-*s  %5" JSON_INTEGER_FORMAT "  ", nw, jstr(r, "name", "?"),
		       jint(r, "queue_length", 0));
		if (permits)
			printf("%-11s  ", permits_cell(cell, sizeof cell, r));
		if (dw > 0) {
			print_padded(stdout, jstr(r, "node", "-"), dw);
			fputs("  ", stdout);
		}
		print_list_holders(r);
		putchar('\n');
	}
}

/*
 * The permits of a resource that has more than one, and every holder, lowest token first:
 *   limit     3 permits, 2 in use
 *   holders   2
 *     slot 0     worker-A (workflow w-1, step 0, token 5, since ...)
 *     exclusive  deploy (workflow lease-d, step 0, token 6, since ...)
 */
static void print_permits(const json_t *res)
{
	const json_t *holders = json_object_get(res, "holders"), *h;
	size_t i;

	json_int_t limit = jint(res, "limit", 1);
	printf("limit     %" JSON_INTEGER_FORMAT " permit%s, %" JSON_INTEGER_FORMAT " in use\n",
	       limit, limit == 1 ? "" : "s", jint(res, "permits_in_use", 0));
	if (!json_is_array(holders)) { /* a server that names only the first */
		printf("holder    ");
		print_holder(json_object_get(res, "holder"));
		putchar('\n');
		return;
	}
	printf("holders   %zu\n", json_array_size(holders));
	json_array_foreach(holders, i, h)
	{
		char slot[48] = "exclusive", n[32];
		if (!json_is_true(json_object_get(h, "exclusive")))
			snprintf(slot, sizeof slot, "slot %s", int_or_dash(n, sizeof n, h, "slot"));
		printf("  %-9s  ", slot);
		print_holder(h);
		putchar('\n');
	}
}

static void print_resource(const json_t *res)
{
	const json_t *waiters = json_object_get(res, "waiters");
	const json_t *totals = json_object_get(res, "totals");
	const json_t *w;
	size_t i;
	int permits = has_permits(res);

	printf("name      %s\n", jstr(res, "name", "?"));
	printf("token     %" JSON_INTEGER_FORMAT " (last fencing token)\n",
	       jint(res, "last_fencing_token", 0));
	if (jhas(res, "node")) /* a cluster: the node that drives it now */
		printf("node      %s\n", jstr(res, "node", "?"));
	if (permits) {
		print_permits(res);
	} else {
		printf("holder    ");
		print_holder(json_object_get(res, "holder"));
		putchar('\n');
	}
	printf("totals    %" JSON_INTEGER_FORMAT " grants; hold %" JSON_INTEGER_FORMAT
	       "ms total, %" JSON_INTEGER_FORMAT "ms max; wait %" JSON_INTEGER_FORMAT
	       "ms total, %" JSON_INTEGER_FORMAT "ms max\n",
	       jint(totals, "grants", 0), jint(totals, "total_hold_ms", 0),
	       jint(totals, "max_hold_ms", 0), jint(totals, "total_wait_ms", 0),
	       jint(totals, "max_wait_ms", 0));
	printf("waiters   %zu\n", json_array_size(waiters));
	json_array_foreach(waiters, i, w)
	{
		printf("  %3" JSON_INTEGER_FORMAT "  %s (workflow %s, step %" JSON_INTEGER_FORMAT
		       ", since %s)%s\n",
		       jint(w, "position", 0), jstr(w, "worker", "?"), jstr(w, "workflow_id", "?"),
		       jint(w, "step", 0), jstr(w, "waiting_since", "-"),
		       permits && json_is_true(json_object_get(w, "exclusive")) ? ", exclusive"
										: "");
	}
}

/*
 * GET /resources page after page, following next_cursor: *doc is {"resources": [all],
 * "next_cursor": null}. Returns an exit status.
 */
static int fetch_resources(http *h, json_t **doc)
{
	json_t *all = json_array();
	char *cursor = NULL;
	int rc = EXIT_OK;
	for (;;) {
		char *path = NULL;
		json_t *page;
		if ((cursor ? asprintf(&path, "/resources?limit=1000&cursor=%s", cursor)
			    : asprintf(&path, "/resources?limit=1000")) < 0) {
			fprintf(stderr, "baton: out of memory\n");
			rc = EXIT_FAILED;
			break;
		}
		rc = http_call(h, "GET", path, NULL, &page, NULL);
		free(path);
		if (rc != EXIT_OK)
			break;
		json_array_extend(all, json_object_get(page, "resources"));
		const char *next = json_string_value(json_object_get(page, "next_cursor"));
		free(cursor);
		cursor = next ? http_escape(next) : NULL;
		json_decref(page);
		if (!cursor)
			break;
	}
	free(cursor);
	if (rc != EXIT_OK) {
		json_decref(all);
		return rc;
	}
	*doc = json_pack("{s:o, s:n}", "resources", all, "next_cursor");
	return EXIT_OK;
}

int cmd_resources(struct cli *cli, int argc, char **argv)
{
	char *path = NULL;
	json_t *doc;
	int rc = parse_no_options(argc, argv);

	if (rc >= 0)
		return rc;
	if (argc - optind > 1)
		return usage_error("resources: expects at most one NAME");
	if (optind < argc) {
		char *esc = http_escape(argv[optind]);
		if (asprintf(&path, "/resources/%s", esc) < 0)
			path = NULL;
		free(esc);
		if (!path) {
			fprintf(stderr, "baton: out of memory\n");
			return EXIT_FAILED;
		}
		rc = http_call(cli->http, "GET", path, NULL, &doc, NULL);
		free(path);
	} else {
		rc = fetch_resources(cli->http, &doc);
	}
	if (rc != EXIT_OK)
		return rc;
	if (cli->json)
		print_json(stdout, doc);
	else if (optind < argc)
		print_resource(doc);
	else
		print_resources(doc);
	json_decref(doc);
	return EXIT_OK;
}

/* `baton health`: GET /healthz, for container health checks. Exit 0 when it answers 200;
 * with --json the server's answer is printed as it is ({"status": "ok"}). */
int cmd_health(struct cli *cli, int argc, char **argv)
{
	struct http_reply reply;
	(void)argv;
	if (argc != 1)
		return usage_error("health takes no arguments");
	int rc = http_request(cli->http, "GET", "/healthz", NULL, &reply);
	if (rc != EXIT_OK)
		return rc;
	long status = reply.status;
	if (cli->json && reply.body)
		print_json(stdout, reply.body);
	http_reply_fini(&reply);
	if (status != 200) {
		print_error("Not healthy", "/healthz answered %ld", status);
		return EXIT_FAILED;
	}
	if (!cli->json)
		puts("ok");
	return EXIT_OK;
}
