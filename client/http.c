/*
 * http.c: the client's only contact with the network.
 *
 * One libcurl easy handle per process, reused for every request so that the demo's
 * 50 ms polling rides one kept-alive connection. Bodies are JSON both ways; an answer
 * is read whole into memory (capped) and parsed with jansson. Transport failures map
 * to EXIT_UNREACHABLE, error statuses to EXIT_FAILED with the problem document
 * (RFC 9457) summarised on stderr.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>

#include "../common/curl_req.h"
#include "client.h"

enum {
	CONNECT_TIMEOUT_MS = 5000,
	REQUEST_TIMEOUT_MS = 30000,
	MAX_REPLY_BYTES = 64 << 20, /* a 10000-step workflow is a few MiB */
};

struct http {
	CURL *curl;
	char *base; /* base URL without trailing slash */
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
	h->base = strdup(base_url);
	h->curl = curl_easy_init();
	h->get_headers = headers(get_h);
	h->post_headers = headers(post_h);
	h->empty_headers = headers(empty_h);
	if (!h->base || !h->curl || !h->get_headers || !h->post_headers || !h->empty_headers) {
		fprintf(stderr, "baton: out of memory\n");
		http_free(h);
		return NULL;
	}
	size_t n = strlen(h->base);
	while (n > 0 && h->base[n - 1] == '/')
		h->base[--n] = '\0';
	return h;
}

const char *http_base(const http *h)
{
	return h->base;
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
	free(h->base);
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
}

/* One request of the client: JSON both ways; only a POST carries `payload` (NULL: empty). */
static curl_req request_of(const http *h, const char *method, const char *url, const char *payload)
{
	curl_req req = {.method = method,
			.url = url,
			.headers = h->get_headers,
			.connect_timeout_ms = CONNECT_TIMEOUT_MS,
			.timeout_ms = h->timeout_ms > 0 ? h->timeout_ms : REQUEST_TIMEOUT_MS};
	if (strcmp(method, "POST") == 0) {
		req.body = payload ? payload : "";
		req.body_len = payload ? strlen(payload) : 0;
		req.headers = payload ? h->post_headers : h->empty_headers;
	}
	return req;
}

/* Reports a transfer that got no usable answer; returns the exit status it deserves. */
static int transport_error(const http *h, CURLcode rc, const char *url, const curl_body *b)
{
	const char *why = h->errbuf[0] ? h->errbuf : curl_easy_strerror(rc);

	if (b->overflow) {
		fprintf(stderr, "baton: %s: answer larger than %d MiB\n", url,
			MAX_REPLY_BYTES >> 20);
		return EXIT_FAILED;
	}
	switch (rc) {
	case CURLE_URL_MALFORMAT:
	case CURLE_UNSUPPORTED_PROTOCOL:
		fprintf(stderr, "baton: bad server URL \"%s\": %s\n", h->base, why);
		return EXIT_USAGE;
	case CURLE_OUT_OF_MEMORY:
	case CURLE_WRITE_ERROR:
		fprintf(stderr, "baton: %s: out of memory\n", url);
		return EXIT_FAILED;
	default:
		fprintf(stderr, "baton: server unreachable at %s: %s\n", h->base, why);
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
		fprintf(stderr, "baton: %s: HTTP %ld with a body that is not JSON: %s\n", url,
			reply->status, err.text);
		return EXIT_FAILED;
	}
	return EXIT_OK;
}

int http_request(http *h, const char *method, const char *path, const json_t *body,
		 struct http_reply *reply)
{
	curl_body b = {.max = MAX_REPLY_BYTES};
	char *payload = NULL;
	char *url = NULL;
	int rc = EXIT_FAILED;

	reply->status = 0;
	reply->body = NULL;
	if (asprintf(&url, "%s%s", h->base, path) < 0) {
		url = NULL;
		fprintf(stderr, "baton: out of memory\n");
		goto out;
	}
	if (body && !(payload = json_dumps(body, JSON_COMPACT))) {
		fprintf(stderr, "baton: cannot encode the request body\n");
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
		rc = transport_error(h, cc, url, &b);
		goto out;
	}
	reply->status = status;
	rc = parse_reply(url, &b, reply);
out:
	curl_body_fini(&b);
	free(payload);
	free(url);
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

/* Summarises an error answer: "baton: HTTP 404 Not Found: workflow \"x\" not found". */
static void print_problem(const char *method, const char *path, const struct http_reply *r)
{
	const char *title = jstr(r->body, "title", NULL);
	const char *detail = jstr(r->body, "detail", NULL);

	fprintf(stderr, "baton: %s %s: HTTP %ld", method, path, r->status);
	if (title)
		fprintf(stderr, " %s", title);
	if (detail)
		fprintf(stderr, ": %s", detail);
	fputc('\n', stderr);
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
		print_problem(method, path, &r);
		http_reply_fini(&r);
		return EXIT_FAILED;
	}
	if (!r.body && r.status == 204)
		return EXIT_OK; /* No Content: *out stays NULL */
	if (!r.body) {
		fprintf(stderr, "baton: %s %s: HTTP %ld with an empty body\n", method, path,
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

int http_download(http *h, const char *path, const char *file)
{
	char *url = NULL, *part = NULL;
	int rc = EXIT_FAILED;
	if (asprintf(&url, "%s%s", h->base, path) < 0 || asprintf(&part, "%s.part", file) < 0) {
		fprintf(stderr, "baton: out of memory\n");
		free(url);
		return EXIT_FAILED;
	}
	FILE *f = fopen(part, "wb");
	if (!f) {
		fprintf(stderr, "baton: cannot write %s: %s\n", part, strerror(errno));
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
	if (cc != CURLE_OK) {
		rc = transport_error(h, cc, url, &b);
	} else if (status != 200) {
		/* The problem document went to the file: read it back to say what it was. */
		struct http_reply r = {status, json_load_file(part, JSON_DECODE_ANY, NULL)};
		print_problem("GET", path, &r);
		http_reply_fini(&r);
	} else if (closed != 0 || rename(part, file) != 0) {
		fprintf(stderr, "baton: cannot write %s: %s\n", file, strerror(errno));
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
