/*
 * members.c - the engine's side of a cluster: which resources this node drives, and what
 * happens when that changes (pg_cluster.c is the database's side, and says how ownership
 * is decided and fenced).
 *
 * A node drives the resources of the partitions it holds: their lock queues, grants and
 * steps live in its memory, and its batches carry the epochs it holds them under. The
 * membership thread posts what it read (MSG_OWNERSHIP); the engine thread compares:
 *  - a partition it gained is loaded like a restart's recovery (recover.c): running
 *    attempts run again as new attempts with a higher token, waiters queue in their order;
 *    event seqs come from a fresh block, above every seq its earlier owner used, so that
 *    event cursors never skip one;
 *  - a partition it lost (another node took it while this one was paused or cut off)
 *    leaves memory at once: its workflows, resources, pending answers; an attempt still
 *    running here finishes on its step thread and its outcome is thrown away (the new
 *    owner runs it again under a higher fencing token, which the resource can check);
 *  - above its fair share (a node joined), it hands partitions over: no new grants there,
 *    and once no step thread runs an attempt of one, it gives it back in the database,
 *    leaves memory, and the other nodes are woken to take it; held leases and claimed
 *    tasks move with it (stored, their ttls counted again by the new owner).
 * A write refused by the fence (store_write_failure.fenced) says the same as a lost
 * partition, earlier: members_fenced() reads what the database shows and drops the rest.
 *
 * Work for a resource this node does not drive: a submission is stored as "not adopted"
 * and its owner is woken (a NOTIFY hint); a cancel is recorded in the workflow's row. The
 * owner looks at its inbox on each hint and once a second (eng_recover with inbox).
 */
#include "engine.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define INBOX_POLL_MS	 1000
#define DEFAULT_LEASE_MS 3000

static void post_ownership(void *ud, const store_ownership *o)
{
	baton_engine *e = ud;
	msg *m = xcalloc(1, sizeof *m);
	m->type = MSG_OWNERSHIP;
	m->own = xcalloc(1, sizeof *m->own);
	*m->own = *o;
	eng_post(e, m);
}

static void post_inbox(void *ud)
{
	baton_engine *e = ud;
	msg *m = xcalloc(1, sizeof *m);
	m->type = MSG_INBOX;
	eng_post(e, m);
}

static int loaded_part(const baton_engine *e, int p);

/* The count of partitions this node drives, for metrics (other threads read it): claimed
 * and loaded. One claimed and not loaded yet is not counted: its requests are answered 503
 * until it is. */
static void count_held(baton_engine *e)
{
	int n = 0;
	for (int p = 0; p < PARTS; p++)
		n += loaded_part(e, p);
	pthread_mutex_lock(&e->metrics_mu);
	e->parts_held = n;
	pthread_mutex_unlock(&e->metrics_mu);
}

int members_join(baton_engine *e, const baton_engine_config *cfg, baton_error *err)
{
	if (!e->st->ops->join)
		return BATON_OK;
	if (cfg->node_id && cfg->node_id[0]) {
		snprintf(e->node_id, sizeof e->node_id, "%s", cfg->node_id);
	} else {
		char host[64] = "node", rnd[33] = "0000";
		if (gethostname(host, sizeof host) != 0 || !host[0])
			snprintf(host, sizeof host, "node");
		host[sizeof host - 1] = 0;
		random_id(rnd);
		snprintf(e->node_id, sizeof e->node_id, "%s-%.4s", host, rnd);
	}
	store_cluster_hooks h = {post_ownership, post_inbox, e};
	int64_t lease = cfg->lease_ms > 0 ? cfg->lease_ms : DEFAULT_LEASE_MS;
	int rc = e->st->ops->join(e->st, e->node_id, cfg->advertise_url ? cfg->advertise_url : "",
				  lease, &h, e->epoch, err);
	if (rc == BATON_OK)
		e->clustered = 1;
	if (rc == BATON_OK && e->st->ops->cluster_stats) { /* the join read after it renewed */
		store_cluster_stats st;
		e->st->ops->cluster_stats(e->st, &st);
		e->owners_read_at = st.lease_since;
	}
	/* Until the membership thread says what a fair share is, what was claimed is kept. */
	e->want = PARTS;
	count_held(e);
	return rc;
}

static int loaded_part(const baton_engine *e, int p)
{
	return e->epoch[p] != 0 && !(e->released[p] < 0);
}

int eng_drives(const baton_engine *e, const char *resource)
{
	if (!e->clustered)
		return 1;
	int p = part_of(resource);
	return loaded_part(e, p) && !e->leaving[p];
}

void members_who(const baton_engine *e, const char *resource, char *out, size_t n)
{
	const char *o = e->clustered ? e->owner[part_of(resource)] : "";
	snprintf(out, n, "%s", o[0] ? o : "no node yet");
}

/* ---- leaving memory ---- */

typedef struct collect {
	baton_engine *e;
	uint64_t mask;
	VEC(void *) v;
} collect;

static int in_mask(uint64_t mask, const char *resource)
{
	return (int)(mask >> part_of(resource) & 1);
}

static void collect_wf(void *ctx, void *value)
{
	collect *c = ctx;
	wf_row *wf = value;
	if (!wf->foreign && in_mask(c->mask, wf->resource))
		VEC_PUSH(c->v, wf);
}

static void collect_lock(void *ctx, void *value)
{
	collect *c = ctx;
	res_lock *l = value;
	if (in_mask(c->mask, l->row.name))
		VEC_PUSH(c->v, l);
}

static int dropping(uint64_t mask, const wf_row *wf)
{
	return !wf->foreign && in_mask(mask, wf->resource);
}

/* Everything of the partitions in mask leaves memory and this round's batch. */
static void drop_parts(baton_engine *e, uint64_t mask, const char *why)
{
	size_t k = 0;
	for (size_t i = 0; i < e->events.n; i++) {
		if (dropping(mask, e->events.v[i].wf))
			json_decref(e->events.v[i].data);
		else
			e->events.v[k++] = e->events.v[i];
	}
	e->events.n = k;
	k = 0;
	for (size_t i = 0; i < e->dirty_wfs.n; i++) {
		if (dropping(mask, e->dirty_wfs.v[i]))
			e->dirty_wfs.v[i]->in_batch = 0;
		else
			e->dirty_wfs.v[k++] = e->dirty_wfs.v[i];
	}
	e->dirty_wfs.n = k;
	k = 0;
	for (size_t i = 0; i < e->dispatches.n; i++) {
		if (!dropping(mask, e->dispatches.v[i].wf))
			e->dispatches.v[k++] = e->dispatches.v[i];
		else /* granted in this round, never sent to a step thread: no outcome comes */
			e->dispatches.v[i].wf->in_flight = 0;
	}
	e->dispatches.n = k;
	k = 0;
	for (size_t i = 0; i < e->finished.n; i++)
		if (!dropping(mask, e->finished.v[i]))
			e->finished.v[k++] = e->finished.v[i];
	e->finished.n = k;
	k = 0;
	for (size_t i = 0; i < e->replies.n; i++) {
		reply *r = &e->replies.v[i];
		if (r->part >= 0 && (mask >> r->part & 1))
			eng_waiter_done(r->w, BATON_EBUSY, 0, why);
		else
			e->replies.v[k++] = *r;
	}
	e->replies.n = k;
	k = 0;
	for (size_t i = 0; i < e->tasks_ready.n; i++) {
		wf_row *wf = strmap_get(e->wfs, e->tasks_ready.v[i]);
		if (wf && dropping(mask, wf))
			free(e->tasks_ready.v[i]);
		else
			e->tasks_ready.v[k++] = e->tasks_ready.v[i];
	}
	e->tasks_ready.n = k;

	collect c = {e, mask, {0}};
	strmap_each(e->wfs, collect_wf, &c);
	for (size_t i = 0; i < c.v.n; i++) {
		wf_row *wf = c.v.v[i];
		if (wf->lease_w) {
			eng_waiter_done(wf->lease_w, BATON_EBUSY, 0, why);
			wf->lease_w = NULL;
		}
		strmap_del(e->wfs, wf->id);
		if (wf->in_flight)
			wf->lost = 1; /* freed when its attempt's outcome comes */
		else
			wf_row_free(wf);
	}
	c.v.n = 0;
	strmap_each(e->locks, collect_lock, &c);
	for (size_t i = 0; i < c.v.n; i++) {
		res_lock *l = c.v.v[i];
		k = 0;
		for (size_t j = 0; j < e->dirty_locks.n; j++)
			if (e->dirty_locks.v[j] != l)
				e->dirty_locks.v[k++] = e->dirty_locks.v[j];
		e->dirty_locks.n = k;
		k = 0;
		for (size_t j = 0; j < e->unloaded.n; j++)
			if (e->unloaded.v[j] != l)
				e->unloaded.v[k++] = e->unloaded.v[j];
		e->unloaded.n = k;
		while (lock_pop(l)) /* its waiters were freed above */
			;
		lock_clear_holds(l);
		eng_drop_lock(e, l);
	}
	free(c.v.v);
}

static int count_parts(uint64_t mask)
{
	int n = 0;
	for (int p = 0; p < PARTS; p++)
		n += (int)(mask >> p & 1);
	return n;
}

static void lose(baton_engine *e, uint64_t lost)
{
	if (!lost)
		return;
	char why[MAX_NAME + 96];
	snprintf(why, sizeof why, "this node (%s) no longer drives the resource; try again",
		 e->node_id);
	drop_parts(e, lost, why);
	for (int p = 0; p < PARTS; p++)
		if (lost >> p & 1) {
			e->epoch[p] = 0;
			e->leaving[p] = 0;
			e->released[p] = 0;
		}
	pthread_mutex_lock(&e->metrics_mu);
	e->parts_lost += (uint64_t)count_parts(lost);
	pthread_mutex_unlock(&e->metrics_mu);
	log_at(&e->log, BATON_LOG_WARN, NULL,
	       "node %s lost %d partition%s (its lease ran out, or the database failed over to"
	       " a new generation); their work goes on where they are driven now",
	       e->node_id, count_parts(lost), count_parts(lost) == 1 ? "" : "s");
}

/* ---- gaining ---- */

/* Loads the partitions in mask that were gained and are not loaded yet (released[p] < 0
 * marks them); those that cannot be read now are tried again next second. */
static void load_gained(baton_engine *e)
{
	uint64_t mask = 0;
	for (int p = 0; p < PARTS; p++)
		if (e->epoch[p] && e->released[p] < 0)
			mask |= (uint64_t)1 << p;
	if (!mask)
		return;
	/* Above every event seq an earlier owner of these workflows used. */
	e->event_seq = e->event_seq_end;
	baton_error err = {0};
	size_t before = strmap_len(e->wfs);
	if (eng_recover(e, mask, 0, &err) != BATON_OK) {
		log_at(&e->log, BATON_LOG_WARN, NULL,
		       "cannot load the work of gained partitions yet (%s); retrying", err.msg);
		return;
	}
	for (int p = 0; p < PARTS; p++)
		if (mask >> p & 1)
			e->released[p] = 0;
	count_held(e);
	pthread_mutex_lock(&e->metrics_mu);
	e->parts_gained += (uint64_t)count_parts(mask);
	pthread_mutex_unlock(&e->metrics_mu);
	log_at(&e->log, BATON_LOG_DEBUG, NULL,
	       "node %s now drives %d more partition%s (%zu unfinished workflow%s)", e->node_id,
	       count_parts(mask), count_parts(mask) == 1 ? "" : "s", strmap_len(e->wfs) - before,
	       strmap_len(e->wfs) - before == 1 ? "" : "s");
}

static void gain(baton_engine *e, int p, int64_t epoch)
{
	/* Whatever this node knew of the partition's resources is stale. */
	drop_parts(e, (uint64_t)1 << p, "the resource moved");
	e->epoch[p] = epoch;
	e->leaving[p] = 0;
	e->released[p] = -1; /* gained, not loaded yet */
}

void members_apply(baton_engine *e, msg *m, int64_t now)
{
	(void)now;
	if (m->type == MSG_INBOX) {
		e->inbox_due = 1;
		return;
	}
	store_ownership *o = m->own;
	e->owners_read_at = o->read_at;
	e->want = o->want;
	memcpy(e->owner, o->owner, sizeof e->owner);
	memcpy(e->owner_url, o->url, sizeof e->owner_url);
	uint64_t lost = 0;
	for (int p = 0; p < PARTS; p++) {
		if (e->epoch[p] && o->epoch[p] != e->epoch[p])
			lost |= (uint64_t)1 << p;
		else if (!e->epoch[p] && o->epoch[p] && o->epoch[p] > e->released[p])
			gain(e, p, o->epoch[p]);
	}
	lose(e, lost);
	count_held(e);
	free(o);
	m->own = NULL;
}

int members_fenced(baton_engine *e, baton_error *err)
{
	int64_t now_held[PARTS];
	int rc = e->st->ops->owned(e->st, now_held, err);
	if (rc)
		return rc;
	uint64_t lost = 0;
	for (int p = 0; p < PARTS; p++)
		if (e->epoch[p] && now_held[p] != e->epoch[p])
			lost |= (uint64_t)1 << p;
	if (!lost)
		return err_set(err, BATON_EBUSY, "the ownership check failed; retrying");
	lose(e, lost);
	count_held(e);
	return BATON_OK;
}

/* ---- handing over ---- */

/* busy: an attempt runs on a step thread here (its outcome must be written by this node).
 * A held lease or a claimed task does not keep a partition: their holders, tokens and ttls
 * are stored, and the new owner counts every ttl again from its claim, after any expiry
 * promised here (lease.c, task.c); their holders renew through the new owner. */
typedef struct part_use {
	int wfs[PARTS];
	int busy[PARTS];
} part_use;

static void count_use(void *ctx, void *value)
{
	part_use *u = ctx;
	wf_row *wf = value;
	if (wf->foreign)
		return;
	int p = part_of(wf->resource);
	u->wfs[p]++;
	const step_row *st = wf->cur < wf->steps_total ? &wf->steps[wf->cur] : NULL;
	int outside = wf->lease || (st && task_is_external(st)); /* held by a process elsewhere */
	if (wf->in_flight || (!outside && st && st->status == ST_RUNNING))
		u->busy[p] = 1;
}

static void hand_over(baton_engine *e)
{
	int held = 0, leaving = 0;
	for (int p = 0; p < PARTS; p++) {
		held += e->epoch[p] != 0;
		leaving += e->leaving[p];
	}
	if (!leaving && held <= e->want)
		return;
	part_use u;
	memset(&u, 0, sizeof u);
	strmap_each(e->wfs, count_use, &u);
	/* The least loaded go first. */
	for (int more = held - leaving - e->want; more > 0; more--) {
		int best = -1;
		for (int p = 0; p < PARTS; p++)
			if (e->epoch[p] && !e->leaving[p] && (best < 0 || u.wfs[p] < u.wfs[best]))
				best = p;
		if (best < 0)
			break;
		e->leaving[best] = 1;
	}
	for (int p = 0; p < PARTS; p++) {
		if (!e->leaving[p] || u.busy[p])
			continue;
		baton_error err = {0};
		if (e->st->ops->release(e->st, p, e->epoch[p], &err) != BATON_OK)
			return; /* the database is away: next round */
		drop_parts(e, (uint64_t)1 << p, "the resource moved to another node; try again");
		e->released[p] = e->epoch[p];
		e->epoch[p] = 0;
		e->leaving[p] = 0;
		log_at(&e->log, BATON_LOG_DEBUG, NULL, "node %s handed partition %d over",
		       e->node_id, p);
		count_held(e);
	}
}

/* One line when the count of driven partitions has changed and stayed a second (a start
 * claims its share in several reads; a line for each would say little). */
static void log_share(baton_engine *e)
{
	int held = 0, loaded = 0;
	for (int p = 0; p < PARTS; p++) {
		held += e->epoch[p] != 0;
		loaded += loaded_part(e, p);
	}
	if (held == e->parts_logged || loaded != held) {
		e->parts_log_at = 0;
		return;
	}
	if (!e->parts_log_at) {
		e->parts_log_at = mono_ms() + 1000;
		return;
	}
	if (mono_ms() < e->parts_log_at)
		return;
	log_at(&e->log, BATON_LOG_INFO, NULL,
	       "node %s drives %d of %d partitions (its share: %d; %zu unfinished workflow%s in"
	       " memory)",
	       e->node_id, held, PARTS, e->want, strmap_len(e->wfs),
	       strmap_len(e->wfs) == 1 ? "" : "s");
	e->parts_logged = held;
	e->parts_log_at = 0;
}

void members_round(baton_engine *e, int64_t now)
{
	(void)now;
	if (!e->clustered || e->no_new_work)
		return;
	load_gained(e);
	log_share(e);
	uint64_t driven = 0;
	for (int p = 0; p < PARTS; p++)
		if (loaded_part(e, p) && !e->leaving[p])
			driven |= (uint64_t)1 << p;
	/* The poll's next time moves on even when nothing is driven: the engine's wait sleeps
	 * until it (engine.c), and a time in the past would never let it sleep. */
	if (e->inbox_due || mono_ms() >= e->inbox_at) {
		baton_error err = {0};
		e->inbox_due = 0;
		e->inbox_at = mono_ms() + INBOX_POLL_MS;
		if (driven && eng_recover(e, driven, 1, &err) != BATON_OK)
			log_at(&e->log, BATON_LOG_DEBUG, NULL, "cannot read the inbox: %s",
			       err.msg);
	}
	/* Only between committed rounds: what is handed over must be in the database. */
	if (!e->faulty && !e->dirty_wfs.n && !e->dirty_locks.n && !e->events.n && !e->replies.n)
		hand_over(e);
}

/* Until when (proof_ms) the lease in st proves this node's partitions. No other node claims
 * them before the lease ends by the database's clock, at least lease_ms after the renewal
 * was sent; a tenth of the lease is left for the machines' clocks running at slightly
 * different rates. */
static int64_t proof_until(const store_cluster_stats *st)
{
	return proof_ms() + st->lease_left_ms - st->lease_ms / 10;
}

int64_t members_send_by(baton_engine *e)
{
	if (!e->clustered || !e->st->ops->cluster_stats)
		return 0;
	store_cluster_stats st;
	e->st->ops->cluster_stats(e->st, &st);
	return proof_until(&st);
}

/* Whether this node may still answer for what a resource already holds: a partition being
 * handed over grants nothing new (eng_drives), but its holders renew, release and read
 * through this node until the hand-over, so that no holder that renews in time loses its
 * lease to it; the new owner counts every ttl again from its claim, after any renewal
 * answered here. */
static int answers_for(const baton_engine *e, const char *resource)
{
	return !e->clustered || loaded_part(e, part_of(resource));
}

static int may_promise(baton_engine *e, const char *resource, baton_error *err)
{
	if (!answers_for(e, resource)) {
		char who[MAX_NAME + 1];
		members_who(e, resource, who, sizeof who);
		return err_set(err, BATON_EBUSY,
			       "resource \"%s\" is driven by node %s: ask that node", resource,
			       who);
	}
	if (!e->clustered || !e->st->ops->cluster_stats)
		return BATON_OK;
	store_cluster_stats st;
	e->st->ops->cluster_stats(e->st, &st);
	if (proof_until(&st) <= proof_ms())
		return err_set(
		    err, BATON_EBUSY,
		    "node %s cannot prove that it still drives resource \"%s\": its lease"
		    " in the database was not confirmed in time; try again shortly",
		    e->node_id, resource);
	/* Its lease ran out and was renewed since it last read who drives what: another node
	 * may have claimed the partition in between. The membership thread's next read, which
	 * follows the renewal, tells. */
	if (e->owners_read_at < st.lease_since)
		return err_set(err, BATON_EBUSY,
			       "node %s cannot prove that it still drives resource \"%s\": its"
			       " lease ran out before it was renewed; try again shortly",
			       e->node_id, resource);
	return BATON_OK;
}

void baton_engine_advertise(baton_engine *e, const char *url)
{
	pthread_mutex_lock(&e->metrics_mu);
	snprintf(e->advertise_url, sizeof e->advertise_url, "%s", url);
	pthread_mutex_unlock(&e->metrics_mu);
	if (e->clustered && e->st->ops->advertise)
		e->st->ops->advertise(e->st, url);
}

int members_elsewhere(const baton_engine *e, const char *resource)
{
	if (!resource || !e->clustered || eng_drives(e, resource))
		return 0;
	int p = part_of(resource);
	return e->owner[p][0] && strcmp(e->owner[p], e->node_id) != 0 && e->owner_url[p][0];
}

/* Answers w with what may_promise refused, naming the node that drives the resource. */
static void refuse(baton_engine *e, waiter *w, const char *resource, const baton_error *err)
{
	int p = resource ? part_of(resource) : 0;
	if (!w)
		return;
	if (members_elsewhere(e, resource)) {
		json_decref(w->lease);
		w->lease = json_pack("{s:s, s:s}", "node", e->owner[p], "url", e->owner_url[p]);
	}
	eng_waiter_done(w, err->code ? err->code : BATON_EBUSY, 0, err->msg);
}

int eng_promise(baton_engine *e, waiter *w, const char *resource)
{
	baton_error err = {0};
	if (may_promise(e, resource, &err) == BATON_OK)
		return 1;
	refuse(e, w, resource, &err);
	return 0;
}

void eng_pass_on(baton_engine *e, waiter *w, const char *resource)
{
	baton_error err = {0};
	if (may_promise(e, resource, &err) == BATON_OK && e->leaving[part_of(resource)])
		err_set(&err, BATON_EBUSY,
			"resource \"%s\" is being handed over by node %s to another node: try"
			" again shortly",
			resource, e->node_id);
	else if (err.code == 0) /* it was stored before this node took its partition, and is
				   not loaded yet */
		err_set(&err, BATON_EBUSY,
			"resource \"%s\" has just been taken over by node %s: try again shortly",
			resource, e->node_id);
	refuse(e, w, resource, &err);
}

int members_ready(baton_engine *e)
{
	if (!e->clustered || !e->st->ops->cluster_stats)
		return 1;
	store_cluster_stats st;
	e->st->ops->cluster_stats(e->st, &st);
	/* Renewals go every third of the lease: half a lease without one is a node that is
	 * about to lose its proof (eng_promise), told before it does. */
	return st.lease_left_ms > st.lease_ms / 2;
}

/* ---- reads ---- */

int baton_engine_nodes(baton_engine *e, json_t **out, baton_error *err)
{
	json_t *list = json_array();
	if (!e->clustered || !e->st->ops->list_nodes) {
		pthread_mutex_lock(&e->metrics_mu);
		json_t *url = json_string(e->advertise_url);
		pthread_mutex_unlock(&e->metrics_mu);
		json_array_append_new(list,
				      json_pack("{s:s, s:o, s:b, s:n, s:i, s:n, s:n}", "id",
						e->node_id[0] ? e->node_id : "local", "url", url,
						"self", 1, "lease_expires_at", "partitions", PARTS,
						"resources", "running_steps"));
		*out = json_pack("{s:o, s:o}", "nodes", list, "store", baton_engine_store(e));
		return BATON_OK;
	}
	store_node *v = NULL;
	int n = 0;
	int rc = e->st->ops->list_nodes(e->st, &v, &n, err);
	if (rc) {
		json_decref(list);
		return rc;
	}
	for (int i = 0; i < n; i++) {
		json_t *j = json_pack(
		    "{s:s, s:s, s:b, s:o, s:i, s:I, s:I}", "id", v[i].id, "url", v[i].url, "self",
		    strcmp(v[i].id, e->node_id) == 0, "lease_expires_at",
		    time_json(v[i].lease_expires_at), "partitions", v[i].partitions, "resources",
		    (json_int_t)v[i].resources, "running_steps", (json_int_t)v[i].running_steps);
		json_array_append_new(list, j);
	}
	store_nodes_free(v, n);
	*out = json_pack("{s:o, s:o}", "nodes", list, "store", baton_engine_store(e));
	return BATON_OK;
}

/* What the database promises of this node's commits: {"backend", "sync_replication":
 * true, false or null (SQLite, where it does not apply, or not read yet),
 * "sync_standbys": a count or null}. */
static json_t *store_json(baton_engine *e, const store_cluster_stats *st)
{
	int known = e->clustered && st->sync_replication >= 0;
	return json_pack("{s:s, s:o, s:o}", "backend", e->st->ops->name, "sync_replication",
			 known ? json_boolean(st->sync_replication) : json_null(), "sync_standbys",
			 known ? json_integer(st->sync_standbys) : json_null());
}

json_t *baton_engine_store(baton_engine *e)
{
	store_cluster_stats st = {.sync_replication = -1};
	if (e->clustered && e->st->ops->cluster_stats)
		e->st->ops->cluster_stats(e->st, &st);
	return store_json(e, &st);
}

json_t *baton_engine_cluster(baton_engine *e)
{
	store_cluster_stats st = {0};
	if (e->clustered && e->st->ops->cluster_stats)
		e->st->ops->cluster_stats(e->st, &st);
	pthread_mutex_lock(&e->metrics_mu);
	uint64_t gained = e->parts_gained, lost = e->parts_lost;
	int held = e->clustered ? e->parts_held : PARTS;
	pthread_mutex_unlock(&e->metrics_mu);
	return json_pack("{s:s, s:b, s:i, s:i, s:I, s:I, s:I, s:I, s:I}", "node_id",
			 e->node_id[0] ? e->node_id : "local", "clustered", e->clustered, "nodes",
			 e->clustered ? st.nodes : 1, "partitions", held, "lease_expires_at",
			 (json_int_t)st.lease_expires_at, "lease_left_ms",
			 (json_int_t)st.lease_left_ms, "partitions_gained", (json_int_t)gained,
			 "partitions_lost", (json_int_t)lost, "renew_failures",
			 (json_int_t)st.renew_failures);
}
