/*
 * minjson.c - the reference of the HTTP read benchmark: a minimal libmicrohttpd server
 * that answers every GET with a small JSON document built with jansson, in the same
 * threading mode as batond (MHD_USE_AUTO_INTERNAL_THREAD with a thread pool, suspend
 * and resume allowed, the same connection timeout). It does nothing else, so the
 * difference between its rate and batond's is what batond's own work costs.
 *
 *     minjson [--threads N] [--port P]
 *
 * Listens on 127.0.0.1 (port 0 by default: a free port), logs
 * "listening on http://127.0.0.1:PORT" and runs until SIGTERM or SIGINT.
 */
#include <microhttpd.h>
#include <jansson.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
				  const char *method, const char *version, const char *upload_data,
				  size_t *upload_size, void **con_cls)
{
	static int first_call_mark;
	(void)cls;
	(void)version;
	(void)upload_data;
	/* Answer on the second call, as batond does: an answer queued on the first call,
	 * before the request is known to be complete, makes libmicrohttpd close the
	 * connection after it (no keep-alive). */
	if (!*con_cls) {
		*con_cls = &first_call_mark;
		return MHD_YES;
	}
	if (strcmp(method, "GET") != 0 || *upload_size)
		return MHD_NO;
	const char *id = strrchr(url, '/');
	json_t *doc = json_pack("{s:s, s:s, s:i}", "id", id ? id + 1 : url, "status", "completed",
				"steps_completed", 1);
	char *text = json_dumps(doc, JSON_COMPACT);
	json_decref(doc);
	if (!text)
		return MHD_NO;
	struct MHD_Response *resp =
	    MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
	if (!resp) {
		free(text);
		return MHD_NO;
	}
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
	enum MHD_Result ret = MHD_queue_response(conn, MHD_HTTP_OK, resp);
	MHD_destroy_response(resp);
	return ret;
}

int main(int argc, char **argv)
{
	unsigned threads = 8, port = 0;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--threads") == 0)
			threads = (unsigned)atoi(argv[i + 1]);
		else if (strcmp(argv[i], "--port") == 0)
			port = (unsigned)atoi(argv[i + 1]);
	}
	if (threads < 1 || threads > 256 || port > 65535) {
		fprintf(stderr, "usage: minjson [--threads 1..256] [--port P]\n");
		return 2;
	}
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
	struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	struct MHD_Daemon *d = MHD_start_daemon(
	    MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME, 0, NULL,
	    NULL, on_request, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
	    MHD_OPTION_THREAD_POOL_SIZE, threads, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60,
	    MHD_OPTION_END);
	if (!d) {
		fprintf(stderr, "minjson: cannot listen on 127.0.0.1:%u\n", port);
		return 1;
	}
	const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
	printf("minjson: %u threads, listening on http://127.0.0.1:%u\n", threads,
	       info ? info->port : port);
	fflush(stdout);
	int sig = 0;
	sigwait(&sigs, &sig);
	MHD_stop_daemon(d);
	return 0;
}
