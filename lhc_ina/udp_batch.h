/*
 * The one batched-UDP layer in C: datagrams out as UDP GSO runs (grouped per destination, in order), bursts
 * in with recvmmsg, and one rule for what a socket error means. Compiled into every extension that moves
 * datagrams: the worker's engine (host_agent/transport), softswitch's data plane and lhc_ina._udp (whose
 * Sender.plan shows the property tests the messages a send would build). No Python here: callers release
 * the GIL around it.
 *
 * Errors: only a fault of the socket itself is *fatal*: the errnos named in UDP_FATAL_ERRORS below (a
 * closed descriptor, not a socket, a buffer outside memory, a socket shut down or without the peer it
 * needs). They do not depend on the datagram, so every later send would fail the same: the call stops,
 * counts what it did not send as dropped, and returns the errno, which the caller raises. Every other
 * errno concerns one datagram or its destination (a full buffer, EINVAL for an address this socket may
 * not send to, an unreachable host or port, a firewall, a datagram too long, an interface gone): that
 * datagram is *dropped*, counted under its errno, and the rest still leave, as on a lossy link. A
 * kernel or route that refuses GSO (EINVAL, EIO, ENOPROTOOPT or EOPNOTSUPP on a run of several
 * datagrams) has that run sent one datagram at a time; the refusal counts against GSO only when some
 * datagram of the run then leaves (if none does, the destination was the reason, not GSO), and after
 * `refusals_max` refusals the sender stops trying GSO.
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

/* The socket's own faults, by name: the one list of the rule (lhc_ina/constants.py's UDP_FATAL_ERRORS
 * names the same errnos; tests/test_udp_socket_errors.py holds them equal through lhc_ina._udp). */
#define UDP_FATAL_ERRORS(X) X(EBADF) X(ENOTSOCK) X(EFAULT) X(EDESTADDRREQ) X(ENOTCONN) X(EPIPE)

/* Whether errno `error` of a send or receive makes the socket unusable (1) or only lost this datagram (0). */
int udp_error_is_fatal(int error);
/* The errnos of UDP_FATAL_ERRORS, in its order, and how many (what lhc_ina._udp.FATAL_ERRORS exports). */
extern const int udp_fatal_errors[];
extern const int udp_fatal_error_count;

/* Drops are counted per errno below this (a larger one, never seen on Linux, counts under 0). */
#define UDP_ERRNO_SLOTS 256

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
    unsigned long long dropped_by[UDP_ERRNO_SLOTS]; /* dropped, per errno (they sum to `dropped`) */
} UdpSender;

void udp_sender_init(UdpSender *s, const UdpLimits *limits, int gso);
/* `count` datagrams lost to errno `error` (those a fatal error left unsent count under it too). */
void udp_sender_drop(UdpSender *s, int error, unsigned long long count);

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

/* A flush's datagrams at most: its table of >= 2 * capacity slots, a power of two, stays within int32. */
#define UDP_RUNS_CAPACITY_MAX (1 << 24)

/* 0, or -1 when memory ran out. `slots` 0 takes the smallest power of two >= 2 * capacity; a larger power
 * of two is kept; a capacity outside 1..UDP_RUNS_CAPACITY_MAX, slots fewer than that or not a power of two
 * is an error (-2). */
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
/* Send the `messages` built; 0, or the fatal errno that made the socket unusable (the unsent are counted
 * as dropped, under it). Call without the GIL. */
int udp_runs_send(UdpRuns *r, int fd, int32_t messages, UdpSender *s);

/* recvmmsg of up to `n` datagrams without waiting: the count (0 when nothing waits or the error was not
 * fatal: an earlier datagram's, reported late), or -1 with *error set when the socket is unusable. Call
 * without the GIL. */
int udp_receive(int fd, struct mmsghdr *messages, unsigned int n, int *error);

#endif
