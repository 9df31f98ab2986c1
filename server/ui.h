/*
 * ui.h - the console's files as batond carries them: a table that scripts/embed-ui.py
 * writes from ui/ at build time (each file's bytes, content type and ETag), read by ui.c.
 */
#ifndef BATOND_UI_H
#define BATOND_UI_H

#include <stddef.h>

typedef struct ui_file {
	const char *name; /* under /ui/, "app.js" */
	const char *type; /* Content-Type */
	const unsigned char *data;
	size_t len;
	const char *etag; /* a quoted hash of the bytes */
} ui_file;

extern const ui_file ui_files[];
extern const size_t ui_nfiles;

#endif
