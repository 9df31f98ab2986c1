/*
 * http.c: the client's only contact with the network.
 *
 * One libcurl easy handle per process, reused for every request so that the demo's
 * 50 ms polling rides one kept-alive connection. Bodies are JSON both ways; an answer
 * is read whole into memory (capped) and parsed with jansson. Transport failures map
 * to EXIT_UNREACHABLE, error statuses to EXIT_FAILED with the problem document
 * (RFC 9457) summarised on stderr.
 *
 * Several servers (--server URL,URL,..., as etcdctl's --endpoints): a request goes to
 * the server that answered last, and moves on to the next one, each tried once, when a
 * server refuses the connection, gives no answer in time, or answers 503 (busy, shutting
 * down, its store failing, or a cluster node that does not drive the resource); a 503
 * from the last one is the answer; each move says why (refused, timed out, or the 503 and
 * the node that drives the resource, from the problem's driven_by). A request that may have reached
 * the server (a timeout or a cut connection after it was sent) is sent again elsewhere only when
 * sending it twice is harmless: any method but POST, or a POST its caller declared so
 * (http_set_resend: baton lock's, whose acquire carries a request_id, and baton
 * worker's). A submission without an id is not: the first server may have stored it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <curl/curl.h>

#include "../common/curl_req.h"
#include "client.h"

enum {
	CONNECT_TIMEOUT_MS = 5000,
	REQUEST_TIMEOUT_MS = 30000,
	MAX_REPLY_BYTES = 64 << 20, /* a 10000-step workflow is a few MiB */
};

#define MAX_SERVERS 16

struct http {
	CURL *curl;
	char *bases[MAX_SERVERS]; /* base URLs without trailing slash */
	/* why each server's last request got no usable answer ("refused the connection",
	 * "answered 503 (...)"); "" once it answered */
	char why[MAX_SERVERS][200];
	size_t n_bases, cur;	      /* cur: the server of the next request */
	int resend;		      /* POSTs may be sent again after an unknown outcome */
	int quiet;		      /* no "server unreachable" line: the caller says it */
	int answered;		      /* some server answered some request (any status) */
	long connect_timeout_ms;      /* 0: CONNECT_TIMEOUT_MS */
	volatile sig_atomic_t *abort; /* nonzero: end the request in flight (NULL: never) */
	struct curl_slist *get_headers;
	struct curl_slist *post_headers;  /* JSON body */
	struct curl_slist *empty_headers; /* POST without body: no Content-Type */
	char errbuf[CURL_ERROR_SIZE];
	long timeout_ms; /* 0: REQUEST_TIMEOUT_MS */
};

static struct curl_slist *headers(const char *const *lines)
{
	struct curl_slist *list = NULL;

	for (; *lines; lines++) {
		struct curl_slist *l = curl_slist_append(list, *lines);
		if (!l) {
			curl_slist_free_all(list);
			return NULL;
		}
		list = l;
	}
	return list;
}

static const char *bearer;

void http_set_token(const char *token)
{
	bearer = token && *token ? token : NULL;
}

void http_auth(void *curl_easy)
{
	if (bearer && curl_easy) {
		curl_easy_setopt(curl_easy, CURLOPT_HTTPAUTH, CURLAUTH_BEARER);
		curl_easy_setopt(curl_easy, CURLOPT_XOAUTH2_BEARER, bearer);
	}
}

/* Fills h->bases from "URL,URL,...": each without trailing slashes. 0, or -1 after
 * saying why (an empty entry, too many, out of memory). */
static int split_servers(http *h, const char *list)
{
	const char *p = list;
	for (;;) {
		size_t n = strcspn(p, ",");
		while (n > 0 && (p[n - 1] == '/' || p[n - 1] == ' '))
			n--;
		while (n > 0 && *p == ' ') {
			p++;
			n--;
		}
		if (n == 0 || h->n_bases == MAX_SERVERS) {
			fprintf(stderr, "baton: bad server list \"%s\": %s\n", list,
				n ? "more than 16 servers" : "an empty URL");
			return -1;
		}
		if (!(h->bases[h->n_bases++] = strndup(p, n))) {
			fprintf(stderr, "baton: out of memory\n");
			return -1;
		}
		p += strcspn(p, ",");
		if (!*p)
			return 0;
		p++;
	}
}

http *http_new(const char *base_url)
{
	static const char *const get_h[] = {"Accept: application/json", NULL};
	static const char *const post_h[] = {"Accept: application/json",
					     "Content-Type: application/json", "Expect:", NULL};
	static const char *const empty_h[] = {"Accept: application/json",
					      "Content-Type:", "Expect:", NULL};
	http *h = calloc(1, sizeof(*h));

	if (!h || curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
		fprintf(stderr, "baton: cannot initialise libcurl\n");
		free(h);
		return NULL;
	}
	h->curl = curl_easy_init();
	h->get_headers = headers(get_h);
	h->post_headers = headers(post_h);
	h->empty_headers = headers(empty_h);
	if (!h->curl || !h->get_headers || !h->post_headers || !h->empty_headers) {
		fprintf(stderr, "baton: out of memory\n");
		http_free(h);
		return NULL;
	}
	if (split_servers(h, base_url) < 0) {
		http_free(h);
		return NULL;
	}
	return h;
}

http *http_clone(const http *h)
{
	char *list = NULL;
	size_t len = 0;
	for (size_t i = 0; i < h->n_bases; i++)
		len += strlen(h->bases[i]) + 1;
	if (!(list = malloc(len + 1))) {
		fprintf(stderr, "baton: out of memory\n");
		return NULL;
	}
	list[0] = '\0';
	for (size_t i = 0; i < h->n_bases; i++) {
		strcat(list, h->bases[i]);
		strcat(list, i + 1 < h->n_bases ? "," : "");
	}
	http *c = http_new(list);
	free(list);
	if (c) {
		c->cur = h->cur;
		c->resend = h->resend;
		c->quiet = h->quiet;
		c->connect_timeout_ms = h->connect_timeout_ms;
	}
	return c;
}

const char *http_base(const http *h)
{
	return h->bases[h->cur];
}

size_t http_server_count(const http *h)
{
	return h->n_bases;
}

const char *http_next_server(http *h)
{
	h->cur = (h->cur + 1) % h->n_bases;
	return h->bases[h->cur];
}

void http_set_resend(http *h, int on)
{
	h->resend = on;
}

void http_set_quiet(http *h, int on)
{
	h->quiet = on;
}

void http_set_connect_timeout(http *h, long ms)
{
	h->connect_timeout_ms = ms;
}

void http_set_abort(http *h, volatile sig_atomic_t *flag)
{
	h->abort = flag;
}

/* libcurl's progress callback, called while a request is in flight, also idle (at least
 * once a second): nonzero ends the transfer. */
static int aborted(void *flag, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
		   curl_off_t ulnow)
{
	(void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
	/* Set by a signal handler, possibly on another thread (baton lock's attempts): an
	 * atomic load, as the handler's store is atomic. */
	return __atomic_load_n((volatile sig_atomic_t *)flag, __ATOMIC_RELAXED) != 0;
}

int http_answered(const http *h)
{
	return h->answered;
}

void http_why_unreachable(const http *h, char *buf, size_t len)
{
	size_t n = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < h->n_bases && n < len; i++) {
		int w = snprintf(buf + n, len - n, "%s%s %s", i ? "; " : "", h->bases[i],
				 h->why[i][0] ? h->why[i] : "was not asked");
		n += w > 0 ? (size_t)w : 0;
	}
}

void http_free(http *h)
{
	if (!h)
		return;
	if (h->curl)
		curl_easy_cleanup(h->curl);
	curl_slist_free_all(h->get_headers);
	curl_slist_free_all(h->post_headers);
	curl_slist_free_all(h->empty_headers);
	for (size_t i = 0; i < h->n_bases; i++)
		free(h->bases[i]);
	free(h);
	curl_global_cleanup();
}

/*
 * Resets the reused handle to the client's own options: the token, the user agent and
 * the error buffer; curl_req sets the rest of each request.
 */
static void prepare(http *h)
{
	curl_easy_reset(h->curl);
	http_auth(h->curl);
	h->errbuf[0] = '\0';
	curl_easy_setopt(h->curl, CURLOPT_ERRORBUFFER, h->errbuf);
	curl_easy_setopt(h->curl, CURLOPT_USERAGENT, "baton/" BATON_CLIENT_VERSION);
	if (h->abort) {
		curl_easy_setopt(h->curl, CURLOPT_NOPROGRESS, 0L);
		curl_easy_setopt(h->curl, CURLOPT_XFERINFOFUNCTION, aborted);
		curl_easy_setopt(h->curl, CURLOPT_XFERINFODATA, (void *)h->abort);
	}
}

/* One request of the client: JSON both ways; only a POST or a PUT carries `payload` (NULL:
 * empty). */
static curl_req request_of(const http *h, const char *method, const char *url, const char *payload)
{
	curl_req req = {.method = method,
			.url = url,
			.headers = h->get_headers,
			.connect_timeout_ms =
			    h->connect_timeout_ms > 0 ? h->connect_timeout_ms : CONNECT_TIMEOUT_MS,
			.timeout_ms = h->timeout_ms > 0 ? h->timeout_ms : REQUEST_TIMEOUT_MS};
	if (strcmp(method, "POST") == 0 || strcmp(method, "PUT") == 0) {
		req.body = payload ? payload : "";
		req.body_len = payload ? strlen(payload) : 0;
		req.headers = payload ? h->post_headers : h->empty_headers;
	}
	return req;
}

/* Notes in h->why[h->cur] why the current server gave no answer, in a few words. */
static void note_no_answer(http *h, CURLcode rc, const curl_req *req)
{
	char *why = h->why[h->cur], secs[32];
	size_t n = sizeof h->why[0];
	curl_off_t connected = 0;
	long os_errno = 0, sent = 0;
	switch (rc) {
	case CURLE_COULDNT_CONNECT:
		if (curl_easy_getinfo(h->curl, CURLINFO_OS_ERRNO, &os_errno) == CURLE_OK &&
		    os_errno == ECONNREFUSED)
			snprintf(why, n, "refused the connection");
		else
			snprintf(why, n, "could not be reached (%.150s)",
				 h->errbuf[0] ? h->errbuf : curl_easy_strerror(rc));
		break;
	case CURLE_COULDNT_RESOLVE_HOST:
		snprintf(why, n, "is a host name that does not resolve");
		break;
	case CURLE_OPERATION_TIMEDOUT:
		/* connected (or a kept-alive connection, which has no connect time) and sent */
		curl_easy_getinfo(h->curl, CURLINFO_CONNECT_TIME_T, &connected);
		if (curl_easy_getinfo(h->curl, CURLINFO_REQUEST_SIZE, &sent) == CURLE_OK && sent)
			connected = 1;
		format_secs(secs, sizeof secs,
			    connected ? req->timeout_ms : req->connect_timeout_ms);
		snprintf(why, n, "%s within %s s",
			 connected ? "did not answer" : "did not accept the connection", secs);
		break;
	case CURLE_ABORTED_BY_CALLBACK:
		snprintf(why, n, "was not waited for");
		break;
	default:
		snprintf(why, n, "failed (%.150s)",
			 h->errbuf[0] ? h->errbuf : curl_easy_strerror(rc));
	}
}

/* Notes why a 503 moves the request on: the node that drives the resource, when the
 * answer names it (driven_by), else its detail. */
static void note_503(http *h, const json_t *problem)
{
	const json_t *by = json_object_get(problem, "driven_by");
	const char *node = jstr(by, "node", NULL), *url = jstr(by, "url", NULL);
	const char *detail = jstr(problem, "detail", NULL);
	char *why = h->why[h->cur];
	size_t n = sizeof h->why[0];
	if (node && url)
		snprintf(why, n, "answered 503 (%s at %s drives it)", node, url);
	else if (node)
		snprintf(why, n, "answered 503 (%s drives it)", node);
	else if (detail)
		snprintf(why, n, "answered 503 (%.160s)", detail);
	else
		snprintf(why, n, "answered 503");
}

/* Reports a transfer that got no usable answer; returns the exit status it deserves. */
static int transport_error(const http *h, CURLcode rc, const char *url, const curl_body *b,
			   int quiet)
{
	const char *why = h->errbuf[0] ? h->errbuf : curl_easy_strerror(rc);

	if (b->overflow) {
		print_error("Answer too large", "%s: answer larger than %d MiB", url,
			    MAX_REPLY_BYTES >> 20);
		return EXIT_FAILED;
	}
	switch (rc) {
	case CURLE_URL_MALFORMAT:
	case CURLE_UNSUPPORTED_PROTOCOL:
		print_error("Bad server URL", "bad server URL \"%s\": %s", http_base(h), why);
		return EXIT_USAGE;
	case CURLE_ABORTED_BY_CALLBACK: /* the caller ended it (http_set_abort): no answer */
		return EXIT_UNREACHABLE;
	case CURLE_OUT_OF_MEMORY:
	case CURLE_WRITE_ERROR:
		fprintf(stderr, "baton: %s: out of memory\n", url);
		return EXIT_FAILED;
	default:
		if (!quiet)
			print_error("Server unreachable", "server unreachable at %s: %s",
				    http_base(h), why);
		return EXIT_UNREACHABLE;
	}
}

/* Parses the answer body; an empty body is a NULL json, anything else must be JSON. */
static int parse_reply(const char *url, const curl_body *b, struct http_reply *reply)
{
	json_error_t err;

	if (b->len == 0)
		return EXIT_OK;
	reply->body = json_loadb(b->data, b->len, JSON_DECODE_ANY, &err);
	if (!reply->body) {
		print_error("Answer not JSON", "%s: HTTP %ld with a body that is not JSON: %s", url,
			    reply->status, err.text);
		return EXIT_FAILED;
	}
	return EXIT_OK;
}

/*
 * Whether a request that failed this way may go to the next server: nothing was sent
 * (the connection refused, the name unknown), or the outcome is unknown (a timeout, a
 * cut connection) and sending it twice is harmless.
 */
static int may_move_on(const http *h, const char *method, CURLcode cc)
{
	long sent = 0;
	switch (cc) {
	case CURLE_COULDNT_CONNECT:
	case CURLE_COULDNT_RESOLVE_HOST:
		return 1;
	case CURLE_OPERATION_TIMEDOUT:
	case CURLE_GOT_NOTHING:
	case CURLE_SEND_ERROR:
	case CURLE_RECV_ERROR:
	case CURLE_PARTIAL_FILE:
		if (curl_easy_getinfo(h->curl, CURLINFO_REQUEST_SIZE, &sent) == CURLE_OK &&
		    sent == 0)
			return 1;
		return strcmp(method, "POST") != 0 || h->resend;
	default:
		return 0;
	}
}

/* One attempt of http_request on the current server; *next: try the next server. `last`:
 * no server comes after it, so its failure is the one to report. */
static int request_once(http *h, const char *method, const char *path, const char *payload,
			struct http_reply *reply, int *next, int last)
{
	curl_body b = {.max = MAX_REPLY_BYTES};
	char *url = NULL;
	int rc = EXIT_FAILED;

	*next = 0;
	if (asprintf(&url, "%s%s", http_base(h), path) < 0) {
		url = NULL;
		fprintf(stderr, "baton: out of memory\n");
		goto out;
	}
	prepare(h);
	curl_req req = request_of(h, method, url, payload);
	CURLcode cc;
	long status = curl_req_perform(h->curl, &req, &b, &cc);
	if (status < 0) {
		fprintf(stderr, "baton: cannot prepare request to %s\n", url);
		goto out;
	}
	if (cc != CURLE_OK) {
		note_no_answer(h, cc, &req);
		int moves = cc != CURLE_ABORTED_BY_CALLBACK && may_move_on(h, method, cc);
		rc = transport_error(h, cc, url, &b, h->quiet || (moves && !last));
		*next = rc == EXIT_UNREACHABLE && moves;
		goto out;
	}
	reply->status = status;
	h->answered = 1;
	h->why[h->cur][0] = '\0';
	rc = parse_reply(url, &b, reply);
	*next = status == 503;
	if (*next)
		note_503(h, reply->body);
out:
	curl_body_fini(&b);
	free(url);
	return rc;
}

int http_request(http *h, const char *method, const char *path, const json_t *body,
		 struct http_reply *reply)
{
	char *payload = NULL;
	int rc = EXIT_FAILED, next = 0;

	reply->status = 0;
	reply->body = NULL;
	if (body && !(payload = json_dumps(body, JSON_COMPACT))) {
		fprintf(stderr, "baton: cannot encode the request body\n");
		return EXIT_FAILED;
	}
	for (size_t tried = 0; tried < h->n_bases; tried++) {
		if (tried) {
			const char *was = http_base(h), *why = h->why[h->cur];
			const char *next_one = http_next_server(h);
			if (!h->quiet)
				fprintf(stderr, "baton: %s %s; trying %s\n", was, why, next_one);
			http_reply_fini(reply);
			reply->status = 0;
		}
		rc = request_once(h, method, path, payload, reply, &next, tried + 1 == h->n_bases);
		if (!next)
			break;
	}
	free(payload);
	return rc;
}

void http_set_timeout(http *h, long ms)
{
	h->timeout_ms = ms;
}

void http_reply_fini(struct http_reply *reply)
{
	if (!reply)
		return;
	json_decref(reply->body);
	reply->body = NULL;
}

int http_call(http *h, const char *method, const char *path, const json_t *body, json_t **out,
	      long *status)
{
	struct http_reply r;
	int rc = http_request(h, method, path, body, &r);

	*out = NULL;
	if (rc != EXIT_OK)
		return rc;
	if (status)
		*status = r.status;
	if (r.status < 200 || r.status > 299) {
		print_problem(method, path, r.status, r.body);
		http_reply_fini(&r);
		return EXIT_FAILED;
	}
	if (!r.body && r.status == 204)
		return EXIT_OK; /* No Content: *out stays NULL */
	if (!r.body) {
		print_error("Empty answer", "%s %s: HTTP %ld with an empty body", method, path,
			    r.status);
		return EXIT_FAILED;
	}
	*out = r.body; /* ownership moves to the caller */
	return EXIT_OK;
}

char *http_escape(const char *s)
{
	char *e = curl_easy_escape(NULL, s, 0);
	char *copy = e ? strdup(e) : NULL;

	curl_free(e);
	if (!copy) {
		fprintf(stderr, "baton: out of memory\n");
		exit(EXIT_FAILED);
	}
	return copy;
}

static size_t to_file(char *ptr, size_t size, size_t nmemb, void *userdata)
{
	return fwrite(ptr, size, nmemb, userdata);
}

/* One attempt of http_download on the current server; *next: try the next server. */
static int download_once(http *h, const char *path, const char *file, int *next)
{
	char *url = NULL, *part = NULL;
	int rc = EXIT_FAILED;
	if (asprintf(&url, "%s%s", http_base(h), path) < 0 ||
	    asprintf(&part, "%s.part", file) < 0) {
		fprintf(stderr, "baton: out of memory\n");
		free(url);
		return EXIT_FAILED;
	}
	/* 0600 whatever the umask: the copy holds the calls' headers (Authorization). The
	 * fchmod covers a FILE.part left by an earlier run, which O_TRUNC keeps as it was. */
	int fd = open(part, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	FILE *f = fd >= 0 && fchmod(fd, 0600) == 0 ? fdopen(fd, "wb") : NULL;
	if (!f) {
		int err = errno;
		if (fd >= 0)
			close(fd);
		print_error("Cannot write", "cannot write %s: %s", part, strerror(err));
		goto out;
	}
	curl_body b = {0}; /* stays empty: the answer goes to the file */
	prepare(h);
	curl_easy_setopt(h->curl, CURLOPT_WRITEFUNCTION, to_file);
	curl_easy_setopt(h->curl, CURLOPT_WRITEDATA, f);
	curl_req req = request_of(h, "GET", url, NULL);
	req.timeout_ms = 0; /* a large database takes its time */
	CURLcode cc;
	long status = curl_req_perform(h->curl, &req, NULL, &cc);
	int closed = fclose(f);
	*next = 0;
	if (cc != CURLE_OK) {
		note_no_answer(h, cc, &req);
		rc = transport_error(h, cc, url, &b, h->quiet);
		*next = rc == EXIT_UNREACHABLE && may_move_on(h, "GET", cc);
	} else if (status == 503) {
		*next = 1;
		print_problem("GET", path, status, NULL);
	} else if (status != 200) {
		/* The problem document went to the file: read it back to say what it was. */
		json_t *problem = json_load_file(part, JSON_DECODE_ANY, NULL);
		print_problem("GET", path, status, problem);
		json_decref(problem);
	} else if (closed != 0 || rename(part, file) != 0) {
		print_error("Cannot write", "cannot write %s: %s", file, strerror(errno));
	} else {
		rc = EXIT_OK;
	}
	if (rc != EXIT_OK)
		unlink(part);
out:
	free(url);
	free(part);
	return rc;
}

int http_download(http *h, const char *path, const char *file)
{
	int rc = EXIT_FAILED, next = 0;
	for (size_t tried = 0; tried < h->n_bases; tried++) {
		if (tried)
			fprintf(stderr, "baton: trying %s\n", http_next_server(h));
		rc = download_once(h, path, file, &next);
		if (!next)
			break;
	}
	return rc;
}
