/*
 * curl_req.c - one HTTP request over a libcurl easy handle, set up once for every HTTP
 * client around batond (see curl_req.h).
 */
#include "curl_req.h"

#include <string.h>

/* The method and the body. Only the options that copy a string can be refused. */
static CURLcode set_method(CURL *c, const curl_req *req)
{
	if (req->read) {
		curl_easy_setopt(c, CURLOPT_POST, 1L);
		curl_easy_setopt(c, CURLOPT_READFUNCTION, req->read);
		curl_easy_setopt(c, CURLOPT_READDATA, req->read_data);
	} else if (req->body || strcmp(req->method, "POST") == 0) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, req->body ? req->body : "");
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE,
				 (curl_off_t)(req->body ? req->body_len : 0));
	}
	if (strcmp(req->method, "HEAD") == 0)
		return curl_easy_setopt(c, CURLOPT_NOBODY, 1L); /* no body to wait for */
	if (strcmp(req->method, "GET") != 0 && strcmp(req->method, "POST") != 0)
		return curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req->method);
	return CURLE_OK;
}

long curl_req_perform(CURL *c, const curl_req *req, curl_body *b, CURLcode *rc)
{
	CURLcode cc = curl_easy_setopt(c, CURLOPT_URL, req->url);
	if (cc == CURLE_OK)
		cc = set_method(c, req);
	if (cc != CURLE_OK) {
		if (rc)
			*rc = cc;
		return -1;
	}
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, req->headers);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, req->connect_timeout_ms);
	curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, req->timeout_ms);
	if (b) {
		curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, curl_body_write);
		curl_easy_setopt(c, CURLOPT_WRITEDATA, b);
	}
	cc = curl_easy_perform(c);
	long status = 0;
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
	if (rc)
		*rc = cc;
	return status;
}
