/*
 * sqlite_admin.c - the upkeep of baton's SQLite store: deleting finished workflows (one at
 * a time, or a bounded batch of those past the retention time) and the online backup.
 *
 * Deleting. One transaction on the writer's connection removes a workflow's row, its
 * definition, its steps and its events; the pages they held go to the file's free list
 * and later writes reuse them, so that under a steady load with retention the file stops
 * growing. A batch is bounded (the caller's max), so the engine thread, which runs it,
 * is never held for long.
 *
 * Event seqs are not stored anywhere but in the events themselves (the next one is the
 * newest row's last_seq + 1 at open), so the newest event row must outlive its workflow:
 * if it belongs to a workflow being deleted, it becomes a tombstone (workflow_seq 0, no
 * resource, no events) that no read sees, and tombstones older than the newest row are
 * dropped by the next delete. Workflow seqs may be used again once every row that named
 * them is gone: nothing outside the store keeps them.
 *
 * Backup. SQLite's online backup API copies the database from a connection of its own:
 * in WAL mode its read transaction sees one commit and never blocks the writer, so the
 * engine goes on while the copy is made.
 */
#include "sqlite.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const final_status[] = {"completed", "failed", "cancelled"};

enum {
	D_STEPS,
	D_DEF,
	D_TOMBSTONE,
	D_EVENTS,
	D_WF,
	D_NSTMT,
};
static const char *const delete_sql[D_NSTMT] = {
    [D_STEPS] = "DELETE FROM steps WHERE workflow_seq=?1",
    [D_DEF] = "DELETE FROM definitions WHERE workflow_seq=?1",
    [D_TOMBSTONE] = "UPDATE events SET workflow_seq=0, resource='', lock=0, data='[]'"
		    " WHERE seq=(SELECT max(seq) FROM events) AND workflow_seq=?1",
    [D_EVENTS] = "DELETE FROM events WHERE workflow_seq=?1",
    [D_WF] = "DELETE FROM workflows WHERE seq=?1",
};

typedef struct doomed {
	int64_t seq;
	char *id;
} doomed;

typedef struct pick {
	doomed *v;
	int n, cap;
} pick;

static void pick_add(pick *p, int64_t seq, const char *id)
{
	if (p->n == p->cap) {
		p->cap = p->cap ? p->cap * 2 : 16;
		p->v = realloc(p->v, (size_t)p->cap * sizeof *p->v);
		if (!p->v)
			abort();
	}
	p->v[p->n++] = (doomed){seq, xstrdup(id)};
}

static void pick_free(pick *p)
{
	for (int i = 0; i < p->n; i++)
		free(p->v[i].id);
	free(p->v);
}

static int prepare(sqlite3 *db, const char *sql, sqlite3_stmt **st, baton_error *err)
{
	int rc = sqlite3_prepare_v2(db, sql, -1, st, NULL);
	return rc == SQLITE_OK ? BATON_OK : sql_fail(db, rc, err, "preparing a delete");
}

/* The workflow `id`, when it has finished. */
static int pick_one(sqlite3 *db, const char *id, pick *p, baton_error *err)
{
	sqlite3_stmt *q;
	int rc = prepare(db, "SELECT seq, status FROM workflows WHERE id=?1", &q, err);
	if (rc)
		return rc;
	sql_bind_text(q, 1, id);
	int s1 = sqlite3_step(q);
	if (s1 == SQLITE_ROW) {
		int st = wf_status_parse((const char *)sqlite3_column_text(q, 1));
		if (st == WF_PENDING || st == WF_RUNNING)
			rc = err_set(err, BATON_ECONFLICT,
				     "workflow \"%s\" has not finished; cancel it first", id);
		else
			pick_add(p, sqlite3_column_int64(q, 0), id);
	} else if (s1 == SQLITE_DONE) {
		rc = err_set(err, BATON_ENOTFOUND, "no workflow with id \"%s\"", id);
	} else {
		rc = sql_fail(db, s1, err, "looking up a workflow");
	}
	sqlite3_finalize(q);
	return rc;
}

/*
 * Up to max workflows finished before `before`, oldest submitted first, per final status.
 * Each status's index is read in seq order, which is the order of submission: the scan
 * stops at the first workflow submitted at or after `before` (none after it can have
 * finished before then), so a pass reads little more than what it deletes.
 */
static int pick_old(sqlite3 *db, int64_t before, int max, pick *p, baton_error *err)
{
	sqlite3_stmt *q;
	int rc = prepare(db,
			 "SELECT seq, id, finished_at, created_at FROM workflows"
			 " WHERE status=?1 ORDER BY seq",
			 &q, err);
	for (size_t k = 0; rc == BATON_OK && k < 3 && p->n < max; k++) {
		sql_bind_text(q, 1, final_status[k]);
		int s1 = SQLITE_DONE;
		while (p->n < max && (s1 = sqlite3_step(q)) == SQLITE_ROW) {
			if (sqlite3_column_int64(q, 3) >= before)
				break;
			if (sqlite3_column_int64(q, 2) < before)
				pick_add(p, sqlite3_column_int64(q, 0),
					 (const char *)sqlite3_column_text(q, 1));
		}
		if (s1 != SQLITE_ROW && s1 != SQLITE_DONE)
			rc = sql_fail(db, s1, err, "finding old workflows");
		sqlite3_reset(q);
	}
	sqlite3_finalize(q);
	return rc;
}

static int delete_rows(sqlite3 *db, const pick *p, baton_error *err)
{
	sqlite3_stmt *st[D_NSTMT] = {0};
	int rc = BATON_OK;
	for (int i = 0; rc == BATON_OK && i < D_NSTMT; i++)
		rc = prepare(db, delete_sql[i], &st[i], err);
	for (int w = 0; rc == BATON_OK && w < p->n; w++)
		for (int i = 0; rc == BATON_OK && i < D_NSTMT; i++) {
			sqlite3_bind_int64(st[i], 1, p->v[w].seq);
			int s1 = sqlite3_step(st[i]);
			sqlite3_reset(st[i]);
			if (s1 != SQLITE_DONE)
				rc = sql_fail(db, s1, err, "deleting a workflow");
		}
	for (int i = 0; i < D_NSTMT; i++)
		sqlite3_finalize(st[i]);
	if (rc == BATON_OK && p->n)
		rc = sql_exec(db,
			      "DELETE FROM events WHERE workflow_seq=0"
			      " AND seq<(SELECT max(seq) FROM events)",
			      err);
	return rc;
}

int sqlite_delete_workflows(store *base, const char *id, int64_t before, int max,
			    store_deleted_fn fn, void *ctx, int *n, baton_error *err)
{
	sqlite_store *s = (sqlite_store *)base;
	pick p = {0};
	int rc = sql_exec(s->db, "BEGIN IMMEDIATE", err);
	if (rc)
		return rc;
	rc = id ? pick_one(s->db, id, &p, err) : pick_old(s->db, before, max, &p, err);
	if (rc == BATON_OK)
		rc = delete_rows(s->db, &p, err);
	if (rc == BATON_OK && p.n)
		rc = sql_exec(s->db, "COMMIT", err);
	if (!sqlite3_get_autocommit(s->db))
		sql_exec(s->db, "ROLLBACK", NULL); /* nothing to delete, or a failure */
	for (int i = 0; rc == BATON_OK && i < p.n; i++)
		fn(ctx, p.v[i].id);
	*n = rc == BATON_OK ? p.n : 0;
	pick_free(&p);
	return rc;
}

int sqlite_backup(store *base, const char *path, baton_error *err)
{
	sqlite_store *s = (sqlite_store *)base;
	sqlite3 *src = NULL, *dst = NULL;
	int rc = sqlite3_open_v2(s->path, &src, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, s->vfs);
	if (rc != SQLITE_OK) {
		rc = sql_fail(src, rc, err, "opening the database to copy it");
		sqlite3_close(src);
		return rc;
	}
	sqlite3_busy_timeout(src, 5000);
	/* A copy holds what the database does: its owner's only (0600), as sqlite_store.c
	 * creates the database itself; SQLite's journal for it takes its mode. */
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd >= 0)
		close(fd);
	rc = sqlite3_open_v2(
	    path, &dst, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
	int out = BATON_OK;
	if (rc != SQLITE_OK) {
		out = sql_fail(dst, rc, err, "creating the copy");
	} else {
		sqlite3_backup *b = sqlite3_backup_init(dst, "main", src, "main");
		if (!b) {
			out = sql_fail(dst, sqlite3_errcode(dst), err, "starting the copy");
		} else {
			/* All pages in one step: one read transaction, one commit's state. */
			rc = sqlite3_backup_step(b, -1);
			sqlite3_backup_finish(b);
			if (rc != SQLITE_DONE)
				out = sql_fail(NULL, rc, err, "copying the database");
		}
	}
	if (sqlite3_close(dst) != SQLITE_OK && out == BATON_OK)
		out = err_set(err, BATON_EIO, "closing the copy");
	sqlite3_close(src);
	return out;
}
