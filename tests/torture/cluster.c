/*
 * cluster.c - the crash torture on a cluster (issue 14): after the single-node torture on
 * PostgreSQL, the same workload on NNODES batond nodes sharing one database, while one
 * node at a time is SIGKILLed and started again, SIGSTOPped past its lease and continued,
 * or SIGTERMed and started again; then the single-node audit (audit.c) and the cluster's
 * own checks.
 *
 * Design. Each node has a fixed --node-id (n0, n1, n2), so that a node started again
 * takes back its partitions at once, and a short --lease-ms (CLUSTER_LEASE_MS), so that a
 * stopped node loses its partitions within a round. The submitter and every read go
 * round robin to the nodes that are up (a stopped node is left out until it is
 * continued): a POST usually lands on a node that does not drive the workflow's resource.
 * A round picks a node (mostly the one that drives a resource drawn at random, so that
 * work changes hands) and a fault:
 *  - SIGKILL, a wait (bounded) until the resources are done with the dead process's
 *    requests (as the single-node torture does, see settle_orphans), a start again;
 *  - SIGSTOP, a wait until the other nodes no longer list it and own every partition
 *    (its lease expired and they claimed what it held), a random while more, SIGCONT:
 *    the node wakes up holding attempts it lost, whose outcomes it can no longer commit;
 *  - SIGTERM (exit status 0 expected: it finishes its steps and hands its partitions
 *    over), a start again.
 * Which node drove each attempt is not in the history, so the torture records it in the
 * database itself: a trigger of its own on `steps` (installed once the schema exists,
 * before any workflow) appends to torture_attempts, in batond's own transaction, every
 * row written as running (an attempt's grant) with its node and the owner of the
 * workflow's partition at that moment. Rows of a batch refused by the ownership check roll back
 * with it, so the table holds exactly the committed grants.
 * Checks beyond the single-node ones: each attempt was granted by a cluster node that
 * owned the resource's partition when it committed the grant, each step's `node` is its
 * latest attempt's, and the cluster ends with its nodes live and every partition owned
 * within the fair share. The single-node checks change in one way: a resource may refuse
 * a call with a stale token when it comes from a node that lost the resource (a stopped
 * node woken up), which is what fencing tokens are for; such a refusal is counted, and
 * is a violation unless the history shows that attempt interrupted (taken over).
 */
#include "torture.h"

#include <libpq-fe.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CLUSTER_LEASE_MS "1500"
#define SETTLE_MS	 3000  /* for the resources to finish with a killed node */
#define LEASE_LOST_MS	 20000 /* for the others to see a stopped node's lease expire */
#define FORM_MS		 30000 /* for the nodes to list each other, partitions shared */

/* ---- the nodes ------------------------------------------------------------------- */

static hs_server *open_node(run *r, int i)
{
	snprintf(r->node_id[i], sizeof r->node_id[i], "n%d", i);
	const char *args[] = {"--node-id", r->node_id[i], "--lease-ms", CLUSTER_LEASE_MS, NULL};
	return open_batond(r, i ? r->node[0] : NULL, args);
}

/* GET /nodes from node `from`: *listed gets a bit per cluster node listed, *parts the
 * partitions they own together, *max the most one of them owns. 0, or -1 without an
 * answer. */
static int nodes_seen(run *r, int from, unsigned *listed, int *parts, int *max)
{
	int port = atomic_load(&r->node_port[from]);
	client cl = {.next = from};
	*listed = 0;
	*parts = *max = 0;
	if (!port)
		return -1;
	long st = 0;
	json_t *j = NULL;
	int rc = api(r, &cl, "GET", "/nodes", NULL, &st, &j);
	client_fini(&cl);
	if (rc != 0 || st != 200 || !j) {
		json_decref(j);
		return -1;
	}
	json_t *n;
	size_t k;
	json_array_foreach(json_object_get(j, "nodes"), k, n)
	{
		const char *id = json_string_value(json_object_get(n, "id"));
		int p = (int)json_integer_value(json_object_get(n, "partitions"));
		for (int i = 0; id && i < r->nodes; i++)
			if (strcmp(id, r->node_id[i]) == 0)
				*listed |= 1u << i;
		*parts += p;
		if (p > *max)
			*max = p;
	}
	json_decref(j);
	return 0;
}

/* Waits (bounded) until node `from` lists exactly the nodes of `want` and they own every
 * partition between them (each at most `share` when share > 0). True when it did. */
static bool wait_nodes(run *r, int from, unsigned want, int share, int timeout_ms)
{
	int64_t deadline = mono_ms() + timeout_ms;
	do {
		unsigned listed;
		int parts, max;
		if (nodes_seen(r, from, &listed, &parts, &max) == 0 && listed == want &&
		    parts == 64 && (share <= 0 || max <= share))
			return true;
		sleep_ms(20);
	} while (mono_ms() < deadline);
	return false;
}

/*
 * Client-side connections to the resources that the kernel still carries for a killed
 * node: no owner any more (inode 0) and still sending (established, SYN sent, or closed
 * with data not yet acknowledged). A request written just before the SIGKILL can wait
 * there and reach the resource after the restarted node's retry; the live nodes'
 * connections have owners.
 */
static int orphan_connections(const run *r)
{
	FILE *f = fopen("/proc/net/tcp", "r");
	if (!f)
		return 0;
	char line[512];
	int n = 0;
	while (fgets(line, sizeof line, f)) {
		unsigned remote, state;
		unsigned long inode;
		if (sscanf(line, " %*d: %*8x:%*x %*8x:%x %x %*x:%*x %*x:%*x %*x %*u %*u %lu",
			   &remote, &state, &inode) != 3 ||
		    inode != 0 || (state != 0x01 && state != 0x02 && state != 0x04))
			continue;
		for (int i = 0; i < r->nres; i++)
			n += remote == (unsigned)fragile_port(r->res[i]);
	}
	fclose(f);
	return n;
}

/* After a SIGKILL: waits (bounded) until each resource was once without a request in
 * flight (the dead node's has ended: the live nodes keep calling) and no orphaned
 * connection carries one still. */
static void settle_orphans(run *r)
{
	int64_t t0 = mono_ms();
	unsigned idle = 0;
	int waited = 0;
	for (;;) {
		for (int i = 0; i < r->nres; i++) {
			fragile_stats st;
			fragile_get_stats(r->res[i], &st);
			idle |= (unsigned)(st.in_flight == 0) << i;
		}
		if (idle == (1u << r->nres) - 1 && orphan_connections(r) == 0)
			break;
		if (!waited++)
			r->settle_waits++;
		if (mono_ms() - t0 >= SETTLE_MS) {
			r->settle_timeouts++;
			break;
		}
		sleep_ms(1);
	}
	if (waited && mono_ms() - t0 > r->settle_max_ms)
		r->settle_max_ms = mono_ms() - t0;
}

/* Node i down and up again; 0, or -1 (after a violation) when it would not start. */
static int restart(run *r, int i, check *c)
{
	if (hs_start(r->node[i]) != 0) {
		r->restarts_failed++;
		violation(c, "node %s did not start again", r->node_id[i]);
		return -1;
	}
	atomic_store(&r->node_port[i], hs_port(r->node[i]));
	return 0;
}

static int fault_kill(run *r, int i, check *c)
{
	atomic_store(&r->node_port[i], 0);
	hs_kill(r->node[i]);
	settle_orphans(r);
	return restart(r, i, c);
}

/* SIGSTOP until the others took its partitions, and a while more; SIGCONT. */
static int fault_stop(run *r, int i, uint64_t *rng, check *c)
{
	int port = hs_port(r->node[i]), other = (i + 1) % r->nodes;
	unsigned others = ((1u << r->nodes) - 1) & ~(1u << i);
	atomic_store(&r->node_port[i], 0);
	int64_t t0 = mono_ms();
	hs_signal(r->node[i], SIGSTOP);
	if (!wait_nodes(r, other, others, 0, LEASE_LOST_MS))
		r->stop_waits_timed_out++;
	sleep_ms(rnd(rng, 0, 600));
	hs_signal(r->node[i], SIGCONT);
	if (mono_ms() - t0 > r->stop_max_ms)
		r->stop_max_ms = mono_ms() - t0;
	if (!hs_alive(r->node[i])) {
		violation(c, "node %s died after SIGSTOP and SIGCONT", r->node_id[i]);
		return restart(r, i, c);
	}
	atomic_store(&r->node_port[i], port);
	return 0;
}

static int fault_term(run *r, int i, check *c)
{
	atomic_store(&r->node_port[i], 0);
	int st = hs_stop(r->node[i]);
	if (st != 0) {
		r->term_bad++;
		violation(c, "node %s exited with %d after SIGTERM, expected 0", r->node_id[i], st);
	}
	return restart(r, i, c);
}

/* The node that drives resource `res` now (GET /resources/R, any node answers), or -1. */
static int driver_of(run *r, int res)
{
	char path[64];
	snprintf(path, sizeof path, "/resources/%s", res_name(res));
	client cl = {0};
	long st = 0;
	json_t *j = NULL;
	int node = -1;
	if (api(r, &cl, "GET", path, NULL, &st, &j) == 0 && st == 200 && j) {
		const char *id = json_string_value(json_object_get(j, "node"));
		for (int i = 0; id && i < r->nodes; i++)
			if (strcmp(id, r->node_id[i]) == 0)
				node = i;
	}
	json_decref(j);
	client_fini(&cl);
	return node;
}

static int fault_loop(run *r, check *c)
{
	static const char *const names[] = {"SIGKILL", "SIGSTOP", "SIGTERM"};
	uint64_t rng = r->seed ^ 0xc1a5ULL;
	int64_t t0 = mono_ms();
	for (int k = 1; k <= r->rounds; k++) {
		sleep_ms(rnd(&rng, 200, 1200));
		/* Mostly the node that drives a resource, so that work changes hands. */
		int i = rnd(&rng, 0, r->nodes - 1), p = rnd(&rng, 0, 99);
		int target = rnd(&rng, 0, 3) ? driver_of(r, rnd(&rng, 0, r->nres - 1)) : -1;
		if (target >= 0)
			i = target;
		int kind = p < 40 ? 0 : p < 70 ? 1 : 2;
		while (!(r->fault_mask >> kind & 1))
			kind = (kind + 1) % 3;
		snprintf(r->fault_what[k - 1], sizeof r->fault_what[0], "%s of %s", names[kind],
			 r->node_id[i]);
		r->killed_at[k - 1] = mono_ms() - r->t0;
		int rc = kind == 0   ? fault_kill(r, i, c)
			 : kind == 1 ? fault_stop(r, i, &rng, c)
				     : fault_term(r, i, c);
		r->up_at[k - 1] = mono_ms() - r->t0;
		r->faults[kind]++;
		r->kills_done = k;
		if (rc != 0)
			return -1;
		if (k % 5 == 0 || k == r->rounds) {
			pthread_mutex_lock(&r->mu);
			size_t n = r->n;
			pthread_mutex_unlock(&r->mu);
			printf("torture: cluster %d/%d rounds (%d SIGKILL, %d SIGSTOP, %d SIGTERM),"
			       " %.1f s, %zu workflows submitted\n",
			       k, r->rounds, r->faults[0], r->faults[1], r->faults[2],
			       (double)(mono_ms() - t0) / 1000.0, n);
		}
	}
	return 0;
}

/* ---- the attempts log (the torture's trigger in the cluster's database) ----------- */

static const char attempts_sql[] =
    "CREATE TABLE torture_attempts (workflow_seq bigint, idx integer, attempt integer,"
    "  token bigint, node text, owner text, at timestamptz DEFAULT clock_timestamp());"
    "CREATE FUNCTION torture_attempt() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
    " IF NEW.status = 'running' THEN INSERT INTO torture_attempts"
    "  (workflow_seq, idx, attempt, token, node, owner) VALUES (NEW.workflow_seq, NEW.idx,"
    "  NEW.attempts, NEW.fencing_token, NEW.node, (SELECT p.owner FROM workflows w"
    "  JOIN partitions p ON p.id = w.part WHERE w.seq = NEW.workflow_seq)); END IF;"
    " RETURN NULL; END $$;"
    "CREATE TRIGGER torture_attempt AFTER INSERT OR UPDATE ON steps FOR EACH ROW"
    " EXECUTE FUNCTION torture_attempt();";

static PGconn *db_connect(const run *r, check *c)
{
	const char *const keys[] = {"dbname", "connect_timeout", NULL};
	const char *const values[] = {hs_db_url(r->srv), "10", NULL};
	PGconn *db = PQconnectdbParams(keys, values, 1);
	if (db && PQstatus(db) == CONNECTION_OK)
		return db;
	violation(c, "cannot connect to %s: %s", hs_db_url(r->srv),
		  db ? PQerrorMessage(db) : "out of memory");
	PQfinish(db);
	return NULL;
}

static int install_attempts_log(run *r, check *c)
{
	PGconn *db = db_connect(r, c);
	if (!db)
		return -1;
	PGresult *res = PQexec(db, attempts_sql);
	int ok = PQresultStatus(res) == PGRES_COMMAND_OK;
	if (!ok)
		violation(c, "installing the attempts log: %s", PQresultErrorMessage(res));
	PQclear(res);
	PQfinish(db);
	return ok ? 0 : -1;
}

typedef struct attempt_row {
	char id[64], node[32], owner[32];
	int idx, attempt;
	long long token;
	int seen; /* matched by a grant of the history */
} attempt_row;

static int cmp_attempt(const void *a, const void *b)
{
	const attempt_row *x = a, *y = b;
	int k = strcmp(x->id, y->id);
	if (k)
		return k;
	if (x->idx != y->idx)
		return x->idx - y->idx;
	return x->attempt - y->attempt;
}

/* The attempts log, sorted by (workflow id, step, attempt); NULL (a violation) when it
 * cannot be read. */
static attempt_row *read_attempts(run *r, check *c, size_t *n)
{
	*n = 0;
	PGconn *db = db_connect(r, c);
	if (!db)
		return NULL;
	PGresult *res = PQexec(db, "SELECT w.id, a.idx, a.attempt, a.token, a.node, a.owner"
				   " FROM torture_attempts a JOIN workflows w"
				   " ON w.seq = a.workflow_seq");
	attempt_row *v = NULL;
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		violation(c, "reading the attempts log: %s", PQresultErrorMessage(res));
	} else {
		*n = (size_t)PQntuples(res);
		v = calloc(*n + 1, sizeof *v);
		for (int i = 0; i < (int)*n; i++) {
			snprintf(v[i].id, sizeof v[i].id, "%s", PQgetvalue(res, i, 0));
			v[i].idx = atoi(PQgetvalue(res, i, 1));
			v[i].attempt = atoi(PQgetvalue(res, i, 2));
			v[i].token = strtoll(PQgetvalue(res, i, 3), NULL, 10);
			snprintf(v[i].node, sizeof v[i].node, "%s",
				 PQgetisnull(res, i, 4) ? "(null)" : PQgetvalue(res, i, 4));
			snprintf(v[i].owner, sizeof v[i].owner, "%s",
				 PQgetisnull(res, i, 5) ? "(null)" : PQgetvalue(res, i, 5));
		}
		qsort(v, *n, sizeof *v, cmp_attempt);
	}
	PQclear(res);
	PQfinish(db);
	return v;
}

static int node_index(const run *r, const char *id)
{
	for (int i = 0; i < r->nodes; i++)
		if (strcmp(id, r->node_id[i]) == 0)
			return i;
	return -1;
}

typedef struct grant {
	int res, node;
	int64_t seq;
} grant;

static int cmp_grant(const void *a, const void *b)
{
	const grant *x = a, *y = b;
	if (x->res != y->res)
		return x->res - y->res;
	return (x->seq > y->seq) - (x->seq < y->seq);
}

/* One grant of the history against the rows the log holds for its attempt; the node
 * that granted it (index), or -1. */
static int check_grant(const run *r, const wf *w, const evt *e, attempt_row *v, size_t nv, check *c)
{
	attempt_row key = {.idx = e->step, .attempt = e->attempt};
	snprintf(key.id, sizeof key.id, "%s", w->id);
	attempt_row *a = bsearch(&key, v, nv, sizeof *v, cmp_attempt);
	if (!a) {
		violation(c, "%s step %d attempt %d: granted, but no running row was committed",
			  w->id, e->step, e->attempt);
		return -1;
	}
	while (a > v && cmp_attempt(a - 1, &key) == 0)
		a--;
	int node = node_index(r, a->node);
	for (; a < v + nv && cmp_attempt(a, &key) == 0; a++) {
		a->seen = 1;
		if (node_index(r, a->node) < 0)
			violation(c, "%s step %d attempt %d: driven by \"%s\", not a cluster node",
				  w->id, e->step, e->attempt, a->node);
		else if (node_index(r, a->node) != node)
			violation(c, "%s step %d attempt %d: written as running by two nodes",
				  w->id, e->step, e->attempt);
		if (strcmp(a->node, a->owner) != 0)
			violation(c,
				  "%s step %d attempt %d: granted by %s while %s owned the"
				  " partition",
				  w->id, e->step, e->attempt, a->node, a->owner);
		if (a->token != e->token)
			violation(c, "%s step %d attempt %d: token %lld in the row, %lld granted",
				  w->id, e->step, e->attempt, a->token, (long long)e->token);
	}
	return node;
}

void check_nodes(run *r, check *c)
{
	size_t nv, ng = 0, per_node[NNODES] = {0}, handovers = 0;
	attempt_row *v = read_attempts(r, c, &nv);
	grant *g = NULL;
	size_t gcap = 0;
	for (size_t i = 0; v && i < r->n; i++) {
		const wf *w = r->wfs[i];
		int last[MAX_STEPS];
		for (int s = 0; s < MAX_STEPS; s++)
			last[s] = -1;
		for (size_t k = 0; w->acked && k < w->nev; k++) {
			const evt *e = &w->ev[k];
			if (e->type != E_ACQ || e->step < 0 || e->step >= w->n)
				continue;
			c->examined++;
			int node = check_grant(r, w, e, v, nv, c);
			last[e->step] = node;
			if (node < 0)
				continue;
			per_node[node]++;
			if (ng == gcap)
				g = realloc(g, (gcap = gcap ? 2 * gcap : 1024) * sizeof *g);
			g[ng++] = (grant){w->res, node, e->seq};
		}
		for (int s = 0; w->acked && s < w->n; s++) {
			const char *want = last[s] >= 0 ? r->node_id[last[s]] : "";
			if (w->attempts[s] > 0 && strcmp(w->node[s], want) != 0)
				violation(c,
					  "%s step %d: node \"%s\", its latest attempt's is \"%s\"",
					  w->id, s, w->node[s], want);
		}
	}
	for (size_t i = 0; v && i < nv; i++)
		if (!v[i].seen)
			violation(c,
				  "%s step %d attempt %d: a running row (node %s) of no grant"
				  " of the history",
				  v[i].id, v[i].idx, v[i].attempt, v[i].node);
	qsort(g, ng, sizeof *g, cmp_grant);
	for (size_t i = 1; i < ng; i++)
		handovers += g[i].res == g[i - 1].res && g[i].node != g[i - 1].node;
	snprintf(c->note, sizeof c->note,
		 "%zu attempts: %zu by n0, %zu by n1, %zu by n2; %zu hand-overs of a resource"
		 " between nodes",
		 c->examined, per_node[0], per_node[1], per_node[2], handovers);
	free(g);
	free(v);
}

/* ---- the run ---------------------------------------------------------------------- */

static int open_cluster(run *r, check *c)
{
	if (setup(r, 0) != 0 || !(r->node[0] = open_node(r, 0)))
		return -1;
	r->srv = r->node[0];
	atomic_store(&r->node_port[0], hs_port(r->node[0]));
	if (install_attempts_log(r, c) != 0)
		return -1;
	for (int i = 1; i < r->nodes; i++) {
		if (!(r->node[i] = open_node(r, i)))
			return -1;
		atomic_store(&r->node_port[i], hs_port(r->node[i]));
	}
	if (!wait_nodes(r, 0, (1u << r->nodes) - 1, 0, FORM_MS)) {
		violation(c, "the nodes did not form a cluster within %d ms", FORM_MS);
		return -1;
	}
	return 0;
}

static void cluster_chaos(run *r, check *restarts)
{
	pthread_t sub;
	pthread_create(&sub, NULL, submitter, r);
	fault_loop(r, restarts);
	atomic_store(&r->stop, true);
	pthread_join(sub, NULL);
	int64_t t_chaos = mono_ms() - r->t0;
	client cl = {0};
	int64_t drained = r->restarts_failed ? -1 : drain(r, &cl);
	size_t acked = 0;
	for (size_t i = 0; i < r->n; i++) {
		wf *w = r->wfs[i];
		acked += w->acked;
		if (w->acked && collect(r, &cl, w) != 0)
			snprintf(w->final, sizeof w->final, "(no answer)");
	}
	client_fini(&cl);
	printf("torture: cluster: %zu workflows acknowledged (%zu POSTs, %zu without answer, %zu"
	       " busy; re-POSTed after a lost answer: %zu had been stored (200), %zu not (201))\n",
	       acked, r->posts, r->no_answer, r->busy, r->reposted_200, r->reposted_201);
	printf("torture: cluster: chaos %.1f s, drained in %.1f s%s; longest SIGSTOP %lld ms;"
	       " %d SIGKILLs waited for the resources (longest %lld ms, %d gave up)\n",
	       (double)t_chaos / 1000.0, (double)drained / 1000.0,
	       drained < 0 ? " (timed out)" : "", (long long)r->stop_max_ms, r->settle_waits,
	       (long long)r->settle_max_ms, r->settle_timeouts);
	snprintf(r->submit.note, sizeof r->submit.note, "%zu POSTs, %zu without answer, %zu busy",
		 r->posts, r->no_answer, r->busy);
}

/* Every node up, listing the others, the partitions all owned within the fair share. */
static void check_membership(run *r, check *c)
{
	int share = (64 + r->nodes - 1) / r->nodes;
	int64_t deadline = mono_ms() + FORM_MS; /* for all of them */
	for (int i = 0; i < r->nodes; i++) {
		c->examined++;
		if (!hs_alive(r->node[i])) {
			violation(c, "node %s is not running at the end", r->node_id[i]);
			continue;
		}
		int64_t left = deadline - mono_ms();
		if (!wait_nodes(r, i, (1u << r->nodes) - 1, share,
				left > 1000 ? (int)left : 1000)) {
			unsigned listed;
			int parts, max;
			nodes_seen(r, i, &listed, &parts, &max);
			violation(
			    c,
			    "node %s, waited up to %d ms: GET /nodes lists nodes %#x of %#x, %d"
			    " partitions owned, at most %d by one (fair share %d)",
			    r->node_id[i], FORM_MS, listed, (1u << r->nodes) - 1, parts, max,
			    share);
		}
	}
	snprintf(c->note, sizeof c->note, "%d nodes, fair share %d partitions", r->nodes, share);
}

static void cluster_audit(run *r, check *checks)
{
	check *restarts = &checks[6];
	int64_t last_token[NRES] = {0}, grants[NRES] = {0};
	check_final(r, &checks[0]);
	check_no_rerun(r, &checks[1], &checks[2]);
	check_holds(r, &checks[2], last_token, grants);
	check_retry_waits(r, &checks[3]);
	check_resources(r, &checks[5]);
	check_membership(r, &checks[8]);
	for (int i = r->nodes - 1; i >= 0; i--) {
		int st = hs_stop(r->node[i]);
		if (st != 0)
			violation(restarts,
				  "node %s exited with %d after the last SIGTERM,"
				  " expected 0",
				  r->node_id[i], st);
	}
	check_database(r, &checks[4], last_token, grants);
	check_nodes(r, &checks[7]);
	snprintf(restarts->note, sizeof restarts->note,
		 "%d SIGKILL, %d SIGSTOP (%d without the lease visibly lost), %d SIGTERM"
		 " (%d not exit 0), %d restarts failed",
		 r->faults[0], r->faults[1], r->stop_waits_timed_out, r->faults[2], r->term_bad,
		 r->restarts_failed);
}

static void cluster_teardown(run *r, check *restarts, int failing)
{
	if (failing)
		setenv("BATON_TEST_KEEP", "1", 0); /* hs_close says where */
	for (int i = r->nodes - 1; i >= 0; i--)	   /* node 0 last: it drops the database */
		if (hs_close(r->node[i]) != 0)
			violation(restarts,
				  "node %s: its logs hold a sanitizer report or a bad"
				  " start",
				  r->node_id[i]);
	run_free(r);
	free(r->fault_what);
}

/* TORTURE_FAULTS: the faults to draw from, a list of kill, stop, term (default all). */
static unsigned parse_faults(void)
{
	static const char *const names[] = {"kill", "stop", "term"};
	const char *v = getenv("TORTURE_FAULTS");
	unsigned mask = 0;
	for (int i = 0; i < 3; i++)
		mask |= (unsigned)(!v || !*v || strstr(v, names[i])) << i;
	return mask ? mask : 7;
}

void cluster_torture(uint64_t seed, int rounds, int *passed, int *failed)
{
	run r = {.seed = seed, .rounds = rounds, .nodes = NNODES, .nres = NRES, .t0 = mono_ms()};
	r.submit.name = "8. every POST answered 201, or 200/201 when re-POSTed after a lost answer";
	check checks[] = {
	    {.name = "1. cluster: every acknowledged workflow finished as expected"},
	    {.name = "2. cluster: no completed step ran again"},
	    {.name = "3. cluster: per resource, holds never overlap across nodes, fencing tokens"
		     " only grow"},
	    {.name = "4. cluster: retry waits were respected"},
	    {.name = "5. cluster: database matches what was acknowledged"},
	    {.name = "6. cluster: resources saw no overlap, accepted no stale token, no bad call"},
	    {.name = "7. cluster: nodes came back after every fault, stopped cleanly, clean logs"},
	    {.name = "9. cluster: each attempt granted by a cluster node owning its partition"},
	    {.name = "10. cluster: all nodes live at the end, every partition owned, fair shares"},
	};
	r.fault_mask = parse_faults();
	struct timespec real;
	clock_gettime(CLOCK_REALTIME, &real);
	r.real_offset = (int64_t)real.tv_sec * 1000 + real.tv_nsec / 1000000 - mono_ms();
	r.killed_at = calloc((size_t)rounds, sizeof *r.killed_at);
	r.up_at = calloc((size_t)rounds, sizeof *r.up_at);
	r.fault_what = calloc((size_t)rounds, sizeof *r.fault_what);
	pthread_mutex_init(&r.mu, NULL);
	char kinds[32] = "";
	static const char *const names[] = {"SIGKILL", "SIGSTOP", "SIGTERM"};
	for (int k = 0; k < 3; k++)
		if (r.fault_mask >> k & 1)
			snprintf(kinds + strlen(kinds), sizeof kinds - strlen(kinds), "%s%s",
				 kinds[0] ? " " : "", names[k]);
	printf("torture: cluster of %d nodes (--lease-ms %s), seed %llu (TORTURE_SEED=%llu"
	       " repeats it), %d rounds of faults (%s)\n",
	       NNODES, CLUSTER_LEASE_MS, (unsigned long long)seed, (unsigned long long)seed, rounds,
	       kinds);
	if (open_cluster(&r, &checks[6]) != 0) {
		violation(&checks[6], "the cluster could not be set up");
	} else {
		cluster_chaos(&r, &checks[6]);
		cluster_audit(&r, checks);
	}
	int failing = 0;
	for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++)
		failing |= checks[i].violations > 0;
	cluster_teardown(&r, &checks[6], failing || r.submit.violations);
	int p = 0, f = 0;
	for (size_t i = 0; i < 7; i++)
		report(&checks[i]) ? p++ : f++;
	report(&r.submit) ? p++ : f++;
	for (size_t i = 7; i < sizeof checks / sizeof checks[0]; i++)
		report(&checks[i]) ? p++ : f++;
	if (f)
		printf("torture: repeat with STORE=postgres TORTURE_SEED=%llu TORTURE_ROUNDS=%d"
		       " (the interleaving varies)\n",
		       (unsigned long long)seed, rounds);
	printf("torture: cluster, %.1f s\n", (double)(mono_ms() - r.t0) / 1000.0);
	*passed += p;
	*failed += f;
}
