/*
 * proxy.h - a TCP proxy on loopback that a test can cut, for partitions between one batond
 * node and PostgreSQL while the node's own clients still reach it.
 *
 * It listens on 127.0.0.1 (port 0: the kernel picks), and pipes each connection it accepts
 * to 127.0.0.1:target_port, both ways. "Cut" closes every piped connection (both sides see
 * them end) and stops listening, so new connections are refused; "heal" listens on the
 * same port again. "Hold" stops passing PostgreSQL's answers, "release" passes them again. One
 * thread runs it; the calls are thread-safe and return once the thread has done what they ask.
 */
#ifndef BATON_TEST_PROXY_H
#define BATON_TEST_PROXY_H

typedef struct hs_proxy hs_proxy;

/* Starts a proxy to 127.0.0.1:target_port. NULL after printing why. */
hs_proxy *hs_proxy_open(int target_port);
/* The port it listens on (also while cut: heal listens there again). */
int hs_proxy_port(const hs_proxy *p);
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
/* The bytes held (hs_proxy_hold) and not passed yet, over every connection: nonzero once
 * the target wrote an answer that its client has not been given. */
long hs_proxy_held_bytes(hs_proxy *p);
/* Stops the thread and closes everything; accepts NULL. */
void hs_proxy_close(hs_proxy *p);

#endif
