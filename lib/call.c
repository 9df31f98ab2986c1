/*
 * call.c - the HTTP step: one request to the shared resource per attempt, made with
 * libcurl while the step holds the resource.
 *
 * Every request carries Idempotency-Key "<workflow id>/<step index>" (the same on every
 * attempt, so the resource can drop the repeat of a request whose answer was lost),
 * Baton-Fencing-Token (so it can refuse a stale holder), Baton-Workflow, Baton-Worker
 * and Baton-Attempt. 2xx completes the step with the response as its result (body
 * bounded to 1 MiB, turned by answer.c into JSON that any store accepts, whatever bytes
 * it holds, before it reaches the engine); connection errors, timeouts, 5xx, 408 and 429 may
 * succeed later and are retried (Retry-After is honoured when longer than the backoff); any other
 * status fails the step for good. Redirects are not followed, and only http and https are spoken.
 * The URL was checked against the operator's allowed prefixes at submission.
 */
#include "internal.h"

#include <curl/curl.h>
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_RESPONSE (1024 * 1024)
/* How long a call given up on (its timeout, a cancel, a stop) keeps the resource after
 * baton hung up, waiting for the resource to close its side: the most baton can know of
 * a request that may still run there. */
#define GIVEN_UP_WAIT_MS 10000
#define KEPT_SOCKETS	 4

/*
 * libcurl is loaded when HTTP steps are allowed (the engine calls call_load at open) or
 * at the first call, not linked: a batond without HTTP steps does not carry libcurl and
 * the libraries it pulls in (TLS, Kerberos, LDAP, SSH, ...: about 3 MB resident).
 */
static struct {
	CURLcode (*global_init)(long flags);
	CURL *(*easy_init)(void);
	CURLcode (*easy_setopt)(CURL *c, CURLoption opt, ...);
	CURLcode (*easy_perform)(CURL *c);
	CURLcode (*easy_getinfo)(CURL *c, CURLINFO info, ...);
	const char *(*easy_strerror)(CURLcode rc);
	void (*easy_cleanup)(CURL *c);
	struct curl_slist *(*slist_append)(struct curl_slist *l, const char *s);
	void (*slist_free_all)(struct curl_slist *l);
	time_t (*getdate)(const char *s, const time_t *unused);
	char *(*version)(void);
} cu;
static pthread_mutex_t curl_mu = PTHREAD_MUTEX_INITIALIZER;
static int curl_loaded; /* under curl_mu; cu is written once, before it becomes 1 */

static void *sym(void *lib, const char *name, char *why, size_t n)
{
	void *p = dlsym(lib, name);
	if (!p && !why[0])
		snprintf(why, n, "%s", dlerror());
	return p;
}

/* 0 when libcurl took the option, else -1 with the first refusal in why. */
static int checked(CURLcode rc, const char *option, char *why, size_t n)
{
	if (rc == CURLE_OK)
		return 0;
	if (!why[0])
		snprintf(why, n, "libcurl refused %s: %s", option, cu.easy_strerror(rc));
	return -1;
}
#define SETOPT(c, opt, val, why, n) checked(cu.easy_setopt(c, opt, val), #opt, why, n)

static int on_progress(void *ud, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d);

/* The options of every call that a libcurl may be too old for, plus the fixed ones. */
static int fixed_options(CURL *c, char *why, size_t n)
{
	int rc = 0;
	rc |= SETOPT(c, CURLOPT_PROTOCOLS_STR, "http,https", why, n); /* 7.85.0 */
	rc |= SETOPT(c, CURLOPT_FOLLOWLOCATION, 0L, why, n);
	rc |= SETOPT(c, CURLOPT_PATH_AS_IS, 1L, why, n); /* 7.42.0; sent exactly as checked */
	rc |= SETOPT(c, CURLOPT_NOSIGNAL, 1L, why, n);
	rc |= SETOPT(c, CURLOPT_NOPROGRESS, 0L, why, n);
	rc |= SETOPT(c, CURLOPT_XFERINFOFUNCTION, on_progress, why, n); /* 7.32.0 */
	rc |= SETOPT(c, CURLOPT_USERAGENT, "baton/" BATON_VERSION, why, n);
	return rc;
}

/* Refuses (why set) a libcurl that does not take every option baton relies on. */
static void probe(char *why, size_t n)
{
	CURL *c = cu.easy_init();
	char refused[160] = "";
	if (!c) {
		snprintf(why, n, "curl_easy_init failed");
		return;
	}
	if (fixed_options(c, refused, sizeof refused)) {
		const char *v = cu.version();
		snprintf(why, n,
			 "%.*s is too old for HTTP steps (%s); baton needs libcurl 7.85.0 or newer",
			 (int)strcspn(v ? v : "libcurl", " "), v ? v : "libcurl", refused);
	}
	cu.easy_cleanup(c);
}

/* 1 when libcurl is usable, else 0 with the reason in why. */
static int load_curl(char *why, size_t n)
{
	why[0] = 0;
	void *lib = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		snprintf(why, n, "%s", dlerror());
		return 0;
	}
	/* dlsym's void * to function pointers: POSIX guarantees the conversion. */
	*(void **)&cu.global_init = sym(lib, "curl_global_init", why, n);
	*(void **)&cu.easy_init = sym(lib, "curl_easy_init", why, n);
	*(void **)&cu.easy_setopt = sym(lib, "curl_easy_setopt", why, n);
	*(void **)&cu.easy_perform = sym(lib, "curl_easy_perform", why, n);
	*(void **)&cu.easy_getinfo = sym(lib, "curl_easy_getinfo", why, n);
	*(void **)&cu.easy_strerror = sym(lib, "curl_easy_strerror", why, n);
	*(void **)&cu.easy_cleanup = sym(lib, "curl_easy_cleanup", why, n);
	*(void **)&cu.slist_append = sym(lib, "curl_slist_append", why, n);
	*(void **)&cu.slist_free_all = sym(lib, "curl_slist_free_all", why, n);
	*(void **)&cu.getdate = sym(lib, "curl_getdate", why, n);
	*(void **)&cu.version = sym(lib, "curl_version", why, n);
	if (!why[0] && cu.global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
		snprintf(why, n, "curl_global_init failed");
	if (!why[0])
		probe(why, n);
	if (why[0]) {
		dlclose(lib);
		return 0;
	}
	return 1;
}

int call_load(char *why, size_t n)
{
	pthread_mutex_lock(&curl_mu);
	if (!curl_loaded) /* tried again at every call until it works: it can be installed */
		curl_loaded = load_curl(why, n);
	int ok = curl_loaded;
	pthread_mutex_unlock(&curl_mu);
	return ok ? 0 : -1;
}

typedef struct response_buf {
	char *data;
	size_t len;
	int truncated;
	int64_t retry_after_ms;
} response_buf;

static size_t on_body(char *ptr, size_t size, size_t n, void *ud)
{
	response_buf *b = ud;
	size_t len = size * n, room = MAX_RESPONSE - b->len;
	if (len > room) {
		b->truncated = 1;
		len = room;
	}
	if (len) {
		char *d = realloc(b->data, b->len + len + 1);
		if (!d)
			return 0;
		b->data = d;
		memcpy(b->data + b->len, ptr, len);
		b->len += len;
		b->data[b->len] = 0;
	}
	return size * n; /* read on, drop what is over the bound */
}

/* Retry-After: delta-seconds or an HTTP date. */
static size_t on_header(char *ptr, size_t size, size_t n, void *ud)
{
	response_buf *b = ud;
	size_t len = size * n;
	static const char name[] = "retry-after:";
	if (len > sizeof name && strncasecmp(ptr, name, sizeof name - 1) == 0) {
		char value[128];
		size_t vlen = len - (sizeof name - 1);
		if (vlen >= sizeof value)
			vlen = sizeof value - 1;
		memcpy(value, ptr + sizeof name - 1, vlen);
		value[vlen] = 0;
		char *v = value + strspn(value, " \t");
		v[strcspn(v, "\r\n")] = 0;
		char *end;
		long secs = strtol(v, &end, 10);
		if (*v && !*end && secs >= 0) {
			b->retry_after_ms = (int64_t)secs * 1000;
		} else {
			time_t when = cu.getdate(v, NULL);
			int64_t wall = wall_ms();
			if (when > 0 && (int64_t)when * 1000 > wall)
				b->retry_after_ms = (int64_t)when * 1000 - wall;
		}
		if (b->retry_after_ms > 3600 * 1000)
			b->retry_after_ms = 3600 * 1000;
	}
	return len;
}

static int on_progress(void *ud, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
	const step_input *in = ud;
	(void)a, (void)b, (void)c, (void)d;
	return in->aborted(in->sleep_ctx) ? 1 : 0;
}

/* Whether this node may have lost the resource since the grant: its lease may have run out
 * (in->send_by), and another node may hold the resource now. */
static int too_late(const step_input *in)
{
	return in->send_by && proof_ms() >= in->send_by;
}

/* The request not sent because it was too late: worth another attempt, on whichever node
 * holds the resource then. */
static void not_sent(step_output *out)
{
	out->retryable = 1;
	snprintf(out->error, sizeof out->error,
		 "not sent: this node's lease may have run out since the grant");
}

/* The call's own state for the callbacks below. */
typedef struct send_check {
	const step_input *in;
	int late;		/* the request was held back: too_late once connected */
	int sent;		/* it went out (on_prereq let it) */
	int answered;		/* its answer came in full */
	int kept[KEPT_SOCKETS]; /* sockets libcurl is done with, closed by close_kept */
	int nkept;
} send_check;

/* libcurl is done with a socket of the call: it is kept open until the call's outcome is
 * known (close_kept), so that a call given up on is not followed by the next holder's
 * while the resource may still run it. */
static int on_close_socket(void *ud, curl_socket_t fd)
{
	send_check *sc = ud;
	if (sc->nkept < KEPT_SOCKETS)
		sc->kept[sc->nkept++] = fd;
	else
		close(fd);
	return 0;
}

/* Waits until the peer of fd has closed its side (or the socket failed), GIVEN_UP_WAIT_MS
 * at most: baton's side is shut first, so that the resource sees the hang-up. */
static void wait_peer_close(int fd)
{
	shutdown(fd, SHUT_WR);
	int64_t end = mono_ms() + GIVEN_UP_WAIT_MS;
	char buf[4096];
	for (int64_t left; (left = end - mono_ms()) > 0;) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		int n = poll(&p, 1, (int)left);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0 || (p.revents & (POLLERR | POLLNVAL)))
			return;
		ssize_t got = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
		if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR))
			return; /* closed by the resource */
	}
}

/* Closes the call's sockets; after a call given up on (sent, and not answered in full),
 * each once the resource has closed its side too, or GIVEN_UP_WAIT_MS passed. */
static void close_kept(send_check *sc, int given_up)
{
	for (int i = 0; i < sc->nkept; i++) {
		if (given_up)
			wait_peer_close(sc->kept[i]);
		close(sc->kept[i]);
	}
	sc->nkept = 0;
}

/* Once the connection is up (and TLS too), right before the request goes out: a connect
 * that took until this node lost its proof sends nothing, or the request would reach the
 * resource with the token of a holder that may have been replaced. */
static int on_prereq(void *ud, char *remote_ip, char *local_ip, int remote_port, int local_port)
{
	send_check *sc = ud;
	(void)remote_ip, (void)local_ip, (void)remote_port, (void)local_port;
	if (!too_late(sc->in)) {
		sc->sent = 1;
		return CURL_PREREQFUNC_OK;
	}
	sc->late = 1;
	return CURL_PREREQFUNC_ABORT;
}

static struct curl_slist *add_header(struct curl_slist *list, const char *name, const char *value)
{
	char line[1024];
	snprintf(line, sizeof line, "%s: %s", name, value);
	struct curl_slist *l = cu.slist_append(list, line);
	return l ? l : list;
}

static struct curl_slist *request_headers(const step_input *in, const json_t *call, int has_body)
{
	struct curl_slist *h = NULL;
	const char *key;
	json_t *v;
	int has_type = 0;
	json_object_foreach((json_t *)json_object_get(call, "headers"), key, v)
	{
		h = add_header(h, key, json_string_value(v));
		has_type |= strcasecmp(key, "content-type") == 0;
	}
	if (has_body && !has_type)
		h = add_header(h, "Content-Type", "application/json");
	char buf[MAX_NAME * 2 + 32];
	snprintf(buf, sizeof buf, "%s/%d", in->workflow_id, in->index);
	h = add_header(h, "Idempotency-Key", buf);
	snprintf(buf, sizeof buf, "%lld", (long long)in->fencing_token);
	h = add_header(h, "Baton-Fencing-Token", buf);
	int slot = lock_params_slot(in->params);
	if (slot >= 0) { /* none for an exclusive step */
		snprintf(buf, sizeof buf, "%d", slot);
		h = add_header(h, "Baton-Slot", buf);
	}
	h = add_header(h, "Baton-Workflow", in->workflow_id);
	h = add_header(h, "Baton-Worker", in->worker);
	snprintf(buf, sizeof buf, "%d", in->attempt);
	h = add_header(h, "Baton-Attempt", buf);
	h = add_header(h, "Expect", ""); /* no 100-continue round trip */
	return h;
}

static void classify(const step_input *in, long status, const char *content_type,
		     const response_buf *b, int64_t latency, const char *url, step_output *out)
{
	if (status >= 200 && status < 300) {
		char action[MAX_NAME + 16];
		snprintf(action, sizeof action, "updated-%s", in->resource);
		json_t *resp = answer_json(status, content_type, b->data, b->len, b->truncated);
		if (!resp) {
			out->retryable = 1;
			snprintf(out->error, sizeof out->error, "out of memory storing the answer");
			return;
		}
		out->result = json_pack("{s:s, s:s, s:I, s:o}", "workerId", in->worker, "action",
					action, "duration", (json_int_t)latency, "response", resp);
		return;
	}
	out->retryable = status >= 500 || status == 408 || status == 429;
	out->retry_after_ms = b->retry_after_ms;
	snprintf(out->error, sizeof out->error, "HTTP %ld from %.160s%s", status, url,
		 status >= 300 && status < 400 ? " (redirects are not followed)" : "");
}

/* Every option of one call; -1 with the option libcurl refused in why. */
static int call_options(CURL *c, const step_input *in, const json_t *call, const char *payload,
			struct curl_slist *headers, response_buf *b, char *why, size_t n)
{
	const char *method = json_string_value(json_object_get(call, "method"));
	long timeout = (long)json_integer_value(json_object_get(call, "timeout_ms"));
	int rc = fixed_options(c, why, n);
	rc |= SETOPT(c, CURLOPT_URL, json_string_value(json_object_get(call, "url")), why, n);
	rc |= SETOPT(c, CURLOPT_CUSTOMREQUEST, method, why, n);
	if (strcmp(method, "GET") == 0)
		rc |= SETOPT(c, CURLOPT_HTTPGET, 1L, why, n);
	if (payload)
		rc |= SETOPT(c, CURLOPT_POSTFIELDS, payload, why, n);
	rc |= SETOPT(c, CURLOPT_HTTPHEADER, headers, why, n);
	rc |= SETOPT(c, CURLOPT_TIMEOUT_MS, timeout, why, n);
	rc |= SETOPT(c, CURLOPT_WRITEFUNCTION, on_body, why, n);
	rc |= SETOPT(c, CURLOPT_WRITEDATA, b, why, n);
	rc |= SETOPT(c, CURLOPT_HEADERFUNCTION, on_header, why, n);
	rc |= SETOPT(c, CURLOPT_HEADERDATA, b, why, n);
	rc |= SETOPT(c, CURLOPT_XFERINFODATA, (void *)in, why, n);
	return rc;
}

/* Runs the prepared transfer and turns its outcome into out. */
static void perform(CURL *c, const step_input *in, const char *url, response_buf *b, send_check *sc,
		    step_output *out)
{
	int64_t t0 = mono_ms();
	CURLcode rc = cu.easy_perform(c);
	sc->answered = rc == CURLE_OK;
	int64_t latency = mono_ms() - t0;
	long status = 0;
	char *content_type = NULL; /* owned by the handle */
	if (cu.easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status) != CURLE_OK)
		status = 0;
	if (cu.easy_getinfo(c, CURLINFO_CONTENT_TYPE, &content_type) != CURLE_OK)
		content_type = NULL;
	out->duration_ms = latency;
	if (rc == CURLE_ABORTED_BY_CALLBACK && sc->late) {
		not_sent(out);
	} else if (rc == CURLE_ABORTED_BY_CALLBACK) {
		out->aborted = 1;
	} else if (rc != CURLE_OK) {
		out->retryable = 1;
		snprintf(out->error, sizeof out->error, "%s calling %.160s",
			 rc == CURLE_OPERATION_TIMEDOUT ? "timed out" : cu.easy_strerror(rc), url);
	} else {
		classify(in, status, content_type, b, latency, url, out);
	}
	json_object_set_new(out->detail, "latency_ms", json_integer(latency));
	json_object_set_new(out->detail, "http_status",
			    status ? json_integer(status) : json_null());
}

void call_run(const step_input *in, step_output *out)
{
	char missing[256];
	if (call_load(missing, sizeof missing)) { /* once installed, the next attempt uses it */
		out->retryable = 1;
		snprintf(out->error, sizeof out->error, "HTTP steps need libcurl: %.200s", missing);
		return;
	}
	const json_t *call = json_object_get(in->params, "call");
	const char *method = json_string_value(json_object_get(call, "method"));
	const char *url = json_string_value(json_object_get(call, "url"));
	json_t *body = json_object_get(call, "body");
	char *payload = body ? json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
	response_buf b = {0};
	CURL *c = cu.easy_init();
	struct curl_slist *headers = c ? request_headers(in, call, payload != NULL) : NULL;
	char refused[160] = "";
	send_check sc = {.in = in};
	out->detail = json_pack("{s:s, s:s, s:I, s:n}", "method", method, "url", url, "latency_ms",
				(json_int_t)0, "http_status");
	if (!c || call_options(c, in, call, payload, headers, &b, refused, sizeof refused) ||
	    SETOPT(c, CURLOPT_PREREQFUNCTION, on_prereq, refused, sizeof refused) || /* 7.80.0 */
	    SETOPT(c, CURLOPT_PREREQDATA, &sc, refused, sizeof refused) ||
	    SETOPT(c, CURLOPT_CLOSESOCKETFUNCTION, on_close_socket, refused, sizeof refused) ||
	    SETOPT(c, CURLOPT_CLOSESOCKETDATA, &sc, refused, sizeof refused)) {
		out->retryable = 1; /* nothing was sent */
		snprintf(out->error, sizeof out->error, "%s",
			 c ? refused : "curl_easy_init failed");
	} else if (too_late(in)) {
		/* This node was stopped or starved past its lease: another node may hold the
		 * resource now, so nothing is sent (the call would reach it with an old token);
		 * on_prereq checks again once connected. */
		not_sent(out);
	} else {
		perform(c, in, url, &b, &sc, out);
	}
	utf8_trim(out->error); /* snprintf may have cut the URL inside a character */
	cu.slist_free_all(headers);
	if (c)
		cu.easy_cleanup(c);
	/* A call given up on may still run at the resource: the step keeps the resource until
	 * the resource has closed the connection too (bounded), and only then is its outcome
	 * recorded and the resource granted again. */
	close_kept(&sc, sc.sent && !sc.answered);
	free(payload);
	free(b.data);
}

/* ---- one exchange for the server (baton_http_exchange) ---- */

typedef struct exchange {
	const baton_http_req *q;
	baton_http_resp *p;
	size_t cap;
	curl_socket_t fd;    /* drain_ms: the exchange's own connection */
	int64_t drain_until; /* mono_ms; 0: not half-closed */
} exchange;

static size_t on_exchange_body(char *ptr, size_t size, size_t n, void *ud)
{
	exchange *x = ud;
	size_t len = size * n;
	if (x->p->body_len + len > MAX_RESPONSE)
		return 0; /* an answer no node gives: the exchange fails */
	if (x->p->body_len + len + 1 > x->cap) {
		size_t cap = (x->p->body_len + len + 1) * 2;
		char *d = realloc(x->p->body, cap);
		if (!d)
			return 0;
		x->p->body = d;
		x->cap = cap;
	}
	memcpy(x->p->body + x->p->body_len, ptr, len);
	x->p->body_len += len;
	x->p->body[x->p->body_len] = 0;
	return len;
}

/* Keeps Location and Retry-After (delta-seconds, as batond sends it) of the answer. */
static size_t on_exchange_header(char *ptr, size_t size, size_t n, void *ud)
{
	exchange *x = ud;
	size_t len = size * n;
	char line[512];
	size_t l = len < sizeof line ? len : sizeof line - 1;
	memcpy(line, ptr, l);
	line[l] = 0;
	line[strcspn(line, "\r\n")] = 0;
	char *colon = strchr(line, ':');
	if (!colon)
		return len;
	*colon = 0;
	const char *v = colon + 1 + strspn(colon + 1, " \t");
	if (strcasecmp(line, "location") == 0)
		snprintf(x->p->location, sizeof x->p->location, "%s", v);
	else if (strcasecmp(line, "retry-after") == 0)
		x->p->retry_after = atoi(v);
	return len;
}

static int on_exchange_progress(void *ud, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
	exchange *x = ud;
	(void)a, (void)b, (void)c, (void)d;
	if (x->drain_until)
		return mono_ms() >= x->drain_until;
	if (!x->q->aborted || !x->q->aborted(x->q->ud))
		return 0;
	if (!x->q->drain_ms || x->fd == CURL_SOCKET_BAD || shutdown(x->fd, SHUT_WR) != 0)
		return 1; /* no draining asked, or not connected yet: cut */
	x->drain_until = mono_ms() + x->q->drain_ms;
	return 0;
}

/* The socket of an exchange that may be half-closed: its own connection, never reused. */
static int on_exchange_socket(void *ud, curl_socket_t fd, curlsocktype purpose)
{
	exchange *x = ud;
	if (purpose == CURLSOCKTYPE_IPCXN)
		x->fd = fd;
	return CURL_SOCKOPT_OK;
}

void baton_http_close(void *handle)
{
	if (handle)
		cu.easy_cleanup(handle);
}

int baton_http_exchange(void **handle, const baton_http_req *q, baton_http_resp *p)
{
	memset(p, 0, sizeof *p);
	if (call_load(p->why, sizeof p->why))
		return -1;
	exchange x = {.q = q, .p = p, .fd = CURL_SOCKET_BAD};
	CURL *c = handle && *handle ? *handle : cu.easy_init();
	if (!c) {
		snprintf(p->why, sizeof p->why, "curl_easy_init failed");
		return -1;
	}
	struct curl_slist *h = NULL;
	for (const char *const *l = q->headers; l && *l; l++) {
		struct curl_slist *n = cu.slist_append(h, *l);
		h = n ? n : h;
	}
	struct curl_slist *n = cu.slist_append(h, "Expect:"); /* no 100-continue round trip */
	h = n ? n : h;
	char *why = p->why;
	size_t wn = sizeof p->why;
	int rc = fixed_options(c, why, wn);
	rc |= SETOPT(c, CURLOPT_URL, q->url, why, wn);
	/* Every option that differs between requests is set each time: a handle is reused
	 * (its connections kept alive) without a reset. */
	int get = strcmp(q->method, "GET") == 0, head = strcmp(q->method, "HEAD") == 0;
	rc |= SETOPT(c, CURLOPT_NOBODY, head ? 1L : 0L, why, wn);
	if (get || head) {
		rc |= SETOPT(c, CURLOPT_HTTPGET, 1L, why, wn);
	} else {
		rc |= SETOPT(c, CURLOPT_POSTFIELDSIZE, (long)q->body_len, why, wn);
		rc |= SETOPT(c, CURLOPT_POSTFIELDS, q->body ? q->body : "", why, wn);
	}
	rc |= SETOPT(c, CURLOPT_CUSTOMREQUEST, get || head ? NULL : q->method, why, wn);
	rc |= SETOPT(c, CURLOPT_HTTPHEADER, h, why, wn);
	rc |= SETOPT(c, CURLOPT_TIMEOUT_MS, (long)q->timeout_ms, why, wn);
	rc |= SETOPT(c, CURLOPT_CONNECTTIMEOUT_MS, 2000L, why, wn);
	rc |= SETOPT(c, CURLOPT_WRITEFUNCTION, on_exchange_body, why, wn);
	rc |= SETOPT(c, CURLOPT_WRITEDATA, &x, why, wn);
	rc |= SETOPT(c, CURLOPT_HEADERFUNCTION, on_exchange_header, why, wn);
	rc |= SETOPT(c, CURLOPT_HEADERDATA, &x, why, wn);
	rc |= SETOPT(c, CURLOPT_XFERINFOFUNCTION, on_exchange_progress, why, wn);
	rc |= SETOPT(c, CURLOPT_XFERINFODATA, &x, why, wn);
	/* One that may be half-closed gets a connection of its own, closed at its end. */
	long own = q->drain_ms > 0;
	rc |= SETOPT(c, CURLOPT_FRESH_CONNECT, own, why, wn);
	rc |= SETOPT(c, CURLOPT_FORBID_REUSE, own, why, wn);
	rc |= SETOPT(c, CURLOPT_SOCKOPTFUNCTION, own ? on_exchange_socket : NULL, why, wn);
	rc |= SETOPT(c, CURLOPT_SOCKOPTDATA, own ? (void *)&x : NULL, why, wn);
	if (rc == 0) {
		CURLcode cr = cu.easy_perform(c);
		char *type = NULL; /* owned by the handle */
		if (cr == CURLE_OK &&
		    cu.easy_getinfo(c, CURLINFO_RESPONSE_CODE, &p->status) == CURLE_OK &&
		    p->status > 0) {
			if (cu.easy_getinfo(c, CURLINFO_CONTENT_TYPE, &type) == CURLE_OK && type)
				snprintf(p->content_type, sizeof p->content_type, "%s", type);
		} else {
			p->status = 0;
			snprintf(p->why, sizeof p->why, "%s",
				 cr == CURLE_OPERATION_TIMEDOUT	   ? "timed out"
				 : cr == CURLE_ABORTED_BY_CALLBACK ? "given up"
								   : cu.easy_strerror(cr));
			rc = -1;
		}
	}
	cu.slist_free_all(h);
	if (handle)
		*handle = c;
	else
		cu.easy_cleanup(c);
	if (rc) {
		free(p->body);
		p->body = NULL;
		p->body_len = 0;
		p->status = 0;
	}
	return rc ? -1 : 0;
}
