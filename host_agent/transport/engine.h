/*
 * The engine's Python object and its socket work (engine_io.c), shared by _engine.c (the type and its
 * methods) and engine_io.c (impairment, UDP GSO sends, recvmmsg drains).
 */
#ifndef LHC_ENGINE_H
#define LHC_ENGINE_H

#define _GNU_SOURCE
#include "engine_core.h"

#include <stdint.h>
#include <sys/socket.h>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103 /* linux/udp.h: the GSO segment size of a sendmsg, as a cmsg */
#endif
#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#define GSO_MAX 64 /* datagrams per GSO message (UDP_MAX_SEGMENTS on older kernels) */

typedef struct {
    PyObject_HEAD
    Core core;
    int fd;
    double loss, duplicate;
    uint64_t rng;
    long long io_sent, io_received, dropped_out, dropped_in, duplicated_out, duplicated_in;
    /* receive buffers for one recvmmsg */
    unsigned char rx[RX_BATCH][RX_SLOT];
    struct mmsghdr rx_msgs[RX_BATCH];
    struct iovec rx_iov[RX_BATCH];
    struct sockaddr_in rx_from[RX_BATCH];
    /* one sendmmsg: every packet a decision queued, twice where the impairment doubles it; with UDP GSO a
     * message carries up to GSO_MAX of them (one kernel traversal), else one each */
    struct mmsghdr *tx_msgs;
    struct iovec *tx_iov;
    char (*tx_ctrl)[CMSG_SPACE(sizeof(uint16_t))];
    int gso;
} Engine;


double monotonic_now(void);
/* Send what the core queued (c->out), impaired per datagram, as GSO runs where the kernel takes them. */
void send_out(Engine *e);
/* Take what waits in the socket, a recvmmsg batch at a time, sending new packets after each batch. */
void drain(Engine *e);

#endif
