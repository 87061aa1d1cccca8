/*
 * The engine's Python object and its socket work (engine_io.c), shared by _engine.c (the type and its
 * methods) and engine_io.c (impairment, UDP GSO sends, recvmmsg drains, the poll wait).
 */
#ifndef LHC_ENGINE_H
#define LHC_ENGINE_H

#define _GNU_SOURCE
#include "engine_core.h"

#include <stdint.h>
#include <sys/socket.h>

#include "../../lhc_ina/udp_batch.h"

/* Datagrams lost in runs (channel.py's BurstLoss): each send or receive batch is cut into runs of
 * `loss_burst`, and one draw decides whether a whole run is lost. */
typedef struct {
    long long left;
    int dropping;
} LossRun;

typedef struct {
    PyObject_HEAD
    Core core;
    int fd;
    int error; /* the errno that made the socket unusable (pump raises it), 0 while it works */
    int busy;  /* while a pump runs (the GIL released in it): every call that changes the engine refuses */
    double loss, duplicate;
    long long loss_burst;
    LossRun run_out, run_in;
    uint64_t rng;
    long long io_sent, io_received, dropped_out, dropped_in, duplicated_out, duplicated_in;
    /* receive buffers for one recvmmsg */
    unsigned char rx[RX_BATCH][RX_SLOT];
    struct mmsghdr rx_msgs[RX_BATCH];
    struct iovec rx_iov[RX_BATCH];
    struct sockaddr_in rx_from[RX_BATCH];
    /* one sendmmsg: every packet a decision queued, twice where the impairment doubles it, as UDP GSO
     * runs where the kernel takes them (lhc_ina/udp_batch.c) */
    struct iovec *tx_iov;
    UdpRuns runs;
    UdpSender sender;
} PacketEngine;


double monotonic_now(void);
/* The OSError for e->error (the socket stays unusable: every later pump raises it again); NULL. */
PyObject *socket_error(PacketEngine *e);
/* Send what the core queued (c->out), impaired per datagram, as GSO runs where the kernel takes them; an
 * unusable socket sets e->error. */
void send_out(PacketEngine *e);
/* Take what waits in the socket, a recvmmsg batch at a time, sending new packets after each batch; stops
 * with e->error set when the socket is unusable. */
void drain(PacketEngine *e);
/* Sleep until a result, a wake-up on wake_fd or `wait` s; 1 when results wait in the socket. A socket error
 * that concerned one datagram is a loss, any other sets e->error. */
int wait_for_io(PacketEngine *e, int wake_fd, double wait);

#endif
