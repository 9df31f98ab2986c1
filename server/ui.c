/*
 * ui.c - the console: plain HTML, CSS and JavaScript modules that batond carries in its
 * binary (ui/, turned into ui_files by scripts/embed-ui.py at build time) and serves at
 * /ui/, with --console-dir serving them from a directory instead while they are worked
 * on.
 *
 * The files hold no data, so they are served without the token, as /healthz is: the
 * console asks the API for everything it shows, with the token the person gave it. Each
 * view has its own address (/ui/, /ui/resources/NAME, /ui/workflows/ID, /ui/nodes,
 * /ui/workflows), all answered with index.html, which reads the address. Every file
 * comes with an ETag (a hash of its bytes: 304 when the browser has it already) and the
 * policy "default-src 'self'": the page loads nothing from elsewhere, and runs no inline
 * script. settings.json tells the console whether to offer its actions
 * (--console-actions); the API decides, as for any client, whether they are allowed.
 */
#include "server.h"
#include "ui.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_UI_FILE (1024 * 1024)

/* The console's own paths: its files, its views, the redirects to it and the icon. */
int srv_ui_path(const char *path)
{
	return strcmp(path, "/") == 0 || strcmp(path, "/ui") == 0 ||
	       strncmp(path, "/ui/", 4) == 0 || strcmp(path, "/favicon.ico") == 0;
}

int h_ui_redirect(srv *s, const request *r, const char *const *p, response *out)
{
	(void)s;
	(void)r;
	(void)p;
	snprintf(out->location, sizeof out->location, "/ui/");
	out->status = 302;
	return 302;
}

/* The views: addresses that index.html shows, which reads the address itself. */
static int is_view(const char *path)
{
	return strcmp(path, "/ui/") == 0 || strcmp(path, "/ui/nodes") == 0 ||
	       strcmp(path, "/ui/workflows") == 0 || strncmp(path, "/ui/resources/", 14) == 0 ||
	       strncmp(path, "/ui/workflows/", 14) == 0;
}

static const char *type_of(const char *name)
{
	static const char *const types[][2] = {
	    {".html", "text/html; charset=utf-8"},
	    {".css", "text/css; charset=utf-8"},
	    {".js", "text/javascript; charset=utf-8"},
	    {".svg", "image/svg+xml"},
	    {".json", "application/json"},
	};
	const char *dot = strrchr(name, '.');
	for (size_t i = 0; dot && i < sizeof types / sizeof types[0]; i++)
		if (strcmp(dot, types[i][0]) == 0)
			return types[i][1];
	return NULL;
}

/* A file name the console could have: letters, digits, '.', '-', '_', not hidden. */
static int plain_name(const char *name)
{
	if (!*name || name[0] == '.' || strlen(name) > 64)
		return 0;
	for (const char *c = name; *c; c++)
		if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_",
			    *c))
			return 0;
	return 1;
}

/* --console-dir: the file's text (malloc'd) and an ETag from its bytes; NULL when none. */
static char *read_dir_file(const char *dir, const char *name, char *etag, size_t etag_len)
{
	char path[4200];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	char *text = malloc(MAX_UI_FILE + 1);
	size_t n = text ? fread(text, 1, MAX_UI_FILE, f) : 0;
	fclose(f);
	if (!text)
		return NULL;
	text[n] = 0;
	unsigned long long h = 1469598103934665603ULL; /* FNV-1a */
	for (size_t i = 0; i < n; i++)
		h = (h ^ (unsigned char)text[i]) * 1099511628211ULL;
	snprintf(etag, etag_len, "\"%016llx\"", h);
	return text;
}

static const ui_file *built_in(const char *name)
{
	for (size_t i = 0; i < ui_nfiles; i++)
		if (strcmp(ui_files[i].name, name) == 0)
			return &ui_files[i];
	return NULL;
}

/* What the console may offer: not data, the server's configuration. */
static int settings(srv *s, response *out)
{
	reply_json(out, 200, json_pack("{s:b}", "actions", s->cfg->console_actions));
	out->console_file = 1;
	return 200;
}

/* Answers with the file's bytes and etag, or 304 when the browser holds that version. */
static int send_file(const request *r, const char *type, const char *etag, char *text,
		     response *out)
{
	snprintf(out->etag, sizeof out->etag, "%s", etag);
	out->console_file = 1;
	const char *inm =
	    MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_NONE_MATCH);
	if (inm && strstr(inm, etag)) {
		free(text);
		out->status = 304;
		return 304;
	}
	out->text = text;
	out->content_type = type;
	out->status = 200;
	return 200;
}

int h_ui_file(srv *s, const request *r, const char *const *p, response *out)
{
	(void)p;
	const char *name = strcmp(r->path, "/favicon.ico") == 0 ? "icon.svg" : r->path + 4;
	if (is_view(r->path))
		name = "index.html";
	else if (strcmp(name, "settings.json") == 0)
		return settings(s, out);
	const char *type = type_of(name);
	if (!plain_name(name) || !type)
		return reply_problem(out, 404, "no such path: %s", r->path);
	if (s->cfg->console_dir[0]) {
		char etag[40];
		char *text = read_dir_file(s->cfg->console_dir, name, etag, sizeof etag);
		if (!text)
			return reply_problem(out, 404, "no such path: %s", r->path);
		return send_file(r, type, etag, text, out);
	}
	const ui_file *f = built_in(name);
	if (!f)
		return reply_problem(out, 404, "no such path: %s", r->path);
	char *text = malloc(f->len + 1);
	if (!text)
		return reply_problem(out, 500, "out of memory");
	memcpy(text, f->data, f->len + 1);
	return send_file(r, f->type, f->etag, text, out);
}
