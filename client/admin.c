/*
 * admin.c: the operator's commands of `baton`: delete a finished workflow, and download
 * a consistent copy of batond's SQLite database (GET /backup).
 */
#include <stdlib.h>
#include <string.h>

#include "client.h"

int cmd_delete(struct cli *cli, int argc, char **argv)
{
	const char *id;
	json_t *none;
	int rc = parse_workflow_id(argc, argv, &id);

	if (rc >= 0)
		return rc;
	char *esc = http_escape(id), *path = NULL;
	if (asprintf(&path, "/workflows/%s", esc) < 0) {
		fprintf(stderr, "baton: out of memory\n");
		exit(EXIT_FAILED);
	}
	free(esc);
	rc = http_call(cli->http, "DELETE", path, NULL, &none, NULL);
	free(path);
	json_decref(none);
	if (rc != EXIT_OK)
		return rc;
	if (cli->json) {
		json_t *j = json_pack("{s:s, s:b}", "id", id, "deleted", 1);
		print_json(stdout, j);
		json_decref(j);
	} else {
		printf("deleted %s\n", id);
	}
	return EXIT_OK;
}

int cmd_backup(struct cli *cli, int argc, char **argv)
{
	const char *file;
	int rc = parse_operand(argc, argv, "FILE to write the copy to", &file);
	if (rc != -1)
		return rc;
	rc = http_download(cli->http, "/backup", file);
	if (rc != EXIT_OK)
		return rc;
	if (cli->json) {
		json_t *j = json_pack("{s:s}", "file", file);
		print_json(stdout, j);
		json_decref(j);
	} else {
		printf("backup written to %s\n", file);
	}
	return EXIT_OK;
}
