/*
 * demo.c: `baton demo [--crash]`, the origin's distributed-mutex demo on batond.
 *
 * Submits five workers that take turns on "payment-gateway" (with --crash, worker-C fails
 * its first attempt), then follows GET /workflows/{id}/events?after=SEQ and prints each
 * line as its event arrives, in the exact words of ../shared/origin/demo-*.txt, with the
 * server's real timings. The rendering of one event is a function of that event alone
 * (render_event), so the output is the same however the polls slice the event stream.
 *
 * Exit status: 0 when the workflow completed, 1 when it failed, was cancelled or did not
 * finish before the deadline, 3 when the server could not be reached.
 */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

enum {
	POLL_INTERVAL_MS = 50,
	DEADLINE_MS = 120000, /* the crash demo needs about 3 s; a busy server gets plenty */
	NUM_WORKERS = 5,
};

static const char RESOURCE[] = "payment-gateway";
static const char *const WORKERS[NUM_WORKERS] = {"worker-A", "worker-B", "worker-C", "worker-D",
						 "worker-E"};
static const char CRASH_WORKER[] = "worker-C";

/* What following the workflow has reached. */
struct follow {
	int crash;	  /* --crash: print the crash notice at the end */
	int json;	  /* --json: print each event as one line of JSON */
	json_int_t after; /* seq of the last event seen, -1 before the first */
	int outcome;	  /* -1 while running, then the exit status */
};

/* Returns a new POST /workflows body for the demo. */
static json_t *demo_body(int crash)
{
	json_t *workers = json_array();

	for (int i = 0; i < NUM_WORKERS; i++) {
		if (crash && strcmp(WORKERS[i], CRASH_WORKER) == 0)
			json_array_append_new(workers, json_pack("{s:s, s:i}", "name", WORKERS[i],
								 "fail_attempts", 1));
		else
			json_array_append_new(workers, json_string(WORKERS[i]));
	}
	return json_pack("{s:s, s:o}", "resource", RESOURCE, "workers", workers);
}

static void print_header(int crash)
{
	printf("=== Distributed Mutex Demo ===\n");
	if (crash)
		printf("Mode: CRASH DEMO  (worker-C fails, retries; A,B not re-run; D,E "
		       "unaffected)\n");
	else
		printf("Mode: HAPPY PATH  (5 workers, serialized access, no conflicts)\n");
	printf("Resource: %s\n", RESOURCE);
	printf("Workers: ");
	for (int i = 0; i < NUM_WORKERS; i++)
		printf("%s%s", i ? ", " : "", WORKERS[i]);
	printf("\n\n");
}

/* The origin runtime's warning for a failed attempt that will be retried, as one JSON line. */
static void print_retry_warning(const json_t *ev, const char *worker, json_int_t retry_in_ms)
{
	char secs[32], *msg = NULL, *line = NULL;
	json_t *warn;

	format_secs(secs, sizeof(secs), retry_in_ms);
	if (asprintf(&msg,
		     "Function 'accessResource' failed with 'Error: Resource \"%s\" timeout for "
		     "%s' (retrying in %s secs)",
		     RESOURCE, worker, secs) < 0)
		msg = NULL;
	warn =
	    json_pack("{s:s, s:s, s:s?, s:s, s:s, s:I, s:I}", "timestamp", jstr(ev, "ts", ""),
		      "level", "warn", "msg", msg, "component", "runtime", "func", "accessResource",
		      "attempt", jint(ev, "attempt", 1), "retryIn", retry_in_ms);
	line = warn ? json_dumps(warn, JSON_COMPACT) : NULL;
	if (line)
		printf("%s\n", line);
	free(line);
	json_decref(warn);
	free(msg);
}

static void print_step_failed(const json_t *ev, const char *worker)
{
	const json_t *retry = json_object_get(ev, "retry_in_ms");

	if (json_is_integer(retry)) {
		printf("  [%s] FAILED — resource timeout (lock released, retrying...)\n", worker);
		print_retry_warning(ev, worker, json_integer_value(retry));
	} else {
		printf("  [%s] FAILED — resource timeout (lock released, no retries left)\n",
		       worker);
	}
}

/* The closing block of a completed workflow: summary, execution order, crash notice. */
static void print_result(const json_t *result, int crash)
{
	const json_t *processed = json_object_get(result, "processed");
	const json_t *p;
	size_t i;
	json_t *summary = json_pack("{s:s, s:I, s:I}", "resource", jstr(result, "resource", "?"),
				    "workersProcessed", jint(result, "workersProcessed", 0),
				    "totalMs", jint(result, "totalMs", 0));

	printf("\n=== Result ===\n");
	if (summary)
		print_json(stdout, summary);
	json_decref(summary);
	printf("\nExecution order (serialized — no overlap):\n");
	json_array_foreach(processed, i, p)
	{
		printf("  %s: %s (%" JSON_INTEGER_FORMAT "ms)\n", jstr(p, "workerId", "?"),
		       jstr(p, "action", "?"), jint(p, "duration", 0));
	}
	if (crash) {
		/* The origin's words, trailing spaces included. */
		printf("\nNotice: worker-A and worker-B each ran once (cached before crash). \n"
		       "worker-C failed → retried → succeeded. Others were not affected. \n"
		       "The mutex ensured no two workers touched the resource simultaneously.\n");
	}
}

/* Exit status for an event that ends the workflow, -1 for any other event. */
static int final_outcome(const char *type)
{
	if (strcmp(type, "workflow_completed") == 0)
		return EXIT_OK;
	if (strcmp(type, "workflow_failed") == 0 || strcmp(type, "workflow_cancelled") == 0)
		return EXIT_FAILED;
	return -1;
}

/* Prints the lines of one event (nothing for events the origin has no words for). */
static void render_event(const json_t *ev, int crash)
{
	const char *type = jstr(ev, "type", "");
	const char *worker = jstr(ev, "worker", "?");

	if (strcmp(type, "lock_acquired") == 0) {
		printf("  [%s] Acquired lock on \"%s\"...\n", worker,
		       jstr(ev, "resource", RESOURCE));
	} else if (strcmp(type, "step_completed") == 0) {
		json_int_t attempt = jint(ev, "attempt", 1);
		printf("  [%s] Done — %" JSON_INTEGER_FORMAT "ms, lock released", worker,
		       jint(ev, "duration_ms", 0));
		if (attempt > 1)
			printf(" (retry %" JSON_INTEGER_FORMAT ")", attempt);
		putchar('\n');
	} else if (strcmp(type, "step_failed") == 0) {
		print_step_failed(ev, worker);
	} else if (strcmp(type, "step_interrupted") == 0) {
		printf("  [%s] Interrupted (batond restarted), running again...\n", worker);
	} else if (strcmp(type, "workflow_completed") == 0) {
		print_result(json_object_get(ev, "result"), crash);
	} else if (strcmp(type, "workflow_failed") == 0) {
		printf("\n=== Failed ===\n%s\n", jstr(ev, "error", "(no error given)"));
	} else if (strcmp(type, "workflow_cancelled") == 0) {
		printf("\n=== Cancelled ===\n");
	}
}

/* Handles one answer of the events endpoint. Returns how many events were new. */
static size_t consume_events(struct follow *f, const json_t *reply)
{
	const json_t *events = json_object_get(reply, "events");
	const json_t *ev;
	size_t i, fresh = 0;

	json_array_foreach(events, i, ev)
	{
		json_int_t seq = jint(ev, "seq", -1);
		if (seq <= f->after)
			continue; /* already shown: never print a line twice */
		f->after = seq;
		fresh++;
		if (f->json) {
			json_dumpf(ev, stdout, JSON_COMPACT);
			putchar('\n');
		} else {
			render_event(ev, f->crash);
		}
		f->outcome = final_outcome(jstr(ev, "type", ""));
		if (f->outcome >= 0)
			break;
	}
	fflush(stdout);
	return fresh;
}

/* Polls the workflow's events until it finishes or the deadline passes. */
static int follow_workflow(http *h, const char *id, struct follow *f)
{
	long long deadline = monotonic_ms() + DEADLINE_MS;
	char *esc = http_escape(id);
	int rc = EXIT_OK;

	while (f->outcome < 0 && monotonic_ms() < deadline) {
		char *path = NULL;
		json_t *reply;
		int n = f->after < 0
			    ? asprintf(&path, "/workflows/%s/events", esc)
			    : asprintf(&path, "/workflows/%s/events?after=%" JSON_INTEGER_FORMAT,
				       esc, f->after);
		if (n < 0) {
			fprintf(stderr, "baton: out of memory\n");
			rc = EXIT_FAILED;
			break;
		}
		rc = http_call(h, "GET", path, NULL, &reply, NULL);
		free(path);
		if (rc != EXIT_OK)
			break;
		size_t got = consume_events(f, reply);
		json_decref(reply);
		if (got == 0 && f->outcome < 0)
			sleep_ms(POLL_INTERVAL_MS);
	}
	free(esc);
	if (rc != EXIT_OK)
		return rc;
	if (f->outcome < 0) {
		fprintf(stderr, "baton: demo: workflow %s did not finish within %d s\n", id,
			DEADLINE_MS / 1000);
		return EXIT_FAILED;
	}
	return f->outcome;
}

static int parse_demo(int argc, char **argv, int *crash)
{
	static const struct option opts[] = {
	    {"crash", no_argument, NULL, 'c'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	int c;

	optind = 0;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		if (c == 'c') {
			*crash = 1;
		} else if (c == 'h') {
			usage(stdout);
			return EXIT_OK;
		} else {
			return bad_option(argv[0], argv);
		}
	}
	if (optind < argc)
		return usage_error("demo: unexpected argument \"%s\"", argv[optind]);
	return -1;
}

int cmd_demo(struct cli *cli, int argc, char **argv)
{
	struct follow f = {.json = cli->json, .after = -1, .outcome = -1};
	json_t *body, *wf;
	int rc = parse_demo(argc, argv, &f.crash);

	if (rc >= 0)
		return rc;
	body = demo_body(f.crash);
	if (!body) {
		fprintf(stderr, "baton: out of memory\n");
		return EXIT_FAILED;
	}
	rc = http_call(cli->http, "POST", "/workflows", body, &wf, NULL);
	json_decref(body);
	if (rc != EXIT_OK)
		return rc;
	char *id = strdup(jstr(wf, "id", ""));
	json_decref(wf);
	if (!id || !*id) {
		fprintf(stderr, "baton: demo: the server's answer has no workflow id\n");
		free(id);
		return EXIT_FAILED;
	}
	if (!f.json)
		print_header(f.crash);
	rc = follow_workflow(cli->http, id, &f);
	free(id);
	return rc;
}
