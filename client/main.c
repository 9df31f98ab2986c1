/*
 * main.c: `baton`, the command-line client of batond.
 *
 *   baton [--server URL] [--json] COMMAND [ARGS]
 *
 * Global options come before the command; each command parses its own arguments
 * (commands.c, demo.c) and returns the exit status of client.h: 0 ok, 1 failed,
 * 2 usage error, 3 server unreachable.
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
};

void usage(FILE *out)
{
	fputs("usage: baton [--server URL] [--token TOKEN] [--json] COMMAND [ARGS]\n"
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
	      "  events ID           show the events of a workflow\n"
	      "  watch ID            follow a workflow live: one line per event, and on a\n"
	      "                      terminal a progress bar; exit 0 if it completes, 1 if\n"
	      "                      it fails or is cancelled (with --json: events as JSON\n"
	      "                      lines); reconnects if the connection drops\n"
	      "  resources [NAME]    list the resources, or show one with its queue\n"
	      "  demo [--crash]      run the distributed-mutex demo and follow it live\n"
	      "                      (with --json: each event as one line of JSON)\n"
	      "  health              exit 0 when batond answers /healthz (for HEALTHCHECK)\n"
	      "\n"
	      "Options:\n"
	      "  --server URL        batond's base URL (default: $BATON_URL, else " DEFAULT_SERVER
	      ")\n"
	      "  --json              print the server's JSON instead of human-readable output\n"
	      "  --token TOKEN       send Authorization: Bearer TOKEN (default: $BATON_TOKEN)\n"
	      "  -h, --help          show this help\n"
	      "  --version           print the version\n"
	      "\n"
	      "Exit status: 0 ok, 1 failed (HTTP error such as 404, or the workflow of demo or\n"
	      "watch did not complete), 2 usage error, 3 server unreachable.\n",
	      out);
}

int usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs("baton: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs("\n\n", stderr);
	usage(stderr);
	return EXIT_USAGE;
}

int bad_option(const char *cmd, char **argv)
{
	return usage_error("%s: unknown option or missing value: %s", cmd, argv[optind - 1]);
}

/* Global options. Returns -1 to go on with the command, else the exit status. */
static int parse_global(int argc, char **argv, const char **server, struct cli *cli)
{
	enum { OPT_SERVER = 256, OPT_JSON, OPT_VERSION, OPT_TOKEN };
	static const struct option opts[] = {
	    {"server", required_argument, NULL, OPT_SERVER},
	    {"token", required_argument, NULL, OPT_TOKEN},
	    {"json", no_argument, NULL, OPT_JSON},
	    {"help", no_argument, NULL, 'h'},
	    {"version", no_argument, NULL, OPT_VERSION},
	    {NULL, 0, NULL, 0},
	};
	int c;

	opterr = 0;
	while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
		switch (c) {
		case OPT_SERVER:
			*server = optarg;
			break;
		case OPT_JSON:
			cli->json = 1;
			break;
		case OPT_TOKEN:
			http_set_token(optarg);
			break;
		case 'h':
			usage(stdout);
			return EXIT_OK;
		case OPT_VERSION:
			printf("baton %s\n", BATON_CLIENT_VERSION);
			return EXIT_OK;
		default:
			return usage_error("unknown option or missing value: %s", argv[optind - 1]);
		}
	}
	if (optind >= argc)
		return usage_error("no command given");
	return -1;
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
	const char *server = getenv("BATON_URL");
	int rc;

	/* Progress must show up live, even through a pipe. */
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!server || !*server)
		server = DEFAULT_SERVER;
	http_set_token(getenv("BATON_TOKEN"));
	rc = parse_global(argc, argv, &server, &cli);
	if (rc >= 0)
		return rc;

	const struct command *cmd = find_command(argv[optind]);
	if (!cmd)
		return usage_error("unknown command \"%s\"", argv[optind]);
	cli.http = http_new(server);
	if (!cli.http)
		return EXIT_FAILED;
	rc = cmd->run(&cli, argc - optind, argv + optind);
	http_free(cli.http);
	if ((fflush(stdout) != 0 || ferror(stdout)) && rc == EXIT_OK)
		rc = EXIT_FAILED; /* e.g. stdout is a full disk */
	return rc;
}
