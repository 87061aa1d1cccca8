/*
 * The one batched-UDP layer (see udp_batch.h for the contract). Python twin of the error rule:
 * lhc_ina/udp.py's is_fatal (the per-datagram fallback sends one sendto at a time and applies it there).
 */
#include "udp_batch.h"

#include <errno.h>
#include <linux/udp.h> /* UDP_SEGMENT */
#include <stdlib.h>
#include <string.h>

#define CONTROL_BYTES CMSG_SPACE(sizeof(uint16_t))

#define AS_ERRNO(name) name,
const int udp_fatal_errors[] = {UDP_FATAL_ERRORS(AS_ERRNO)};
#undef AS_ERRNO
const int udp_fatal_error_count = (int)(sizeof(udp_fatal_errors) / sizeof(udp_fatal_errors[0]));

int udp_error_is_fatal(int error) /* udp.py: is_fatal */
{
    for (int i = 0; i < udp_fatal_error_count; i++)
        if (error == udp_fatal_errors[i])
            return 1;
    return 0;
}

void udp_sender_drop(UdpSender *s, int error, unsigned long long count) /* udp.py: PythonIO._drop */
{
    s->dropped += count;
    s->dropped_by[error > 0 && error < UDP_ERRNO_SLOTS ? error : 0] += count;
}

static int gso_refused(int error)
{
    return error == EINVAL || error == EIO || error == ENOPROTOOPT || error == EOPNOTSUPP;
}

void udp_sender_init(UdpSender *s, const UdpLimits *limits, int gso)
{
    memset(s, 0, sizeof(*s));
    s->limits = *limits;
    s->gso = gso && limits->segments_max > 1;
}

int udp_runs_init(UdpRuns *r, int32_t capacity, int32_t slots)
{
    memset(r, 0, sizeof(*r));
    if (capacity < 1 || capacity > UDP_RUNS_CAPACITY_MAX)
        return -2; /* checked before 2 * capacity is formed: it stays within int32 */
    int32_t smallest = 2;
    while (smallest < 2 * capacity)
        smallest *= 2;
    if (slots == 0)
        slots = smallest;
    if (slots < smallest || (slots & (slots - 1)) != 0)
        return -2;
    r->capacity = capacity, r->slots = slots;
    r->shift = 64;
    for (int32_t s = slots; s > 1; s >>= 1)
        r->shift--;
    size_t n = (size_t)capacity;
    r->table = malloc((size_t)slots * sizeof(int32_t));
    r->keys = calloc((size_t)slots, sizeof(uint64_t));
    r->taken = calloc(n, sizeof(int32_t));
    r->next = calloc(n, sizeof(int32_t));
    r->head = calloc(n, sizeof(int32_t));
    r->tail = calloc(n, sizeof(int32_t));
    r->segments = calloc(n, sizeof(int32_t));
    r->first = calloc(n, sizeof(int32_t));
    r->iov = calloc(n, sizeof(struct iovec));
    r->messages = calloc(n, sizeof(struct mmsghdr));
    r->control = calloc(n, CONTROL_BYTES);
    if (!r->table || !r->keys || !r->taken || !r->next || !r->head || !r->tail || !r->segments || !r->first
        || !r->iov || !r->messages || !r->control) {
        udp_runs_free(r);
        return -1;
    }
    for (int32_t i = 0; i < slots; i++)
        r->table[i] = -1;
    return 0;
}

void udp_runs_free(UdpRuns *r)
{
    free(r->table), free(r->keys), free(r->taken), free(r->next), free(r->head), free(r->tail);
    free(r->segments), free(r->first), free(r->iov), free(r->messages), free(r->control);
    memset(r, 0, sizeof(*r));
}

static uint64_t key_of(const struct sockaddr_in *to)
{
    return ((uint64_t)to->sin_addr.s_addr << 16) | to->sin_port;
}

uint32_t udp_runs_home(const UdpRuns *r, const struct sockaddr_in *to)
{
    return (uint32_t)((key_of(to) * UINT64_C(0x9E3779B97F4A7C15)) >> r->shift); /* Fibonacci hashing */
}

/* Chain datagrams per destination, in order; returns the number of destinations. The table is emptied
 * again through the slots this flush took (never by probing again: a destination that probing placed
 * past its home slot would then stay behind, and a later flush would append to its stale group). */
static int32_t group(UdpRuns *r, const struct sockaddr_in *to, int32_t n)
{
    int32_t groups = 0;
    for (int32_t q = 0; q < n; q++) {
        uint64_t key = key_of(&to[q]);
        uint32_t h = udp_runs_home(r, &to[q]);
        while (r->table[h] >= 0 && r->keys[h] != key)
            h = (h + 1) & (uint32_t)(r->slots - 1);
        r->next[q] = -1;
        if (r->table[h] < 0) {
            r->table[h] = groups;
            r->keys[h] = key;
            r->taken[groups] = (int32_t)h;
            r->head[groups] = r->tail[groups] = q;
            groups++;
        } else {
            int32_t at = r->table[h];
            r->next[r->tail[at]] = q;
            r->tail[at] = q;
        }
    }
    for (int32_t at = 0; at < groups; at++)
        r->table[r->taken[at]] = -1;
    return groups;
}

static void set_segment_size(UdpRuns *r, int32_t m, struct msghdr *header, size_t size)
{
    header->msg_control = r->control + (size_t)m * CONTROL_BYTES;
    header->msg_controllen = CONTROL_BYTES;
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(header);
    cmsg->cmsg_level = IPPROTO_UDP;
    cmsg->cmsg_type = UDP_SEGMENT;
    cmsg->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    uint16_t gso_size = (uint16_t)size;
    memcpy(CMSG_DATA(cmsg), &gso_size, sizeof(gso_size));
}

static void add_message(UdpRuns *r, int32_t m, int32_t first_iov, int32_t segments, const struct sockaddr_in *to)
{
    struct msghdr *header = &r->messages[m].msg_hdr;
    memset(header, 0, sizeof(*header));
    header->msg_name = (void *)to;
    header->msg_namelen = to ? sizeof(struct sockaddr_in) : 0;
    header->msg_iov = &r->iov[first_iov];
    header->msg_iovlen = (size_t)segments;
    if (segments > 1)
        set_segment_size(r, m, header, r->iov[first_iov].iov_len);
    r->segments[m] = segments;
}

int32_t udp_runs_build(UdpRuns *r, const struct iovec *iov, const struct sockaddr_in *to, int per_datagram,
                       int32_t n, const UdpSender *s)
{
    int32_t messages = 0, v = 0;
    if (!s->gso) {
        for (int32_t q = 0; q < n; q++, messages++) {
            r->iov[q] = iov[q];
            r->first[messages] = q;
            add_message(r, messages, q, 1, to == NULL ? NULL : per_datagram ? &to[q] : to);
        }
        return messages;
    }
    int32_t groups;
    if (per_datagram && to != NULL) {
        groups = group(r, to, n);
    } else { /* one destination: a single chain in queue order */
        for (int32_t q = 0; q < n; q++)
            r->next[q] = q + 1 < n ? q + 1 : -1;
        r->head[0] = 0;
        groups = n > 0;
    }
    const UdpLimits *L = &s->limits;
    for (int32_t at = 0; at < groups; at++) {
        for (int32_t q = r->head[at]; q >= 0; messages++) {
            size_t size = iov[q].iov_len;
            int32_t first = v, segments = 0;
            r->first[messages] = q;
            do {
                r->iov[v++] = iov[q];
                segments++;
                q = r->next[q];
            } while (q >= 0 && size > 0 && segments < L->segments_max && iov[q].iov_len == size
                     && (long)(size * (size_t)(segments + 1)) <= L->bytes_max);
            const struct sockaddr_in *dest = to == NULL ? NULL : per_datagram ? &to[r->first[messages]] : to;
            add_message(r, messages, first, segments, dest);
        }
    }
    return messages;
}

/* Message m's datagrams from `from` on, one by one: 0 or the fatal errno of an unusable socket; *sent_any
 * says whether one left. Python twin: PythonIO._send_all, which sends every datagram so. */
static int one_by_one(UdpRuns *r, int fd, int32_t m, int32_t from, UdpSender *s, int *sent_any)
{
    struct msghdr single = r->messages[m].msg_hdr;
    single.msg_control = NULL;
    single.msg_controllen = 0;
    single.msg_iovlen = 1;
    for (int32_t i = from; i < r->segments[m]; i++) {
        single.msg_iov = r->messages[m].msg_hdr.msg_iov + i;
        ssize_t sent;
        do
            sent = sendmsg(fd, &single, MSG_DONTWAIT);
        while (sent < 0 && errno == EINTR);
        if (sent >= 0) {
            s->sent++;
            *sent_any = 1;
        } else if (udp_error_is_fatal(errno)) {
            int error = errno;
            udp_sender_drop(s, error, (unsigned long long)(r->segments[m] - i));
            return error;
        } else {
            udp_sender_drop(s, errno, 1);
        }
    }
    return 0;
}

int udp_runs_send(UdpRuns *r, int fd, int32_t messages, UdpSender *s)
{
    int32_t next = 0;
    int error = 0, sent_any = 0;
    while (next < messages) {
        int accepted = sendmmsg(fd, &r->messages[next], (unsigned int)(messages - next), MSG_DONTWAIT);
        if (accepted > 0) {
            for (int32_t m = next; m < next + accepted; m++)
                s->sent += (unsigned long long)r->segments[m];
            next += accepted;
            continue;
        }
        if (accepted < 0 && errno == EINTR)
            continue;
        int failure = accepted < 0 ? errno : EIO; /* 0 accepted with nothing wrong: the kernel's EIO */
        if (udp_error_is_fatal(failure)) {
            error = failure;
        } else if (r->segments[next] > 1 && gso_refused(failure)) {
            /* GSO's fault only if a datagram of the run leaves on its own; else its destination's */
            sent_any = 0;
            error = one_by_one(r, fd, next++, 0, s, &sent_any);
            if (sent_any && ++s->refusals >= s->limits.refusals_max)
                s->gso = 0;
        } else {
            /* as one message per datagram would: the first is lost, the rest of the run still tries
               (the error may have been an earlier datagram's, reported once) */
            udp_sender_drop(s, failure, 1);
            error = one_by_one(r, fd, next++, 1, s, &sent_any);
        }
        if (error) {
            for (; next < messages; next++)
                udp_sender_drop(s, error, (unsigned long long)r->segments[next]);
            return error;
        }
    }
    return 0;
}

int udp_receive(int fd, struct mmsghdr *messages, unsigned int n, int *error)
{
    int received;
    do
        received = recvmmsg(fd, messages, n, MSG_DONTWAIT, NULL);
    while (received < 0 && errno == EINTR);
    *error = 0;
    if (received >= 0)
        return received;
    if (!udp_error_is_fatal(errno))
        return 0;
    *error = errno;
    return -1;
}
