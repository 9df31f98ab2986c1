/*
 * proxy.h - a TCP proxy on loopback that a test can cut, for partitions between one batond
 * node and PostgreSQL while the node's own clients still reach it, and for the faults of a
 * client's own network between the clients and a node.
 *
 * It listens on 127.0.0.1 (a free port of 10000-19999, outside the kernel's ephemeral range,
 * so that no client's connection takes it while the proxy is cut), and pipes each connection it
 * accepts to 127.0.0.1:target_port, both ways. "Cut" closes every piped connection (both sides see
 * them end) and stops listening, so new connections are refused; "heal" listens on the
 * same port again. "Hold" stops passing PostgreSQL's answers, "release" passes them again.
 * When either side closes its end, the proxy closes the other: a client that gives up on a
 * request is seen giving up by the node. One thread runs it; the calls are thread-safe and
 * return once the thread has done what they ask.
 *
 * Client faults (hs_proxy_strike), for a proxy between HTTP clients and batond: the proxy
 * follows each connection's exchanges (a request is what the client sends after the last
 * answer began, its answer what the node sends then; HTTP/1.1 without pipelining, as libcurl
 * sends) and strikes a share of the requests with one of the faults below, chosen by a
 * seeded generator. A reset is SO_LINGER 0 and close, on both sides: each sees ECONNRESET.
 */
#ifndef BATON_TEST_PROXY_H
#define BATON_TEST_PROXY_H

typedef struct hs_proxy hs_proxy;

enum hs_fault {
	HS_DROP_ANSWER,	  /* the request is delivered; its answer is dropped, both sides reset */
	HS_RESET_REQUEST, /* half the request delivered, or all of it and then, before its
			   * answer (within 1.5 s, or when the answer comes), both sides reset */
	HS_RESET_ANSWER,  /* the request delivered; half the answer's first bytes passed, then
			   * both sides reset */
	HS_HOLD_REQUEST,  /* the request held back 0.2 to 3 s, then delivered; a client that
			   * closes meanwhile has its connection to the node closed, unsent */
	HS_FAULTS
};

/* Starts a proxy to 127.0.0.1:target_port. NULL after printing why. */
hs_proxy *hs_proxy_open(int target_port);
/* The port it listens on (also while cut: heal listens there again). */
int hs_proxy_port(const hs_proxy *p);
/* Connections accepted from now on go to 127.0.0.1:target_port (a node started again). */
void hs_proxy_retarget(hs_proxy *p, int target_port);
/* Drops every piped connection and refuses new ones. */
void hs_proxy_cut(hs_proxy *p);
/* Accepts connections again. 0, or -1 when the port could not be bound again. */
int hs_proxy_heal(hs_proxy *p);
/* Stops passing what PostgreSQL sends, on every piped connection and on those accepted
 * from now on; what the node sends still passes. Its statements run and commit in the
 * database, and it waits for their answers, as when its host pauses after sending them. */
void hs_proxy_hold(hs_proxy *p);
/* Passes again what was held on the connection to PostgreSQL from local port `port` (the
 * client_port pg_stat_activity shows for the node's session); port 0: on every connection,
 * and new ones are no longer held. 1 when a connection held was released, else 0. */
int hs_proxy_release(hs_proxy *p, int port);
/*
 * From now on each request that starts is struck, with probability percent / 100, by one
 * of the faults whose bit (1u << enum hs_fault) is set in `kinds`, the draws made by a
 * generator seeded with `seed` (rand_r). percent 0 (or kinds 0) stops striking; requests
 * struck before finish as their fault says.
 */
void hs_proxy_strike(hs_proxy *p, unsigned kinds, int percent, unsigned seed);
/* How many requests fault f has struck since the proxy opened. */
int hs_proxy_struck(hs_proxy *p, enum hs_fault f);
/* The bytes held (hs_proxy_hold) and not passed yet, over every connection: nonzero once
 * the target wrote an answer that its client has not been given. */
long hs_proxy_held_bytes(hs_proxy *p);
/* Stops the thread and closes everything; accepts NULL. */
void hs_proxy_close(hs_proxy *p);

#endif
