/*
 * The engine's socket work: the impairment's draws, sends and receives through lhc_ina/udp_batch.c (UDP
 * GSO runs where the kernel takes them, a recvmmsg batch at a time, one rule for socket errors: an
 * unusable socket stops the engine, a refused datagram is a drop). The GIL is released while the kernel
 * works.
 */
#include "engine.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double uniform(PacketEngine *e)  /* splitmix64 -> [0, 1): the impairment's draws */
{
    uint64_t z = (e->rng += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return (double)((z ^ (z >> 31)) >> 11) * 0x1.0p-53;
}

double monotonic_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

PyObject *socket_error(PacketEngine *e)
{
    PyObject *args = Py_BuildValue("(iss)", e->error, strerror(e->error), "the packet engine's socket");
    if (args != NULL) {
        PyErr_SetObject(PyExc_OSError, args); /* OSError(errno, strerror, what): its subclass, errno set */
        Py_DECREF(args);
    }
    return NULL;
}

/* Whether the next datagram one way is lost: channel.py's BurstLoss.lost, on the same draws. */
static int lost(PacketEngine *e, LossRun *run)
{
    if (run->left == 0) {
        run->left = e->loss_burst;
        run->dropping = uniform(e) < e->loss;
    }
    run->left--;
    return run->dropping;
}

/* Send what the core queued, each datagram lost (in runs) or doubled where impaired, as GSO runs. */
void send_out(PacketEngine *e)  /* channel.py: Channel.send_many */
{
    int n = 0;
    e->run_out.left = 0; /* a run of losses never reaches into the next send */
    for (int i = 0; i < e->core.n_out; i++) {
        int copies = 1;
        if (e->loss > 0 || e->duplicate > 0) {
            if (lost(e, &e->run_out)) {
                e->dropped_out++;
                continue;
            }
            if (uniform(e) < e->duplicate) {
                e->duplicated_out++;
                copies = 2;
            }
        }
        for (int k = 0; k < copies; k++, n++) {
            e->tx_iov[n].iov_base = (void *)e->core.out[i];
            e->tx_iov[n].iov_len = (size_t)engine_constants.packet_bytes;
        }
    }
    e->core.n_out = 0;
    if (n == 0 || e->error)
        return;
    unsigned long long sent = e->sender.sent, dropped = e->sender.dropped;
    int error;
    Py_BEGIN_ALLOW_THREADS
    error = udp_runs_send(&e->runs, e->fd, udp_runs_build(&e->runs, e->tx_iov, &e->core.sw, 0, n, &e->sender),
                          &e->sender);
    Py_END_ALLOW_THREADS
    e->io_sent += (long long)(e->sender.sent - sent);
    e->dropped_out += (long long)(e->sender.dropped - dropped);
    e->error = error;
}

/* Take what waits in the socket, a recvmmsg batch at a time (at most RX_BURST datagrams), each batch
 * followed by the decisions it allows. */
void drain(PacketEngine *e)
{
    for (int taken = 0; taken < RX_BURST && !e->error;) {
        int got, error;
        for (int i = 0; i < RX_BATCH; i++)
            e->rx_msgs[i].msg_hdr.msg_namelen = sizeof(e->rx_from[i]);
        Py_BEGIN_ALLOW_THREADS
        got = udp_receive(e->fd, e->rx_msgs, RX_BATCH, &error);
        Py_END_ALLOW_THREADS
        if (got < 0)
            e->error = error;
        if (got <= 0)
            return;
        e->io_received += got;
        taken += got;
        e->run_in.left = 0; /* nor into the next receive batch */
        double now = monotonic_now();
        for (int i = 0; i < got; i++) {
            int copies = 1;
            if (e->loss > 0 || e->duplicate > 0) {
                if (lost(e, &e->run_in)) {
                    e->dropped_in++;
                    continue;
                }
                if (uniform(e) < e->duplicate && core_from_switch(&e->core, &e->rx_from[i])) {
                    e->duplicated_in++;
                    copies = 2;
                }
            }
            for (int k = 0; k < copies; k++)
                core_result(&e->core, now, e->rx[i], (Py_ssize_t)e->rx_msgs[i].msg_len, &e->rx_from[i]);
        }
        core_decide(&e->core, now, 0);  /* new packets at once; losses only once the socket is empty */
        send_out(e);
        if (got < RX_BATCH)
            return;
    }
}


/* POLLERR: take the socket's pending error; a fatal one (udp_batch.h's list) makes the socket unusable, any
 * other concerned a datagram (ICMP unreachable) and is a loss the timers recover. */
static void pending_error(PacketEngine *e)
{
    int error = 0;
    socklen_t size = sizeof(error);
    if (getsockopt(e->fd, SOL_SOCKET, SO_ERROR, &error, &size) < 0)
        error = errno;
    if (error && udp_error_is_fatal(error))
        e->error = error;
}

/* Twin of the select in engine_io.py's ChannelEngine.pump: sleep until a result, a wake-up on wake_fd (emptied here) or `wait` s. */
int wait_for_io(PacketEngine *e, int wake_fd, double wait)
{
    struct pollfd fds[2] = {{.fd = e->fd, .events = POLLIN}, {.fd = wake_fd, .events = POLLIN}};
    int ready;
    Py_BEGIN_ALLOW_THREADS
    ready = poll(fds, 2, (int)ceil(wait * 1000.0));
    if (ready > 0 && (fds[1].revents & POLLIN)) {
        char sink[256];
        while (read(wake_fd, sink, sizeof(sink)) > 0) {
        }
    }
    Py_END_ALLOW_THREADS
    if (ready < 0 && errno != EINTR)
        e->error = errno;
    else if (ready > 0 && (fds[0].revents & POLLNVAL))
        e->error = EBADF; /* the descriptor was closed under the engine */
    else if (ready > 0 && (fds[0].revents & POLLERR))
        pending_error(e);
    return !e->error && ready > 0 && (fds[0].revents & POLLIN);
}
