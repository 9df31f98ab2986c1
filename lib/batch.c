/*
 * batch.c - the write half of a group commit: everything the engine changed in one round
 * (dirty workflow and step rows, resource rows, new events) becomes one store_batch,
 * written by the store in one transaction. What happens once it is durable, or when it
 * fails, is commit.c's.
 *
 * Events are numbered with seqs the store hands out in blocks, and are stored one row
 * per run of consecutive events of one workflow (a step's end, its release, the next
 * request and grant: one row). A write that is tried again after a failure keeps the
 * seqs and the rows it had, so that writing it again over a commit that did land (its
 * outcome unknown) changes nothing; events of a later round start rows of their own.
 */
#include "engine.h"

#include <stdlib.h>
#include <string.h>

/* Ids taken from the store at a time. */
#define ID_BLOCK 1024

/* After a block could not be taken, how long no other is asked for. */
#define ID_RETRY_MS 1000

/*
 * A block of ids from the store. Taking it commits, and that commit waits for a synchronous
 * standby too, until the store gives up on it (--commit-timeout-ms, pg_store.c), with the
 * engine thread held: after one failure the next blocks are refused at once for a while,
 * so that a burst of requests is answered 503 together, not each after a wait of its own.
 * The block is taken with a synchronous commit, never synchronous_commit = local: a block
 * committed on a primary alone and lost in a failover would be handed out again by the new
 * primary, to another node or to this one once its block runs out, while this node goes on
 * numbering from it (a round of unknown outcome is written again on the new primary with
 * the seqs it had). And a block whose commit was not confirmed is not used at all.
 */
static int take_ids(baton_engine *e, int kind, int64_t *first, baton_error *err)
{
	if (mono_ms() < e->ids_retry_at)
		return err_set(err, BATON_EBUSY, "%s", e->ids_why);
	int rc = store_next_ids(e->st, kind, ID_BLOCK, first, err);
	if (rc) {
		e->ids_retry_at = mono_ms() + ID_RETRY_MS;
		snprintf(e->ids_why, sizeof e->ids_why, "cannot take ids (%.240s); try again later",
			 err->msg);
	}
	return rc;
}

static int next_event_seq(baton_engine *e, int64_t *seq, baton_error *err)
{
	if (e->event_seq == e->event_seq_end) {
		int64_t first;
		int rc = take_ids(e, STORE_ID_EVENT, &first, err);
		if (rc)
			return rc;
		e->event_seq = first - 1;
		e->event_seq_end = first - 1 + ID_BLOCK;
	}
	*seq = ++e->event_seq;
	return BATON_OK;
}

int eng_next_wf_seq(baton_engine *e, int64_t *seq, baton_error *err)
{
	if (e->wf_seq == e->wf_seq_end) {
		int64_t first;
		int rc = take_ids(e, STORE_ID_WORKFLOW, &first, err);
		if (rc)
			return rc;
		e->wf_seq = first - 1;
		e->wf_seq_end = first - 1 + ID_BLOCK;
	}
	*seq = ++e->wf_seq;
	return BATON_OK;
}

/* Appends {"seq":S,"ts":T,"type":"...",<data's members>}. */
static void text_event(baton_engine *e, const pending_event *ev)
{
	textbuf_put(&e->text, "{\"seq\":", 7);
	textbuf_int(&e->text, ev->seq);
	textbuf_put(&e->text, ",\"ts\":", 6);
	textbuf_int(&e->text, ev->ts);
	textbuf_put(&e->text, ",\"type\":\"", 9);
	textbuf_put(&e->text, ev->type, strlen(ev->type));
	textbuf_put(&e->text, "\"", 1);
	codec_text_members(&e->text, ev->data);
	textbuf_put(&e->text, "}", 1);
}

/* Numbers the events that have no seq yet, in the order they happened. */
static int number_events(baton_engine *e, baton_error *err)
{
	unsigned gen = ++e->write_gen;
	for (size_t i = 0; i < e->events.n; i++) {
		pending_event *ev = &e->events.v[i];
		if (ev->seq)
			continue;
		int rc = next_event_seq(e, &ev->seq, err);
		if (rc)
			return rc;
		ev->gen = gen;
	}
	return BATON_OK;
}

/* One row per run of one workflow's events numbered by the same write. */
static void build_event_rows(baton_engine *e)
{
	size_t n = e->events.n;
	e->text.len = 0;
	e->event_rows.n = 0;
	for (size_t g = 0; g < n;) {
		const pending_event *first = &e->events.v[g];
		store_event_row row = {first->seq, first->seq, first->wf, 0, NULL, e->text.len};
		textbuf_put(&e->text, "[", 1);
		size_t k = g;
		for (; k < n && e->events.v[k].wf == first->wf && e->events.v[k].gen == first->gen;
		     k++) {
			const pending_event *ev = &e->events.v[k];
			if (k > g)
				textbuf_put(&e->text, ",", 1);
			text_event(e, ev);
			row.last_seq = ev->seq;
			row.lock |= machine_resource_event(ev->type);
		}
		textbuf_put(&e->text, "]", 1);
		row.len = e->text.len - row.len; /* the offset until the text stops moving */
		VEC_PUSH(e->event_rows, row);
		g = k;
	}
	size_t off = 0;
	for (size_t i = 0; i < e->event_rows.n; i++) {
		store_event_row *row = &e->event_rows.v[i];
		row->text = e->text.v + off;
		off += row->len;
	}
}

/* Every holder of l as the resource row keeps it for reads: [[seq, idx], ...]. */
static char *holders_text(const res_lock *l)
{
	size_t n = (size_t)l->nholds * 36 + 3, k = 0;
	char *t = xcalloc(n, 1);
	t[k++] = '[';
	for (int h = 0; h < l->nholds; h++)
		k += (size_t)snprintf(t + k, n - k, "%s[%lld,%d]", h ? "," : "",
				      (long long)l->holds[h].wf->seq, l->holds[h].wf->cur);
	t[k++] = ']';
	return t;
}

int eng_write_batch(baton_engine *e, store_write_failure *why, baton_error *err)
{
	*why = (store_write_failure){0};
	int rc = number_events(e, err);
	if (rc)
		return rc;
	build_event_rows(e);
	e->res_rows.n = 0;
	for (size_t i = 0; i < e->dirty_locks.n; i++) {
		res_lock *l = e->dirty_locks.v[i];
		if (!l->dirty)
			continue;
		wf_row *first = lock_first_holder(l);
		l->row.holder_seq = first ? first->seq : 0;
		l->row.holder_idx = first ? first->cur : 0;
		free(l->row.holders);
		l->row.holders = NULL;
		if (l->nholds > 1)
			l->row.holders = holders_text(l);
		VEC_PUSH(e->res_rows, &l->row);
	}
	/* The partitions written, for the store's ownership check (a foreign submission
	 * writes none: it waits for the owner, who adopts it under its own check). */
	uint64_t parts = 0;
	for (size_t i = 0; e->clustered && i < e->dirty_wfs.n; i++)
		if (!e->dirty_wfs.v[i]->foreign)
			parts |= (uint64_t)1 << part_of(e->dirty_wfs.v[i]->resource);
	for (size_t i = 0; e->clustered && i < e->res_rows.n; i++)
		parts |= (uint64_t)1 << part_of(e->res_rows.v[i]->name);
	store_batch b = {
	    .parts = parts,
	    .epochs = e->epoch,
	    .wfs = e->dirty_wfs.v,
	    .nwfs = e->dirty_wfs.n,
	    .resources = e->res_rows.v,
	    .nresources = e->res_rows.n,
	    .events = e->event_rows.v,
	    .nevents = e->event_rows.n,
	};
	return store_write(e->st, &b, why, err);
}
