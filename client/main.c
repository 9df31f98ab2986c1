/*
 * main.c: `baton`, the command-line client of batond.
 *
 *   baton [--server URL[,URL...]] [--token TOKEN] [--json] COMMAND [ARGS]
 *
 * The global options may also come after the command (`baton get ID --json`): they are
 * taken out of the whole command line first (up to a "--"), and each command parses
 * what is left (commands.c, demo.c, watch.c). Every command returns an exit status of
 * client.h: 0 ok, 1 failed, 2 usage error, 3 server unreachable, 4 completed with
 * failed steps.
 */
#include <getopt.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

static const struct command {
	const char *name;
	int (*run)(struct cli *cli, int argc, char **argv);
} commands[] = {
    {"submit", cmd_submit}, {"get", cmd_get},	    {"list", cmd_list},
    {"cancel", cmd_cancel}, {"events", cmd_events}, {"resources", cmd_resources},
    {"demo", cmd_demo},	    {"watch", cmd_watch},   {"health", cmd_health},
    {"delete", cmd_delete}, {"backup", cmd_backup}, {"lock", cmd_lock},
    {"worker", cmd_worker}, {"limit", cmd_limit},
};

void usage(FILE *out)
{
	fputs("usage: baton [--server URL[,URL...]] [--token TOKEN] [--json] COMMAND [ARGS]\n"
	      "\n"
	      "Client of batond, which runs workflows whose steps take turns on a shared "
	      "resource.\n"
	      "\n"
	      "Commands:\n"
	      "  submit [--id ID] --resource NAME WORKER...\n"
	      "                      submit a workflow, one step per worker, in order\n"
	      "  submit FILE|-       submit the workflow in a JSON file (- reads stdin)\n"
	      "  get ID              show a workflow and its steps\n"
	      "  list [--status S] [--resource R] [--limit N] [--cursor C]\n"
	      "                      list workflows, newest first\n"
	      "  cancel ID           cancel a workflow\n"
	      "  delete ID           delete a finished workflow with its events\n"
	      "  events ID           show the events of a workflow so far, as watch shows them\n"
	      "  watch ID            follow a workflow live: one line per event, and on a\n"
	      "                      terminal a progress bar (with --json: events as JSON\n"
	      "                      lines); reconnects if the connection drops\n"
	      "  resources [NAME]    list the resources, or show one with its queue (and,\n"
	      "                      when its limit is over 1, its permits and holders)\n"
	      "  limit NAME [N]      show the resource's limit, how many permits it has (1, the\n"
	      "                      default: a mutex); with N (1 to 10000) set it first\n"
	      "  demo [--crash]      run the distributed-mutex demo and follow it live\n"
	      "                      (with --json: each event as one line of JSON)\n"
	      "  health              exit 0 when batond answers /healthz (for HEALTHCHECK)\n"
	      "  backup FILE         write a consistent copy of batond's SQLite database to\n"
	      "                      FILE, taken while it runs (start batond on it to restore)\n"
	      "  lock [--exclusive] RESOURCE [--ttl 15s] [--wait 60s] [--holder NAME]\n"
	      "       [--connect-timeout 5s] -- COMMAND [ARGS...]\n"
	      "                      run COMMAND while holding a lease on RESOURCE (one of its\n"
	      "                      permits; --exclusive: all of them, so COMMAND runs alone),\n"
	      "                      with BATON_FENCING_TOKEN, BATON_LEASE_ID, BATON_RESOURCE\n"
	      "                      and BATON_SLOT (the permit's slot, 0 to limit-1; empty with\n"
	      "                      --exclusive) in its environment; renews it every ttl/3;\n"
	      "                      stops COMMAND's process group (TERM, then KILL) if the\n"
	      "                      lease is lost; a background child COMMAND leaves behind\n"
	      "                      keeps the lease (renewed) until it ends too: lock waits\n"
	      "                      for the whole group before it releases the lease and\n"
	      "                      exits; on a terminal COMMAND is its foreground job\n"
	      "                      (Ctrl-C, Ctrl-Z and fg act on it; the lease is renewed\n"
	      "                      while stopped)\n"
	      "                      (durations: 500ms, 15s, 2m, 1h; --ttl 1s to 24h, --wait\n"
	      "                      at most 168h; a --wait over 300s keeps its place in the\n"
	      "                      queue from one request to the next); exit 3 when no\n"
	      "                      server answered anything within --connect-timeout\n"
	      "  worker --worker NAME [--resource R] [--ttl 30s] [--once [--wait 60s]]\n"
	      "         -- COMMAND [ARGS...]\n"
	      "                      do the steps of external worker NAME: claim each, run\n"
	      "                      COMMAND with the task as JSON on stdin and BATON_TASK_ID,\n"
	      "                      BATON_WORKFLOW_ID, BATON_STEP, BATON_ATTEMPT,\n"
	      "                      BATON_FENCING_TOKEN... in its environment, heartbeat while\n"
	      "                      it runs (stops COMMAND's group, TERM then KILL, when no\n"
	      "                      heartbeat succeeded for 2/3 of the ttl); exit 0 completes\n"
	      "                      the step with its stdout (JSON, else a string), any other\n"
	      "                      status fails it (retryable) with its stderr's last lines;\n"
	      "                      --once: one task, then exit 0 if it completed, else 1;\n"
	      "                      75 when no task came within --wait (default 60s);\n"
	      "                      SIGINT/TERM/HUP/QUIT go to COMMAND; Ctrl-Z stops COMMAND\n"
	      "                      and the worker, whose claim is heartbeaten meanwhile\n"
	      "\n"
	      "Options (before or after the command; \"--\" ends them, for a worker named\n"
	      "like an option):\n"
	      "  --server URL[,URL...]\n"
	      "                      batond's base URL, or several (the nodes of a cluster):\n"
	      "                      a request moves on to the next when one refuses the\n"
	      "                      connection, times out or answers 503 (default:\n"
	      "                      $BATON_SERVER, else $BATON_URL, else " DEFAULT_SERVER ")\n"
	      "  --json              print the server's JSON, one document per line, instead\n"
	      "                      of human-readable output; an error is then one line of\n"
	      "                      JSON on stderr (the server's problem document, or\n"
	      "                      {\"type\": \"about:blank\", \"title\", \"detail\"} when no\n"
	      "                      answer came), the exit status unchanged\n"
	      "  --token TOKEN       send Authorization: Bearer TOKEN (default: $BATON_TOKEN)\n"
	      "  -h, --help          show this help\n"
	      "  --version           print the version\n"
	      "\n"
	      "Exit status:\n"
	      "  0  ok; for watch and demo: the workflow completed\n"
	      "  1  failed: an HTTP error such as 404, or for watch and demo the workflow\n"
	      "     failed or was cancelled\n"
	      "  2  usage error\n"
	      "  3  server unreachable (for watch: lost, and did not come back)\n"
	      "  4  watch and get: the workflow completed, but some of its steps failed\n"
	      "     (on_failure: continue)\n"
	      "  lock: the command's own exit status (128 + N when signal N ended it; not\n"
	      "  its background children's), or\n"
	      "  75 the lease was not granted within --wait, or ran out before the command\n"
	      "     could start; the command was not run\n"
	      "     worker --once: no task came within --wait; nothing was run\n"
	      "  76 the lease was lost while the command or its group ran; the group was\n"
	      "     stopped\n",
	      out);
}

int usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs("baton: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\nTry 'baton --help' for more information.\n", stderr);
	return EXIT_USAGE;
}

int bad_option(const char *cmd, char **argv)
{
	return usage_error("%s: unknown option or missing value: %s", cmd, argv[optind - 1]);
}

/* Options of the commands that take a value: their value is never a global option. */
static int command_option_with_value(const char *arg)
{
	static const char *const names[] = {"--id",    "--resource", "--status",
					    "--limit", "--cursor",   "--ttl",
					    "--wait",  "--holder",   "--worker"};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (strcmp(arg, names[i]) == 0)
			return 1;
	}
	return 0;
}

/* When arg is "--NAME" or "--NAME=VALUE": 1, with *value the inline VALUE or NULL. */
static int is_option(const char *arg, const char *name, const char **value)
{
	size_t n = strlen(name);

	if (strncmp(arg, "--", 2) != 0 || strncmp(arg + 2, name, n) != 0)
		return 0;
	if (arg[2 + n] == '\0') {
		*value = NULL;
		return 1;
	}
	if (arg[2 + n] != '=')
		return 0;
	*value = arg + 3 + n;
	return 1;
}

/*
 * Takes the global options out of argv, wherever they stand before a "--", and leaves
 * the command and its own arguments in argv[1..*argc-1]. Returns -1 to go on with the
 * command, else the exit status (after --help, --version or a usage error).
 */
static int take_globals(int *argc, char **argv, const char **server, struct cli *cli)
{
	int kept = 1, command = 0;

	for (int i = 1; i < *argc; i++) {
		const char *arg = argv[i], *value = NULL;
		int server_opt = is_option(arg, "server", &value);
		int token_opt = !server_opt && is_option(arg, "token", &value);

		if (strcmp(arg, "--") == 0) {
			while (i < *argc)
				argv[kept++] = argv[i++];
			break;
		}
		if (server_opt || token_opt) {
			if (!value && i + 1 == *argc)
				return usage_error("%s needs a value", arg);
			value = value ? value : argv[++i];
			if (server_opt)
				*server = value;
			else
				http_set_token(value);
		} else if (strcmp(arg, "--json") == 0) {
			cli->json = 1;
		} else if (strcmp(arg, "--version") == 0) {
			printf("baton %s\n", BATON_CLIENT_VERSION);
			return EXIT_OK;
		} else if (!command && (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0)) {
			usage(stdout);
			return EXIT_OK;
		} else if (!command && arg[0] == '-' && arg[1] != '\0') {
			return usage_error("unknown option: %s", arg);
		} else {
			command |= arg[0] != '-';
			argv[kept++] = argv[i];
			if (command_option_with_value(arg) && i + 1 < *argc)
				argv[kept++] = argv[++i];
		}
	}
	*argc = kept;
	argv[kept] = NULL;
	if (kept == 1)
		return usage_error("no command given");
	return -1;
}

/* Whether "URL,URL,..." names 1 to 16 servers, none of them empty. */
static int server_list_ok(const char *list)
{
	int n = 0;

	for (const char *p = list;; p++) {
		size_t len = strcspn(p, ","), blank = strspn(p, " /");
		if (blank >= len || ++n > 16)
			return 0;
		p += len;
		if (!*p)
			return 1;
	}
}

static const struct command *find_command(const char *name)
{
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		if (strcmp(commands[i].name, name) == 0)
			return &commands[i];
	}
	return NULL;
}

int main(int argc, char **argv)
{
	struct cli cli = {0};
	const char *server = getenv("BATON_SERVER");
	int rc;

	/* Progress must show up live, even through a pipe. */
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!server || !*server)
		server = getenv("BATON_URL"); /* its older name */
	if (!server || !*server)
		server = DEFAULT_SERVER;
	http_set_token(getenv("BATON_TOKEN"));
	opterr = 0; /* the commands report bad options themselves (bad_option) */
	rc = take_globals(&argc, argv, &server, &cli);
	if (rc >= 0)
		return rc;
	set_json_errors(cli.json);

	const struct command *cmd = find_command(argv[1]);
	if (!cmd)
		return usage_error("unknown command \"%s\"", argv[1]);
	if (!server_list_ok(server))
		return usage_error("bad server list \"%s\": 1 to 16 URLs, none empty", server);
	cli.http = http_new(server);
	if (!cli.http)
		return EXIT_FAILED;
	rc = cmd->run(&cli, argc - 1, argv + 1);
	http_free(cli.http);
	if ((fflush(stdout) != 0 || ferror(stdout)) && rc == EXIT_OK)
		rc = EXIT_FAILED; /* e.g. stdout is a full disk */
	return rc;
}
