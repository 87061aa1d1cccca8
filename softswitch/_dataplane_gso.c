/*
 * A UDP port's queue out with UDP GSO: the datagrams to one destination, in their order, leave as one
 * message with UDP_SEGMENT (up to 64 datagrams of one size), one sendmmsg for them all.
 *
 * Why: on loopback (and in VMs) a datagram's trip down the stack costs several times its recvmmsg; a
 * result's W copies go to W destinations, but over a burst each destination gets many results of the
 * same size, and GSO sends them in one trip. Receivers still get separate datagrams (the kernel splits
 * them unless the receiving socket asked for UDP_GRO). The order per destination is kept; between
 * destinations there is no order to keep (UDP promises none, and copies of one frame leave together).
 * A refused run leaves one datagram per message; a port whose runs keep being refused (a kernel or route
 * without UDP GSO) turns GSO off.
 */
#define _GNU_SOURCE
#include "_dataplane.h"

#include <errno.h>
#include <linux/udp.h>
#include <netinet/in.h>
#include <string.h>

/* The kernel's UDP_MAX_SEGMENTS (64 since UDP GSO came in 4.18; not in the uapi headers). */
#define GSO_SEGMENTS 64
/* GSO runs a port's kernel may refuse before the port sends one message per datagram for good. */
#define GSO_REFUSALS 8
/* Open addressing over (address, port): twice the queue, so a probe always ends. */
#define TABLE_SLOTS 2048
#define CONTROL_BYTES CMSG_SPACE(sizeof(uint16_t))

int gso_setup(Engine *e)
{
    Gso *g = &e->gso;
    size_t n = (size_t)e->queue_capacity;
    g->iov = PyMem_Calloc(n, sizeof(struct iovec));
    g->messages = PyMem_Calloc(n, sizeof(struct mmsghdr));
    g->control = PyMem_Calloc(n, CONTROL_BYTES);
    g->next = PyMem_Calloc(n, sizeof(int32_t));
    g->head = PyMem_Calloc(n, sizeof(int32_t));
    g->tail = PyMem_Calloc(n, sizeof(int32_t));
    g->segments = PyMem_Calloc(n, sizeof(int32_t));
    g->first = PyMem_Calloc(n, sizeof(int32_t));
    g->table = PyMem_Calloc(TABLE_SLOTS, sizeof(int32_t));
    g->keys = PyMem_Calloc(TABLE_SLOTS, sizeof(uint64_t));
    if (!g->iov || !g->messages || !g->control || !g->next || !g->head || !g->tail || !g->segments || !g->first
        || !g->table || !g->keys) {
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < TABLE_SLOTS; i++)
        g->table[i] = -1;
    return 0;
}

void gso_free(Engine *e)
{
    Gso *g = &e->gso;
    PyMem_Free(g->iov); PyMem_Free(g->messages); PyMem_Free(g->control); PyMem_Free(g->next);
    PyMem_Free(g->head); PyMem_Free(g->tail); PyMem_Free(g->segments); PyMem_Free(g->first);
    PyMem_Free(g->table); PyMem_Free(g->keys);
}

/* Chain the queued datagrams per destination; returns the number of destinations (groups). */
static int32_t group(Gso *g, const Port *p)
{
    int32_t groups = 0;
    for (int32_t q = 0; q < p->queued; q++) {
        const struct sockaddr_in *to = &p->destinations[q];
        uint64_t key = ((uint64_t)to->sin_addr.s_addr << 16) | to->sin_port;
        uint32_t h = (uint32_t)((key * UINT64_C(0x9E3779B97F4A7C15)) >> 53) & (TABLE_SLOTS - 1);
        while (g->table[h] >= 0 && g->keys[h] != key)
            h = (h + 1) & (TABLE_SLOTS - 1);
        g->next[q] = -1;
        if (g->table[h] < 0) {
            g->table[h] = groups;
            g->keys[h] = key;
            g->head[groups] = g->tail[groups] = q;
            groups++;
        } else {
            int32_t at = g->table[h];
            g->next[g->tail[at]] = q;
            g->tail[at] = q;
        }
    }
    for (int32_t q = 0; q < p->queued; q++) { /* empty the table again for the next flush */
        const struct sockaddr_in *to = &p->destinations[q];
        uint64_t key = ((uint64_t)to->sin_addr.s_addr << 16) | to->sin_port;
        uint32_t h = (uint32_t)((key * UINT64_C(0x9E3779B97F4A7C15)) >> 53) & (TABLE_SLOTS - 1);
        while (g->table[h] >= 0 && g->keys[h] != key)
            h = (h + 1) & (TABLE_SLOTS - 1);
        g->table[h] = -1;
    }
    return groups;
}

/* One message per run of equal-size datagrams to one destination (at most GSO_SEGMENTS, at most
 * `most` bytes); returns the number of messages. */
static int32_t build(Gso *g, const Port *p, int32_t groups, long most)
{
    int32_t messages = 0, v = 0;
    for (int32_t at = 0; at < groups; at++) {
        for (int32_t q = g->head[at]; q >= 0;) {
            size_t size = p->iov[q].iov_len;
            int32_t first = v, segments = 0;
            g->first[messages] = q;
            do {
                g->iov[v++] = p->iov[q];
                segments++;
                q = g->next[q];
            } while (q >= 0 && size > 0 && segments < GSO_SEGMENTS && p->iov[q].iov_len == size
                     && (long)(size * (size_t)(segments + 1)) <= most);
            struct msghdr *header = &g->messages[messages].msg_hdr;
            memset(header, 0, sizeof(*header));
            header->msg_name = (void *)&p->destinations[g->first[messages]];
            header->msg_namelen = sizeof(struct sockaddr_in);
            header->msg_iov = &g->iov[first];
            header->msg_iovlen = (size_t)segments;
            if (segments > 1) {
                header->msg_control = g->control + (size_t)messages * CONTROL_BYTES;
                header->msg_controllen = CONTROL_BYTES;
                struct cmsghdr *cmsg = CMSG_FIRSTHDR(header);
                cmsg->cmsg_level = IPPROTO_UDP;
                cmsg->cmsg_type = UDP_SEGMENT;
                cmsg->cmsg_len = CMSG_LEN(sizeof(uint16_t));
                uint16_t gso_size = (uint16_t)size;
                memcpy(CMSG_DATA(cmsg), &gso_size, sizeof(gso_size));
            }
            g->segments[messages++] = segments;
        }
    }
    return messages;
}

/* The datagrams of message m one by one (the kernel refused GSO); counts the ones it refuses. */
static void one_by_one(Gso *g, Port *p, int32_t m)
{
    struct msghdr single = g->messages[m].msg_hdr;
    single.msg_control = NULL;
    single.msg_controllen = 0;
    single.msg_iovlen = 1;
    for (int32_t i = 0; i < g->segments[m]; i++) {
        single.msg_iov = g->messages[m].msg_hdr.msg_iov + i;
        while (sendmsg(p->fd, &single, MSG_DONTWAIT) < 0) {
            if (errno != EINTR) {
                p->send_errors++;
                break;
            }
        }
    }
}

int gso_flush(Engine *e, Port *p, int *error)
{
    Gso *g = &e->gso;
    int32_t messages = build(g, p, group(g, p), 0xFFFF - e->L.ipv4_bytes - e->L.udp_bytes);
    int32_t next = 0;
    while (next < messages) {
        int accepted = sendmmsg(p->fd, &g->messages[next], (unsigned int)(messages - next), MSG_DONTWAIT);
        if (accepted > 0) {
            next += accepted;
        } else if (accepted < 0 && errno == EINTR) {
            continue;
        } else if (accepted < 0 && (errno == EBADF || errno == ENOTSOCK || errno == EFAULT)) {
            *error = errno;
            for (; next < messages; next++)
                p->send_errors += (unsigned long long)g->segments[next];
            break;
        } else if (g->segments[next] > 1 && (errno == EINVAL || errno == EIO || errno == ENOPROTOOPT
                                            || errno == EOPNOTSUPP)) {
            /* refused: this run leaves one datagram at a time; a kernel or route that keeps refusing GSO
               (not one odd run, e.g. datagrams longer than the route's MTU) has it turned off */
            if (++p->gso_refusals >= GSO_REFUSALS)
                p->gso = 0;
            one_by_one(g, p, next++);
        } else { /* lost (full buffer, unreachable), the rest of the batch still leaves */
            p->send_errors += (unsigned long long)g->segments[next++];
        }
    }
    p->queued = 0;
    return *error ? -1 : 0;
}
