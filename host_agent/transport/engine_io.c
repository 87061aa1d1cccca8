/*
 * The engine's socket work: the impairment's draws, sends as UDP GSO runs (or one message per datagram
 * after the kernel's first refusal), and drains a recvmmsg batch at a time. The GIL is released while
 * the kernel works.
 */
#include "engine.h"

#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <time.h>

static double uniform(Engine *e)  /* splitmix64 -> [0, 1): the impairment's draws */
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

/* Messages for the n datagrams of tx_iov: GSO runs of up to GSO_MAX, or one per datagram. */
static int build_messages(Engine *e, int n)
{
    int per = e->gso ? GSO_MAX : 1, m = 0;
    for (int at = 0; at < n; at += per, m++) {
        struct msghdr *h = &e->tx_msgs[m].msg_hdr;
        memset(&e->tx_msgs[m], 0, sizeof(e->tx_msgs[m]));
        h->msg_iov = &e->tx_iov[at];
        h->msg_iovlen = (size_t)(n - at < per ? n - at : per);
        h->msg_name = &e->core.sw;
        h->msg_namelen = sizeof(e->core.sw);
        if (h->msg_iovlen > 1) {
            h->msg_control = e->tx_ctrl[m];
            h->msg_controllen = sizeof(e->tx_ctrl[m]);
            struct cmsghdr *cmsg = CMSG_FIRSTHDR(h);
            cmsg->cmsg_level = SOL_UDP;
            cmsg->cmsg_type = UDP_SEGMENT;
            cmsg->cmsg_len = CMSG_LEN(sizeof(uint16_t));
            uint16_t size = (uint16_t)g.packet_bytes;
            memcpy(CMSG_DATA(cmsg), &size, sizeof(size));
        }
    }
    return m;
}

/* Send what the core queued, each datagram lost or doubled on its own where impaired, one sendmmsg. */
void send_out(Engine *e)
{
    int n = 0;
    for (int i = 0; i < e->core.n_out; i++) {
        int copies = 1;
        if (e->loss > 0 || e->duplicate > 0) {
            if (uniform(e) < e->loss) {
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
            e->tx_iov[n].iov_len = (size_t)g.packet_bytes;
        }
    }
    e->core.n_out = 0;
    int m = build_messages(e, n), at = 0;
    Py_BEGIN_ALLOW_THREADS
    while (at < m) {
        int sent = sendmmsg(e->fd, e->tx_msgs + at, (unsigned)(m - at), 0);
        if (sent < 0 && errno == EINTR)
            continue;
        if (sent < 0 && e->gso && (errno == EINVAL || errno == EIO || errno == ENOPROTOOPT ||
                                   errno == EOPNOTSUPP)) {
            e->gso = 0;  /* this kernel or route takes no GSO: one message per datagram from now on */
            int done = 0;
            for (int k = 0; k < at; k++)
                done += (int)e->tx_msgs[k].msg_hdr.msg_iovlen;
            memmove(e->tx_iov, e->tx_iov + done, sizeof(*e->tx_iov) * (size_t)(n - done));
            n -= done;
            m = build_messages(e, n), at = 0;
            continue;
        }
        if (sent < 0) {  /* this message is lost (a full buffer, an unreachable port), as a sendto's */
            e->dropped_out += (long long)e->tx_msgs[at].msg_hdr.msg_iovlen;
            at++;
            continue;
        }
        for (int k = at; k < at + sent; k++)
            e->io_sent += (long long)e->tx_msgs[k].msg_hdr.msg_iovlen;
        at += sent;
    }
    Py_END_ALLOW_THREADS
}

/* Take what waits in the socket, a recvmmsg batch at a time (at most RX_BURST datagrams), each batch
 * followed by the decisions it allows. */
void drain(Engine *e)
{
    for (int taken = 0; taken < RX_BURST;) {
        int got;
        for (int i = 0; i < RX_BATCH; i++)
            e->rx_msgs[i].msg_hdr.msg_namelen = sizeof(e->rx_from[i]);
        Py_BEGIN_ALLOW_THREADS
        do
            got = recvmmsg(e->fd, e->rx_msgs, RX_BATCH, MSG_DONTWAIT, NULL);
        while (got < 0 && errno == EINTR);
        Py_END_ALLOW_THREADS
        if (got <= 0)
            return;
        e->io_received += got;
        taken += got;
        double now = monotonic_now();
        for (int i = 0; i < got; i++) {
            int copies = 1;
            if (e->loss > 0 || e->duplicate > 0) {
                if (uniform(e) < e->loss) {
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

