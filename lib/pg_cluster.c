/*
 * pg_cluster.c - several batond nodes on one PostgreSQL database: membership, leases and
 * the ownership of partitions (members.c is the engine's side of it).
 *
 * Design. The database is the only authority, and its clock the only clock: a node's
 * lease is a row of `nodes` whose `expires` the node pushes forward (clock_timestamp()
 * plus the lease) every third of the lease, and a node is live while expires > now() as
 * the database sees it. Work is cut into PARTS partitions (a resource's is part_of() its
 * name); a row of `partitions` names its owner and an epoch that every claim raises. A
 * node claims partitions that are free or whose owner is not live, up to its fair share
 * (PARTS divided by the live nodes, rounded up), with one conditional UPDATE that skips
 * rows another transaction has locked; a node above its share hands partitions back
 * (members.c picks idle ones). Every batch a node commits starts with the ownership check
 * (W_FENCE, pg_store.c), which holds its partitions' rows FOR SHARE until the commit and
 * refuses the batch unless the rows still show this node under the epochs it claimed
 * them with: a claim by another node waits for that commit, then raises the epoch, and
 * from then on nothing the old owner sends can commit. So a node paused past its lease,
 * or cut off from the database, finds out at its next commit, and no two nodes ever
 * commit for one resource.
 *
 * The membership thread has a connection of its own, so that a long batch does not delay
 * the lease. It LISTENs on channel "baton" for hints: "free" (a node gave partitions up:
 * take a share now) and "p<N>" (another node stored a submission or cancel for partition
 * N: its owner looks now rather than at its next poll). Hints carry no data and may be
 * lost; members.c polls once a second as well.
 *
 * After the database was unreachable, every lease may have run out while no node could
 * renew it; a node that reconnects first waits one lease before it takes partitions that
 * belong to others, so that they can renew theirs instead of losing their work to it.
 *
 * Generations. When a standby is promoted, the database's generation (baton_generation(),
 * pg_store.c) rises, and an epoch claimed before it no longer passes the ownership check.
 * A node reads the generation with the partitions: its own partitions under an older epoch
 * count as not held, and it claims them again at once, with an epoch at or above the new
 * generation's floor (whose bits the engine's tokens then start from, idle.c); the
 * partitions of other nodes only one lease after it saw the change.
 */
#include "pg.h"

#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct pg_cluster {
	pg_store *s;
	store_cluster_hooks hooks;
	int64_t lease_ms;
	PGconn *c;	  /* the membership thread's (join's, before it starts) */
	int stop_pipe[2]; /* written to stop the thread */
	pthread_t thread;
	int started;
	int lost;	       /* the database is unreachable (logged once) */
	int64_t grace_until;   /* mono_ms: others' partitions are not claimed before */
	int64_t backoff_ms;    /* between reconnection attempts */
	store_ownership owner; /* as last read */
	pthread_mutex_t mu;    /* guards stats and renewed_at */
	store_cluster_stats stats;
	int64_t renewed_at; /* proof_ms when the last renewal was sent */
	char incarnation[33];
	char url[MAX_URL + 1]; /* this node's, as the others reach it (under mu) */
	int free_parts;	       /* partitions with no owner, as last read */
	int joined;	       /* the row is this process's: renewals are conditional from now on */
	int64_t earlier_left;  /* the join: what the row's lease had left (join_sql) */
	int64_t generation;    /* the database's (baton_generation()) as last read; -1: unread */
} pg_cluster;

/* A node's row belongs to the process that joined last under its id (its incarnation): a
 * second batond started with the same --node-id takes the row over, and the first one's
 * next renewal finds nothing to renew and stops. The third column: how long the row's
 * lease as it stood still runs, by the database's clock (0 when it had run out or there
 * was none): until then the first one may still promise from memory (pg_join waits). */
static const char join_sql[] =
    "WITH old AS (SELECT expires FROM nodes WHERE id = $1)"
    " INSERT INTO nodes (id, expires, incarnation, url) VALUES ($1, clock_timestamp() + $2 *"
    " interval '1 ms', $3, $4) ON CONFLICT (id) DO UPDATE SET expires = excluded.expires,"
    " incarnation = excluded.incarnation, url = excluded.url"
    " RETURNING (extract(epoch FROM expires) * 1000)::bigint,"
    " (SELECT count(*) FROM nodes WHERE expires > now() AND id <> $1) + 1,"
    " coalesce((SELECT greatest(0, ceil(extract(epoch FROM old.expires - clock_timestamp())"
    " * 1000))::bigint FROM old), 0)";
static const char renew_sql[] =
    "UPDATE nodes SET expires = clock_timestamp() + $2 * interval '1 ms', url = $4"
    " WHERE id = $1 AND incarnation = $3"
    " RETURNING (extract(epoch FROM expires) * 1000)::bigint,"
    " (SELECT count(*) FROM nodes WHERE expires > now() AND id <> $1) + 1";
/* With the database's generation and timeline (pg_store.c, schema 7), and whether this
 * session's commits are replicated synchronously: synchronous_standby_names is set and
 * synchronous_commit (on, as pg_connect sets it on every session) waits for a standby;
 * and the standbys that pg_stat_replication shows as sync or quorum (its sync_state is
 * shown only to superusers and members of pg_read_all_stats: 0 for others). Read every
 * tick, as a reload (Patroni's non-strict mode) changes it without a reconnect. */
static const char read_sql[] =
    "SELECT p.id, p.epoch, coalesce(p.owner, ''), coalesce(n.url, ''), g.floor,"
    " baton_timeline(), g.sync, g.standbys FROM partitions p"
    " LEFT JOIN nodes n ON n.id = p.owner,"
    " (SELECT baton_generation() AS floor, current_setting('synchronous_standby_names') <> ''"
    " AND current_setting('synchronous_commit') NOT IN ('local', 'off') AS sync,"
    " (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))"
    " AS standbys) g ORDER BY p.id";
/* This node's own partitions claimed under an earlier generation first, then free
 * partitions, then (with $3) those whose owner is not live. A claim's epoch is at least
 * the generation's floor. */
static const char claim_sql[] =
    "WITH g AS MATERIALIZED (SELECT baton_generation() AS floor)"
    " UPDATE partitions p SET owner = $1, epoch = greatest(p.epoch + 1, g.floor) FROM g,"
    " (SELECT id FROM partitions q WHERE (q.owner = $1 AND q.epoch < (SELECT floor FROM g))"
    " OR q.owner IS NULL OR ($3 AND q.owner <> $1 AND NOT EXISTS (SELECT 1 FROM nodes n"
    " WHERE n.id = q.owner AND n.expires > now()))"
    " ORDER BY q.owner IS DISTINCT FROM $1, q.owner IS NOT NULL, q.id"
    " LIMIT $2 FOR UPDATE SKIP LOCKED) w WHERE p.id = w.id RETURNING p.id, p.epoch";

/* Runs sql on *c under the commit bound (pg_exec_by: one not confirmed in time fails, and
 * *c is closed and set to NULL), expecting rows or success; BATON_OK or the failure in err.
 * A renewal with a synchronous standby down waits for it (never synchronous_commit = local:
 * a renewal that a promotion may lose is no renewal), but no longer than that bound, so that
 * this node stops promising, and stops, in time. */
static int run_ok(pg_store *s, PGconn **c, const char *sql, const pg_params *p, PGresult **out,
		  baton_error *err, const char *what)
{
	PGresult *r = pg_exec_by(s, c, sql, NULL, p, err, what);
	if (!r)
		return err->code ? err->code : BATON_EIO;
	ExecStatusType st = PQresultStatus(r);
	if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
		int rc = pg_fail(*c, r, err, what);
		PQclear(r);
		return rc;
	}
	if (out)
		*out = r;
	else
		PQclear(r);
	return BATON_OK;
}

/* Pushes this node's lease forward; *live: the live nodes, this one included. */
static int renew(pg_cluster *cl, int *live, baton_error *err)
{
	pg_params p = {0};
	pg_text(&p, cl->s->node_id);
	pg_int(&p, cl->lease_ms);
	pg_text(&p, cl->incarnation);
	char url[sizeof cl->url];
	pthread_mutex_lock(&cl->mu);
	memcpy(url, cl->url, sizeof url);
	pthread_mutex_unlock(&cl->mu);
	pg_text(&p, url);
	PGresult *r;
	int64_t t0 = proof_ms();
	int rc = run_ok(cl->s, &cl->c, cl->joined ? renew_sql : join_sql, &p, &r, err,
			"renewing the lease");
	if (rc)
		return rc;
	if (PQntuples(r) != 1) {
		PQclear(r);
		return err_set(err, BATON_ECONFLICT,
			       "another batond joined as node %s; this one drives nothing more"
			       " (give each batond its own --node-id)",
			       cl->s->node_id);
	}
	if (!cl->joined)
		cl->earlier_left = pg_col_int(r, 0, 2);
	cl->joined = 1;
	*live = (int)pg_col_int(r, 0, 1);
	int64_t t1 = proof_ms();
	pthread_mutex_lock(&cl->mu);
	/* Unbroken when this renewal committed before the last one ran out, as members_send_by
	 * counts it (a tenth of the lease short); else the others could claim this node's
	 * partitions in between. */
	if (!cl->renewed_at || t1 >= cl->renewed_at + cl->lease_ms - cl->lease_ms / 10)
		cl->stats.lease_since = t0;
	cl->stats.lease_expires_at = pg_col_int(r, 0, 0);
	cl->stats.nodes = *live;
	cl->renewed_at = t0; /* the lease runs from before the statement was sent */
	pthread_mutex_unlock(&cl->mu);
	PQclear(r);
	return BATON_OK;
}

/*
 * The database's generation changed under this node (a standby was promoted): the others
 * may not have found the new primary yet, and their leases, as the new primary's clock
 * sees them, may have run out while nobody could renew them. So no partition of another
 * node is claimed for one lease from now; this node's own are claimed again at once.
 */
static void new_generation(pg_cluster *cl, int64_t floor, int64_t timeline)
{
	if (cl->generation >= 0) {
		cl->grace_until = mono_ms() + cl->lease_ms;
		log_at(
		    cl->s->log, BATON_LOG_WARN, NULL,
		    "the database changed generation (a promotion: timeline %lld); node %s claims "
		    "its partitions again, and fencing tokens continue from %lld",
		    (long long)timeline, cl->s->node_id, (long long)floor);
	}
	cl->generation = floor;
}

/* What the database promises of this node's commits, as read with the partitions: one
 * log line when it changes. */
static void note_sync(pg_cluster *cl, const PGresult *r)
{
	if (!PQntuples(r))
		return;
	int sync = PQgetvalue(r, 0, 6)[0] == 't';
	int standbys = (int)pg_col_int(r, 0, 7);
	pthread_mutex_lock(&cl->mu);
	int was = cl->stats.sync_replication;
	cl->stats.sync_replication = sync;
	cl->stats.sync_standbys = standbys;
	pthread_mutex_unlock(&cl->mu);
	if (sync == was)
		return;
	if (sync)
		log_at(cl->s->log, BATON_LOG_INFO, NULL,
		       "commits are replicated synchronously (synchronous_standby_names is set;"
		       " %d synchronous standby%s connected)",
		       standbys, standbys == 1 ? "" : "s");
	else
		log_at(cl->s->log, BATON_LOG_WARN, NULL,
		       "commits are NOT replicated synchronously (synchronous_standby_names is"
		       " empty): a failover may lose acknowledged work");
}

static int read_owners(pg_cluster *cl, baton_error *err)
{
	PGresult *r;
	int64_t t0 = proof_ms();
	int rc = run_ok(cl->s, &cl->c, read_sql, NULL, &r, err, "reading partitions");
	if (rc)
		return rc;
	cl->owner.read_at = t0;
	memset(cl->owner.epoch, 0, sizeof cl->owner.epoch);
	cl->free_parts = 0;
	note_sync(cl, r);
	int64_t floor = PQntuples(r) ? pg_col_int(r, 0, 4) : cl->generation;
	if (floor != cl->generation)
		new_generation(cl, floor, PQntuples(r) ? pg_col_int(r, 0, 5) : 0);
	for (int i = 0; i < PQntuples(r); i++) {
		cl->free_parts += PQgetvalue(r, i, 2)[0] == 0;
		int id = (int)pg_col_int(r, i, 0);
		if (id < 0 || id >= PARTS)
			continue;
		snprintf(cl->owner.owner[id], sizeof cl->owner.owner[id], "%s",
			 PQgetvalue(r, i, 2));
		snprintf(cl->owner.url[id], sizeof cl->owner.url[id], "%s", PQgetvalue(r, i, 3));
		/* Claimed before a promotion: no longer held, claimed again (claim_sql). */
		if (strcmp(cl->owner.owner[id], cl->s->node_id) == 0 &&
		    pg_col_int(r, i, 1) >= floor)
			cl->owner.epoch[id] = pg_col_int(r, i, 1);
	}
	PQclear(r);
	return BATON_OK;
}

static int held(const pg_cluster *cl)
{
	int n = 0;
	for (int i = 0; i < PARTS; i++)
		n += cl->owner.epoch[i] != 0;
	return n;
}

/* Claims up to n partitions; others: also those of nodes that are not live. */
static int claim(pg_cluster *cl, int n, int others, baton_error *err)
{
	pg_params p = {0};
	pg_text(&p, cl->s->node_id);
	pg_int(&p, n);
	pg_bool(&p, others);
	PGresult *r;
	int rc = run_ok(cl->s, &cl->c, claim_sql, &p, &r, err, "claiming partitions");
	if (rc)
		return rc;
	for (int i = 0; i < PQntuples(r); i++) {
		int id = (int)pg_col_int(r, i, 0);
		if (id < 0 || id >= PARTS)
			continue;
		cl->owner.epoch[id] = pg_col_int(r, i, 1);
		snprintf(cl->owner.owner[id], sizeof cl->owner.owner[id], "%s", cl->s->node_id);
	}
	PQclear(r);
	return BATON_OK;
}

/* One round of membership: renew, read, take a share. */
static int tick(pg_cluster *cl, baton_error *err)
{
	int live = 1;
	int rc = renew(cl, &live, err);
	if (rc == BATON_OK)
		rc = read_owners(cl, err);
	if (rc)
		return rc;
	cl->owner.want = (PARTS + live - 1) / live;
	int have = held(cl);
	if (have < cl->owner.want)
		rc = claim(cl, cl->owner.want - have, mono_ms() >= cl->grace_until, err);
	return rc;
}

static PGconn *connect_listening(pg_cluster *cl, baton_error *err)
{
	PGconn *c = pg_connect(cl->s, err);
	if (c && pg_exec_ok(c, "LISTEN baton", err, "listening for hints")) {
		PQfinish(c);
		c = NULL;
	}
	return c;
}

/* Waits up to ms for a hint or the stop; 1 when the thread must stop. *now_due: a hint
 * said partitions are free. */
/* Acts on the hints libpq has read; *now_due: one said that shares change ("free": a node
 * gave partitions up; "join": a node joined, so the others' shares shrink). */
static void take_hints(pg_cluster *cl, int *now_due)
{
	PGnotify *n;
	while ((n = PQnotifies(cl->c)) != NULL) {
		if (strcmp(n->extra, "free") == 0 || strcmp(n->extra, "join") == 0) {
			*now_due = 1;
		} else if (n->extra[0] == 'p') {
			int part = atoi(n->extra + 1);
			if (part >= 0 && part < PARTS && cl->owner.epoch[part] && cl->hooks.inbox)
				cl->hooks.inbox(cl->hooks.ud);
		}
		PQfreemem(n);
	}
}

static int wait_hints(pg_cluster *cl, int64_t ms, int *now_due)
{
	/* Hints that arrived with the answers of the last round's statements are already
	 * read: the socket would not wake for them. */
	if (cl->c)
		take_hints(cl, now_due);
	if (*now_due)
		return 0;
	struct pollfd fds[2] = {{cl->stop_pipe[0], POLLIN, 0}, {-1, POLLIN, 0}};
	int sock = cl->c ? PQsocket(cl->c) : -1;
	fds[1].fd = sock;
	int rc = poll(fds, sock >= 0 ? 2 : 1, ms > 0 ? (int)ms : 0);
	if (rc > 0 && fds[0].revents)
		return 1;
	if (rc <= 0 || sock < 0 || !fds[1].revents)
		return 0;
	if (!PQconsumeInput(cl->c)) { /* the connection broke: reconnect */
		PQfinish(cl->c);
		cl->c = NULL;
		return 0;
	}
	take_hints(cl, now_due);
	return 0;
}

static void *member_main(void *arg)
{
	pg_cluster *cl = arg;
	pthread_setname_np(pthread_self(), "baton-members");
	int64_t period = cl->lease_ms / 3;
	for (;;) {
		baton_error err = {0};
		int rc = BATON_OK;
		if (!cl->c) {
			cl->c = connect_listening(cl, &err);
			rc = cl->c ? BATON_OK : BATON_EIO;
			if (cl->c && cl->lost) /* the others may not have renewed yet */
				cl->grace_until = mono_ms() + cl->lease_ms;
		}
		if (rc == BATON_OK)
			rc = tick(cl, &err);
		if (rc == BATON_ECONFLICT) { /* replaced: everything goes, for good */
			log_at(cl->s->log, BATON_LOG_ERROR, NULL, "%s", err.msg);
			memset(&cl->owner, 0, sizeof cl->owner);
			if (cl->hooks.ownership)
				cl->hooks.ownership(cl->hooks.ud, &cl->owner);
			break;
		}
		if (rc) {
			if (!cl->lost)
				log_at(cl->s->log, BATON_LOG_ERROR, NULL,
				       "node %s cannot renew its lease (%s); retrying",
				       cl->s->node_id, err.msg);
			cl->lost = 1;
			pthread_mutex_lock(&cl->mu);
			cl->stats.renew_failures++;
			pthread_mutex_unlock(&cl->mu);
			if (cl->c && PQstatus(cl->c) != CONNECTION_OK) {
				PQfinish(cl->c);
				cl->c = NULL;
			}
			cl->backoff_ms = cl->backoff_ms ? cl->backoff_ms * 2 : 100;
			if (cl->backoff_ms > period)
				cl->backoff_ms = period;
			int ignored = 0;
			if (wait_hints(cl, cl->backoff_ms, &ignored))
				break;
			continue;
		}
		if (cl->lost)
			log_at(cl->s->log, BATON_LOG_WARN, NULL, "node %s renews its lease again",
			       cl->s->node_id);
		cl->lost = 0;
		cl->backoff_ms = 0;
		if (cl->hooks.ownership)
			cl->hooks.ownership(cl->hooks.ud, &cl->owner);
		/* Below its share, a node looks again soon: the partitions it lacks are being
		 * handed over by nodes above theirs (free ones were seen), and a hint that says
		 * so may be lost. */
		int soon = held(cl) < cl->owner.want && cl->free_parts > 0 && period > 1000;
		int64_t next = mono_ms() + (soon ? 1000 : period);
		int due = 0, stop = 0;
		while (!due && cl->c && !(stop = wait_hints(cl, next - mono_ms(), &due)) &&
		       mono_ms() < next)
			;
		if (stop)
			break;
	}
	return NULL;
}

/* The join took the row over from a process that may still be running under this node id
 * (or one killed so recently that its lease has not run out): that process answers from
 * memory while its proof lasts, which ends before the row's lease as it stood (the proof is
 * counted from before its renewal was sent, a tenth of the lease short). Its partitions are
 * taken once that lease has run out; its next renewal finds the row taken and stops it. */
static void wait_for_earlier(pg_cluster *cl)
{
	if (cl->earlier_left <= 0)
		return;
	log_at(cl->s->log, BATON_LOG_WARN, NULL,
	       "node %s: the lease of an earlier batond with this node id runs %lld ms more (is "
	       "it still running?); waiting for it before taking its partitions",
	       cl->s->node_id, (long long)cl->earlier_left);
	int64_t until = proof_ms() + cl->earlier_left;
	for (int64_t left; (left = until - proof_ms()) > 0;) {
		struct timespec ts = {(time_t)(left / 1000), (long)(left % 1000) * 1000000L};
		nanosleep(&ts, NULL);
	}
}

int pg_join(store *base, const char *node_id, const char *url, int64_t lease_ms,
	    const store_cluster_hooks *h, int64_t epochs[PARTS], baton_error *err)
{
	pg_store *s = (pg_store *)base;
	pg_cluster *cl = xcalloc(1, sizeof *cl);
	cl->s = s;
	cl->hooks = *h;
	cl->lease_ms = lease_ms;
	cl->generation = -1;
	cl->stats.sync_replication = -1;
	cl->stop_pipe[0] = cl->stop_pipe[1] = -1;
	pthread_mutex_init(&cl->mu, NULL);
	snprintf(s->node_id, sizeof s->node_id, "%s", node_id);
	snprintf(cl->url, sizeof cl->url, "%s", url ? url : "");
	random_id(cl->incarnation);
	s->cluster = cl;
	/* A session stuck in a transaction ends within a lease (pg_connect); the writer's,
	 * opened before the join, is set here. */
	s->idle_tx_ms = lease_ms < 60000 ? lease_ms : 60000;
	char set[96];
	snprintf(set, sizeof set, "SET idle_in_transaction_session_timeout = %lld",
		 (long long)s->idle_tx_ms);
	if (s->w && PQstatus(s->w) == CONNECTION_OK)
		pg_exec_ok(s->w, set, NULL, "setting the session's timeout");
	int rc =
	    pipe(cl->stop_pipe) ? err_set(err, BATON_EINTERNAL, "cannot make a pipe") : BATON_OK;
	if (rc == BATON_OK && !(cl->c = connect_listening(cl, err)))
		rc = err->code;
	/* What this node id held in an earlier life is its own again, under a new epoch: a
	 * process of that life still running would be refused from now on. */
	pg_params p = {0};
	pg_text(&p, node_id);
	int live = 1;
	if (rc == BATON_OK)
		rc = renew(cl, &live, err);
	if (rc == BATON_OK)
		wait_for_earlier(cl);
	if (rc == BATON_OK)
		rc = run_ok(s, &cl->c,
			    "UPDATE partitions SET epoch = greatest(epoch + 1, baton_generation())"
			    " WHERE owner = $1",
			    &p, NULL, err, "taking back partitions");
	if (rc == BATON_OK)
		rc = tick(cl, err);
	if (rc == BATON_OK) /* the others' shares shrink: they hand over now, not at their tick */
		pg_exec_by_ok(s, &cl->c, "NOTIFY baton, 'join'", NULL, NULL, "announcing the join");
	if (rc == BATON_OK)
		memcpy(epochs, cl->owner.epoch, sizeof cl->owner.epoch);
	if (rc == BATON_OK && pthread_create(&cl->thread, NULL, member_main, cl) != 0)
		rc = err_set(err, BATON_EINTERNAL, "cannot start the membership thread");
	if (rc) {
		pg_leave(base);
		return rc;
	}
	cl->started = 1;
	pthread_mutex_lock(&cl->mu);
	cl->stats.joined = 1;
	pthread_mutex_unlock(&cl->mu);
	int n = 0;
	for (int i = 0; i < PARTS; i++)
		n += epochs[i] != 0;
	log_at(s->log, BATON_LOG_INFO, NULL,
	       "node %s joined the cluster (%d node%s live, %d of %d partitions, lease %lld ms)",
	       node_id, live, live == 1 ? "" : "s", n, PARTS, (long long)lease_ms);
	return BATON_OK;
}

void pg_advertise(store *base, const char *url)
{
	pg_cluster *cl = ((pg_store *)base)->cluster;
	if (!cl)
		return;
	pthread_mutex_lock(&cl->mu);
	snprintf(cl->url, sizeof cl->url, "%s", url);
	pthread_mutex_unlock(&cl->mu);
}

void pg_leave(store *base)
{
	pg_store *s = (pg_store *)base;
	pg_cluster *cl = s ? s->cluster : NULL;
	if (!cl)
		return;
	if (cl->started) {
		ssize_t w = write(cl->stop_pipe[1], "x", 1);
		(void)w;
		pthread_join(cl->thread, NULL);
	}
	/* Everything this node held goes back, and the others hear of it at once. */
	baton_error err = {0};
	if (cl->started && !cl->c)
		cl->c = pg_connect(s, &err);
	if (cl->started && cl->c) {
		pg_params p = {0};
		pg_text(&p, s->node_id);
		pg_text(&p, cl->incarnation);
		/* Only while the row is still this process's: a batond that took the node id
		 * over keeps what it holds. */
		int rc = pg_exec_ok(cl->c, "BEGIN", &err, "begin");
		if (rc == BATON_OK)
			rc = run_ok(
			    s, &cl->c,
			    "WITH me AS (DELETE FROM nodes WHERE id = $1 AND incarnation = $2"
			    " RETURNING 1) UPDATE partitions SET owner = NULL WHERE owner = $1"
			    " AND EXISTS (SELECT 1 FROM me)",
			    &p, NULL, &err, "giving partitions back");
		if (rc == BATON_OK)
			rc = pg_exec_by_ok(s, &cl->c, "NOTIFY baton, 'free'; COMMIT", NULL, &err,
					   "commit");
		if (rc)
			log_at(s->log, BATON_LOG_WARN, NULL,
			       "node %s could not give its partitions back (%s); the others take "
			       "them when its lease ends",
			       s->node_id, err.msg);
		else
			log_at(s->log, BATON_LOG_INFO, NULL, "node %s left the cluster",
			       s->node_id);
	}
	PQfinish(cl->c);
	for (int i = 0; i < 2; i++)
		if (cl->stop_pipe[i] >= 0)
			close(cl->stop_pipe[i]);
	pthread_mutex_destroy(&cl->mu);
	free(cl);
	s->cluster = NULL;
}

/* ---- the engine's side (its writer connection) ---- */

/* Runs a statement on the writer's connection, reconnecting first when it broke. */
static int writer_ok(pg_store *s, const char *sql, const pg_params *p, PGresult **out,
		     baton_error *err, const char *what)
{
	int rc = pg_writer(s, err);
	if (rc == BATON_OK)
		rc = run_ok(s, &s->w, sql, p, out, err, what);
	if (rc)
		pg_writer_failed(s);
	return rc;
}

int pg_owned(store *base, int64_t epochs[PARTS], baton_error *err)
{
	pg_store *s = (pg_store *)base;
	pg_params p = {0};
	pg_text(&p, s->node_id);
	PGresult *r;
	/* One claimed before a promotion is held no more: the fence refuses its batches. */
	int rc = writer_ok(s,
			   "SELECT id, epoch FROM partitions WHERE owner = $1"
			   " AND epoch >= baton_generation()",
			   &p, &r, err, "reading partitions");
	if (rc)
		return rc;
	memset(epochs, 0, PARTS * sizeof *epochs);
	for (int i = 0; i < PQntuples(r); i++) {
		int id = (int)pg_col_int(r, i, 0);
		if (id >= 0 && id < PARTS)
			epochs[id] = pg_col_int(r, i, 1);
	}
	PQclear(r);
	return BATON_OK;
}

int pg_release(store *base, int part, int64_t epoch, baton_error *err)
{
	pg_store *s = (pg_store *)base;
	pg_params p = {0};
	pg_int(&p, part);
	pg_text(&p, s->node_id);
	pg_int(&p, epoch);
	return writer_ok(
	    s,
	    "WITH u AS (UPDATE partitions SET owner = NULL WHERE id = $1 AND owner = $2"
	    " AND epoch = $3 RETURNING 1) SELECT pg_notify('baton', 'free') FROM u",
	    &p, NULL, err, "giving a partition back");
}

int pg_load_inbox(store *base, uint64_t parts, void (*wf_fn)(void *ctx, wf_row *wf), void *ctx,
		  baton_error *err)
{
	pg_store *s = (pg_store *)base;
	int rc = pg_writer(s, err);
	if (rc == BATON_OK)
		rc = pg_load_where(s,
				   "part = ANY($1) AND status IN ('pending', 'running') AND"
				   " (NOT adopted OR cancel_requested)",
				   parts, wf_fn, ctx, err);
	if (rc)
		pg_writer_failed(s);
	return rc;
}

int pg_request_cancel(store *base, const char *id, baton_error *err)
{
	pg_store *s = (pg_store *)base;
	pg_params p = {0};
	pg_text(&p, id);
	PGresult *r;
	int rc =
	    writer_ok(s,
		      "WITH w AS (SELECT seq, status, part FROM workflows WHERE id = $1),"
		      " u AS (UPDATE workflows SET cancel_requested = true WHERE seq ="
		      " (SELECT seq FROM w) AND status IN ('pending', 'running') RETURNING part)"
		      " SELECT w.status, (SELECT pg_notify('baton', 'p' || part) FROM u)"
		      " FROM w",
		      &p, &r, err, "requesting a cancel");
	if (rc)
		return rc;
	if (PQntuples(r) == 0)
		rc = err_set(err, BATON_ENOTFOUND, "no such workflow");
	else if (wf_status_parse(PQgetvalue(r, 0, 0)) > WF_RUNNING)
		rc = err_set(err, BATON_ECONFLICT, "the workflow has already finished");
	PQclear(r);
	return rc;
}

void pg_cluster_stats(store *base, store_cluster_stats *out)
{
	pg_store *s = (pg_store *)base;
	memset(out, 0, sizeof *out);
	pg_cluster *cl = s->cluster;
	if (!cl)
		return;
	pthread_mutex_lock(&cl->mu);
	*out = cl->stats;
	out->lease_left_ms = cl->lease_ms - (proof_ms() - cl->renewed_at);
	out->lease_ms = cl->lease_ms;
	pthread_mutex_unlock(&cl->mu);
}
