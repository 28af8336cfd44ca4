/*
 * broker_bind.h: where the embedded broker's listeners go (tools/broker_bind.c). librdkafka
 * 2.0.2's mock cluster binds each broker to 127.0.0.1 port 0 and has no option to choose;
 * while the hook is installed, librdkafka's own calls to bind(2) (and no one else's) are
 * turned into binds to the requested address and ports, with Nagle's algorithm off.
 */
#ifndef ARCLIGHT_TOOLS_BROKER_BIND_H
#define ARCLIGHT_TOOLS_BROKER_BIND_H

#include <netinet/in.h>
#include <stddef.h>

/* Installs the hook for the mock cluster's creation (rd_kafka_mock_cluster_new, which binds
 * every listener in the calling thread). rewrite: loopback port-0 binds go to addr instead,
 * and, with first_port, to first_port, first_port + 1, ... (SO_REUSEADDR); without rewrite
 * only TCP_NODELAY is set. 0, or -1 with errstr filled (librdkafka's bind not found). */
int broker_bind_hook_install(struct in_addr addr, int first_port, int rewrite, char *errstr,
                             size_t errlen);

/* Removes the hook: librdkafka binds as it does by itself again (a broker taken down and
 * up re-binds the port it has). Sets the listeners given TCP_NODELAY and the binds
 * rewritten while it was installed. */
void broker_bind_hook_remove(int *nodelay_count, int *fixed_count);

#endif
