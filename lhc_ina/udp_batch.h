/*
 * The one batched-UDP layer in C: datagrams out as UDP GSO runs (grouped per destination, in order), bursts
 * in with recvmmsg, and one rule for what a socket error means. Compiled into every extension that moves
 * datagrams: the worker's engine (host_agent/transport), softswitch's data plane and lhc_ina._udp (whose
 * Sender.plan shows the property tests the messages a send would build). No Python here: callers release
 * the GIL around it.
 *
 * Errors: a datagram the kernel would not take for a reason of its own (a full buffer, an unreachable
 * host or port, a firewall, a datagram too long for the route) is *dropped*, counted, and the rest
 * still leave, as on a lossy link. Any other error means the socket itself is unusable (closed, not a
 * socket, a bad buffer): the call stops and returns the errno, which the caller raises at once. A kernel
 * or route that refuses GSO (EINVAL, EIO, ENOPROTOOPT or EOPNOTSUPP on a run of several datagrams) has
 * that run sent one datagram at a time; after `refusals_max` refusals the sender stops trying GSO.
 */
#ifndef LHC_UDP_BATCH_H
#define LHC_UDP_BATCH_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <netinet/in.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* Messages one sendmmsg or recvmmsg takes at most (the kernel's UIO_MAXIOV). */
#define UDP_MAX_PER_CALL 1024

/* Whether errno `error` of a send or receive only lost this datagram (1) or the socket is unusable (0). */
int udp_error_is_drop(int error);

/* The limits a sender works within, from lhc_ina.constants (UDP_GSO_SEGMENTS, UDP_GSO_REFUSALS). */
typedef struct {
    int segments_max; /* datagrams in one GSO message at most (the kernel's UDP_MAX_SEGMENTS) */
    int refusals_max; /* GSO runs refused before the sender sends one message per datagram for good */
    long bytes_max;   /* payload bytes of one GSO message at most (an IPv4 datagram's) */
} UdpLimits;

/* One socket's sending state and counters. */
typedef struct {
    UdpLimits limits;
    int gso;      /* still sending runs with UDP_SEGMENT */
    int refusals; /* runs the kernel refused so far */
    unsigned long long sent, dropped;
} UdpSender;

void udp_sender_init(UdpSender *s, const UdpLimits *limits, int gso);

/* Scratch for planning and sending one flush of at most `capacity` datagrams: the destination table
 * (open addressing over address and port, `slots` a power of two of at least twice the capacity, so a
 * probe always ends) and the messages. One UdpRuns serves any number of senders, one flush at a time. */
typedef struct {
    int32_t capacity, slots;
    int shift;       /* 64 - log2(slots): a key's home slot is the top bits of its Fibonacci hash */
    int32_t *table;  /* slot -> destination group, -1 when empty (all empty between flushes) */
    uint64_t *keys;  /* slot -> (address, port) */
    int32_t *taken;  /* the slots the current flush filled, to empty them again */
    int32_t *next, *head, *tail; /* per-destination chains of datagram indices, in order */
    int32_t *segments;           /* datagrams per message */
    int32_t *first;              /* the index of each message's first datagram */
    struct iovec *iov;
    struct mmsghdr *messages;
    uint8_t *control;
} UdpRuns;

/* 0, or -1 when memory ran out. `slots` 0 takes the smallest power of two >= 2 * capacity; a larger power
 * of two is kept, a smaller one or one that is not a power of two is an error (-2). */
int udp_runs_init(UdpRuns *r, int32_t capacity, int32_t slots);
void udp_runs_free(UdpRuns *r);
/* The table slot a destination's probe starts at (exposed for tests that force collisions). */
uint32_t udp_runs_home(const UdpRuns *r, const struct sockaddr_in *to);

/* Messages for `n` (<= capacity) datagrams iov[i]: to `to[i]` when `per_datagram`, else all to `to[0]`
 * (`to` NULL: no address, a connected or packet socket). With GSO on, a destination's datagrams leave in
 * their order, in runs of equal size (at most segments_max datagrams and bytes_max bytes); without, one
 * message per datagram in queue order. Returns the number of messages. */
int32_t udp_runs_build(UdpRuns *r, const struct iovec *iov, const struct sockaddr_in *to, int per_datagram,
                       int32_t n, const UdpSender *s);
/* Send the `messages` built; 0, or the errno that made the socket unusable (the unsent are counted as
 * dropped). Call without the GIL. */
int udp_runs_send(UdpRuns *r, int fd, int32_t messages, UdpSender *s);

/* recvmmsg of up to `n` datagrams without waiting: the count (0 when nothing waits or the error only
 * concerned one datagram), or -1 with *error set when the socket is unusable. Call without the GIL. */
int udp_receive(int fd, struct mmsghdr *messages, unsigned int n, int *error);

#endif
